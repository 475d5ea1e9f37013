"""The float64/int64 numpy oracle of a plain product and its error bound, shared by the
matmul, rows and gemv tests.

- integer results are exact;
- float16 operands drawn from small integers (|x| <= 3) multiply and add exactly in both
  f16 and f32 while |sums| <= 2048, so those results must equal numpy's exactly;
- for general float data, the error bound is the classic worst-case for a K-term dot
  product, |err| <= K * u_acc * (|A| @ |B|) + u_out * |ref|, with u = 2**-11 for an f16
  accumulator or output, 2**-24 for f32.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
U = {np.dtype(np.float16): 2.0 ** -11, np.dtype(np.float32): 2.0 ** -24}
RNG = np.random.default_rng(1234)


def small_ints(shape, dtype, rng: np.random.Generator | None = None):
    # via float32: numpy casts integers to ml_dtypes' bfloat16 only through a float
    return (rng or RNG).integers(-3, 4, size=shape).astype(np.float32).astype(dtype)


def reference(a, b, result_dtype):
    if np.dtype(result_dtype).kind in "iu":
        return np.matmul(a.astype(np.int64), b.astype(np.int64)).astype(result_dtype)
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


def float_tolerance(a, b, acc, out):
    K = a.shape[-1]
    mag = np.matmul(np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))
    return K * U[np.dtype(acc)] * mag + U[np.dtype(out)] * mag + 1e-30


def require(pairs, dtype, result):
    """Skip unless the device offers dtype -> result (float16 -> float16 comes through a
    float32 accumulator where the device has one)."""
    name = f"{np.dtype(dtype).name}->{np.dtype(result).name}"
    if name not in pairs and not (dtype == "float16" and result == np.float16
                                  and "float16->float32" in pairs):
        pytest.skip(f"the device does not offer {name} (it offers {pairs})")
