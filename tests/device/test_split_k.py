"""Split-K (issue #16): the khr GEMM over S slices of K in one dispatch, the last
workgroup of each tile summing the float32 partials and applying the epilogue
(KhrTraits.split_k).

Policy tests run on recorded devices (no GPU). Live tests force the split
(COOPMAT_SPLIT_K) on the device scripts/test runs on (lavapipe in CI) and compare with
numpy in float64: operands drawn from small integers give exact float32 partials and
sums, so those results must equal the float64 product rounded once to D's type; general
data, C and the fused operations get test_epilogue's bound (the K-term dot product, the
result's rounding, an allowance for the device's exp).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from epilogue_oracle import check
from epilogue_oracle import oracle as epilogue_oracle
from gpu_av import gpu_av_env
from sampling import pairwise
from spirv_checks import assert_valid

import coopmat
import coopmat.api.matmul
import coopmat.policy.kernel as policy_kernel
from coopmat.codegen import KhrTraits, Layout, abi
from coopmat.codegen.tools import find_tool
from coopmat.codegen.traits import Activation, EpilogueOps
from coopmat.common.enums import ComponentType as CT
from coopmat.device.record import load_records
from coopmat.policy import (
    OperandLayout,
    Options,
    Problem,
    choose,
    resolve,
    split_k_for,
    split_k_violation,
)
from coopmat.policy.options import SPLIT_K_ENV

DATA = Path(__file__).parents[1] / "data"
(H200,) = load_records(DATA / "nvidia-h200-khr-coopmat.json")
(LAVAPIPE,) = load_records(DATA / "lavapipe-mesa26-khr-coopmat.json")
RNG = np.random.default_rng(16)
F16, F32 = np.float16, np.float32
U = {np.dtype(np.float16): 2.0 ** -11, np.dtype(np.float32): 2.0 ** -24}


def decode(info, M: int, N: int, K: int, **kw) -> Problem:
    """x @ w.T: A row-major M x K, B column-major (a weight stored N x K)."""
    pair = kw.pop("pair", None) or resolve(info, F16, F16)
    return Problem(pair, M, N, K, OperandLayout(Layout.ROW_MAJOR, K),
                   OperandLayout(Layout.COLUMN_MAJOR, K), **kw)


def unsplit(info, problem: Problem) -> KhrTraits:
    """The khr kernel the problem would run unsplit (forced: 1 to 4 rows against a
    column-major B run gemv by default)."""
    traits = choose(info, problem, Options(split_k=1, family="khr")).traits
    assert isinstance(traits, KhrTraits)
    return traits


# -- policy ------------------------------------------------------------------------------

def test_forced_split_with_explicit_traits() -> None:
    """Options.split_k splits given khr traits (the tuner's, the sweep's) as it splits the
    policy's own, where the product allows it; elsewhere, and for other families, they
    run unsplit rather than fail."""
    p = decode(H200, 16, 4096, 4096)
    traits = unsplit(H200, p)
    split = choose(H200, p, Options(split_k=4), traits=traits)
    assert split.split_k == 4 and isinstance(split.traits, KhrTraits)
    assert split.traits.split_k == 4 and split.params.K == 1024
    batched = decode(H200, 16, 4096, 4096, batch=2)
    assert choose(H200, batched, Options(split_k=4), traits=traits).split_k == 1
    gemv = choose(H200, decode(H200, 1, 4096, 4096), Options(family="gemv")).traits
    assert choose(H200, decode(H200, 1, 4096, 4096), Options(split_k=4),
                  traits=gemv).split_k == 1
    with pytest.raises(ValueError, match="no split-K of 4"):  # asked for by argument
        choose(H200, batched, traits=traits, split_k=4)


def test_explicit_traits_must_store_the_products_type() -> None:
    """Unsplit, given traits that store another type than the product's D (whose buffer
    is sized for its own type) are refused with the two types named, not run."""
    p = decode(H200, 64, 4096, 4096)
    traits = unsplit(H200, p)
    assert choose(H200, p, Options(split_k=1), traits=traits).traits == traits
    with pytest.raises(ValueError, match="store FLOAT32 results, the product float16"):
        choose(H200, p, Options(split_k=1), traits=replace(traits, out_type=None))


def test_split_of_unaligned_d_runs_unsplit() -> None:
    """D's float16 rows of N = 68 (136 bytes) do not start on 16 bytes: a forced split
    runs unsplit there (the general variant's split measured wrong on an H200); float32
    D's rows (272 bytes) do, and split."""
    for info in (H200, LAVAPIPE):
        p = decode(info, 70, 68, 4096)
        assert "16-byte" in (split_k_violation(info, p, 4) or "")
        assert choose(info, p, Options(split_k=4, family="khr")).split_k == 1
        p32 = decode(info, 70, 68, 4096, pair=resolve(info, F16, F16, F32))
        assert choose(info, p32, Options(split_k=4, family="khr")).split_k == 4


def test_quantized_splits_stage_units_of_eight() -> None:
    """A split-K of a quantized B stages at least 8 weights a unit
    (plan.SPLIT_MIN_QUANT_UNIT): with units of 4 the H200 summed wrong. A q8_0 product of
    more than SMALL_M rows, which runs units of 4 unsplit, is split with units of 8, and
    split traits with units of 4 are refused."""
    from coopmat.codegen.plan import plan_kernel

    p = decode(H200, 96, 4096, 4096, b_quant="q8_0")
    whole = choose(H200, p, Options(split_k=1, dequant="fused"))
    assert isinstance(whole.traits, KhrTraits) and whole.traits.b_quant_unit == 4
    split = choose(H200, p, Options(split_k=4, dequant="fused"))
    assert split.split_k == 4 and isinstance(split.traits, KhrTraits)
    assert split.traits.b_quant_unit == 8
    plan_kernel(split.traits)
    with pytest.raises(ValueError, match="units of at least 8"):
        plan_kernel(replace(split.traits, b_quant_unit=4))
    # given traits with units of 4 are split with units of 8 too
    given = choose(H200, p, Options(split_k=4, dequant="fused"), traits=whole.traits)
    assert given.split_k == 4 and given.traits.b_quant_unit == 8


def test_rule_on_h200_decode_shapes() -> None:
    """On the H200's tuned few-row tiles (16, 32 or 64 rows): S from the measured table
    (SPLIT_K_BY_TILE_ROWS) for the three weights it was measured on, as x @ w.T."""
    from coopmat.policy import tuning

    tuned = tuning.choices(replace(H200, device_id=0x2335))  # the shipped table
    want = {  # (M, N, K): S, as lab/notebook/kernels.md's split-K table measured it best
        (8, 4096, 4096): 8, (16, 4096, 4096): 8, (8, 4096, 14336): 8, (16, 4096, 14336): 8,
        (16, 14336, 4096): 1,  # exact: unsplit, on the 256-deep step
        (8, 14336, 4096): 1, (12, 14336, 4096): 1,  # exact with clamped rows: the same
        (32, 4096, 4096): 4, (32, 14336, 4096): 1, (32, 4096, 14336): 4,
        (64, 4096, 4096): 4, (64, 4096, 14336): 4, (64, 14336, 4096): 1,
    }
    for (M, N, K), S in want.items():
        p = decode(H200, M, N, K)
        choice = choose(H200, p, Options(), tuned)
        rows = choice.traits.tile.tile_m
        assert rows == {8: 16, 12: 16, 16: 16, 32: 32, 64: 64}[M], (M, N, K)
        assert choice.split_k == S, (M, N, K)
    deep = choose(H200, decode(H200, 16, 14336, 4096), Options(), tuned).traits
    assert deep.tile.tile_k == 256 and deep.exact, deep
    # A row-major B's deeper step does not fit the H200's 48 KiB, so the exact kernel
    # splits as the others do (lab/notebook/kernels.md, "Clamped rows": 35.2 against 39.4 us).
    for M in (1, 8, 16):
        p = Problem(resolve(H200, F16, F16), M, 14336, 4096,
                    OperandLayout(Layout.ROW_MAJOR, 4096), OperandLayout(Layout.ROW_MAJOR, 14336))
        row_b = choose(H200, p, Options(), tuned)
        assert row_b.split_k == 2 and row_b.traits.exact and row_b.traits.tile.tile_k == 128
        whole = choose(H200, p, Options(split_k=1), tuned).traits
        assert split_k_for(H200, p, whole, deepens=False) == 2
        assert split_k_for(H200, p, whole) == 1  # as for a column-major B
    # Not 512 of K a slice: fewer slices, or none.
    assert choose(H200, decode(H200, 16, 4096, 2048), Options(), tuned).split_k == 4
    assert choose(H200, decode(H200, 16, 4096, 512), Options(), tuned).split_k == 1


def test_mid_size_products_split_on_the_general_tile() -> None:
    """More than SMALL_M rows (prefill-sized products) whose general tile's grid leaves a
    GPU part idle split K until the grid fills it, the slices on the general tile; K too
    short for MID_SPLIT_MIN_SLICE slices, a full grid, a batch or a CPU driver: unsplit."""
    general = choose(H200, decode(H200, 8192, 8192, 8192), Options()).traits.tile
    for M, K, S in ((128, 14336, 8), (256, 14336, 4), (512, 14336, 2), (512, 4096, 2),
                    (1024, 14336, 1), (512, 2048, 1), (128, 4096, 1), (2048, 14336, 1),
                    (128, 8192, 4)):
        choice = choose(H200, decode(H200, M, 4096, K), Options())
        assert choice.split_k == S, (M, K)
        # 128 rows in 4 slices of the general tile would still leave the GPU part idle:
        # the filling tile runs them; 8 slices fill it
        assert S == 1 or (choice.traits.tile == general) == (M > 128 or S == 8), (M, K)
    assert choose(H200, decode(H200, 512, 4096, 14336, batch=2), Options()).split_k == 1
    assert choose(LAVAPIPE, decode(LAVAPIPE, 512, 4096, 14336), Options()).split_k == 1
    assert choose(H200, decode(H200, 512, 4096, 14336), Options(split_k=1)).split_k == 1


def test_covering_tiles_specialize_large_products() -> None:
    """On the H200, 17-64 rows run a covering tile (32 or 64 rows in one row block), and
    such products of SPECIALIZE_COVERING_MIN_OPS or more get their sizes compiled in,
    split or not; 16 rows (their own tile) and smaller products do not."""
    from coopmat.policy import tuning

    tuned = tuning.choices(replace(H200, device_id=0x2335))
    for (M, N, K), want in {(32, 4096, 4096): True, (64, 14336, 4096): True,
                            (48, 4096, 14336): True, (16, 4096, 14336): False,
                            (8, 14336, 4096): False, (32, 1024, 1024): False}.items():
        t = khr_of(choose(H200, decode(H200, M, N, K), Options(), tuned))
        assert bool(t.specialized) is want, (M, N, K)
        assert (t.tile.tile_m > 16) is (M > 16), (M, N, K)
        off = choose(H200, decode(H200, M, N, K), Options(specialize="never"), tuned)
        assert not khr_of(off).specialized
    # Quantized weights on their few-row tiles likewise (16 rows: one matrix's rows).
    for M, want in ((32, True), (64, True), (16, False)):
        q = choose(H200, decode(H200, M, 4096, 4096, b_quant="q8_0"), Options(), tuned)
        assert bool(khr_of(q).specialized) is want, M
    # Specialization is a policy of GPUs' covering tiles: lavapipe's products stay general.
    assert not khr_of(choose(LAVAPIPE, decode(LAVAPIPE, 64, 4096, 4096))).specialized


def test_rolled_loops_and_unchecked_storage_on_h200() -> None:
    """On the H200 (lab/notebook/kernels.md, "The driver's machine code"): few-row products whose
    workgroups take ROLLED_MIN_K_STEPS K steps or more keep the K loop rolled, except a
    bounds-checked kernel on a covering tile; exact kernels run without the driver's
    storage checks, quantized ones only with the loop rolled; bounds-checked ones keep
    them. As x @ w.T, (M, N, K) -> (rolled, unchecked)."""
    from coopmat.policy import tuning

    tuned = tuning.choices(replace(H200, device_id=0x2335))
    want = {
        (32, 14336, 4096): (True, True),    # covering, exact, 32 steps
        (64, 4096, 14336): (True, True),    # split 4: 28 steps a slice
        (16, 14336, 4096): (True, True),    # unsplit, 256-deep step: 16 steps
        (16, 4096, 14336): (False, True),   # split 8: 14 steps
        (16, 4096, 4096): (False, True),    # split 8: 4 steps
        (8, 14336, 4096): (True, True),     # 8 rows of a 16-row tile: clamped rows
        (48, 14336, 4096): (True, True),    # 48 rows of the 64-row tile: clamped, covering
        (12, 14336, 4104): (True, False),   # no whole K step: bounds-checked, 33 steps
        (48, 14336, 4104): (False, False),  # the same on the covering tile
    }
    for (M, N, K), (rolled, unchecked) in want.items():
        t = khr_of(choose(H200, decode(H200, M, N, K), Options(), tuned))
        assert (t.k_loop_rolled, not t.storage_checks) == (rolled, unchecked), (M, N, K)
    big = khr_of(choose(H200, Problem(resolve(H200, F16, F16), 4096, 4096, 4096,
                                      OperandLayout(Layout.ROW_MAJOR, 4096),
                                      OperandLayout(Layout.ROW_MAJOR, 4096)), Options(), tuned))
    assert big.exact and not big.storage_checks and not big.k_loop_rolled
    for (M, N, K), want_q in {(16, 14336, 4096): (True, True), (16, 4096, 4096): (False, False),
                              (8, 14336, 4096): (True, True),
                              (8, 14336, 4128): (True, False)}.items():
        q = khr_of(choose(H200, decode(H200, M, N, K, b_quant="q4_0"), Options(), tuned))
        assert (q.k_loop_rolled, not q.storage_checks) == want_q, (M, N, K)
    # The bounds-checked fallback (operands without read-past margins) takes the checks back.
    exact = khr_of(choose(H200, decode(H200, 32, 14336, 4096), Options(), tuned))
    assert policy_kernel.bounds_checked(exact).storage_checks
    assert not policy_kernel.bounds_checked(exact).exact
    # Rolling is a GPU policy; the exact variant runs unchecked on lavapipe too.
    lp = khr_of(choose(LAVAPIPE, decode(LAVAPIPE, 32, 256, 4096)))
    assert not lp.k_loop_rolled and lp.exact and not lp.storage_checks


def khr_of(choice) -> KhrTraits:
    assert isinstance(choice.traits, KhrTraits)
    return choice.traits


def test_rule_elsewhere_counts_workgroups() -> None:
    """Tiles the table does not list: S = the power of two nearest ceil(target / G) for an
    unsplit grid of G <= SPLIT_K_MAX_GROUPS workgroups. A quantized B's few-row tiles are
    the table's."""
    for M, N, K in ((8, 4096, 4096), (16, 2048, 4096), (8, 14336, 4096), (8, 1024, 8192)):
        p = decode(H200, M, N, K)
        traits = unsplit(H200, p)
        traits = replace(traits, tile=replace(traits.tile, tile_m=128, subgroups_m=2))
        t = traits.tile
        groups = -(-M // t.tile_m) * -(-N // t.tile_n)
        want = -(-policy_kernel.SPLIT_K_TARGET_GROUPS // groups)
        S = min((2, 4, 8), key=lambda s: (abs(math.log2(s) - math.log2(want)), s))
        while S > 1 and (K % (S * t.tile_k) or K // S < 512):
            S //= 2
        ok = groups <= policy_kernel.SPLIT_K_MAX_GROUPS
        assert split_k_for(H200, p, traits) == (S if ok else 1), (M, N, K)
    # a quantized B on its few-row tiles: the table, as a float B
    for M, N, K in ((16, 4096, 4096), (16, 14336, 4096), (64, 4096, 14336), (64, 14336, 4096)):
        q = decode(H200, M, N, K, b_quant="q8_0")
        traits = unsplit(H200, q)
        t = traits.tile
        groups = -(-M // t.tile_m) * -(-N // t.tile_n)
        table = policy_kernel.SPLIT_K_BY_TILE_ROWS[t.tile_m]
        assert split_k_for(H200, q, traits) == next((s for most, s, _ in table
                                                     if groups <= most), 1), (M, N, K)


def test_unsplit_few_row_products_stream_deeper() -> None:
    """tiles.deep_few_row_tile: where the split-K rule leaves a few-row product whole (a
    wide weight), the one-row-block tile takes 256 of K a step; split products, more
    rows, a quantized B and a forced family keep theirs."""
    from coopmat.policy import tuning

    # The H200's shipped table (the record's device id is 0): 16 x 64 x 128 tiles, 4
    # subgroups, for few rows.
    tuned = tuning.choices(replace(H200, device_id=0x2335))

    def pick(M: int, N: int, K: int, **kw):  # -> KernelChoice
        return choose(H200, decode(H200, M, N, K, **kw), Options(), tuned)

    wide = 28672  # 448 workgroups of the 16-row tile: more than the split rule takes
    for M in (8, 16):
        c = pick(M, wide, 4096)
        t = c.traits.tile
        assert c.split_k == 1 and (t.tile_m, t.tile_n, t.tile_k) == (16, 64, 256)
        assert c.traits.exact and c.why == "tuned"
        assert c.traits.clamp_rows == (M == 8)  # 8 rows: a partial tile
        forced = choose(H200, decode(H200, M, wide, 4096), Options(family="khr"), tuned)
        assert forced.traits.tile.tile_k == 128
        odd = pick(M, wide, 4104)  # no whole K step: not exact
        assert odd.traits.tile.tile_k == 256 and not odd.traits.exact
    split = pick(16, 4096, 4096)
    assert split.split_k > 1 and split.traits.tile.tile_k == 128
    assert pick(32, 14336, 4096).traits.tile.tile_k == 128
    quant = pick(16, 14336, 4096, b_quant="q8_0")
    assert quant.traits.tile.tile_k == 128 and quant.traits.tile.tile_n == 64


def test_deeper_step_fits_without_margins() -> None:
    """A plan whose operands lack the exact variant's read-past margins runs the bounds-
    checked variant of the chosen tile (dispatch.gemm._make_plan), which stages more: the
    deeper few-row step is taken only where that variant fits the device's shared memory
    too. On the H200 it did not at 16 x 256 @ 256^2 (row-major B: 49408 bytes of 49152), and
    chained Array products of that shape raised MissingFeatureError."""
    from coopmat.codegen.plan import plan_kernel
    from coopmat.policy import tuning

    tuned = tuning.choices(replace(H200, device_id=0x2335))
    limit = H200.limits.max_compute_shared_memory_size
    pair = resolve(H200, F16, F16)
    deep = 0
    for M in (8, 16):
        for n in (256, 512, 1024, 2048, 4096, 14336):
            for b in (OperandLayout(Layout.ROW_MAJOR, n), OperandLayout(Layout.COLUMN_MAJOR, n)):
                p = Problem(pair, M, n, n, OperandLayout(Layout.ROW_MAJOR, n), b)
                t = choose(H200, p, Options(), tuned).traits
                if isinstance(t, KhrTraits):
                    deep += t.tile.tile_k == 256
                    checked = policy_kernel.bounds_checked(t)
                    assert plan_kernel(checked).shared_bytes <= limit, (M, n, b)
    assert deep  # the rule still applies somewhere


def test_rule_says_one_elsewhere() -> None:
    p = decode(H200, 8, 4096, 4096)
    khr = unsplit(H200, p)
    assert split_k_for(LAVAPIPE, decode(LAVAPIPE, 8, 4096, 4096),
                       unsplit(LAVAPIPE, decode(LAVAPIPE, 8, 4096, 4096))) == 1  # a CPU
    assert split_k_for(H200, replace(p, M=65), khr) == 1  # more than SMALL_M rows
    assert split_k_for(H200, replace(p, batch=2), khr) == 1
    assert split_k_for(H200, replace(p, N=65536), khr) == 1  # enough workgroups already
    assert split_k_for(H200, replace(p, K=512), khr) == 1  # no slice of 512 or more
    assert split_k_for(H200, replace(p, K=1024), khr) == 2  # two slices of 512
    assert split_k_for(H200, replace(p, K=4096 + khr.tile.tile_k), khr) == 1  # not whole
    i8 = resolve(H200, np.int8, np.int8)
    assert split_k_for(H200, replace(p, pair=i8), khr) == 1  # an integer result


def test_default_is_on_and_the_rule_applies(monkeypatch) -> None:
    p = decode(H200, 8, 4096, 4096)
    assert policy_kernel.SPLIT_K_DEFAULT
    # 28672 columns: 448 workgroups of the untuned 32-row tile, more than the rule splits.
    assert choose(H200, replace(p, N=28672)).split_k == 1
    monkeypatch.setattr(policy_kernel, "SPLIT_K_DEFAULT", False)
    assert choose(H200, p).split_k == 1
    monkeypatch.setattr(policy_kernel, "SPLIT_K_DEFAULT", True)
    choice = choose(H200, p)
    assert choice.split_k == 4 and choice.why == "default"
    params = choice.params
    assert (params.K, params.batch_stride_a, params.batch_stride_b) == (1024, 1024, 1024)
    assert (params.ldd, params.batch_stride_d, params.alpha, params.beta) == \
        (4096, 8 * 4096, 1, 0)
    t = choice.traits
    assert isinstance(t, KhrTraits)
    # float32 partials, the product's own D type for the last workgroup's epilogue
    assert t.result_type == CT.FLOAT32 and t.out_type == CT.FLOAT16 and t.split_k == 4
    assert not t.has_c and t.ops is None
    assert choose(H200, p, Options(split_k=1)).split_k == 1  # forced off


def test_forced_split_strides_follow_the_layouts() -> None:
    pair = resolve(H200, F16, F16)
    M, N, K = 16, 200, 512
    # A column-major (lda = M), B row-major (ldb = N): slices step K lines.
    p = Problem(pair, M, N, K, OperandLayout(Layout.COLUMN_MAJOR, M),
                OperandLayout(Layout.ROW_MAJOR, N), has_c=True, alpha=2.0, beta=0.5,
                ops=EpilogueOps(bias=True, activation=Activation.GELU_TANH, residual=True))
    choice = choose(H200, p, Options(split_k=4))
    assert choice.split_k == 4 and choice.why == "forced"
    q = choice.params
    assert (q.K, q.batch_stride_a, q.batch_stride_b) == (128, 128 * M, 128 * N)
    # The last workgroup of a tile applies the product's own epilogue.
    assert (q.alpha, q.beta, choice.traits.has_c, choice.traits.ops) == (2.0, 0.5, True, p.ops)


def test_forced_split_falls_back_where_it_cannot_run() -> None:
    """A forced S runs where split_k_violation allows it; elsewhere the product runs
    unsplit (the choice says split_k == 1)."""
    p = decode(H200, 8, 4096, 4096)
    cases = {
        "K=4098 is not a multiple": replace(p, K=4098, a=OperandLayout(Layout.ROW_MAJOR, 4098),
                                            b=OperandLayout(Layout.COLUMN_MAJOR, 4098)),
        "batch": replace(p, batch=2),
        "float results only": replace(p, pair=resolve(H200, np.int8, np.int8)),
        "float16 accumulation": replace(p, pair=resolve(H200, F16, F16, accumulator=F16)),
        "blocks": replace(p, K=4160, a=OperandLayout(Layout.ROW_MAJOR, 4160),
                          b=OperandLayout(Layout.COLUMN_MAJOR, 4160), b_quant="q8_0"),
    }
    for why, q in cases.items():
        if why != "float16 accumulation":
            assert why.split()[-1] in (split_k_violation(H200, q, 4) or ""), why
        assert choose(H200, q, Options(split_k=4)).split_k == 1, why
    # Another family than khr (forced, or gemv/rows tuned) is never split.
    assert choose(H200, p, Options(split_k=4, family="gemv")).split_k == 1


def test_split_needs_a_counter_per_tile() -> None:
    """A split-K counts arrivals in the device's SPLIT_K_MAX_TILES shared counters: a
    forced split of a product with more tiles runs unsplit, and the tuner's explicit
    traits for one get a clear error."""
    p = decode(H200, 32768, 32768, 1024)
    forced = choose(H200, p, Options(split_k=2))
    assert forced.split_k == 1
    sliced = choose(H200, policy_kernel.slice_problem(p, 2)).traits
    assert isinstance(sliced, KhrTraits)
    assert abi.split_layout(sliced, p.M, p.N)[0] > abi.SPLIT_K_MAX_TILES
    with pytest.raises(ValueError, match="counts arrivals for at most"):
        choose(H200, p, traits=sliced, split_k=2)
    small = decode(H200, 4096, 4096, 1024)  # fewer tiles: the same force splits
    assert choose(H200, small, Options(split_k=2)).split_k == 2


def test_options_and_environment() -> None:
    assert Options.from_env({}).split_k is None
    assert Options.from_env({SPLIT_K_ENV: "auto"}).split_k is None
    assert Options.from_env({SPLIT_K_ENV: " 4 "}).split_k == 4
    assert Options.from_env({SPLIT_K_ENV: "1"}).split_k == 1
    for bad in ("0", "-2", "two", "2.5"):
        with pytest.raises(ValueError, match=SPLIT_K_ENV):
            Options.from_env({SPLIT_K_ENV: bad})
    for bad_value in (0, -1, True):
        with pytest.raises(ValueError, match="split_k"):
            Options(split_k=bad_value)


@pytest.mark.skipif(find_tool("spirv-val") is None, reason="spirv-val not found")
@pytest.mark.parametrize("operand", [CT.FLOAT16, CT.BFLOAT16], ids=str)
def test_split_kernels_validate(operand: CT) -> None:
    """The split kernels of the H200's float32-accumulating khr configs, with every D type
    they store, C and fused operations, pass spirv-val (Vulkan 1.3 environment)."""
    from coopmat.codegen import build_gemm
    from coopmat.policy.variants import device_variants

    base = next(t for t in device_variants(H200) if isinstance(t, KhrTraits)
                and t.a_type == operand and t.result_type == CT.FLOAT32 and not t.exact)
    for out_type in (None, operand):
        for has_c in (False, True):
            for ops in (None, EpilogueOps(bias=True, activation=Activation.GELU_TANH),
                        EpilogueOps(activation=Activation.SILU, residual=True)):
                t = replace(base, split_k=4, out_type=out_type, has_c=has_c, ops=ops)
                assert_valid(build_gemm(t).spirv)


# -- live --------------------------------------------------------------------------------

def small_ints(*shape: int) -> np.ndarray:
    return RNG.integers(-3, 4, size=shape).astype(np.float16)


def normal(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float16)


def forced(monkeypatch, S: int) -> None:
    """Split-K of S on the khr family (on a GPU, few rows against a column-major B would
    run gemv by default, which does not split)."""
    coopmat.set_options(split_k=S, family="khr")


def ran_split() -> int:
    return coopmat.api.matmul._last.result.split_k


def oracle(a, b, *, c=None, alpha=1.0, beta=0.0, bias=None, gelu=False, residual=None):
    """(float64 act(alpha a @ b + beta c + bias) + residual, its tolerance before D's
    rounding): test_epilogue's oracle."""
    ref, tol, _ = epilogue_oracle(a, b, bias, "gelu_tanh" if gelu else None, residual, c=c,
                                  alpha=alpha, beta=beta)
    return ref, tol


# Every split, M, K (2 and 4 x (S x tile_k) on lavapipe, tile_k 16), result type and B
# layout, and every pair of them (tests/support/sampling.py).
@pytest.mark.parametrize("S,M,K,out,b_col", pairwise([2, 4], [1, 5, 16], [128, 256], [F16, F32],
                                                     [False, True]))
def test_exact_results(live_device_info, monkeypatch, S, M, K, out, b_col) -> None:
    forced(monkeypatch, S)
    N = 40  # not a multiple of any tile's N
    a = small_ints(M, K)
    b = np.ascontiguousarray(small_ints(N, K)).T if b_col else small_ints(K, N)
    d = coopmat.matmul(a, b, dtype=out)
    assert ran_split() == S
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_array_equal(d, ref.astype(out))  # exact sums, one rounding


def test_many_row_blocks(live_device_info, monkeypatch) -> None:
    """A split of a prefill-sized product (mid_split_k's case): several row and column
    blocks, M and N ragged, each tile finished by its own last arrival."""
    forced(monkeypatch, 2)
    M, N, K = 70, 40, 256
    a, w = small_ints(M, K), small_ints(N, K)
    d = coopmat.matmul(a, w.T, dtype=F32)
    assert ran_split() == 2
    np.testing.assert_array_equal(d, a.astype(np.float64) @ w.T.astype(np.float64))


@pytest.mark.parametrize("S", [2, 4])
def test_counters_return_to_zero(live_device_info, monkeypatch, S) -> None:
    """The last workgroup of each tile sets its arrival counter back to zero: the same
    split plan runs again on new data, and a chain of split products of another grid
    runs on Arrays (one submission after another, sharing the counters), each exact; the
    counters read zero after all of them. A counter left at 1 would make the next run's
    finishing workgroup the wrong one (or none), and some tile would keep stale D."""
    from coopmat.dispatch.runtime import runtime

    forced(monkeypatch, S)
    M, N, K = 16, 72, 256
    for _ in range(3):
        a, w = small_ints(M, K), small_ints(N, K)
        d = coopmat.matmul(a, w.T)
        assert ran_split() == S
        np.testing.assert_array_equal(d, (a.astype(np.float64) @ w.T).astype(F16))
    x, w = small_ints(5, K), np.eye(K, dtype=F16)[::-1].copy()  # a permutation
    X, W = coopmat.asarray(x), coopmat.asarray(w)
    for _ in range(4):
        X = X @ W
        assert ran_split() == S
    np.testing.assert_array_equal(X.numpy(), x)  # reversed an even number of times
    rt = runtime()
    counters = np.empty(64, np.uint32)
    rt.transfers.download(rt.split_counters(), 0, counters)
    np.testing.assert_array_equal(counters, 0)


# Each split and each result type once (S is a constant of the same code; a kernel
# costs lavapipe seconds to compile).
@pytest.mark.parametrize("S,out", [(2, F16), (4, F32)], ids=["2-f16", "4-f32"])
def test_c_alpha_beta(live_device_info, monkeypatch, S, out) -> None:
    forced(monkeypatch, S)
    M, N, K = 5, 40, 256
    a, w, c = normal(M, K), normal(N, K), normal(M, N).astype(out)
    d = coopmat.matmul(a, w.T, c=c, alpha=0.5, beta=-2.0, dtype=out)
    assert ran_split() == S
    ref, tol = oracle(a, w.T, c=c, alpha=0.5, beta=-2.0)
    check(d, ref, tol, out)


# Each split and each M (a partial and a whole row block) once: three kernels a case.
@pytest.mark.parametrize("S,M", [(2, 1), (4, 16)])
def test_fused_bias_gelu_and_residual(live_device_info, monkeypatch, S, M) -> None:
    forced(monkeypatch, S)
    N, K = 40, 128
    x, w, bias, res = normal(M, K), normal(N, K), normal(N), normal(M, N)
    y = coopmat.linear(x, w, bias, "gelu_tanh")
    assert ran_split() == S
    ref, tol = oracle(x, w.T, bias=bias, gelu=True)
    check(y, ref, tol, F16)
    y = coopmat.linear(x, w, residual=res)
    assert ran_split() == S
    ref, tol = oracle(x, w.T, residual=res)
    check(y, ref, tol, F16)
    y = coopmat.matmul(x, w.T, c=res, beta=0.25, bias=bias, activation="gelu_tanh",
                       residual=res)
    ref, tol = oracle(x, w.T, c=res, beta=0.25, bias=bias, gelu=True, residual=res)
    check(y, ref, tol, F16)


@pytest.mark.parametrize("S", [4])  # S is compiled in like the sizes: one split shows it
def test_specialized_splits(live_device_info, monkeypatch, S) -> None:
    """Splits with their sizes and strides compiled in (as the policy does for 32 and 64
    rows on a covering tile, SPECIALIZE_COVERING_MIN_OPS): C, alpha, beta and the fused
    operations, whose strides the slices' problem does not carry."""
    forced(monkeypatch, S)
    coopmat.set_options(specialize="always")
    M, N, K = 40, 72, 256
    a, w, c = normal(M, K), normal(N, K), normal(M, N)
    bias, res = normal(N), normal(M, N)
    d = coopmat.matmul(a, w.T, c=c, alpha=0.5, beta=-2.0, dtype=F32)
    assert ran_split() == S
    assert coopmat.api.matmul._last.result.traits.specialized
    ref, tol = oracle(a, w.T, c=c, alpha=0.5, beta=-2.0)
    check(d, ref, tol, F32)
    y = coopmat.matmul(a, w.T, c=c, beta=0.25, bias=bias, activation="gelu_tanh",
                       residual=res)
    assert ran_split() == S
    ref, tol = oracle(a, w.T, c=c, beta=0.25, bias=bias, gelu=True, residual=res)
    check(y, ref, tol, F16)
    X, W = coopmat.asarray(a), coopmat.asarray(w)  # device arrays: no read-past margins
    ref, tol = oracle(a, w.T)
    check((X @ W.T).numpy(), ref, tol, F16)
    assert ran_split() == S


# Each split and each B layout once.
@pytest.mark.parametrize("S,b_col", [(2, False), (4, True)], ids=["2-b_row", "4-b_col"])
def test_device_arrays(live_device_info, monkeypatch, S, b_col) -> None:
    forced(monkeypatch, S)
    M, N, K = 5, 40, 256
    a, w, bias, res = normal(M, K), normal(N, K), normal(N), normal(M, N)
    A = coopmat.asarray(a)
    B = coopmat.asarray(np.ascontiguousarray(w)).T if b_col else coopmat.asarray(
        np.ascontiguousarray(w.T))
    D = A @ B
    assert isinstance(D, coopmat.Array) and ran_split() == S
    ref, tol = oracle(a, w.T)
    check(D.numpy(), ref, tol, F16)
    C = coopmat.asarray(res)
    Y = coopmat.matmul(A, B, c=C, alpha=2.0, beta=-1.0, bias=coopmat.asarray(bias),
                       activation="gelu_tanh", residual=coopmat.asarray(res))
    assert ran_split() == S
    ref, tol = oracle(a, w.T, c=res, alpha=2.0, beta=-1.0, bias=bias, gelu=True, residual=res)
    check(Y.numpy(), ref, tol, F16)
    D32 = coopmat.matmul(A, B, dtype=F32)
    assert ran_split() == S
    check(D32.numpy(), *oracle(a, w.T), F32)


def test_exact_variant_and_column_major_a(live_device_info, monkeypatch) -> None:
    """Whole tiles (the exact variant, whose look-ahead reads past each slice into the
    next, and past the last into the margin) and a transposed-view A."""
    forced(monkeypatch, 2)
    M, N, K = 32, 64, 256
    a, b = small_ints(M, K), small_ints(K, N)
    d = coopmat.matmul(a, b, dtype=F32)
    assert ran_split() == 2
    traits = coopmat.api.matmul._last.result.traits
    np.testing.assert_array_equal(d, a.astype(np.float64) @ b.astype(np.float64))
    assert isinstance(traits, KhrTraits)
    t = traits.tile
    if M % t.tile_m == 0 and N % t.tile_n == 0 and (K // 2) % t.tile_k == 0:
        assert traits.exact
    D = coopmat.asarray(a) @ coopmat.asarray(b)  # no margin: the inexact variant
    assert ran_split() == 2
    np.testing.assert_array_equal(D.numpy(), (a.astype(np.float64) @ b).astype(F16))
    at = np.asfortranarray(a)  # column-major A
    d = coopmat.matmul(at, b)
    assert ran_split() == 2
    np.testing.assert_array_equal(d, (a.astype(np.float64) @ b).astype(F16))


@pytest.mark.parametrize("out,N", [(F16, 72), (F32, 72), (F32, 68)])
def test_finishing_workgroups_inside_and_past_the_edges(live_device_info, monkeypatch,
                                                        out, N) -> None:
    """A split whose tiles lie both inside M x N and past both edges, each finished by its
    last arrival (inside, four results a store where the kernel's flags say D's rows
    start on 16 bytes): C, alpha and beta, then the fused bias, activation (float16 D,
    which N = 68 splits only as float32) and residual, against float64."""
    forced(monkeypatch, 4)
    M, K = 70, 256  # whole tiles and tiles past both edges
    a, w, c = normal(M, K), normal(N, K), normal(M, N).astype(out)
    d = coopmat.matmul(a, w.T, c=c, alpha=0.5, beta=-2.0, dtype=out)
    assert ran_split() == 4
    t = coopmat.api.matmul._last.result.traits.tile
    assert M // t.tile_m and N // t.tile_n and (M % t.tile_m or N % t.tile_n), t
    check(d, *oracle(a, w.T, c=c, alpha=0.5, beta=-2.0), out)
    bias, res = normal(N), normal(M, N)
    y = coopmat.matmul(a, w.T, bias=bias, activation="gelu_tanh", residual=res)
    assert ran_split() == (4 if N * 2 % 16 == 0 else 1)  # float16 D
    check(y, *oracle(a, w.T, bias=bias, gelu=True, residual=res), F16)


def test_k_not_divisible_runs_unsplit(live_device_info, monkeypatch) -> None:
    forced(monkeypatch, 4)
    M, N, K = 5, 40, 130
    a, b = small_ints(M, K), small_ints(K, N)
    d = coopmat.matmul(a, b)
    assert ran_split() == 1
    np.testing.assert_array_equal(d, (a.astype(np.float64) @ b).astype(F16))


def test_batches_run_unsplit(live_device_info, monkeypatch) -> None:
    forced(monkeypatch, 2)
    a, b = small_ints(3, 5, 64), small_ints(3, 64, 40)
    d = coopmat.matmul(a, b)
    assert ran_split() == 1
    np.testing.assert_array_equal(d, (a.astype(np.float64) @ b).astype(F16))


def test_serial_seconds_times_the_split(live_device_info) -> None:
    from coopmat.dispatch.gemm import PreparedGemm
    from coopmat.dispatch.runtime import runtime

    rt = runtime()
    pair = resolve(rt.device.info, F16, F16)
    M, N, K = 8, 40, 256
    a, w = small_ints(M, K), small_ints(N, K)
    g = PreparedGemm(rt, pair, a[None], np.ascontiguousarray(w).T[None], None, 1, 1, 0,
                     options=Options(split_k=4))
    try:
        assert g.choice.split_k == 4 and g.plan.workspace_bytes > 0
        assert len(g.dispatches) == 1
        g.execute()
        if rt.executor.timestamps:
            per = g.serial_seconds(3, submits=1)
            assert per is not None and per > 0
        with pytest.raises(ValueError, match="split-K"):
            g.independent_copies(2)
        if g.downloads:
            rt.executor.run([], [], g.downloads)
        got = np.empty((1, M, N), F16)
        g.read(got)
        np.testing.assert_array_equal(got[0], (a.astype(np.float64) @ w.T).astype(F16))
    finally:
        g.release()


GPU_AV_CHILD = textwrap.dedent('''
    import json
    import numpy as np
    from coopmat.codegen import Tile
    from coopmat.device import instance
    from coopmat.device.vkffi import vk as _vk
    from coopmat.dispatch.gemm import PreparedGemm
    from coopmat.dispatch.runtime import runtime
    from coopmat.policy import Options, resolve

    rt = runtime()
    rng = np.random.default_rng(5)
    cases = []
    # Power-of-two byte sizes fill pooled buffers exactly: a read past an operand's end
    # (the exact variant's look-ahead past the last slice) is a read past its buffer.
    # The exact variant on whole tiles (big) and with its rows and columns clamped (few),
    # each operand K-contiguous in one case and not in the other, so each operand's
    # slices step along lines and along K; each split once. A case under GPU-AV takes
    # lavapipe about half a minute of CPU (a bounds-checked one twice that; it runs
    # unsplit in test_buffer_bounds.py): not every pair of split, shape and layouts.
    big, few = (64, 64, 256, np.float16), (8, 40, 128, np.float32)
    for S, (M, N, K, out), (ta, tb) in ((2, big, (False, False)), (4, few, (True, True))):
        a = rng.integers(-3, 4, (K, M) if ta else (M, K)).astype(np.float16)
        b = rng.integers(-3, 4, (N, K) if tb else (K, N)).astype(np.float16)
        a, b = (a.T if ta else a), (b.T if tb else b)
        c = rng.integers(-3, 4, (1, M, N)).astype(out)
        pair = resolve(rt.device.info, np.float16, np.float16, out)
        before = len(instance.validation_errors)
        g = PreparedGemm(rt, pair, a[None], b[None], c, 1, 1, 1,
                         options=Options(split_k=S))
        try:
            g.execute()
            got = np.empty((1, M, N), out)
            g.read(got)
        finally:
            g.release()
        _vk().vkDeviceWaitIdle(rt.device.handle)
        want = (a.astype(np.float64) @ b + c[0]).astype(out)
        cases.append({"case": f"S={S} {M}x{N}x{K} ta={ta} tb={tb} "
                              f"{g.traits.describe()} split={g.choice.split_k}",
                      "equal": bool(np.array_equal(got[0], want)),
                      "errors": instance.validation_errors[before:]})
    print("REPORT" + json.dumps(cases), flush=True)
    import os
    os._exit(0)  # GPU-AV's teardown aborts on lavapipe (test_buffer_bounds.py)
''')


@pytest.mark.live
@pytest.mark.gpu_av
def test_split_k_stays_inside_its_buffers(live_device_info, tmp_path) -> None:
    """Both dispatches under GPU-assisted validation (as test_buffer_bounds.py runs the
    khr variants): the slices' overlapping batch strides, the exact variant's look-ahead
    and the reduction touch nothing outside their buffers."""
    from coopmat.device.instance import VALIDATION_LAYER
    from coopmat.device.vkffi import vk

    if VALIDATION_LAYER not in {p.layerName for p in vk().vkEnumerateInstanceLayerProperties()}:
        pytest.skip(f"{VALIDATION_LAYER} is not installed")
    env = gpu_av_env(tmp_path)
    env.pop(SPLIT_K_ENV, None)
    proc = subprocess.run([sys.executable, "-c", GPU_AV_CHILD], env=env, capture_output=True,
                          text=True, timeout=1200)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    cases = json.loads(lines[-1][len("REPORT"):])
    assert len(cases) == 2 and all("split=" in c["case"] and "split=1" not in c["case"]
                                    for c in cases)
    assert "-exact-" in cases[0]["case"] and "-clamped-clampedcols" in cases[1]["case"], cases
    bad = [c for c in cases if c["errors"] or not c["equal"]]
    assert not bad, json.dumps(bad, indent=1)[:6000]
