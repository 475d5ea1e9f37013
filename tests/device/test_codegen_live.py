"""Generated kernels run on a Vulkan device (lavapipe under scripts/cpu-vulkan) and match numpy.

Tolerances. Integer results must be exact. For float results the reference is computed in
float64 from the same (already rounded) f16 inputs, so the only error is the kernel's own
accumulation and scaling; by the standard bound for recursive summation,
|D - ref| <= (K + 8) * u * (|alpha| * |A| @ |B| + |beta| * |C|) elementwise, with u the unit
roundoff of the accumulator type (2^-24 for f32, 2^-11 for f16). The "+ 8" covers the
alpha/beta multiply-add and the final rounding to the result type. Padding between rows
(strides > logical dims) holds NaN / 0x55 patterns, so a read of anything outside the
matrix shows up in the result, and D's gaps are checked to be untouched.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kernel_runner import KernelRunner, NoDevice, pack, param_id, unpack
from sampling import pairwise

from coopmat.codegen import (
    GemmParams,
    KhrTraits,
    Layout,
    Tile,
    aligned_ok,
    build_gemm,
    cache,
    exact_ok,
)
from coopmat.codegen.abi import clamped_ok
from coopmat.common.enums import ComponentType as CT

pytestmark = pytest.mark.live

SUBGROUP = 8
SHAPE = (8, 8, 8)
CONFIGS = [  # lavapipe's list: (A/B type, result type)
    (CT.FLOAT16, CT.FLOAT16), (CT.FLOAT16, CT.FLOAT32), (CT.UINT8, CT.UINT32),
    (CT.SINT8, CT.SINT32),
]
DEFAULT_TILE = Tile(32, 32, 16, 2, 2, 2)
NP: dict[CT, Any] = {CT.FLOAT16: np.float16, CT.FLOAT32: np.float32, CT.UINT8: np.uint8,
                     CT.SINT8: np.int8, CT.UINT32: np.uint32, CT.SINT32: np.int32}


def _device_runs_pinned_configs() -> None:
    """These tests pin lavapipe's configs (8x8x8 at subgroup size 8). Elsewhere they would
    run configs the device never listed, which is undefined; there the dispatcher's tests
    (tests/test_matmul.py) run the kernels through the device's own configs."""
    from coopmat import device
    from coopmat.common.errors import CoopmatError
    try:
        info = device.select_info()
    except CoopmatError:
        return  # KernelRunner below reports the missing device
    shapes = {(p.M, p.N, p.K) for p in info.cooperative_matrix_properties}
    if info.limits.min_subgroup_size != SUBGROUP or SHAPE not in shapes:
        pytest.skip(f"pinned to 8x8x8 configs at subgroup size {SUBGROUP}; {info.name} lists "
                    f"{sorted(shapes)} at subgroup size {info.limits.subgroup_size} "
                    f"(tests/test_matmul.py covers it)")


@pytest.fixture(scope="module")
def runner() -> KernelRunner:
    _device_runs_pinned_configs()
    try:
        return KernelRunner(["shaderFloat16", "storageBuffer16BitAccess", "shaderInt8",
                             "storageBuffer8BitAccess"])
    except NoDevice as e:
        pytest.skip(f"no Vulkan device with VK_KHR_cooperative_matrix: {e} "
                    f"(run under scripts/cpu-vulkan for lavapipe)")


def traits(ab: CT, res: CT, a_layout: Layout, b_layout: Layout, has_c: bool, aligned: bool,
           tile: Tile = DEFAULT_TILE) -> KhrTraits:
    m, n, k = SHAPE
    return KhrTraits(a_type=ab, b_type=ab, c_type=res, result_type=res, a_layout=a_layout,
                     b_layout=b_layout, has_c=has_c, tile=tile, subgroup_size=SUBGROUP,
                     m=m, n=n, k=k, aligned=aligned)


@dataclass
class Case:
    M: int
    N: int
    K: int
    batch: int = 1
    pad: int = 0  # extra elements per line in every operand (strides > logical dims)
    broadcast: str = ""  # operands ("a", "b", "c") with batch stride 0
    alpha: float | int = 1
    beta: float | int = 0


