"""numpy.matmul's rules, applied once per call by the matmul front: shapes and
broadcasting, the result dtype argument, alpha and beta, and the one check of the
arguments cast into or out of the result (out, c, bias, residual). Pure: shapes and dtypes
in, an answer or a clear exception out; nothing here touches a device."""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import numpy as np

from coopmat.api.operands import Kind, Operand
from coopmat.codegen.traits import EpilogueOps
from coopmat.common.dtypes import dtype_name

SIGNATURE = "(n?,k),(k,m?)->(n?,m?)"


class Shapes(NamedTuple):
    """A product's sizes: the GEMM's M, N, K, the broadcast batch axes, the result's
    shape with both matrix axes (full) and as numpy returns it (1-D operands drop one)."""

    M: int
    N: int
    K: int
    batch: tuple[int, ...]
    full: tuple[int, ...]
    result: tuple[int, ...]


def core_dims_error(operand: int, dim: int, got: int, want: int) -> ValueError:
    return ValueError(
        f"matmul: Input operand {operand} has a mismatch in its core dimension {dim}, with "
        f"gufunc signature {SIGNATURE} (size {got} is different from {want})")


def shapes(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> Shapes:
    """numpy.matmul's shape rules."""
    for i, x in enumerate((a_shape, b_shape)):
        if len(x) == 0:
            raise ValueError(
                f"matmul: Input operand {i} does not have enough dimensions (has 0, gufunc "
                f"core with signature {SIGNATURE} requires 1)")
    a2 = (1, *a_shape) if len(a_shape) == 1 else a_shape
    b2 = (*b_shape, 1) if len(b_shape) == 1 else b_shape
    K = a2[-1]
    if b2[-2] != K:
        raise core_dims_error(1, 0, b2[-2], K)
    M, N = a2[-2], b2[-1]
    try:
        batch_shape = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        raise ValueError(
            f"matmul: operands could not be broadcast together with shapes {a_shape} "
            f"{b_shape}") from None
    full = (*batch_shape, M, N)
    shape = full
    if len(a_shape) == 1:
        shape = (*shape[:-2], shape[-1])
    if len(b_shape) == 1:
        shape = shape[:-1]
    return Shapes(M, N, K, tuple(batch_shape), full, shape)


def weight_shapes(x_shape: tuple[int, ...], w_shape: tuple[int, int]) -> Shapes:
    """numpy's rules for x @ w.T, w a quantized N x K weight, with the errors saying so."""
    N, K = w_shape
    if len(x_shape) == 0:
        raise ValueError("matmul: Input operand 0 does not have enough dimensions (has 0)")
    if x_shape[-1] != K:
        raise ValueError(f"matmul: x has shape {x_shape}; its last axis must be the weight's "
                         f"K = {K} (w is {w_shape}, N x K)")
    return shapes(x_shape, (K, N))


def result_dtype_arg(dtype: Any, out_dtype: Any) -> Any:
    """The one result dtype of dtype= and its alias out_dtype=."""
    if dtype is not None and out_dtype is not None and np.dtype(dtype) != np.dtype(out_dtype):
        raise TypeError("matmul: dtype and out_dtype (its alias) disagree")
    return dtype if dtype is not None else out_dtype


def scalars(float_result: bool, alpha: Any, beta: Any) -> tuple[Any, Any]:
    """alpha and beta as the kernel takes them: integers for integer results."""
    for name, val in (("alpha", alpha), ("beta", beta)):
        # Python and numpy real scalars, and 0-d real arrays; not strings or complex.
        if not (isinstance(val, numbers.Real) or isinstance(val, np.ndarray)
                and val.ndim == 0 and val.dtype.kind in "biuf"):
            raise TypeError(f"matmul: {name} must be a real number, not {val!r}")
    if not float_result:
        for name, val in (("alpha", alpha), ("beta", beta)):
            if not float(val).is_integer():
                raise TypeError(f"matmul: {name}={val!r} must be an integer for an integer result")
        return int(alpha), int(beta)
    return float(alpha), float(beta)


def check_into_result(what: str, dtype: np.dtype, result_dtype: np.dtype) -> None:
    """c, bias or residual cast to the result dtype, under numpy's "same_kind" rule."""
    if dtype != result_dtype and not np.can_cast(dtype, result_dtype, casting="same_kind"):
        raise TypeError(f"matmul: {what} has dtype {dtype}, which cannot be cast to the "
                        f"result dtype {result_dtype}")


def check_activation(ops: EpilogueOps | None, float_result: bool, result_name: str) -> None:
    if ops is not None and ops.activation is not None and not float_result:
        raise TypeError(f"matmul: the {ops.activation.value!r} activation needs a float "
                        f"result, not {result_name}")


def check_bias_shape(shape: tuple[int, ...], N: int) -> None:
    if tuple(shape) != (N,):
        raise ValueError(f"matmul: bias must have shape ({N},), one element per column of "
                         f"the result, not {tuple(shape)}")


def check_residual_shape(shape: tuple[int, ...], result_shape: tuple[int, ...]) -> None:
    if tuple(shape) != tuple(result_shape):
        raise ValueError(f"matmul: residual must have the result's shape {result_shape}, "
                         f"not {tuple(shape)}")


def check_epilogue(ops: EpilogueOps | None, float_result: bool, result_dtype: np.dtype,
                   bias: Operand | None, residual: Operand | None, bias_n: int,
                   shape: tuple[int, ...]) -> None:
    """The fused epilogue's arguments against the result: activation on a float result,
    bias of shape (bias_n,), residual of the result's shape, dtypes castable to the result
    (device arrays: already the result dtype, C-contiguous)."""
    check_activation(ops, float_result, dtype_name(result_dtype))
    if bias is not None:
        check_bias_shape(bias.shape, bias_n)
    if residual is not None:
        check_residual_shape(residual.shape, shape)
    for what, x in (("bias", bias), ("residual", residual)):
        if x is None:
            continue
        if x.kind is Kind.DEVICE and (x.dtype != result_dtype or not x.contiguous):
            raise TypeError(f"matmul: a device array {what} must be C-contiguous and of the "
                            f"result dtype {dtype_name(result_dtype)}, not "
                            f"{dtype_name(x.dtype)}")
        check_into_result(what, x.dtype, result_dtype)


def check_out(out: Operand, shape: tuple[int, ...], result_dtype: np.dtype,
              device_result: bool) -> None:
    """out= for a result of `shape` and `result_dtype`: a numpy array of that shape that
    numpy's "same_kind" casting accepts the result into, and writeable; where the result
    is a device array (device_result), a C-contiguous Array of the result dtype."""
    if device_result and out.kind is not Kind.DEVICE:
        raise TypeError("matmul: out must be a coopmat.Array when an operand lives on the "
                        "device (a coopmat.Array or a quantized weight)")
    if out.kind is Kind.WEIGHT or not device_result and not isinstance(out.value, np.ndarray):
        raise TypeError("matmul: out must be a numpy array or a coopmat.Array")
    if out.shape != shape:
        raise ValueError(f"matmul: out has shape {out.shape}, the result has shape {shape}")
    if out.kind is Kind.DEVICE:
        if out.dtype != result_dtype:
            raise TypeError(f"matmul: out has dtype {dtype_name(out.dtype)}; a device array "
                            f"out must have the result dtype {dtype_name(result_dtype)}")
        if not out.contiguous:
            raise ValueError("matmul: a device array out must be C-contiguous")
        return
    if out.dtype != result_dtype and not np.can_cast(result_dtype, out.dtype,
                                                     casting="same_kind"):
        raise TypeError(f"matmul: cannot cast the result from dtype "
                        f"{dtype_name(result_dtype)} to out's {dtype_name(out.dtype)} "
                        f"with casting rule 'same_kind'")
    if not out.value.flags.writeable:
        raise ValueError("matmul: out is read-only (assignment destination is read-only); "
                         "pass a writeable array")
