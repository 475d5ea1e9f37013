"""The khr kernel's exact variant with clamped rows and columns (KhrTraits.clamp_rows,
clamp_cols): K whole tiles, M or N ending inside the last block. Rows past M read A's row
M - 1, columns past N B's column N - 1, and neither is stored; the straddling blocks'
D goes element by element. Live tests run on the device
scripts/test runs on (lavapipe in CI, the GPU by hand) against numpy in float64: small
integer operands give exact sums, so results must equal the float64 product rounded
once; general data and the fused operations get test_epilogue's bound.
(tests/test_buffer_bounds.py has GPU-AV watch the clamped reads stay inside A.)
"""

from __future__ import annotations

import numpy as np
import pytest
from epilogue_oracle import check
from epilogue_oracle import oracle as epilogue_oracle
from sampling import pairwise

import coopmat
import coopmat.api.matmul
from coopmat.codegen import KhrTraits

pytestmark = pytest.mark.live

RNG = np.random.default_rng(41)
F16, F32 = np.float16, np.float32
N, K = 256, 512  # whole tiles of every device's few-row and general tiles
N_EDGE = 200  # 8 elements past a multiple of every device's tile_n (32, 64, 128)


def small_ints(*shape: int) -> np.ndarray:
    return RNG.integers(-3, 4, size=shape).astype(F16)


def last_traits() -> KhrTraits:
    traits = coopmat.api.matmul._last.result.traits
    assert isinstance(traits, KhrTraits)
    return traits


@pytest.fixture
def khr(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The khr family (a GPU runs gemv for a few rows against a column-major B)."""
    coopmat.set_options(family="khr")
    return monkeypatch


# Every M, N, B layout, result type and split, and every pair of them
# (tests/support/sampling.py).
@pytest.mark.parametrize("M,n,b_col,out,S", pairwise([5, 8, 12, 20, 48, 100], [N, N_EDGE],
                                                     [True, False], [F16, F32], [1, 2]))
def test_results(live_device_info, khr, M: int, n: int, b_col: bool, out: type,
                 S: int) -> None:
    coopmat.set_options(split_k=S)
    a = small_ints(M, K)
    b = np.ascontiguousarray(small_ints(n, K)).T if b_col else small_ints(K, n)
    d = coopmat.matmul(a, b, dtype=out)
    np.testing.assert_array_equal(d, (a.astype(np.float64) @ b).astype(out))
    t = last_traits()
    assert t.exact and t.clamp_rows == (M % t.tile.tile_m != 0), t.describe()
    assert t.clamp_cols == (n % t.tile.tile_n != 0), t.describe()
    assert coopmat.api.matmul._last.result.split_k in (1, S)


@pytest.mark.parametrize(("M", "n"), [(8, N), (20, N), (32, N_EDGE), (20, N_EDGE)])
def test_fused_operations(live_device_info, khr, M: int, n: int) -> None:
    """bias, gelu and a residual on the edge blocks' element-wise path."""
    x = (RNG.standard_normal((M, K)) / 8).astype(F16)
    w = (RNG.standard_normal((n, K)) / 8).astype(F16)
    bias = RNG.standard_normal(n).astype(F16)
    residual = RNG.standard_normal((M, n)).astype(F16)
    d = coopmat.linear(x, w, bias=bias, activation="gelu_tanh", residual=residual)
    t = last_traits()
    assert t.exact and t.clamp_rows == (M % t.tile.tile_m != 0), t.describe()
    ref, tol, _ = epilogue_oracle(x, w.T, bias, "gelu_tanh", residual)
    check(d, ref, tol, F16)


@pytest.mark.parametrize("M", [12, 40])
def test_device_arrays(live_device_info, khr, M: int) -> None:
    """Arrays in and out (their allocations keep less read-past margin than numpy
    operands' staging: the plan takes the bounds-checked variant where it lacks room)."""
    a, w = small_ints(M, K), small_ints(N, K)
    d = (coopmat.asarray(a) @ coopmat.asarray(w).T).numpy()
    np.testing.assert_array_equal(d, (a.astype(np.float64) @ w.T).astype(F16))
    t = last_traits()
    assert t.clamp_rows == (t.exact and M % t.tile.tile_m != 0), t.describe()


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_quantized_weight(live_device_info, khr, fmt: str) -> None:
    """A quantized B on the khr kernel, 12 rows: integer weights whose blocks have scale
    1 (tests/test_quant.py), so the sums are exact."""
    pytest.importorskip("gguf")
    from quant_oracle import exact_weight, oracle

    w = exact_weight(fmt, N, K)
    deq = oracle(fmt, w)
    assert np.array_equal(deq, w), "precondition: the blocks have d = 1"
    x = small_ints(12, K)
    d = coopmat.matmul(x, coopmat.quantize(w, fmt).T, dtype=F32)
    np.testing.assert_array_equal(d, x.astype(np.float64) @ deq.T)
    t = last_traits()
    assert t.b_quant == fmt and t.exact and t.clamp_rows == (12 % t.tile.tile_m != 0)
