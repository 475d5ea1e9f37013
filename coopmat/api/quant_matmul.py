"""`coopmat.matmul(x, w.T)` for a quantized weight w (coopmat/quantized.py).

x (numpy or coopmat.Array, float16, or bfloat16 where the device offers it) is ... x K;
its leading axes are flattened into the GEMM's M rows, as numpy broadcasts a 2-D B over
them. The product runs on the weight's device through the same policy and dispatch as
other device products (policy.choose picks the khr kernel with a quantized B, or the gemv
kernel where forced, family="gemv"): numpy x gives a numpy result, an Array x an Array
queued without waiting.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from coopmat.api.array import Array, empty
from coopmat.api.quantized import _USE, QuantizedArray, QuantizedTranspose
from coopmat.codegen import Layout
from coopmat.codegen.traits import EpilogueOps
from coopmat.common.dtypes import dtype_name, numpy_dtype
from coopmat.common.errors import DeviceMismatchError
from coopmat.common.lru import Lru
from coopmat.dispatch.executor import Copy
from coopmat.dispatch.gemm import (
    DeviceOperand,
    GemmResult,
    Plan,
    Staged,
    enqueue_gemm,
    enqueue_plan,
    plan_fits,
)
from coopmat.dispatch.runtime import DeviceArg, runtime
from coopmat.policy import Options, resolve

ACTIVATION_DTYPES = ("float16", "bfloat16")


def is_quantized(x: Any) -> bool:
    return isinstance(x, QuantizedArray | QuantizedTranspose)


def weight_operand(w: QuantizedArray) -> DeviceOperand:
    """The N x K weight's blocks as matmul's B (w.T): column-major, K along each line."""
    return DeviceOperand(w.buffer, 0, Staged(Layout.COLUMN_MAJOR, w.shape[1], 0, w.nbytes,
                                             quant=w.format))


@dataclass(frozen=True)
class _Recipe:
    """What a plain device-array call x @ w.T decided, kept per call signature: a decode
    loop then pays for the result's allocation and the submission only."""

    weight: weakref.ref[QuantizedArray]  # the key holds id(w): this tells a reused id
    shape: tuple[int, ...]
    result_dtype: np.dtype
    a: Staged
    d: Staged
    plan: Plan


RECIPES = 64
_recipes: Lru[_Recipe] = Lru(RECIPES)


def _fast(x: Array, w: QuantizedArray, key: tuple[Any, ...]) -> Array | None:
    """The kept way through for a device-array x @ w.T with default arguments."""
    from coopmat.api.linalg import _last
    r = _recipes.get(key)
    if r is None or r.weight() is not w:
        return None
    a_op = DeviceOperand(x.buffer, x.offset_bytes, r.a)
    b_op = weight_operand(w)
    if not plan_fits(r.plan, a_op, b_op):
        return None
    result = empty(r.shape, r.result_dtype, device=w.runtime.device)
    enqueue_plan(w.runtime, r.plan, a_op, b_op, None, DeviceOperand(result.buffer, 0, r.d))
    _last.result = GemmResult(None, r.plan.traits, r.plan.choice.split_k)
    return result


