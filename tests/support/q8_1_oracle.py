"""The oracle of the q8_1 activation quantization (matmul's activation_quant="q8_1"): a
numpy q8_1 quantizer written from the format's definition in ggml (ggml-quants.c,
quantize_row_q8_1_ref; ggml-common.h, block_q8_1), and the error bound of a product of
q8_1-quantized x with a dequantized weight.

gguf.quants has no Q8_1; its Q8_0 quantizer (bit-exact with ggml's reference) computes the
same qs and d (d = amax / 127, qs = roundf(x / d)), so tests check qs and float16(d)
against it, and s against its definition, d * sum(qs)."""

from __future__ import annotations

import numpy as np

BLOCK = 32
QMAX = 127


def exact_x(rng: np.random.Generator, M: int, K: int, top: int = 127) -> np.ndarray:
    """float16 integers in [-top, top] with a +-top in every 32-element block: q8_1 gives
    d = top / 127 (1 for the default, where its qs are x itself)."""
    x = rng.integers(-top, top + 1, (M, K // BLOCK, BLOCK))
    at = rng.integers(0, BLOCK, (M, K // BLOCK))
    np.put_along_axis(x, at[..., None], top * rng.choice([-1, 1], (M, K // BLOCK, 1)), axis=2)
    return x.reshape(M, K).astype(np.float16)


def roundf(t: np.ndarray) -> np.ndarray:
    """C's roundf (halves away from zero), exactly: t - trunc(t) is exact in float."""
    whole = np.trunc(t)
    return whole + np.where(np.abs(t - whole) >= 0.5, np.sign(t), 0)


def quantize_q8_1(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(qs int8 M x nb x 32, d float32 M x nb, s float32 M x nb) of x (M x K, K a multiple
    of 32), in float32 arithmetic as ggml's reference: d = amax / 127, id = 1 / d (0 where
    d = 0), qs = roundf(x * id), s = float(sum(qs)) * d. ggml stores d and s as float16;
    coopmat keeps them float32."""
    M, K = x.shape
    b = np.asarray(x, np.float32).reshape(M, K // BLOCK, BLOCK)
    d = (np.abs(b).max(axis=-1) / np.float32(QMAX)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    qs = roundf(b * inv[..., None]).astype(np.int8)
    s = (qs.sum(axis=-1, dtype=np.int32).astype(np.float32) * d).astype(np.float32)
    return qs, d, s


def dequantize_q8_1(qs: np.ndarray, d: np.ndarray) -> np.ndarray:
    """x as the integer product sees it: qs * d, M x K, float64."""
    M = qs.shape[0]
    return (qs.astype(np.float64) * d.astype(np.float64)[..., None]).reshape(M, -1)


def error_bound(x: np.ndarray, w: np.ndarray, result_unit: float = 0.0) -> np.ndarray:
    """An elementwise bound on |y - x @ w.T| for y the integer product of q8_1-quantized x
    (M x K) with the weight w (N x K, its dequantized values, float64), float32 sums and a
    result rounded with unit `result_unit` (2**-11 for float16, 0 for float32):
    - x's quantization: each element off by at most half its block's step d = amax / 127
      (times 1 + 2**-10 for the float32 rounding of x * (1 / d)):
      sum over blocks of amax / 254 * sum |w| over the block;
    - the float32 arithmetic of each block's dw * (dx * sumi - 8 s) and of the sum over
      blocks: 2**-16 times the same sums taken with |x| + d and 8/7 of the block's largest
      |w| (at least 8 dw for q4_0), far above its few roundings per block;
    - the result's rounding: result_unit times |x @ w.T| plus the above."""
    M, K = x.shape
    xb = np.abs(np.asarray(x, np.float64)).reshape(M, K // BLOCK, BLOCK)
    amax = xb.max(axis=-1)  # M x nb
    wb = np.abs(np.asarray(w, np.float64)).reshape(w.shape[0], K // BLOCK, BLOCK)
    w_sum = wb.sum(axis=-1)  # N x nb
    quant = (amax / (2 * QMAX) * (1 + 2.0 ** -10)) @ w_sum.T
    w_big = np.broadcast_to(8 / 7 * wb.max(axis=-1, keepdims=True), wb.shape)
    fp = 2.0 ** -16 * np.einsum("mbk,nbk->mn", xb + (amax / QMAX)[..., None], w_big)
    exact = np.abs(np.asarray(x, np.float64) @ np.asarray(w, np.float64).T)
    return quant + fp + result_unit * (exact + quant + fp)
