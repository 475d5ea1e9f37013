"""Kernel choice for a quantized B on recorded devices (no GPU needed): always khr, whole
blocks per K step, the same variants as a float16 B, and the margins the exact variant
needs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import DATA

from coopmat.codegen import KhrTraits, Layout
from coopmat.codegen.quant import overread_bytes
from coopmat.device.record import load_records
from coopmat.policy import Options, choose
from coopmat.policy.kernel import OperandLayout, Problem
from coopmat.policy.types import resolve
from coopmat.quant_formats import FORMATS


def _problem(info, M: int, N: int, K: int, fmt: str | None) -> Problem:
    pair = resolve(info, "float16", "float16")
    return Problem(pair, M, N, K, OperandLayout(Layout.ROW_MAJOR, K),
                   OperandLayout(Layout.COLUMN_MAJOR, K), b_quant=fmt)


@pytest.fixture(scope="module")
def h200():
    return load_records(DATA / "nvidia-h200-khr-coopmat.json")[0]


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("M", [512, 16])
def test_h200_picks_khr_with_whole_blocks(h200, fmt, M):
    choice = choose(h200, _problem(h200, M, 4096, 4096, fmt))
    t = choice.traits
    assert isinstance(t, KhrTraits) and t.b_quant == fmt and t.b_layout == Layout.COLUMN_MAJOR
    assert t.tile.tile_k % 32 == 0
    plain = choose(h200, _problem(h200, M, 4096, 4096, None)).traits
    if plain.family == "khr":  # same tile and variant as a float16 B where it is khr
        assert replace(t, b_quant=None) == plain
    if t.exact:
        steps = 2 if t.tile.buffering == 3 else 1
        assert choice.margins[1] == overread_bytes(FORMATS[fmt], t.tile.tile_k, steps)


def test_nv2_refused(h200):
    with pytest.raises(ValueError, match="khr"):
        choose(h200, _problem(h200, 512, 4096, 4096, "q8_0"), Options(family="nv2"))


def test_describe_names_the_format(h200):
    t = choose(h200, _problem(h200, 512, 4096, 4096, "q4_0")).traits
    assert t.describe().endswith("-bq4_0u8-outf16")
    assert "bq" not in replace(t, b_quant=None).describe()
