"""Kernel choice (coopmat.policy) against recorded devices: no GPU, no Vulkan.

The recorded lists are what real drivers report (tests/data/README.md): the NVIDIA H200
(driver 580), Mesa 26 lavapipe, and RADV on RDNA4 (float8 matrices, from Mesa's source).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from coopmat.codegen import KhrTraits, Layout, Nv2Traits, Tile
from coopmat.device.enums import ComponentType as CT
from coopmat.device.record import load_records
from coopmat.dispatch.tuning import SHIPPED
from coopmat.errors import MissingFeatureError
from coopmat.policy import (
    MEDIUM_MN,
    KernelChoice,
    OperandLayout,
    Options,
    Problem,
    TypePair,
    choose,
    choose_family,
    resolve,
    shape_class,
)

DATA = Path(__file__).parent / "data"
(H200,) = load_records(DATA / "nvidia-h200-khr-coopmat.json")
(LAVAPIPE,) = load_records(DATA / "lavapipe-mesa26-khr-coopmat.json")
(RADV,) = load_records(DATA / "radv-gfx12-khr-coopmat.json")
F16, F32, I8, I32 = np.float16, np.float32, np.int8, np.int32


def khr(choice: KernelChoice) -> KhrTraits:
    """The chosen traits, which must be the khr family's."""
    assert isinstance(choice.traits, KhrTraits), choice.traits
    return choice.traits


def row_major(M: int, N: int, K: int, pair: TypePair, **kw: object) -> Problem:
    return Problem(pair, M, N, K, OperandLayout(Layout.ROW_MAJOR, K),
                   OperandLayout(Layout.ROW_MAJOR, N), **kw)  # type: ignore[arg-type]


# -- types ---------------------------------------------------------------------------------
def test_float16_defaults_to_float32_accumulation_with_a_float16_result() -> None:
    for info in (H200, LAVAPIPE):
        pair = resolve(info, F16, F16)
        assert (pair.operand, pair.result, pair.out) == (CT.FLOAT16, CT.FLOAT32, CT.FLOAT16)
        assert pair.describe() == "float16->float32"  # the config (and tuning key)
        assert pair.describe_result() == "float16->float16 (float32 accumulation)"
        half = resolve(info, F16, F16, accumulator=F16)
        assert (half.result, half.out) == (CT.FLOAT16, None)
        wide = resolve(info, F16, F16, F32)
        assert (wide.result, wide.stored) == (CT.FLOAT32, CT.FLOAT32)


def test_other_defaults_and_errors() -> None:
    assert resolve(H200, I8, I8) == TypePair(CT.SINT8, CT.SINT32)
    assert resolve(H200, ml_dtypes.bfloat16, ml_dtypes.bfloat16) == \
        TypePair(CT.BFLOAT16, CT.FLOAT32)
    with pytest.raises(TypeError, match="different dtypes float16 and int8"):
        resolve(H200, F16, I8)
    with pytest.raises(TypeError, match="unsupported dtype float64; device 0 .* supports"):
        resolve(H200, np.float64, np.float64)
    with pytest.raises(TypeError, match="unsupported dtype bfloat16"):
        resolve(LAVAPIPE, ml_dtypes.bfloat16, ml_dtypes.bfloat16)  # lavapipe lists none
    with pytest.raises(TypeError, match="int8->int32 with float16 accumulation"):
        resolve(H200, I8, I8, accumulator=F16)


def test_float8_where_the_driver_lists_it() -> None:
    for dt, ct in ((ml_dtypes.float8_e4m3fn, CT.FLOAT8_E4M3),
                   (ml_dtypes.float8_e5m2, CT.FLOAT8_E5M2)):
        pair = resolve(RADV, dt, dt)
        assert pair == TypePair(ct, CT.FLOAT32)
        t = khr(choose(RADV, row_major(256, 256, 256, pair)))
        assert (t.a_type, t.b_type, t.result_type) == (ct, ct, CT.FLOAT32)
        assert t.subgroup_size == 64 and (t.m, t.n, t.k) == (16, 16, 16)
        with pytest.raises(TypeError, match="unsupported dtype"):
            resolve(H200, dt, dt)  # driver 580 lists no float8 matrix


# -- kernels -------------------------------------------------------------------------------
def shipped_h200() -> dict[str, tuple[str, Tile]]:
    import json
    table = json.loads((SHIPPED / "10de-2335.json").read_text())
    return {k: (v["family"], Tile(*v["tile"])) for k, v in table.items()}


