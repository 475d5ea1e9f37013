"""The gemv kernel family (few rows against a column-major B, no cooperative matrices).

Codegen and policy tests run on recorded devices without a GPU (spirv-val where it is
installed). Live tests force the family (family="gemv", the policy's default keeps khr
until gemv is measured on a GPU) on the device scripts/test selects (lavapipe in CI:
subgroup size 8, so the default tile reads 8 x 8 x 2 = 128 elements of K per step) and
compare with numpy in float64: small-integer data exactly, general data within the
K-term dot-product bound of test_matmul (test_epilogue's oracle for the fused ops).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from epilogue_oracle import check, oracle
from matmul_oracle import BFLOAT16, float_tolerance, reference, require, small_ints
from sampling import pairwise

import coopmat
import coopmat.api.matmul
from coopmat.api.quantized import PAD_BYTES
from coopmat.codegen import GemmParams, GemvTraits, Layout, abi, build_gemm
from coopmat.codegen.quant import QUANT_PAD_BYTES
from coopmat.codegen.tools import find_tool, validate
from coopmat.codegen.traits import Activation, EpilogueOps, gemv_tile
from coopmat.codegen.variants import khr_subgroup_size
from coopmat.common.enums import ComponentType as CT
from coopmat.device.record import load_records
from coopmat.policy import OperandLayout, Options, Problem, TypePair, choose, gemv_tiles
from coopmat.policy import kernel as policy_kernel
from coopmat.policy.gemv_tiles import GEMV_MAX_M, default_gemv_tile, gemv_sweep, gemv_traits
from coopmat.policy.variants import gemv_variants

DATA = Path(__file__).parents[1] / "data"
(H200,) = load_records(DATA / "nvidia-h200-khr-coopmat.json")
(LAVAPIPE,) = load_records(DATA / "lavapipe-mesa26-khr-coopmat.json")
RNG = np.random.default_rng(1616)
F16 = TypePair(CT.FLOAT16, CT.FLOAT32, CT.FLOAT16)
F16_F32 = TypePair(CT.FLOAT16, CT.FLOAT32)

needs_spirv_val = pytest.mark.skipif(find_tool("spirv-val") is None,
                                     reason="spirv-val not found")


# -- codegen ----------------------------------------------------------------------------

def test_traits_name_and_tile_mapping() -> None:
    t = gemv_traits(CT.FLOAT16, CT.FLOAT32, H200.limits, False, 5, out_type=CT.FLOAT16)
    assert (t.rows, t.cols, t.splits, t.unroll) == (5, 2, 4, 1)  # U = 4 up to 4 rows
    assert gemv_traits(CT.FLOAT16, CT.FLOAT32, H200.limits, False, 4).unroll == 4
    t = dataclasses.replace(t, tile=gemv_tile(rows=5, cols=2, splits=4, unroll=2,
                                              subgroup_size=32))
    assert t.tile.tile_k == 8 * 32 * 2 and t.invocations == 128
    assert t.describe() == \
        "gemv-f16f16-f32-5x2x2-sg32-rc-noc-general-t5x8x512s4x1b2-unchecked-outf16"
    k = build_gemm(t)
    assert k.shared_memory_bytes == 0 and k.workgroups(5, 4100, 3) == (513, 1, 3)
    assert "shaderFloat16" in k.features and "cooperativeMatrix" not in k.features
    # Rows past GEMV_MAX_M are further row blocks.
    assert gemv_traits(CT.FLOAT16, CT.FLOAT32, H200.limits, False, 20).tile.tile_m == 8
    with pytest.raises(ValueError, match="tile_k must be"):
        dataclasses.replace(t, tile=dataclasses.replace(t.tile, tile_k=64)).check_tile()
    with pytest.raises(ValueError, match="column-major B"):
        dataclasses.replace(t, b_layout=Layout.ROW_MAJOR).check_tile()


@needs_spirv_val
@pytest.mark.parametrize("info", [H200, LAVAPIPE], ids=["h200", "lavapipe"])
def test_spirv_val_sweep_tiles(info) -> None:
    sg = khr_subgroup_size(info.limits)
    ops = EpilogueOps(bias=True, activation=Activation.GELU_TANH, residual=True)
    for M in (1, GEMV_MAX_M):
        for tile in gemv_sweep(M, sg, info.limits.max_compute_work_group_invocations):
            t = gemv_traits(CT.FLOAT16, CT.FLOAT32, info.limits, True, M, tile=tile,
                            out_type=CT.FLOAT16, ops=ops)
            result = validate(build_gemm(t).spirv)
            assert result.ok, (t.describe(), result.message)


@needs_spirv_val
def test_spirv_val_variants_and_types() -> None:
    names = [t.describe() for t in gemv_variants(H200)]
    assert len(names) == len(set(names)) and any("bf16" in n for n in names)
    extra = [gemv_traits(CT.BFLOAT16, CT.FLOAT32, H200.limits, False, 3,
                         ops=EpilogueOps(activation=Activation.SILU)),
             gemv_traits(CT.FLOAT16, CT.FLOAT16, H200.limits, True, 8)]
    for t in [*gemv_variants(H200), *extra]:
        result = validate(build_gemm(t).spirv)
        assert result.ok, (t.describe(), result.message)


def test_kernel_refuses_broken_parameters() -> None:
    t = gemv_traits(CT.FLOAT16, CT.FLOAT32, H200.limits, False, 1)
    k = build_gemm(t)
    ok = GemmParams(M=1, N=100, K=64, lda=64, ldb=64, ldc=100, ldd=100)
    k.push_constants(ok)
    for bad, why in ((dataclasses.replace(ok, K=60, lda=60, ldb=60), "K=60"),
                     (dataclasses.replace(ok, ldb=68), "leading dimension 68"),
                     (dataclasses.replace(ok, batch_stride_a=4), "batch stride 4")):
        with pytest.raises(ValueError, match=f"gemv kernel cannot run.*{why}"):
            k.push_constants(bad)


# -- codegen: a quantized B (gemv_quant.py) ----------------------------------------------

def test_quantized_traits_name_and_tile() -> None:
    t = gemv_traits(CT.FLOAT16, CT.FLOAT32, H200.limits, False, 3, out_type=CT.FLOAT16,
                    b_quant="q8_0")
    # A whole block (32 elements of K) per lane and load; the default takes one at a time,
    # four columns a subgroup from 3 rows of q8_0 (gemv_tiles.QUANT_COLS_FROM_ROWS).
    assert (t.rows, t.cols, t.splits, t.unroll) == (3, 4, 4, 1)
    assert t.tile == gemv_tile(rows=3, cols=4, splits=4, unroll=1, subgroup_size=32,
                               b_quant="q8_0")
    assert t.tile.tile_k == 32 * 32 * 1
    assert t.describe() == \
        "gemv-f16f16-f32-3x4x1-sg32-rc-noc-general-t3x16x1024s4x1b1-bq8_0-unchecked-outf16"
    # Two columns for fewer rows of q8_0 (K unknown here) and for a float B; four for any
    # rows of q4_0; for 2 rows of q8_0 where K is at most 4096.
    assert gemv_traits(CT.FLOAT16, CT.FLOAT32, H200.limits, False, 2, b_quant="q8_0",
                       K=4096).cols == 4
    assert gemv_traits(CT.FLOAT16, CT.FLOAT32, H200.limits, False, 2, b_quant="q8_0",
                       K=14336).cols == 2
    cols = {(fmt, rows): gemv_traits(CT.FLOAT16, CT.FLOAT32, H200.limits, False, rows,
                                     b_quant=fmt).cols
            for fmt in ("q8_0", "q4_0", None) for rows in (1, 2, 3, 4)}
    assert cols == {**{("q8_0", r): 2 if r < 3 else 4 for r in (1, 2, 3, 4)},
                    **{("q4_0", r): 4 for r in (1, 2, 3, 4)},
                    **{(None, r): 2 for r in (1, 2, 3, 4)}}
    # No driver bounds checks (every load is of a valid column, row and K unit): none
    # measured faster with them on the H200 (gemv_tiles.CHECKED_QUANT_ROWS is empty); a
    # format listed there would keep them up to its rows.
    def checked_cases() -> set[tuple[str | None, int]]:
        return {(fmt, rows) for fmt in ("q8_0", "q4_0", None) for rows in (1, 2, 8)
                if gemv_traits(CT.FLOAT16, CT.FLOAT32, H200.limits, False, rows,
                               b_quant=fmt, N=4096).storage_checks}

    assert checked_cases() == set()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gemv_tiles, "CHECKED_QUANT_ROWS", {"q8_0": 2})
        assert checked_cases() == {("q8_0", 1), ("q8_0", 2)}
    assert dataclasses.replace(t, b_quant=None, tile=default_gemv_tile(3, 32)).describe() == \
        "gemv-f16f16-f32-3x2x4-sg32-rc-noc-general-t3x8x1024s4x1b4-unchecked-outf16"
    k = build_gemm(t)
    assert k.workgroups(3, 4100, 1) == (257, 1, 1) and abi.bindings(t) == (0, 1, 2)
    # bfloat16 A needs no float16 arithmetic of its own, but the blocks' scales do.
    bf = gemv_traits(CT.BFLOAT16, CT.FLOAT32, H200.limits, False, 1, b_quant="q4_0")
    assert "shaderFloat16" in build_gemm(bf).features
    assert "shaderFloat16" not in build_gemm(dataclasses.replace(
        bf, b_quant=None, tile=default_gemv_tile(1, 32))).features
    with pytest.raises(ValueError, match="tile_k must be 32 x subgroup size"):
        dataclasses.replace(t, tile=default_gemv_tile(3, 32)).check_tile()
    with pytest.raises(ValueError, match="unknown quantized format"):
        dataclasses.replace(t, b_quant="q5_1").check_tile()
    assert [x.tile_k for x in gemv_sweep(1, 32, b_quant="q4_0")[:2]] == [1024, 1024]
    assert all(x.tile_k == 32 * 32 * x.buffering for x in gemv_sweep(8, 32, b_quant="q8_0"))


@needs_spirv_val
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("info", [H200, LAVAPIPE], ids=["h200", "lavapipe"])
def test_spirv_val_quantized_sweep_tiles(info, fmt) -> None:
    sg = khr_subgroup_size(info.limits)
    ops = EpilogueOps(bias=True, activation=Activation.GELU_TANH, residual=True)
    for M in (1, GEMV_MAX_M):
        for tile in gemv_sweep(M, sg, info.limits.max_compute_work_group_invocations,
                               b_quant=fmt):
            t = gemv_traits(CT.FLOAT16, CT.FLOAT32, info.limits, False, M, tile=tile,
                            out_type=CT.FLOAT16, ops=ops, b_quant=fmt)
            result = validate(build_gemm(t).spirv)
            assert result.ok, (t.describe(), result.message)
    for op, res in ((CT.BFLOAT16, CT.FLOAT32), (CT.FLOAT16, CT.FLOAT16)):
        t = gemv_traits(op, res, info.limits, False, 5, b_quant=fmt,
                        ops=EpilogueOps(activation=Activation.SILU))
        result = validate(build_gemm(t).spirv)
        assert result.ok, (t.describe(), result.message)


def test_quantized_variants_are_listed() -> None:
    """gemv_variants (and so --validate-all) holds the quantized kernels too: per format,
    without C, one row and GEMV_MAX_M rows, every result type of the float ones."""
    names = [t.describe() for t in gemv_variants(H200)]
    assert len(names) == len(set(names))
    for fmt in ("q8_0", "q4_0"):
        quant = [n for n in names if n.endswith(f"-b{fmt}") or f"-b{fmt}-" in n]
        # float16 (float16 and float32 results) and bfloat16 configs, M 1 and 8.
        assert len(quant) == 6 and not any("-c-general" in n for n in quant), quant


def test_quantized_kernel_refuses_broken_parameters() -> None:
    t = gemv_traits(CT.FLOAT16, CT.FLOAT32, H200.limits, False, 1, b_quant="q4_0")
    k = build_gemm(t)
    ok = GemmParams(M=1, N=100, K=64, lda=64, ldb=64, ldc=100, ldd=100)
    k.push_constants(ok)
    for bad in (dataclasses.replace(ok, K=40, lda=40, ldb=40),
                dataclasses.replace(ok, ldb=72), dataclasses.replace(ok, batch_stride_b=6400)):
        with pytest.raises(ValueError, match="gemv kernel cannot run.*whole 32-weight blocks"):
            k.push_constants(bad)
    # The kernel reads at most 2 bytes past the last block: within the pad a quantized
    # weight's buffer keeps (and the margin the policy asks for).
    assert abi.overread_bytes_b(t, 64, 2) == QUANT_PAD_BYTES <= PAD_BYTES


# -- policy -----------------------------------------------------------------------------

def _problem(M: int, N: int = 4096, K: int = 4096, pair: TypePair = F16,
             b_layout: Layout = Layout.COLUMN_MAJOR, **kw) -> Problem:
    ldb = K if b_layout == Layout.COLUMN_MAJOR else N
    return Problem(pair, M, N, K, OperandLayout(Layout.ROW_MAJOR, K),
                   OperandLayout(b_layout, ldb), **kw)


def test_forced_family() -> None:
    ops = EpilogueOps(bias=True, activation=Activation.RELU)
    c = choose(H200, _problem(4, ops=ops), Options(family="gemv"))
    assert isinstance(c.traits, GemvTraits) and c.why == "forced"
    assert c.traits.ops == ops and c.traits.out_type == CT.FLOAT16 and c.traits.rows == 4
    assert c.margins == (0, 0)
    # M past GEMV_MAX_M still runs, in row blocks (forced only).
    assert choose(H200, _problem(20), Options(family="gemv")).traits.tile.tile_m == 8
    with pytest.raises(ValueError, match="gemv kernel family cannot run.*not column-major"):
        choose(H200, _problem(4, b_layout=Layout.ROW_MAJOR), Options(family="gemv"))
    with pytest.raises(ValueError, match="gemv kernel family cannot run.*K=4092 is not a "
                                         "multiple of 8"):
        choose(H200, _problem(4, K=4092), Options(family="gemv"))
    with pytest.raises(ValueError, match="gemv kernel family cannot run.*int8"):
        choose(H200, _problem(4, pair=TypePair(CT.SINT8, CT.SINT32)), Options(family="gemv"))
    assert Options.from_env({"COOPMAT_FAMILY": "gemv"}).family == "gemv"


def test_default_rule_picks_gemv_for_few_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    def rule(info, p):
        return policy_kernel.gemv_by_default(info, p, p.a.layout, p.b.layout,
                                             choose(info, p).params)

    most = policy_kernel.GEMV_DEFAULT_MAX_M
    assert rule(H200, _problem(1)) and rule(H200, _problem(most))
    assert rule(H200, _problem(2, pair=TypePair(CT.BFLOAT16, CT.FLOAT32)))
    assert not rule(H200, _problem(most + 1))
    assert not rule(H200, _problem(1, b_layout=Layout.ROW_MAJOR))
    assert not rule(H200, _problem(1, K=4100))
    assert not rule(H200, _problem(1, pair=TypePair(CT.SINT8, CT.SINT32)))
    assert not rule(LAVAPIPE, _problem(1))  # a CPU driver
    no_arith = dataclasses.replace(H200, limits=dataclasses.replace(
        H200.limits, subgroup_arithmetic=False))
    assert not rule(no_arith, _problem(1))
    # On by default: gemv for decode shapes up to GEMV_DEFAULT_MAX_M rows, khr otherwise;
    # off, khr.
    assert policy_kernel.GEMV_DEFAULT
    assert choose(H200, _problem(1)).traits.family == "gemv"
    most = policy_kernel.GEMV_DEFAULT_MAX_M
    assert choose(H200, _problem(most)).traits.family == "gemv"
    assert choose(H200, _problem(most + 1)).traits.family == "khr"
    assert choose(H200, _problem(16)).traits.family == "khr"
    # Against 8192 columns or more, gemv for one row only (lab/notebook/kernels.md, "Clamped rows").
    assert policy_kernel.gemv_max_m(None, 14336) == 1
    assert choose(H200, _problem(1, N=14336)).traits.family == "gemv"
    assert choose(H200, _problem(2, N=14336)).traits.family == "khr"
    assert choose(H200, _problem(4, N=8191)).traits.family == "gemv"
    monkeypatch.setattr(policy_kernel, "GEMV_DEFAULT", False)
    assert choose(H200, _problem(1)).traits.family == "khr"
    monkeypatch.setattr(policy_kernel, "GEMV_DEFAULT", True)
    assert choose(H200, _problem(1, b_layout=Layout.ROW_MAJOR)).traits.family == "khr"
    assert choose(H200, _problem(1), Options(family="khr")).traits.family == "khr"


def test_prefetch_for_deep_float_weights() -> None:
    """The policy's gemv kernel loads a step ahead from PREFETCH_MIN_STEPS full steps of a
    float B (1 x 14336 @ (4096 x 14336)^T on the H200), not at K = 4096 nor for a
    quantized B, and the name says so."""
    from coopmat.policy.gemv_tiles import PREFETCH_MIN_STEPS, PREFETCH_TILES, prefetches

    deep = choose(H200, _problem(1, K=14336)).traits
    assert isinstance(deep, GemvTraits) and deep.prefetch
    assert deep.describe().endswith("-prefetch-outf16")
    assert 14336 >= PREFETCH_MIN_STEPS * deep.tile.tile_k
    shallow = choose(H200, _problem(2, K=4096)).traits
    assert isinstance(shallow, GemvTraits) and not shallow.prefetch
    assert "prefetch" not in shallow.describe()
    assert not prefetches(14336, deep.tile, "q4_0")
    at = PREFETCH_MIN_STEPS * deep.tile.tile_k
    assert prefetches(at, deep.tile) and not prefetches(at - 8, deep.tile)
    # Four rows of a deep weight take their own tile (gemv_tiles.PREFETCH_TILES), still
    # prefetched; of a shallow one the default.
    four = choose(H200, _problem(4, K=14336)).traits
    assert isinstance(four, GemvTraits) and four.prefetch
    assert (four.cols, four.splits, four.unroll) == PREFETCH_TILES[4] == (2, 8, 2)
    shallow4 = choose(H200, _problem(4, K=4096)).traits
    assert isinstance(shallow4, GemvTraits) and not shallow4.prefetch
    assert shallow4.tile == default_gemv_tile(4, 32)
    assert deep.tile == default_gemv_tile(1, 32)


def test_tuned_choice() -> None:
    tile = gemv_tile(rows=8, cols=4, splits=2, unroll=4, subgroup_size=32)
    tuned = {"float16->float32@small-m": ("gemv", tile)}
    c = choose(H200, _problem(3), tuned=tuned)
    assert c.why == "tuned" and c.traits.tile == dataclasses.replace(tile, tile_m=3)
    # Where the problem does not fit gemv, the tuned choice falls back to khr.
    assert choose(H200, _problem(3, b_layout=Layout.ROW_MAJOR), tuned=tuned).traits.family \
        == "khr"
    # A tile of another subgroup size is replaced by the default.
    odd = {"float16->float32@small-m": ("gemv", dataclasses.replace(tile, tile_k=64))}
    assert choose(H200, _problem(3), tuned=odd).traits.tile == default_gemv_tile(3, 32)


# -- live -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pairs(live_device_info):
    return coopmat.supported_dtypes()


def gemv_matmul(a, b, **kw):
    d = coopmat.matmul(a, b, family="gemv", **kw)
    t = coopmat.api.matmul.last_kernel_traits()
    assert isinstance(t, GemvTraits), t
    return d, t


def tail_k(info) -> int:
    """Two whole steps of the default tile and a remainder of 3 units."""
    sg = khr_subgroup_size(info.limits)
    return 2 * default_gemv_tile(1, sg).tile_k + 24


@pytest.mark.parametrize("out_dtype,result", [(None, np.float16), (np.float32, np.float32)],
                         ids=["f16", "f32"])
@pytest.mark.parametrize("M", [1, 2, 5, 8])
def test_exact(pairs, live_device_info, M, out_dtype, result):
    require(pairs, "float16", result)
    N, K = 37, tail_k(live_device_info)  # N: not whole workgroups of columns
    a = small_ints((M, K), np.float16)
    w = small_ints((N, K), np.float16)
    d, t = gemv_matmul(a, w.T, out_dtype=out_dtype)
    assert t.rows == M and N % t.tile.tile_n
    assert d.dtype == np.dtype(result) and d.shape == (M, N)
    np.testing.assert_array_equal(d, reference(a, w.T, result).astype(result))


@pytest.mark.parametrize("K", [8, 24, 64])
def test_short_k(pairs, K):
    """K shorter than one step: only the remainder loop runs."""
    require(pairs, "float16", np.float32)
    a, w = small_ints((3, K), np.float16), small_ints((19, K), np.float16)
    d, _ = gemv_matmul(a, w.T, out_dtype=np.float32)
    np.testing.assert_array_equal(d, reference(a, w.T, np.float32))


@pytest.mark.parametrize("out_dtype", [None, np.float32], ids=["f16", "f32"])
@pytest.mark.parametrize("M", [1, 5])
def test_alpha_beta_c(pairs, live_device_info, M, out_dtype):
    result = np.float16 if out_dtype is None else np.float32
    require(pairs, "float16", result)
    N, K = 45, tail_k(live_device_info)
    a = RNG.standard_normal((M, K)).astype(np.float16)
    w = RNG.standard_normal((N, K)).astype(np.float16)
    c = RNG.standard_normal((M, N)).astype(result)
    alpha, beta = 0.71875, -1.375
    d, t = gemv_matmul(a, w.T, c=c, alpha=alpha, beta=beta, out_dtype=out_dtype)
    assert t.has_c
    ref = alpha * reference(a, w.T, np.float64) + beta * c.astype(np.float64)
    tol = abs(alpha) * float_tolerance(a, w.T, np.float32, result) + \
        2.0 ** -11 * np.abs(ref) + 1e-30
    err = np.abs(d.astype(np.float64) - ref)
    assert np.all(err <= tol), np.max(err / tol)


def test_batch_and_broadcast_weight(pairs):
    require(pairs, "float16", np.float16)
    a = small_ints((3, 2, 160), np.float16)
    w = small_ints((3, 21, 160), np.float16)  # one weight per batch entry
    d, _ = gemv_matmul(a, w.transpose(0, 2, 1))
    np.testing.assert_array_equal(
        d, reference(a, w.transpose(0, 2, 1), np.float16).astype(np.float16))
    w1 = small_ints((21, 160), np.float16)  # one weight for every batch entry
    c = small_ints((3, 2, 21), np.float16)
    d, t = gemv_matmul(a, w1.T, c=c, beta=1.0)
    assert t.has_c
    np.testing.assert_array_equal(
        d, (reference(a, w1.T, np.float64) + c).astype(np.float16))


def test_more_rows_than_one_block(pairs):
    """Forced past GEMV_MAX_M rows: further row blocks (WorkgroupId.y) cover the rest."""
    require(pairs, "float16", np.float16)
    a, w = small_ints((19, 96), np.float16), small_ints((30, 96), np.float16)
    d, t = gemv_matmul(a, w.T)
    assert t.tile.tile_m == GEMV_MAX_M
    np.testing.assert_array_equal(d, reference(a, w.T, np.float16).astype(np.float16))


# Every activation with and without bias and residual, and both with each other
# (tests/support/sampling.py); the unfused case is test_exact's.
@pytest.mark.parametrize("act,bias,residual", pairwise(
    [None, "relu", "gelu_tanh", "silu"], [True, False], [True, False],
    allowed=lambda c: c != (None, False, False)))
def test_fused_epilogue(pairs, live_device_info, act, bias, residual):
    require(pairs, "float16", np.float16)
    M, N, K = 3, 29, tail_k(live_device_info)
    a, w = RNG.standard_normal((M, K)).astype(np.float16), \
        (RNG.standard_normal((N, K)) / 8).astype(np.float16)
    bv = RNG.standard_normal(N).astype(np.float16) if bias else None
    rv = RNG.standard_normal((M, N)).astype(np.float16) if residual else None
    d, t = gemv_matmul(a, w.T, bias=bv, activation=act, residual=rv)
    assert t.ops is not None
    ref, tol, _ = oracle(a, w.T, bv, act, rv)
    check(d, ref, tol, np.float16)


def test_float32_result_with_c_and_ops(pairs):
    require(pairs, "float16", np.float32)
    M, N, K = 6, 40, 136
    a, w = RNG.standard_normal((M, K)).astype(np.float16), \
        RNG.standard_normal((N, K)).astype(np.float16)
    c = RNG.standard_normal((M, N)).astype(np.float32)
    bv = RNG.standard_normal(N).astype(np.float32)
    rv = RNG.standard_normal((M, N)).astype(np.float32)
    d, _ = gemv_matmul(a, w.T, c=c, alpha=0.5, beta=-2.0, dtype=np.float32, bias=bv,
                       activation="silu", residual=rv)
    ref, tol, _ = oracle(a, w.T, bv, "silu", rv, c=c, alpha=0.5, beta=-2.0)
    check(d, ref, tol, np.float32)


def test_linear(pairs):
    require(pairs, "float16", np.float16)
    x, w, bv = RNG.standard_normal((2, 4, 48)).astype(np.float16), \
        RNG.standard_normal((36, 48)).astype(np.float16), \
        RNG.standard_normal(36).astype(np.float16)
    y = coopmat.linear(x, w, bv, "gelu_tanh", family="gemv")
    assert isinstance(coopmat.api.matmul.last_kernel_traits(), GemvTraits)
    ref, tol, _ = oracle(x, w.T, bv, "gelu_tanh")
    check(y, ref, tol, np.float16)


def _run_explicit(t: GemvTraits, pair: TypePair, a: np.ndarray, b: np.ndarray,
                  out_dtype) -> np.ndarray:
    """Run explicit traits through PreparedGemm (as a GPU sweep does)."""
    from coopmat.dispatch.gemm import PreparedGemm
    from coopmat.dispatch.runtime import runtime

    g = PreparedGemm(runtime(), pair, a[None], b[None], None, 1, 1.0, 0.0, traits=t)
    try:
        out = np.empty((1, a.shape[0], b.shape[1]), out_dtype)
        g.execute()
        g.read(out)
    finally:
        g.release()
    assert g.traits == t
    return out[0]


def test_bfloat16(live_device_info):
    """bfloat16 operands are widened with integer operations (no bfloat16 feature needed
    for float32 results): explicit traits run where matmul offers no bfloat16."""
    a = small_ints((4, 200), BFLOAT16)
    w = small_ints((33, 200), BFLOAT16)
    t = gemv_traits(CT.BFLOAT16, CT.FLOAT32, live_device_info.limits, False, 4)
    out = _run_explicit(t, TypePair(CT.BFLOAT16, CT.FLOAT32), a, w.T, np.float32)
    np.testing.assert_array_equal(out, reference(a, w.T, np.float32))
    if "bfloat16->float32" in coopmat.supported_dtypes():
        d, t = gemv_matmul(a, w.T)
        assert t.a_type == CT.BFLOAT16
        np.testing.assert_array_equal(d, reference(a, w.T, np.float32))


@pytest.mark.parametrize("cols,splits,unroll,k_splits,prefetch,steps", [
    (*tile, prefetch, steps) for tile, prefetch, steps in
    pairwise([(1, 8, 4, 1), (4, 2, 1, 1), (3, 3, 3, 1), (2, 2, 2, 3), (1, 1, 1, 4)],
             [False, True], [0, 1, 3])])
def test_swept_tiles(pairs, live_device_info, cols, splits, unroll, k_splits, prefetch,
                     steps):
    """Explicit traits with other tiles (as a GPU sweep times them), with and without the
    prefetch: no, one and three whole steps, each with a remainder; K split between
    k_splits subgroups of each column group."""
    require(pairs, "float16", np.float32)
    sg = khr_subgroup_size(live_device_info.limits)
    tile = gemv_tile(rows=8, cols=cols, splits=splits, unroll=unroll, subgroup_size=sg,
                     k_splits=k_splits)
    t = gemv_traits(CT.FLOAT16, CT.FLOAT32, live_device_info.limits, False, 7, tile=tile)
    t = dataclasses.replace(t, prefetch=prefetch)
    M, N, K = 7, 3 * t.tile.tile_n + 5, steps * t.tile.tile_k + 8 * sg + 16
    a = small_ints((M, K), np.float16)
    w = small_ints((N, K), np.float16)
    out = _run_explicit(t, F16_F32, a, w.T, np.float32)
    np.testing.assert_array_equal(out, reference(a, w.T, np.float32))


def test_preconditions_are_errors(pairs):
    require(pairs, "float16", np.float16)
    a = small_ints((2, 64), np.float16)
    with pytest.raises(ValueError, match="gemv kernel family cannot run.*not column-major"):
        coopmat.matmul(a, small_ints((64, 16), np.float16), family="gemv")
    with pytest.raises(ValueError, match="K=20 is not a multiple of 8"):
        coopmat.matmul(small_ints((2, 20), np.float16), small_ints((16, 20), np.float16).T,
                       family="gemv")
    if "int8->int32" in pairs:
        with pytest.raises(ValueError, match="gemv kernel family cannot run"):
            coopmat.matmul(np.ones((2, 64), np.int8), np.ones((16, 64), np.int8).T,
                           family="gemv")