def _random(t: CT, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if t == CT.FLOAT16:
        return rng.uniform(-1, 1, shape).astype(np.float16)
    if t == CT.FLOAT32:
        return rng.uniform(-1, 1, shape).astype(np.float32)
    info = np.iinfo(NP[t])
    lo, hi = (info.min, info.max) if info.bits == 8 else (-1000, 1000)
    lo = max(lo, 0) if info.min == 0 else lo
    return rng.integers(lo, hi, shape, endpoint=True).astype(NP[t])


def _fill(t: CT) -> float | int:
    return np.nan if t.is_float else 0x55


def run_case(runner: KernelRunner, tr: KhrTraits, case: Case, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    M, N, K, batch = case.M, case.N, case.K, case.batch
    A = _random(tr.a_type, (batch, M, K), rng)
    B = _random(tr.b_type, (batch, K, N), rng)
    C = _random(tr.c_type, (batch, M, N), rng)
    a_col, b_col = tr.a_layout == Layout.COLUMN_MAJOR, tr.b_layout == Layout.COLUMN_MAJOR
    lda = (M if a_col else K) + case.pad
    ldb = (K if b_col else N) + case.pad
    ldc = ldd = N + case.pad
    bs = {name: 0 if name in case.broadcast else size for name, size in
          (("a", lda * (K if a_col else M) + case.pad), ("b", ldb * (N if b_col else K)),
           ("c", ldc * M), ("d", ldd * M + case.pad))}
    for name, mats in (("a", A), ("b", B), ("c", C)):
        if name in case.broadcast:
            mats[1:] = mats[0]
    p = GemmParams(M, N, K, lda, ldb, ldc, ldd, bs["a"], bs["b"], bs["c"], bs["d"],
                   case.alpha, case.beta)
    kernel = build_gemm(tr)
    if tr.aligned:
        assert aligned_ok(tr, p), "test case does not meet the aligned preconditions"
    if tr.clamp_rows or tr.clamp_cols:
        assert clamped_ok(tr, p) and not exact_ok(tr, p), "test case is not K tiles"
    elif tr.exact:
        assert exact_ok(tr, p), "test case is not whole tiles"
    sentinel = np.array(_fill(tr.result_type), dtype=NP[tr.result_type])
    d_flat = np.full((batch - 1) * bs["d"] + (M - 1) * ldd + N, sentinel)
    buffers = {0: pack(A, a_col, lda, bs["a"], _fill(tr.a_type)),
               1: pack(B, b_col, ldb, bs["b"], _fill(tr.b_type)), 2: d_flat}
    if tr.has_c:
        buffers[3] = pack(C, False, ldc, bs["c"], _fill(tr.c_type))
    raw = runner.run(kernel, p, buffers, batch)
    out_flat = np.frombuffer(raw, dtype=NP[tr.result_type])[:d_flat.size]
    D = unpack(out_flat, batch, M, N, ldd, bs["d"])

    # Gaps of D (between rows and between batches) must be untouched.
    written = np.zeros(d_flat.size, bool)
    for b, i in itertools.product(range(batch), range(M)):
        written[b * bs["d"] + i * ldd:b * bs["d"] + i * ldd + N] = True
    np.testing.assert_array_equal(out_flat[~written].view(np.uint8),
                                  d_flat[~written].view(np.uint8), "write outside D")

    beta = case.beta if tr.has_c else 0
    if tr.result_type.is_float:
        a64, b64, c64 = A.astype(np.float64), B.astype(np.float64), C.astype(np.float64)
        ref = case.alpha * (a64 @ b64) + (beta * c64 if tr.has_c else 0)
        bound = abs(case.alpha) * (np.abs(a64) @ np.abs(b64)) + abs(beta) * np.abs(c64)
        u = 2.0 ** -11 if tr.result_type == CT.FLOAT16 else 2.0 ** -24
        tol = (K + 8) * u * bound + 1e-30
        err = np.abs(D.astype(np.float64) - ref)
        assert np.all(np.isfinite(D)), "non-finite output: a padding element was read"
        worst = np.unravel_index(np.argmax(err - tol), err.shape)
        assert np.all(err <= tol), (f"max error {err[worst]} > tol {tol[worst]} at {worst} "
                                    f"(got {D[worst]}, want {ref[worst]})")
    else:
        a64, b64, c64 = A.astype(np.int64), B.astype(np.int64), C.astype(np.int64)
        iref: np.ndarray = int(case.alpha) * (a64 @ b64)
        if tr.has_c:
            iref = iref + int(beta) * c64
        want = (iref & 0xFFFFFFFF).astype(np.uint32).view(NP[tr.result_type])
        np.testing.assert_array_equal(D, want)


LAYOUTS = list(itertools.product(Layout, Layout))


def case_id(config: tuple[CT, CT], layouts: tuple[Layout, Layout], has_c: bool,
            *rest: object) -> str:
    more = [f"buf{x}" if isinstance(x, int) else str(x) for x in rest]
    return "-".join([param_id(config), param_id(layouts), "c" if has_c else "noc", *more])


# Edge handling: bounds checks everywhere (general), no checks inside aligned operands,
# none at all on whole tiles (exact), or the exact variant with clamped rows and/or columns.
EDGES = ["general", "aligned", "exact", "clamped"]
# Clamped cases' M and N, by buffering: M or N ending inside the last block of a 32 x 32
# tile (8 rows: inside the first; 88 columns: 24 into the third), rows, columns or both.
CLAMPED_MN = {1: (40, 96), 2: (8, 96), 3: (40, 88), 4: (8, 88), 5: (64, 88)}
# A covering sample of the variants (tests/support/sampling.py): every config, layout pair,
# C, edge handling and buffering, and every pair of them, at least once, in one sweep (a
# kernel each: seconds of lavapipe's compile). Every variant of lavapipe's list runs in
# the interpreter (tests/interpreter).
VARIANT_CASES = pairwise(CONFIGS, LAYOUTS, [False, True], EDGES, [1, 2, 3, 4, 5])


@pytest.mark.parametrize("config,layouts,has_c,edges,buffering", VARIANT_CASES,
                         ids=[case_id(*c) for c in VARIANT_CASES])
def test_variants(runner: KernelRunner, config: tuple[CT, CT], layouts: tuple[Layout, Layout],
                  has_c: bool, edges: str, buffering: int) -> None:
    """lavapipe's configs x layouts x C x edge handling x buffering (one shared stage, two,
    streamed B fragments, two register sets). General and aligned: edges in M, N and K, K
    an odd number of steps, so stages and register sets alternate and wrap. Exact and
    clamped: whole K tiles, several workgroups each way, padded strides and a broadcast
    batch; the padding of A and B is NaN and D's gaps are checked, so a read of a row or
    column past the matrix, or a store of one, shows."""
    ab, res = config
    alpha, beta = (0.5, -1.5) if res.is_float else (3, -2)
    tr = traits(ab, res, *layouts, has_c, edges != "general", Tile(32, 32, 16, 2, 2, buffering))
    if edges == "general":  # primes, odd strides
        case = Case(37, 29, 71, pad=3, alpha=alpha, beta=beta)
    elif edges == "aligned":  # inner dims and strides multiples of 16 elements; M, N off the tile
        case = Case(48, 80, 80, pad=16, alpha=alpha, beta=beta)
    else:
        M, N = (64, 96) if edges == "exact" else CLAMPED_MN[buffering]
        tr = replace(tr, exact=True, clamp_rows=M % 32 != 0, clamp_cols=N % 32 != 0)
        case = Case(M, N, 80, batch=2, pad=16, broadcast="b", alpha=alpha, beta=beta)
    run_case(runner, tr, case, seed=hash((ab, res, layouts, has_c, edges, buffering)) % 1000)


# Many cases of few kernels: on one xdist worker, so that each kernel compiles once.
@pytest.mark.xdist_group("test_sizes_general")
@pytest.mark.parametrize("size", [(1, 1, 1), (1, 19, 3), (23, 1, 7), (8, 8, 8), (9, 7, 1),
                                  (32, 32, 16), (33, 31, 17), (5, 70, 40), (64, 3, 100)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layouts", [(Layout.ROW_MAJOR, Layout.ROW_MAJOR),
                                     (Layout.COLUMN_MAJOR, Layout.COLUMN_MAJOR)], ids=param_id)
def test_sizes_general(runner: KernelRunner, size: tuple[int, int, int],
                       layouts: tuple[Layout, Layout]) -> None:
    tr = traits(CT.FLOAT16, CT.FLOAT32, *layouts, True, False)
    run_case(runner, tr, Case(*size, alpha=1.0, beta=1.0))
    for buffering in (3, 5):  # one to seven K steps: stages and register sets wrap
        staged = traits(CT.FLOAT16, CT.FLOAT32, *layouts, True, False,
                        Tile(32, 32, 16, 2, 2, buffering))
        run_case(runner, staged, Case(*size, alpha=1.0, beta=1.0))


@pytest.mark.xdist_group("test_batch_with_broadcast")  # as test_sizes_general
@pytest.mark.parametrize("config", CONFIGS[1:3], ids=param_id)
@pytest.mark.parametrize("broadcast", ["a", "b", "c", "ab"])
@pytest.mark.parametrize("buffering", [2, 3], ids=lambda b: f"buf{b}")
def test_batch_with_broadcast(runner: KernelRunner, config: tuple[CT, CT], broadcast: str,
                              buffering: int) -> None:
    ab, res = config
    tr = traits(ab, res, Layout.ROW_MAJOR, Layout.COLUMN_MAJOR, True, False,
                Tile(32, 32, 16, 2, 2, buffering))
    run_case(runner, tr, Case(19, 21, 35, batch=3, pad=2, broadcast=broadcast, alpha=2,
                              beta=1))


@pytest.mark.parametrize("buffering", [2, 3], ids=lambda b: f"buf{b}")
def test_batch_aligned(runner: KernelRunner, buffering: int) -> None:
    tr = traits(CT.SINT8, CT.SINT32, Layout.COLUMN_MAJOR, Layout.ROW_MAJOR, True, True,
                Tile(32, 32, 16, 2, 2, buffering))
    run_case(runner, tr, Case(40, 24, 32, batch=2, pad=16, broadcast="b", alpha=-1, beta=2))


# Tiles other than the default, each once, with one buffering and one edge handling:
# every buffering but 5 meets both edge handlings, and every tile shape runs (the default
# tile's variants, buffering 5 among them: test_variants above, and every one in the
# interpreter). A tile's sizes are loop counts of the same code, so each shape once is
# enough, and the odd tile (3 x 3 x 3 fragments on one subgroup), whose kernel is the
# slowest to compile, runs once.
OTHER_TILES = [(Tile(8, 8, 8, 1, 1, 1), True), (Tile(16, 32, 8, 1, 2, 3), False),
               (Tile(64, 16, 32, 4, 1, 4), False), (Tile(24, 24, 24, 1, 1, 3), True),
               (Tile(32, 64, 16, 2, 2, 4), True),
               # tiles.filling_ladder's shapes at lavapipe's 8 x 8 x 8
               (Tile(32, 32, 64, 2, 2, 2), False), (Tile(16, 32, 64, 1, 2, 2), True),
               (Tile(8, 16, 64, 1, 2, 1), False)]


@pytest.mark.parametrize("tile,aligned", OTHER_TILES,
                         ids=[t.describe().replace(" ", "-") + ("-aligned" if a else "-general")
                              for t, a in OTHER_TILES])
def test_other_tiles(runner: KernelRunner, tile: Tile, aligned: bool) -> None:
    tr = traits(CT.FLOAT16, CT.FLOAT32, Layout.COLUMN_MAJOR, Layout.ROW_MAJOR, True, aligned,
                tile)
    case = Case(48, 64, 80, pad=8, alpha=1.0, beta=0.25) if aligned else Case(
        45, 51, 27, pad=1, alpha=1.0, beta=0.25)
    run_case(runner, tr, case)


def test_misaligned_output_stride_falls_back(runner: KernelRunner) -> None:
    """General variant, sizes that fill whole tiles but ldd breaks coopmat store alignment."""
    tr = traits(CT.FLOAT16, CT.FLOAT16, Layout.ROW_MAJOR, Layout.ROW_MAJOR, True, False)
    run_case(runner, tr, Case(32, 32, 32, pad=1, alpha=1.0, beta=1.0))


def test_integer_extremes(runner: KernelRunner) -> None:
    """Sign extension of i8 and zero extension of u8 at the ends of their ranges."""
    for ab, res, val in ((CT.SINT8, CT.SINT32, -128), (CT.UINT8, CT.UINT32, 255)):
        tr = traits(ab, res, Layout.ROW_MAJOR, Layout.ROW_MAJOR, False, False)
        M = N = K = 9
        A = np.full((1, M, K), val, NP[ab])
        p = GemmParams(M, N, K, K, N, N, N)
        raw = runner.run(build_gemm(tr), p, {0: pack(A, False, K, 0, 0),
                                             1: pack(A, False, N, 0, 0),
                                             2: np.zeros(M * N, NP[res])})
        got = np.frombuffer(raw, NP[res])[:M * N]
        assert np.all(got == K * val * val), got


def test_cached_kernel_runs(runner: KernelRunner, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A module read back from the disk cache is the one that runs."""
    monkeypatch.setenv("COOPMAT_CACHE_DIR", str(tmp_path))
    tr = traits(CT.UINT8, CT.UINT32, Layout.ROW_MAJOR, Layout.ROW_MAJOR, False, False)
    build_gemm(tr)
    cache.clear_memory_cache()
    run_case(runner, tr, Case(10, 12, 14))
