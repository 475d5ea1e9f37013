"""The rows kernel family (few rows, B streamed from global memory) against numpy, live.

coopmat's policy keeps khr as the default on lavapipe, so these tests force the family
(family="rows") and check that it ran. Oracles and tolerances as in tests/test_matmul.py:
small-integer float16 data is exact in every accumulator here, so those results must equal
numpy's float64 product exactly; general data is held to the K-term dot-product bound.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from matmul_oracle import float_tolerance, reference, require, small_ints
from sampling import pairwise

import coopmat
import coopmat.api.matmul
from coopmat.codegen import GemmParams, RowsTraits, build_gemm, rows_tile

RNG = np.random.default_rng(4321)


@pytest.fixture(scope="module")
def pairs(live_device_info):
    return coopmat.supported_dtypes()


def rows_matmul(a, b, **kw):
    d = coopmat.matmul(a, b, family="rows", **kw)
    t = coopmat.api.matmul.last_kernel_traits()
    assert isinstance(t, RowsTraits), t
    return d, t


def weight(K, N, dtype, column_major):
    """B as x @ W (row-major K x N) or x @ w.T (w an N x K row-major array)."""
    if column_major:
        return small_ints((N, K), dtype).T
    return small_ints((K, N), dtype)


# Every M, N x K, B layout and result type, and every pair of them
# (tests/support/sampling.py). M sets the row fragments a workgroup holds (a kernel each,
# 2 to 5 s of lavapipe's compile): one fragment, partly used (1) or whole (8), and
# several with the last partly used (17); more rows are the same code at a larger count
# (64 rows, the most a workgroup takes: test_more_rows_than_one_block).
@pytest.mark.parametrize("M,N,K,column_major,out_dtype,result", [
    (M, *nk, col, *out) for M, nk, col, out in pairwise(
        [1, 8, 17], [(32, 64), (96, 48)], [False, True],
        [(None, np.float16), (np.float32, np.float32)])])
def test_exact(pairs, M, N, K, column_major, out_dtype, result):
    require(pairs, "float16", result)
    a = small_ints((M, K), np.float16)
    b = weight(K, N, np.float16, column_major)
    d, t = rows_matmul(a, b, out_dtype=out_dtype)
    assert t.b_layout.name == ("COLUMN_MAJOR" if column_major else "ROW_MAJOR")
    assert d.dtype == np.dtype(result) and d.shape == (M, N)
    np.testing.assert_array_equal(d, reference(a, b, result).astype(result))


# Every pair of M (one row fragment or three), result type and B layout: each case is a
# kernel with C of its own (test_exact runs them without C).
@pytest.mark.parametrize("M,out_dtype,column_major", pairwise([5, 17], [None, np.float32],
                                                               [False, True]))
def test_alpha_beta_c(pairs, M, out_dtype, column_major):
    """Odd alpha and beta, general data, K = 208 (whole chunks and a partial one; a
    multiple of every listed cooperative-matrix K)."""
    result = np.float16 if out_dtype is None else np.float32
    require(pairs, "float16", result)
    N, K = 64, 208
    a = RNG.standard_normal((M, K)).astype(np.float16)
    b = RNG.standard_normal((N, K)).astype(np.float16).T if column_major else \
        RNG.standard_normal((K, N)).astype(np.float16)
    c = RNG.standard_normal((M, N)).astype(result)
    alpha, beta = 0.71875, -1.375
    d, t = rows_matmul(a, b, c=c, alpha=alpha, beta=beta, out_dtype=out_dtype)
    assert t.has_c
    ref = alpha * reference(a, b, np.float64) + beta * c.astype(np.float64)
    tol = abs(alpha) * float_tolerance(a, b, np.float32, result) + \
        2.0 ** -11 * np.abs(ref) + 1e-30
    err = np.abs(d.astype(np.float64) - ref)
    assert np.all(err <= tol), np.max(err / tol)
    assert err.max() < 0.01 * np.abs(ref).max()  # accumulation error, not garbage


def test_column_major_a_and_a_long_k(pairs):
    """A a transposed view (the general variant's element loads of A), K = 1072 normal
    data: several chunks and a tail (a multiple of every listed cooperative-matrix K)."""
    require(pairs, "float16", np.float32)
    M, N, K = 12, 32, 1072
    a = np.ascontiguousarray(RNG.standard_normal((K, M)).astype(np.float16)).T
    b = RNG.standard_normal((K, N)).astype(np.float16)
    d, t = rows_matmul(a, b, out_dtype=np.float32)
    assert t.a_layout.name == "COLUMN_MAJOR" and not t.aligned
    ref = reference(a, b, np.float64)
    err = np.abs(d - ref)
    assert np.all(err <= float_tolerance(a, b, np.float32, np.float32))


def test_batch_and_broadcast_weight(pairs):
    require(pairs, "float16", np.float16)
    a = small_ints((3, 9, 64), np.float16)
    b = small_ints((3, 64, 32), np.float16)
    d, _ = rows_matmul(a, b)
    np.testing.assert_array_equal(d, reference(a, b, np.float16).astype(np.float16))
    w = weight(64, 32, np.float16, column_major=True)  # one weight for every batch entry
    d, t = rows_matmul(a, w)
    assert t.b_layout.name == "COLUMN_MAJOR"
    np.testing.assert_array_equal(d, reference(a, w, np.float16).astype(np.float16))


def test_more_rows_than_one_block(pairs):
    """Forced past 64 rows: further row blocks (WorkgroupId.y) cover the rest."""
    require(pairs, "float16", np.float16)
    a = small_ints((150, 64), np.float16)
    b = small_ints((64, 32), np.float16)
    d, t = rows_matmul(a, b)
    assert t.tile.tile_m == 64
    np.testing.assert_array_equal(d, reference(a, b, np.float16).astype(np.float16))


# Each signedness once (the multiply's signedness operands, a sign- or zero-extended
# load), one of them with C: a kernel each, 1 to 2 s of lavapipe's compile.
@pytest.mark.parametrize("dtype,result,with_c", [("int8", np.int32, True),
                                                 ("uint8", np.uint32, False)])
def test_integers(pairs, dtype, result, with_c):
    require(pairs, dtype, result)
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max + 1, size=(7, 64), dtype=dtype)
    b = RNG.integers(info.min, info.max + 1, size=(64, 64), dtype=dtype)
    if not with_c:
        d, t = rows_matmul(a, b)
        assert not t.has_c
        np.testing.assert_array_equal(d, reference(a, b, result))
    else:
        d, t = rows_matmul(a, b, c=np.ones((7, 64), result), alpha=3, beta=-2)
        assert t.has_c
        np.testing.assert_array_equal(d, (3 * reference(a, b, np.int64) - 2).astype(result))


def test_swept_tile(pairs, live_device_info):
    """A non-default tile, passed as explicit traits (as a GPU sweep would): 2 row
    fragments, NF 1, S 2, U 1, kc 2 k; K = 40 is whole chunks and a partial one."""
    require(pairs, "float16", np.float32)
    from coopmat.codegen import Layout
    from coopmat.common.enums import ComponentType as CT
    from coopmat.dispatch.gemm import PreparedGemm
    from coopmat.dispatch.runtime import runtime
    from coopmat.policy import TypePair, config_for
    from coopmat.policy.rows_tiles import rows_traits

    pair = TypePair(CT.FLOAT16, CT.FLOAT32)
    cfg = config_for(live_device_info, pair)
    tile = rows_tile(cfg.M, cfg.N, row_frags=2, nf=1, splits=2, unroll=1, kc=2 * cfg.K)
    t = rows_traits(cfg, live_device_info.limits, Layout.ROW_MAJOR, Layout.ROW_MAJOR, False,
                    11, tile=tile)
    assert t.tile == replace(tile, tile_m=-(-11 // cfg.M) * cfg.M)
    a = small_ints((11, 5 * cfg.K), np.float16)
    b = small_ints((5 * cfg.K, 3 * cfg.N), np.float16)
    g = PreparedGemm(runtime(), pair, a[None], b[None], None, 1, 1.0, 0.0, traits=t)
    try:
        out = np.empty((1, 11, 3 * cfg.N), np.float32)
        g.execute()
        g.read(out)
    finally:
        g.release()
    assert g.traits == t
    np.testing.assert_array_equal(out[0], reference(a, b, np.float32))


def test_preconditions_are_errors(pairs):
    require(pairs, "float16", np.float16)
    with pytest.raises(ValueError, match="N=20 is not a multiple"):
        coopmat.matmul(small_ints((4, 64), np.float16), small_ints((64, 20), np.float16),
                       family="rows")
    # The kernel itself refuses parameters that break them, whoever calls it.
    from coopmat.policy.variants import current_device, rows_variants

    t = rows_variants(current_device())[0]
    kernel = build_gemm(t)
    with pytest.raises(ValueError, match="rows kernel cannot run"):
        kernel.push_constants(GemmParams(M=4, N=t.tile.tile_n + 1, K=64, lda=64,
                                         ldb=t.tile.tile_n + 1, ldc=1, ldd=1))
