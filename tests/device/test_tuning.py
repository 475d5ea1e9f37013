"""Tuned kernel choices: a recorded choice is used, and COOPMAT_NO_TUNING ignores it."""

from __future__ import annotations

import json

import numpy as np
import pytest

import coopmat
from coopmat.api.matmul import last_kernel_traits
from coopmat.codegen import Tile
from coopmat.device.record import nv2_usable
from coopmat.dispatch import gemm
from coopmat.dispatch.runtime import runtime
from coopmat.policy import TypePair, shape_class, tuning
from coopmat.policy import kernel as policy_kernel


@pytest.fixture
def private_tuning(tmp_path, monkeypatch, live_device_info):
    monkeypatch.setenv("COOPMAT_CACHE_DIR", str(tmp_path))
    # A table shipped for the device (the H200 has one) would seed the user's file and
    # answer for classes a test means to leave untuned.
    monkeypatch.setattr(tuning, "SHIPPED", tmp_path / "no-shipped-tables")
    # On a GPU the filling rule shrinks a tile whose grid leaves it idle, a tuned tile
    # too (tests/unit/test_policy.py checks that rule); off here, so the tile the table
    # names is the one that runs.
    monkeypatch.setattr(policy_kernel, "fills_small", lambda problem: False)
    tuning._loaded.clear()
    gemm._plans.clear()
    yield live_device_info
    tuning._loaded.clear()
    gemm._plans.clear()


def test_recorded_tile_is_used_and_can_be_ignored(private_tuning, monkeypatch):
    if "int8->int32" not in coopmat.supported_dtypes():
        pytest.skip("needs int8->int32")
    info = private_tuning
    rng = np.random.default_rng(3)
    a = rng.integers(-9, 9, size=(70, 90), dtype=np.int8)
    b = rng.integers(-9, 9, size=(90, 50), dtype=np.int8)
    coopmat.set_options(tuning=False)  # a shipped table may exist for the device
    coopmat.matmul(a, b)
    default = last_kernel_traits().tile
    cfg = last_kernel_traits()
    coopmat.set_options(tuning=True)
    gemm._plans.clear()
    other = Tile(2 * cfg.m, 2 * cfg.n, cfg.k, 2, 1, 1)
    assert other != default
    # The problem's own class: a shipped table (the H200's) may hold the others.
    key = shape_class(TypePair(cfg.a_type, cfg.result_type), 70, 50)
    assert key == "int8->int32@medium"
    tuning.record(info, key, "khr", other, {"note": "test"})
    assert json.loads(tuning.path_for(info).read_text())[key]["tile"][:3] == [
        other.tile_m, other.tile_n, other.tile_k]
    gemm._plans.clear()
    d = coopmat.matmul(a, b)
    assert last_kernel_traits().tile == other
    np.testing.assert_array_equal(d, a.astype(np.int32) @ b.astype(np.int32))
    # Few rows are their own shape class: the square-class record does not apply there.
    coopmat.matmul(a[:16], b)
    assert last_kernel_traits().tile != other
    coopmat.set_options(tuning=False)
    gemm._plans.clear()
    coopmat.matmul(a, b)
    assert last_kernel_traits().tile == default


def test_forcing_a_family(private_tuning, monkeypatch):
    if "int8->int32" not in coopmat.supported_dtypes():
        pytest.skip("needs int8->int32")
    a = np.ones((8, 8), np.int8)
    coopmat.matmul(a, a, family="khr")
    assert last_kernel_traits().family == "khr"
    with pytest.raises(ValueError, match="unknown kernel family 'xyz'"):
        coopmat.matmul(a, a, family="xyz")
    if not nv2_usable(runtime().device.info):
        with pytest.raises(coopmat.MissingFeatureError, match="nv2 kernel family needs"):
            coopmat.matmul(a, a, family="nv2")
        coopmat.set_options(family="nv2")
        with pytest.raises(coopmat.MissingFeatureError):
            coopmat.matmul(a, a)
    else:
        coopmat.matmul(a, a, family="nv2")
        assert last_kernel_traits().family == "nv2"
