"""The float64 oracle of the fused epilogue, D = act(alpha * A @ B + beta * C + bias) +
residual (torch's definitions: gelu with approximate="tanh", silu = x * sigmoid(x)), and
the check of a result against it: the K-term dot-product bound plus the result's rounding
and a small allowance for the device's tanh/exp."""

from __future__ import annotations

import math

import numpy as np

U = {np.dtype(np.float16): 2.0 ** -11, np.dtype(np.float32): 2.0 ** -24}


def act64(x: np.ndarray, act: str | None) -> np.ndarray:
    if act == "relu":
        return np.maximum(x, 0.0)
    if act == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    if act == "silu":
        with np.errstate(over="ignore"):
            return x / (1.0 + np.exp(-x))
    return x


def oracle(a, b, bias=None, act=None, residual=None, c=None, alpha=1.0, beta=0.0):
    """(float64 result, tolerance) of act(alpha a @ b + beta c + bias) + residual."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    pre = alpha * (a64 @ b64)
    mag = abs(alpha) * (np.abs(a64) @ np.abs(b64))
    if c is not None:
        pre = pre + beta * c.astype(np.float64)
    if bias is not None:
        pre = pre + bias.astype(np.float64)
    x = act64(pre, act)
    if residual is not None:
        x = x + residual.astype(np.float64)
    K = a.shape[-1]
    # Every activation here has a slope of at most 1.13, so the accumulator's error passes
    # through about unscaled; 1e-6 (1 + |pre|) covers float32 tanh/exp on the device.
    return x, K * 2.0 ** -24 * mag * 1.2 + 1e-6 * (1 + np.abs(pre)), pre


def check(d, ref, tol, out_dtype):
    d = np.asarray(d)
    assert d.dtype == out_dtype
    bound = tol + U[np.dtype(out_dtype)] * np.abs(ref)
    err = np.abs(d.astype(np.float64) - ref)
    assert np.all(err <= bound), (float(err.max()), np.unravel_index(err.argmax(), err.shape))
