"""Kernel choice for a quantized B on recorded devices (no GPU needed): khr by default,
whole blocks per K step, the same variants as a float16 B, and the margins the exact
variant needs; the gemv family where forced (or, once GEMV_QUANT_DEFAULT is on, for
decode shapes on a GPU)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import DATA

from coopmat.codegen import GemvTraits, KhrTraits, Layout
from coopmat.codegen.quant import QUANT_PAD_BYTES, overread_bytes
from coopmat.codegen.traits import Activation, EpilogueOps
from coopmat.common.quant_formats import FORMATS
from coopmat.device.record import load_records
from coopmat.policy import SMALL_M, Options, choose
from coopmat.policy import kernel as policy_kernel
from coopmat.policy.gemv_tiles import GEMV_MAX_M, default_gemv_tile
from coopmat.policy.kernel import OperandLayout, Problem, split_k_for
from coopmat.policy.types import resolve


def _problem(info, M: int, N: int, K: int, fmt: str | None) -> Problem:
    pair = resolve(info, "float16", "float16")
    return Problem(pair, M, N, K, OperandLayout(Layout.ROW_MAJOR, K),
                   OperandLayout(Layout.COLUMN_MAJOR, K), b_quant=fmt)


@pytest.fixture(scope="module")
def h200():
    return load_records(DATA / "nvidia-h200-khr-coopmat.json")[0]


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("M", [512, 64, 32, 16])
def test_h200_picks_khr_with_whole_blocks(h200, fmt, M):
    choice = choose(h200, _problem(h200, M, 4096, 4096, fmt))
    t = choice.traits
    assert isinstance(t, KhrTraits) and t.b_quant == fmt and t.b_layout == Layout.COLUMN_MAJOR
    assert t.tile.tile_k % 32 == 0
    plain = choose(h200, _problem(h200, M, 4096, 4096, None), Options(split_k=1)).traits
    assert t.tile != plain.tile  # its own tiles (measured: tiles.quant_*_tile)
    # The dequantization's magic in a register on few-row tiles, a literal on taller ones:
    # the policy's choice, which the split-K kernel keeps.
    assert t.b_quant_held_magic == (t.tile.tile_m <= SMALL_M) == (M <= SMALL_M)
    if M > SMALL_M:  # and staging unit
        assert (t.tile.tile_m, t.tile.tile_n, t.tile.tile_k) == (128, 64, 64)
        assert t.b_quant_unit == policy_kernel.QUANT_GENERAL_UNIT[fmt]
        assert choice.split_k == 1
    else:  # 64 columns, four blocks deep, four subgroups; split by the float table
        assert (t.tile.tile_m, t.tile.tile_n, t.tile.tile_k) == (M, 64, 128)
        assert (t.tile.subgroups_m, t.tile.subgroups_n) == ((1, 4) if M == 16 else (2, 2))
        unsplit = choose(h200, _problem(h200, M, 4096, 4096, fmt), Options(split_k=1))
        assert choice.split_k == split_k_for(h200, _problem(h200, M, 4096, 4096, fmt),
                                             unsplit.traits) > 1
        assert choice.params.K == 4096 // choice.split_k and choice.params.ldb == 4096
        assert choice.params.batch_stride_b == 4096 // choice.split_k
        # 64 workgroups unsplit: 8 slices on the 16-row tile (measured), 4 on the others
        assert choice.split_k == (8 if M == 16 else 4)
        deep = choose(h200, _problem(h200, M, 4096, 14336, fmt))
        assert deep.split_k == choice.split_k and deep.params.K == 14336 // deep.split_k
        wide = choose(h200, _problem(h200, M, 14336, 4096, fmt))  # 224 workgroups
        assert wide.split_k == (2 if M == 16 else 1) and wide.traits.tile == t.tile
    if t.exact:
        steps = 2 if t.tile.buffering == 3 else 1
        assert choice.margins[1] == overread_bytes(FORMATS[fmt], t.tile.tile_k, steps)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_mid_size_split(h200, fmt):
    """policy.kernel.mid_split_k for a quantized B the fused kernel runs (more than SMALL_M
    rows, not dequantized first): its general tile's grid G splits to fill the GPU while
    G <= MID_SPLIT_QUANT_MAX_GROUPS and the slices stay MID_SPLIT_MIN_SLICE deep."""
    lavapipe = load_records(DATA / "lavapipe-mesa26-khr-coopmat.json")[0]

    def split(info, M: int, N: int, K: int) -> tuple[int, KhrTraits]:
        choice = choose(info, _problem(info, M, N, K, fmt))
        assert not [p for p in choice.packs if p.quant is not None]  # the fused kernel
        assert isinstance(choice.traits, KhrTraits) and choice.traits.b_quant == fmt
        return choice.split_k, choice.traits

    # 128 x 64 tiles: 64 workgroups split in 4, 128 in 2, with the slices' own units
    for M, N, K, S in ((128, 4096, 14336, 4), (256, 4096, 14336, 2), (256, 4096, 4096, 2),
                       (96, 4096, 7168, 4)):
        got, traits = split(h200, M, N, K)
        assert got == S and traits.split_k == S
        assert (traits.tile.tile_m, traits.tile.tile_n) == (128, 64)
        assert traits.b_quant_unit >= 8  # plan.SPLIT_MIN_QUANT_UNIT
    assert split(h200, 128, 14336, 4096)[0] == 1  # 224 workgroups: measured slower split
    assert split(h200, 128, 4096, 4096)[0] == 1  # 4 slices of 1024 are too short
    assert split(h200, 512, 4096, 4096)[0] == 1  # 256 workgroups fill the GPU
    assert split(h200, 512, 4096, 14336)[0] == 1
    assert split(lavapipe, 128, 4096, 14336)[0] == 1  # a CPU never splits
    assert choose(h200, _problem(h200, 128, 4096, 14336, fmt),
                  Options(split_k=1)).split_k == 1


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_dequantize_first_rule(h200, fmt, monkeypatch: pytest.MonkeyPatch):
    """policy.kernel.dequantizes_first: many rows against a quantized weight run a pass
    into a float16 B, then the float problem's own choice (tuned tile and all); the
    fused kernel elsewhere, where forced, and where Options.dequant says so."""
    lavapipe = load_records(DATA / "lavapipe-mesa26-khr-coopmat.json")[0]

    def first(info, M: int, N: int, K: int = 4096, options: Options | None = None) -> bool:
        choice = choose(info, _problem(info, M, N, K, fmt), options or Options())
        packs = [p for p in choice.packs if p.quant is not None]
        if not packs:
            assert getattr(choice.traits, "b_quant", None) == fmt
            return False
        (pack,) = packs
        assert choice.packs[0] is pack and pack.operand == 1 and pack.quant == fmt
        assert (pack.lines, pack.other, pack.packed_elems) == (K, N, N * K)
        assert pack.packed == OperandLayout(Layout.COLUMN_MAJOR, K)
        float_choice = choose(info, _problem(info, M, N, K, None), options or Options())
        assert choice.traits == float_choice.traits and choice.params == float_choice.params
        assert choice.margins == float_choice.margins  # B's is the float copy's
        return True

    assert first(h200, 1024, 4096) and first(h200, 2048, 14336)
    assert first(h200, 256, 14336)  # 3.7 M results
    assert not first(h200, 512, 4096)  # 2 M: the fused kernel measured faster
    assert not first(h200, 64, 65536)  # few rows: the few-row paths
    assert not first(h200, 1024, 4096, options=Options(family="khr"))
    assert not first(h200, 1024, 4096, options=Options(dequant="fused"))
    assert first(h200, 16, 4096, options=Options(dequant="first"))
    assert not first(lavapipe, 1024, 4096)  # a CPU: not measured there
    assert first(lavapipe, 1024, 4096, options=Options(dequant="first"))
    # a float copy larger than one binding may hold: fused
    big = h200.limits.max_storage_buffer_range // 2 // 4096 + 32
    assert not first(h200, 1024, big, options=Options(dequant="first"))
    monkeypatch.setenv("COOPMAT_DEQUANT", "sideways")
    with pytest.raises(ValueError, match="COOPMAT_DEQUANT"):
        Options.from_env()
    with pytest.raises(ValueError, match="dequant="):
        Options(dequant="later")


def test_nv2_refused(h200):
    with pytest.raises(ValueError, match="khr"):
        choose(h200, _problem(h200, 512, 4096, 4096, "q8_0"), Options(family="nv2"))


def test_describe_names_the_format(h200):
    t = choose(h200, _problem(h200, 512, 4096, 4096, "q4_0")).traits
    assert t.describe().endswith("-bq4_0u8-outf16")
    assert "bq" not in replace(t, b_quant=None).describe()


# -- the gemv family (gemv_quant.py) --------------------------------------------------------

@pytest.fixture(scope="module")
def lavapipe():
    return load_records(DATA / "lavapipe-mesa26-khr-coopmat.json")[0]


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_gemv_forced(h200, fmt):
    ops = EpilogueOps(bias=True, activation=Activation.GELU_TANH)
    for options in (Options(family="gemv"), Options.from_env({"COOPMAT_FAMILY": "gemv"})):
        choice = choose(h200, replace(_problem(h200, 3, 4096, 4096, fmt), ops=ops), options)
        t = choice.traits
        assert isinstance(t, GemvTraits) and t.b_quant == fmt and choice.why == "forced"
        assert t.rows == 3 and t.ops == ops and t.out_type is not None
        assert t.tile == default_gemv_tile(3, 32, fmt)
        assert choice.margins == (0, QUANT_PAD_BYTES)
    # Past GEMV_MAX_M rows, forced: further row blocks, as for a float B.
    assert choose(h200, _problem(h200, 40, 4096, 4096, fmt),
                  Options(family="gemv")).traits.tile.tile_m == GEMV_MAX_M
    # khr forced: the khr kernel.
    assert isinstance(choose(h200, _problem(h200, 3, 4096, 4096, fmt),
                             Options(family="khr")).traits, KhrTraits)


def test_gemv_quant_one_row_tile(h200):
    """One row of a quantized B takes the tile gemv_tiles.QUANT_ONE_ROW gives for its N:
    q8_0 two columns a subgroup and two blocks a step at any N; q4_0 four columns and two
    blocks on two subgroups sharing K against few columns, four columns and one block
    against many; more rows and an unknown N keep the default."""
    from coopmat.policy.gemv_tiles import QUANT_ONE_ROW

    def shape(fmt, M, N, K=4096):
        t = choose(h200, _problem(h200, M, N, K, fmt)).traits
        assert isinstance(t, GemvTraits)
        return t.cols, t.unroll, t.splits, t.k_splits, t.tile.tile_k

    assert set(QUANT_ONE_ROW) <= set(FORMATS)
    assert shape("q8_0", 1, 4096) == shape("q8_0", 1, 14336) == (2, 2, 4, 1, 2048)
    assert shape("q8_0", 1, 4096, 14336) == (2, 2, 4, 1, 2048)
    assert shape("q4_0", 1, 4096) == shape("q4_0", 1, 4096, 14336) == (4, 2, 4, 2, 4096)
    assert shape("q4_0", 1, 14336) == shape("q4_0", 1, 8192) == (4, 1, 4, 1, 1024)
    assert shape("q4_0", 2, 4096) == (4, 1, 4, 1, 1024)
    assert shape("q8_0", 2, 4096, 14336) == (2, 1, 4, 1, 1024)
    assert shape("q8_0", 2, 4096) == shape("q8_0", 2, 14336) == (4, 1, 4, 1, 1024)
    assert default_gemv_tile(1, 32, "q4_0") == default_gemv_tile(1, 32, "q4_0", 14336)


def test_other_families_refused(h200):
    for family in ("nv2", "rows"):
        with pytest.raises(ValueError, match=f"khr or gemv kernel families only, not "
                                             f"'{family}'"):
            choose(h200, _problem(h200, 1, 4096, 4096, "q4_0"), Options(family=family))


def test_gemv_preconditions(h200):
    """A quantized B that gemv cannot read is an error when forced (the khr kernel states
    the same preconditions)."""
    p = _problem(h200, 1, 64, 4096, "q8_0")
    p = replace(p, a=OperandLayout(Layout.COLUMN_MAJOR, 1))
    with pytest.raises(ValueError, match="gemv kernel family cannot run.*A is not row-major"):
        choose(h200, p, Options(family="gemv"))
    p = replace(_problem(h200, 1, 64, 4096, "q8_0"), a=OperandLayout(Layout.ROW_MAJOR, 4100))
    with pytest.raises(ValueError, match="gemv kernel family cannot run.*A's leading dim"):
        choose(h200, p, Options(family="gemv"))


def test_gemv_quant_default_rule(h200, lavapipe, monkeypatch: pytest.MonkeyPatch):
    def rule(info, p):
        params = choose(info, p).params
        return policy_kernel.gemv_quant_by_default(info, p, p.a.layout, p.b.layout, params)

    # Every format has its row limit, within what one gemv row block holds.
    assert set(policy_kernel.GEMV_QUANT_MAX_M) == set(FORMATS)
    for fmt in FORMATS:
        most = policy_kernel.GEMV_QUANT_MAX_M[fmt]
        assert 1 <= most <= GEMV_MAX_M
        assert rule(h200, _problem(h200, 1, 4096, 4096, fmt))
        assert rule(h200, _problem(h200, most, 4096, 14336, fmt))
        assert not rule(h200, _problem(h200, most + 1, 4096, 14336, fmt))
        wide = policy_kernel.gemv_max_m(fmt, 14336)
        assert 1 <= wide <= most and rule(h200, _problem(h200, wide, 14336, 4096, fmt))
        assert not rule(h200, _problem(h200, wide + 1, 14336, 4096, fmt))
        assert not rule(lavapipe, _problem(lavapipe, 1, 4096, 4096, fmt))  # a CPU driver
    # The measured crossovers (lab/notebook/quantized.md, lab/notebook/kernels.md "Clamped
    # rows"): khr's few-row tile from 5 rows, from 4 against 8192 columns or more.
    assert policy_kernel.GEMV_QUANT_MAX_M == {"q8_0": 4, "q4_0": 4}
    for fmt in FORMATS:
        assert rule(h200, _problem(h200, 4, 4096, 4096, fmt))
        assert rule(h200, _problem(h200, 3, 14336, 4096, fmt))
        assert not rule(h200, _problem(h200, 4, 14336, 4096, fmt))
        assert rule(h200, _problem(h200, 4, 8191, 4096, fmt))
        assert not rule(h200, _problem(h200, 4, 8192, 4096, fmt))
        assert not rule(h200, _problem(h200, 5, 4096, 4096, fmt))
    assert not rule(h200, _problem(h200, 1, 4096, 4096, None))  # a float B: gemv_by_default
    # On by default: gemv for decode shapes on a GPU (up to GEMV_QUANT_MAX_M rows) and khr
    # otherwise; off, khr.
    assert policy_kernel.GEMV_QUANT_DEFAULT
    monkeypatch.setattr(policy_kernel, "GEMV_QUANT_DEFAULT", False)
    assert isinstance(choose(h200, _problem(h200, 1, 4096, 4096, "q8_0")).traits, KhrTraits)
    monkeypatch.setattr(policy_kernel, "GEMV_QUANT_DEFAULT", True)
    assert isinstance(choose(h200, _problem(h200, 4, 4096, 4096, "q8_0")).traits, GemvTraits)
    assert isinstance(choose(h200, _problem(h200, 5, 4096, 4096, "q8_0")).traits, KhrTraits)
    assert isinstance(choose(h200, _problem(h200, 8, 4096, 4096, "q4_0")).traits, KhrTraits)
    c = choose(h200, _problem(h200, 1, 4096, 4096, "q8_0"))
    assert isinstance(c.traits, GemvTraits) and c.why == "default"
    assert isinstance(choose(h200, _problem(h200, 16, 4096, 4096, "q8_0")).traits, KhrTraits)
    assert isinstance(choose(lavapipe, _problem(lavapipe, 1, 4096, 4096, "q8_0")).traits,
                      KhrTraits)
    assert isinstance(choose(h200, _problem(h200, 1, 4096, 4096, "q8_0"),
                             Options(family="khr")).traits, KhrTraits)
    # A float B is not the quantized rule's: GEMV_DEFAULT decides it.
    monkeypatch.setattr(policy_kernel, "GEMV_DEFAULT", False)
    assert choose(h200, _problem(h200, 1, 4096, 4096, None)).traits.family == "khr"
