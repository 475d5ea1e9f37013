"""A float64 oracle for coopmat.attention: torch's scaled_dot_product_attention written
out in numpy (heads repeated for grouped-query attention as torch's enable_gqa does, the
mask added in q's dtype, a fully masked row 0 as torch's _safe_softmax gives it), and the
error bound a float32-accumulating kernel that rounds the weights to q's dtype may reach.

The bound, per row i with weights w_ij = softmax(s_i)_j:
    A_i = sum_j w_ij |v_j|                     (what the row's sums are made of)
    ds_i = (E + 2) u32 scale max_j sum_d |q_id k_jd|   (the scores' float32 error, ln units)
    |o_i - ref_i| <= 2 [(u_op + Lk u32 + 4 ds_i) A_i + u_out |ref_i|]
u_op: the weights rounded to q's dtype before P V; Lk u32: P V's float32 sums; 4 ds_i: a
score error e moves each weight by at most a factor e^(2e), and the row's weighted mean
by at most 2 e A_i on each side; u_out: the result's rounding. Twice that, as the matmul
tests double theirs, for the terms this first-order bound leaves out.
"""

from __future__ import annotations

import numpy as np
from matmul_oracle import BFLOAT16, U

# Unit roundoff of each type the kernels round to.
UNIT = {**U, BFLOAT16: 2.0 ** -8}


def _heads(x: np.ndarray) -> int:
    return x.shape[-3] if x.ndim >= 3 else 1


def _repeat_kv(q: np.ndarray, x: np.ndarray) -> np.ndarray:
    """k or v with each head repeated for its group of q's heads."""
    hq, hk = _heads(q), _heads(x)
    if q.ndim >= 3 and x.ndim >= 3 and 1 < hk < hq and hq % hk == 0:
        return np.repeat(x, hq // hk, axis=-3)
    return x


def weights(q: np.ndarray, k: np.ndarray, mask: np.ndarray | None = None,
            causal: bool = False, scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(softmax weights, |scores| bound sum_d |q k| x scale), float64."""
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    q64 = q.astype(np.float64)
    k64 = _repeat_kv(q, k).astype(np.float64)
    s = np.matmul(q64, np.swapaxes(k64, -1, -2)) * scale
    mag = np.matmul(np.abs(q64), np.swapaxes(np.abs(k64), -1, -2)) * abs(scale)
    Lq, Lk = s.shape[-2:]
    if causal:
        s = np.where(np.tril(np.ones((Lq, Lk), bool)), s, -np.inf)
    if mask is not None:
        if mask.dtype == np.bool_:
            s = np.where(mask, s, -np.inf)
        else:  # added in q's dtype, as torch adds a float mask
            s = s + np.asarray(mask).astype(q.dtype).astype(np.float64)
    top = s.max(axis=-1, keepdims=True)
    empty = np.isneginf(top)
    e = np.exp(s - np.where(empty, 0.0, top))
    total = e.sum(axis=-1, keepdims=True)
    w = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)
    return w, mag


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None,
              causal: bool = False, scale: float | None = None) -> np.ndarray:
    w, _ = weights(q, k, mask, causal, scale)
    return np.matmul(w, _repeat_kv(q, v).astype(np.float64))


def tolerance(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None,
              causal: bool = False, scale: float | None = None,
              out_dtype: np.dtype | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(reference, per-element bound) for the kernel's result in out_dtype (q's)."""
    w, mag = weights(q, k, mask, causal, scale)
    v64 = _repeat_kv(q, v).astype(np.float64)
    ref = np.matmul(w, v64)
    A = np.matmul(w, np.abs(v64))
    E, Lk = q.shape[-1], k.shape[-2]
    u32 = UNIT[np.dtype(np.float32)]
    ds = (E + 2) * u32 * np.where(w > 0, mag, 0.0).max(axis=-1, keepdims=True)
    u_op = UNIT[np.dtype(q.dtype)]
    u_out = UNIT[np.dtype(out_dtype if out_dtype is not None else q.dtype)]
    tol = 2 * ((u_op + Lk * u32 + 4 * ds) * A + u_out * np.abs(ref))
    return ref, tol


def check(got: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
          mask: np.ndarray | None = None, causal: bool = False, scale: float | None = None,
          out_dtype: np.dtype | None = None) -> None:
    ref, tol = tolerance(q, k, v, mask, causal, scale, out_dtype)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert not np.isnan(got).any(), "NaN in the result"
    err = np.abs(got.astype(np.float64) - ref)
    bad = err > tol
    assert not bad.any(), (f"{bad.sum()} of {bad.size} elements off: worst "
                           f"{err[bad].max():.3g} against a bound of {tol[bad].min():.3g}")