def test_large_float16_takes_the_tuned_tile_exact_and_specialized() -> None:
    pair = resolve(H200, F16, F16)
    tuned = shipped_h200()
    choice = choose(H200, row_major(8192, 8192, 8192, pair), Options(), tuned)
    t = khr(choice)
    assert t.exact and t.specialized and choice.why == "tuned"
    assert t.tile == tuned["float16->float32"][1] and t.out_type == CT.FLOAT16
    assert choice.margins[0] > 0  # the exact look-ahead reads past A: its buffer grows
    off = choose(H200, row_major(8192, 8192, 8192, pair), Options(specialize="never"), tuned)
    assert not khr(off).specialized
    untuned = choose(H200, row_major(8192, 8192, 8192, pair), Options(tuning=False), tuned)
    assert untuned.why == "default" and untuned.traits.tile != t.tile


def test_shape_classes_and_their_fallback() -> None:
    pair = TypePair(CT.SINT8, CT.SINT32)
    side = int(MEDIUM_MN ** 0.5)
    assert shape_class(pair, side, side) == "int8->int32@medium"
    assert shape_class(pair, side, side + 1) == "int8->int32"
    assert shape_class(pair, 64, 10 ** 6) == "int8->int32@small-m"
    big, mid = Tile(64, 64, 32, 2, 2, 2), Tile(32, 32, 32, 2, 2, 1)
    opts = Options(family="khr")
    tuned = {"int8->int32": ("khr", big)}
    assert choose_family(H200, pair, opts, tuned, side, side) == ("khr", big)  # fallback
    tuned["int8->int32@medium"] = ("khr", mid)
    assert choose_family(H200, pair, opts, tuned, side, side) == ("khr", mid)
    assert choose_family(H200, pair, opts, tuned, side, side + 1) == ("khr", big)
    # A tuned nv2 choice applies only where the device can run nv2.
    nv2 = {"int8->int32": ("nv2", big)}
    assert choose_family(H200, pair, Options(), nv2) == ("nv2", big)
    assert choose_family(LAVAPIPE, pair, Options(), nv2) == ("khr", None)


def test_few_rows_get_their_own_tile_and_no_repack() -> None:
    pair = resolve(H200, I8, I8)
    few = choose(H200, row_major(16, 4096, 4096, pair))
    many = choose(H200, row_major(4096, 4096, 4096, pair))
    assert few.traits.tile != many.traits.tile
    assert not few.packs  # with few rows B is read about once: no repack
    (pack,) = many.packs  # a row-major 8-bit B is repacked K-contiguous first
    assert pack.operand == 1 and pack.packed.layout is Layout.COLUMN_MAJOR
    assert many.traits.b_layout is Layout.COLUMN_MAJOR
    assert many.params.ldb == pack.packed.ld


def test_variants_follow_sizes_and_strides() -> None:
    pair = resolve(LAVAPIPE, F16, F16)
    exact = khr(choose(LAVAPIPE, row_major(64, 64, 64, pair)))
    aligned = khr(choose(LAVAPIPE, row_major(60, 64, 64, pair)))
    general = khr(choose(LAVAPIPE, row_major(61, 63, 63, pair)))
    assert (exact.exact, exact.aligned) == (True, True)
    assert (aligned.exact, aligned.aligned) == (False, True)
    assert (general.exact, general.aligned) == (False, False)


def test_no_room_for_the_exact_margin_falls_back() -> None:
    pair = resolve(H200, F16, F16)
    small = replace(H200, limits=replace(H200.limits, max_storage_buffer_range=4096 * 4096 * 2))
    choice = choose(small, row_major(4096, 4096, 4096, pair))
    assert not khr(choice).exact and choice.margins == (0, 0)


def test_forced_family_and_missing_features() -> None:
    pair = resolve(H200, F16, F16)
    nv2 = choose(H200, row_major(1024, 1024, 1024, pair), Options(family="nv2"))
    assert isinstance(nv2.traits, Nv2Traits) and nv2.traits.family == "nv2"
    assert nv2.traits.out_type == CT.FLOAT16
    assert nv2.why == "forced"
    with pytest.raises(MissingFeatureError, match="nv2 kernel family needs"):
        choose(LAVAPIPE, row_major(64, 64, 64, resolve(LAVAPIPE, F16, F16)),
               Options(family="nv2"))


def test_options_from_the_environment_name_the_variable() -> None:
    assert Options.from_env({}) == Options()
    assert Options.from_env({"COOPMAT_FAMILY": "nv2", "COOPMAT_SPECIALIZE": "0",
                             "COOPMAT_NO_TUNING": "1"}) == Options("nv2", "never", False)
    with pytest.raises(ValueError, match="COOPMAT_FAMILY='cuda'"):
        Options.from_env({"COOPMAT_FAMILY": "cuda"})
    with pytest.raises(ValueError, match="COOPMAT_SPECIALIZE='yes'"):
        Options.from_env({"COOPMAT_SPECIALIZE": "yes"})
    with pytest.raises(ValueError, match="unknown kernel family 'xyz'"):
        Options().with_family("xyz")
