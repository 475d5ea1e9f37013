"""The opt-in integer product: matmul / linear with activation_quant="q8_1" against a q4_0
or q8_0 weight (x quantized to q8_1 blocks by codegen/quant_q8_1.py, multiplied in 8-bit
integer dot products by codegen/gemv_q8_1.py).

Oracles: tests/support/q8_1_oracle.py (numpy q8_1 from ggml's definition, itself checked
against gguf.quants in tests/unit/test_act_quant.py), gguf.quants for the weight, numpy in
float64.
- Exact cases: x of integers with a +-127 in every block (q8_1 scale d = 1, so qs = x) and
  weights with scale 1: every integer sum and float32 operation is exact, so any wrong
  byte, nibble, block, row, column, scale or sum shows as an exact mismatch.
- Halves: x of integers with a +-254 in every block (d = 2), so odd elements are ties
  that roundf sends away from zero (round-half-even would not).
- Random cases: the elementwise bound of x's quantization plus float32 and result
  rounding (q8_1_oracle.error_bound), the product of the oracle's q8_1 x to float32
  rounding, and the relative RMS error of Gaussian x (measured 0.5 %) under 1 %.
Exact agreement with the oracle's quantization assumes a correctly rounded float32
division (amax / 127, 1 / d), as lavapipe's; Vulkan allows 2.5 ulp, so on other devices
a q may land one step off where x / d is within an ulp of a half, which the comparisons
there allow for.
Rows 1 to 16 on five kernels: one row, 3 rows, and 8-row workgroups (11 and 16 rows: two
row blocks, the second clamped for 11).
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.live

gguf = pytest.importorskip("gguf")
coopmat = pytest.importorskip("coopmat")

from conftest import is_lavapipe  # noqa: E402
from q8_1_oracle import dequantize_q8_1, error_bound, exact_x, quantize_q8_1, roundf  # noqa: E402
from quant_oracle import RNG, exact_weight, oracle  # noqa: E402

from coopmat.api.matmul import last_kernel_traits  # noqa: E402

# (format, M, K, N): K of 2, 3, 5 and 8 blocks; N not whole workgroup strips.
CASES = [("q4_0", 1, 256, 40), ("q8_0", 3, 96, 24), ("q4_0", 11, 160, 16),
         ("q4_0", 16, 64, 8), ("q8_0", 16, 128, 40)]


@pytest.mark.parametrize("fmt,M,K,N", CASES)
def test_exact(rt, fmt, M, K, N):
    w = exact_weight(fmt, N, K)
    x = exact_x(RNG, M, K)
    qs, d, _ = quantize_q8_1(x)
    assert np.all(d == 1) and np.array_equal(qs.reshape(M, K), x), "precondition"
    y = coopmat.matmul(x, coopmat.quantize(w, fmt).T, activation_quant="q8_1",
                       dtype=np.float32)
    assert isinstance(y, coopmat.Array) and y.shape == (M, N)
    np.testing.assert_array_equal(y.numpy(), x.astype(np.float64) @ oracle(fmt, w).T)
    t = last_kernel_traits()
    assert t.family == "gemv_q8_1" and t.b_quant == fmt


# (format, M, K, N): the GPU tiles (gemv_tiles.INTEGER_TILES) against few columns (two
# subgroups sharing K: a full step and a remainder) and against many (8 columns a subgroup).
GPU_TILE_CASES = [("q4_0", 2, 2 * 4 * 32 * 32 + 96, 20), ("q8_0", 3, 128, 8200)]


@pytest.mark.parametrize("fmt,M,K,N", GPU_TILE_CASES)
def test_gpu_tiles(rt, monkeypatch, fmt, M, K, N):
    """The tiles the policy takes on a GPU, run here (the CPU driver's policy keeps the
    float kernel's default tile)."""
    from coopmat.policy import act_quant
    monkeypatch.setattr(act_quant, "is_cpu", lambda info: False)
    w = exact_weight(fmt, N, K)
    x = exact_x(RNG, M, K)
    y = coopmat.matmul(x, coopmat.quantize(w, fmt).T, activation_quant="q8_1",
                       dtype=np.float32)
    np.testing.assert_array_equal(y.numpy(), x.astype(np.float64) @ oracle(fmt, w).T)
    t = last_kernel_traits()
    assert (t.cols, t.k_splits) == ((4, 2) if N < 8192 else (8, 1)), t.describe()


def test_rounding_halves_away_from_zero(rt):
    fmt, M, K, N = CASES[1]
    w = exact_weight(fmt, N, K)
    x = exact_x(RNG, M, K, 254)  # +-254 in every block: d = 2, odd elements halves
    qs, d, _ = quantize_q8_1(x)
    assert np.all(d == 2) and np.array_equal(qs.reshape(M, K), roundf(x / 2)), "precondition"
    wd = oracle(fmt, w)
    want = (2 * roundf(x.astype(np.float64) / 2)) @ wd.T
    assert not np.array_equal(want, (2 * np.round(x.astype(np.float64) / 2)) @ wd.T)
    y = coopmat.matmul(x, coopmat.quantize(w, fmt).T, activation_quant="q8_1",
                       dtype=np.float32).numpy()
    if is_lavapipe(rt.device.info):
        np.testing.assert_array_equal(y, want)
    else:  # a q one step (2) off per row at most
        np.testing.assert_array_less(np.abs(y - want), 2 * np.abs(wd).max() + 1e-9)


@pytest.mark.parametrize("fmt,M,K,N", CASES)
def test_random_within_bound(rt, fmt, M, K, N):
    """Gaussian x and weights, float16 result (the default): inside the bound, the oracle's
    q8_1 product to rounding, and the measured error level."""
    w = RNG.standard_normal((N, K)).astype(np.float32)
    x = RNG.standard_normal((M, K)).astype(np.float16)
    wd = oracle(fmt, w)
    y = coopmat.matmul(x, coopmat.quantize(w, fmt).T, activation_quant="q8_1")
    assert y.dtype == np.float16
    y = y.numpy().astype(np.float64)
    exact = x.astype(np.float64) @ wd.T
    assert np.all(np.abs(y - exact) <= error_bound(x, wd, 2.0 ** -11))
    qs, d, _ = quantize_q8_1(x)
    via = dequantize_q8_1(qs, d) @ wd.T
    mag = np.abs(x.astype(np.float64)) @ np.abs(wd).T
    step = 0 if is_lavapipe(rt.device.info) else d.max() * np.abs(wd).max()  # see above
    assert np.all(np.abs(y - via) <= 2.0 ** -11 * np.abs(via) + 2.0 ** -16 * mag + step)
    rel = np.sqrt(((y - exact) ** 2).mean() / (exact ** 2).mean())
    assert 1e-4 < rel < 0.01, rel  # above 0: x really was quantized


def test_linear_with_epilogue_and_device_x(rt):
    """linear(x, w, bias, activation, activation_quant=...) with x a device array: the
    epilogue on the integer kernel's float32 sums."""
    M, K, N = 1, 256, 40
    w = exact_weight("q4_0", N, K)
    x = exact_x(RNG, M, K)
    bias = RNG.uniform(-4, 4, N).astype(np.float16)
    y = coopmat.linear(coopmat.asarray(x), coopmat.quantize(w, "q4_0"), bias, "relu",
                       activation_quant="q8_1", dtype=np.float32)
    # The integer sum is exact in float32; adding the bias rounds once there.
    z = (x.astype(np.float64) @ oracle("q4_0", w).T).astype(np.float32) + \
        bias.astype(np.float32)
    np.testing.assert_array_equal(y.numpy(), np.maximum(z, 0))
    assert last_kernel_traits().family == "gemv_q8_1"


def test_refusals(rt):
    """A float weight, an unknown name, bfloat16 x or a column-major device x: errors
    naming why (a numpy x is staged row-major)."""
    w = exact_weight("q8_0", 8, 64)
    q = coopmat.quantize(w, "q8_0")
    x = exact_x(RNG, 2, 64)
    with pytest.raises(ValueError, match="quantized weight"):
        coopmat.matmul(x, w.T.astype(np.float16), activation_quant="q8_1")
    with pytest.raises(ValueError, match="'q8_1'"):
        coopmat.matmul(x, q.T, activation_quant="q8_0")
    with pytest.raises(ValueError, match="row-major x"):  # a transposed device view
        coopmat.matmul(coopmat.asarray(exact_x(RNG, 64, 64)).T, q.T, activation_quant="q8_1")
    if "bfloat16" in coopmat.supported_dtypes():
        import ml_dtypes
        with pytest.raises(ValueError, match="float16 activations"):
            coopmat.matmul(x.astype(ml_dtypes.bfloat16), q.T, activation_quant="q8_1")


# (format, M, K, N, epilogue): a full K step and a remainder of blocks (lavapipe's 8-lane
# subgroups take 32 blocks a step of one q4_0 row, 8 of q8_0's); N not whole tiles.
FUSED_CASES = [("q4_0", 1, 1120, 36, False), ("q8_0", 3, 352, 20, False),
               ("q4_0", 1, 256, 36, True)]


@pytest.mark.parametrize("fmt,M,K,N,epilogue", FUSED_CASES)
def test_fused_quantization_matches_the_pass(rt, monkeypatch, fmt, M, K, N, epilogue):
    """The kernel quantizing x itself (within FUSED_MAX_ROWS) gives the bits of the
    quantizing pass's two dispatches, on Gaussian x (every rounding path taken) with a
    zero block (d = 0)."""
    from coopmat.policy import act_quant
    w = RNG.standard_normal((N, K)).astype(np.float32)
    x = RNG.standard_normal((M, K)).astype(np.float16)
    x[-1, 32:64] = 0
    q = coopmat.quantize(w, fmt)
    bias = RNG.uniform(-4, 4, N).astype(np.float16) if epilogue else None

    def run() -> tuple[np.ndarray, str]:
        y = coopmat.linear(x, q, bias, "relu" if epilogue else None,
                           activation_quant="q8_1", dtype=np.float32).numpy()
        return y, last_kernel_traits().describe()

    monkeypatch.setattr(act_quant, "FUSED_MAX_ROWS", M)
    fused, name = run()
    assert name.endswith("-aq8_1f"), name
    monkeypatch.setattr(act_quant, "FUSED_MAX_ROWS", 0)
    passed, name = run()
    assert name.endswith("-aq8_1"), name
    np.testing.assert_array_equal(fused, passed)
    wd = oracle(fmt, w)
    y = np.maximum(x.astype(np.float64) @ wd.T + (0 if bias is None else bias), 0) \
        if epilogue else x.astype(np.float64) @ wd.T
    assert np.all(np.abs(fused - y) <= error_bound(x, wd, 2.0 ** -20) + 2.0 ** -20 * np.abs(y))