def matmul_quantized(a: Any, b: Any, *, c: Any, alpha: float | int, beta: float | int,
                     out: Any, dtype: Any, accumulator: Any, device: DeviceArg,
                     family: str | None, bias: Any = None, residual: Any = None,
                     ops: EpilogueOps | None = None) -> Any:
    """x @ w.T for a quantized w, with matmul's fused epilogue (bias, activation,
    residual) where asked."""
    from coopmat.api.array_matmul import _on, _operand, check_epilogue, epilogue_operands
    from coopmat.api.linalg import _last, _scalars

    if is_quantized(a):
        raise TypeError(f"matmul: a quantized weight cannot be operand 0 (A); {_USE}")
    if isinstance(b, QuantizedArray):
        raise ValueError(f"matmul: the quantized weight has shape {b.shape} (N x K) with K "
                         f"along its rows; {_USE}")
    assert isinstance(b, QuantizedTranspose)
    w = b.base
    rt = w.runtime
    key = None
    if isinstance(a, Array) and c is None and out is None and dtype is None and \
            accumulator is None and device is None and ops is None and a.runtime is rt:
        key = (id(w), a.shape, a.element_strides, a.dtype, a.offset_bytes == 0, alpha,
               family, Options.from_env())
        done = _fast(a, w, key)
        if done is not None:
            return done
    if c is not None and beta != 0:
        raise TypeError("matmul: c and beta are not supported with a quantized B")
    if family not in (None, "khr", "gemv"):
        raise ValueError(f"matmul: a quantized B runs on the khr or gemv kernel families "
                         f"only, not {family!r}")
    if device is not None and runtime(device) is not rt:
        raise DeviceMismatchError(f"device={device!r} is not the device the quantized weight "
                                  f"lives on ({rt.device.info.index}: {rt.device.info.name})")
    if isinstance(a, Array):
        x_shape, x_dtype = a.shape, a.dtype
    else:
        a = np.asarray(a)
        x_shape, x_dtype = a.shape, a.dtype
    K, N = b.shape
    if len(x_shape) == 0:
        raise ValueError("matmul: Input operand 0 does not have enough dimensions (has 0)")
    if x_shape[-1] != K:
        raise ValueError(f"matmul: x has shape {x_shape}; its last axis must be the weight's "
                         f"K = {K} (w is {w.shape}, N x K)")
    if dtype_name(x_dtype) not in ACTIVATION_DTYPES:
        raise TypeError(f"matmul: activations for a quantized weight are float16 (or "
                        f"bfloat16 where the device offers it), not {dtype_name(x_dtype)}; "
                        f"cast x first")
    pair = resolve(rt.device.info, x_dtype, x_dtype, dtype, accumulator)
    result_dtype = numpy_dtype(pair.stored)
    alpha, _ = _scalars(pair, alpha, 0)
    shape = (*x_shape[:-1], N)
    M = math.prod(x_shape[:-1])
    check_epilogue(ops, pair.result.is_float, result_dtype, bias, residual, N, shape)
    if any(isinstance(e, Array) and e.runtime is not rt for e in (bias, residual)):
        raise DeviceMismatchError("matmul: bias or residual lives on another device than "
                                  "the weight")

    host_out = out if isinstance(out, np.ndarray) else None
    if out is not None:
        if out.shape != shape:
            raise ValueError(f"matmul: out has shape {out.shape}, the result has shape {shape}")
        if isinstance(out, Array):
            if out.runtime is not rt:
                raise DeviceMismatchError("matmul: out lives on another device than the weight")
            if out.dtype != result_dtype or not out.is_c_contiguous:
                raise TypeError(f"matmul: a device array out must be C-contiguous with the "
                                f"result dtype {dtype_name(result_dtype)}")
        elif not isinstance(out, np.ndarray):
            raise TypeError("matmul: out must be a numpy array or a coopmat.Array")
        elif not np.can_cast(result_dtype, out.dtype, casting="same_kind"):
            raise TypeError(f"matmul: cannot cast the result from dtype "
                            f"{dtype_name(result_dtype)} to out's {dtype_name(out.dtype)}")
    result = out if isinstance(out, Array) else empty(shape, result_dtype, device=rt.device)
    result._storage.written()
    if M:
        uploads: list[Copy] = []
        x = _on(rt, a, uploads)
        x2 = x.reshape(M, K)
        a_op = _operand(x2, (), 0)
        b_op = weight_operand(w)
        d_op = DeviceOperand(result.buffer, result.offset_bytes,
                             Staged(Layout.ROW_MAJOR, N, 0, M * N * result_dtype.itemsize))
        bias_op, res_op = epilogue_operands(rt, bias, residual, N, result_dtype, uploads)
        options = Options.from_env().with_family(family)
        _, plan = enqueue_gemm(rt, pair, a_op, b_op, None, d_op, (1, M, N, K), alpha, 0,
                               options, uploads, bias=bias_op, residual=res_op, ops=ops)
        _last.result = GemmResult(None, plan.traits, plan.choice.split_k)
        if key is not None and not uploads and result.offset_bytes == 0:
            _recipes.put(key, _Recipe(weakref.ref(w), shape, result_dtype, a_op.staged,
                                      d_op.staged, plan))
    if isinstance(a, Array) and host_out is None:
        return result
    values = result.numpy()  # waits for the product
    if host_out is not None:
        np.copyto(host_out, values, casting="same_kind")
        return host_out
    return values
