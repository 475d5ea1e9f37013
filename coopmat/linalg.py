"""`coopmat.matmul`: numpy.matmul on a cooperative-matrix Vulkan device."""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from coopmat.device.enums import ComponentType
from coopmat.dispatch.gemm import GemmResult, check_fits, run_gemm
from coopmat.dispatch.runtime import DeviceArg, runtime
from coopmat.dispatch.types import (
    DEFAULT_RESULT,
    TypePair,
    component_type,
    config_for,
    dtype_name,
    numpy_dtype,
    supported_pairs,
)

_SIGNATURE = "(n?,k),(k,m?)->(n?,m?)"
_last = threading.local()


def last_kernel_time() -> float | None:
    """GPU time in seconds (timestamp queries) of this thread's last matmul kernel."""
    r: GemmResult | None = getattr(_last, "result", None)
    return r.kernel_seconds if r else None


def last_kernel_traits() -> Any:
    r: GemmResult | None = getattr(_last, "result", None)
    return r.traits if r else None


def _resolve_types(rt: Any, a: np.ndarray, b: np.ndarray, out_dtype: Any) -> TypePair:
    pairs = supported_pairs(rt.device)
    op = component_type(a.dtype)
    if a.dtype == b.dtype and out_dtype is None and op is not None and op in DEFAULT_RESULT:
        fast = TypePair(op, DEFAULT_RESULT[op])
        if fast in pairs:  # the common case, without building any message
            return fast
    offered = ", ".join(p.describe() for p in pairs) or "nothing"
    where = f"device {rt.device.info.index} ({rt.device.info.name}) supports {offered}"
    if a.dtype != b.dtype:
        raise TypeError(f"matmul: operands have different dtypes {dtype_name(a.dtype)} and "
                        f"{dtype_name(b.dtype)}; {where}")
    operand = component_type(a.dtype)
    if operand is None or not any(p.operand == operand for p in pairs):
        raise TypeError(f"matmul: unsupported dtype {dtype_name(a.dtype)}; {where}")
    if out_dtype is None:
        result = DEFAULT_RESULT[operand]
        # A device without the same-type config still serves float16 through f32
        # accumulation; the cast back to float16 happens on the host.
        if TypePair(operand, result) not in pairs:
            wider = [p for p in pairs if p.operand == operand]
            if wider:
                return wider[0]
    else:
        result_t = component_type(np.dtype(out_dtype))
        if result_t is None:
            raise TypeError(f"matmul: unsupported out_dtype {np.dtype(out_dtype).name}; {where}")
        result = result_t
    pair = TypePair(operand, result)
    if pair not in pairs:
        raise TypeError(f"matmul: {pair.describe()} is not supported; {where}")
    return pair


def _core_dims_error(operand: int, dim: int, got: int, want: int) -> ValueError:
    return ValueError(
        f"matmul: Input operand {operand} has a mismatch in its core dimension {dim}, with "
        f"gufunc signature {_SIGNATURE} (size {got} is different from {want})")


def matmul(a: Any, b: Any, *, c: Any = None, alpha: float | int = 1, beta: float | int = 0,
           out: np.ndarray | None = None, out_dtype: Any = None,
           device: DeviceArg = None, family: str | None = None) -> np.ndarray:
    """alpha * (a @ b) + beta * c on the GPU, with numpy.matmul's shape rules.

    - a, b: float16, int8, uint8 or bfloat16 (ml_dtypes.bfloat16) arrays of one dtype;
      1-D operands are promoted as numpy does, N-D ones batched with broadcasting.
    - Result dtype: float16 -> float16 (numpy's own result dtype; out_dtype=np.float32 keeps
      the f32 accumulator instead), int8 -> int32, uint8 -> uint32, bfloat16 -> float32.
    - c: optional, broadcastable to the result's shape; alpha and beta scale the product
      and c (integers for integer results).
    - out: written in place; it must have the result's shape and dtype.
    - device: index, name substring, or a device object; default $COOPMAT_DEVICE or the
      first discrete GPU with VK_KHR_cooperative_matrix.
    - family: force a kernel family, 'khr' (VK_KHR_cooperative_matrix, subgroup scope) or
      'nv2' (VK_NV_cooperative_matrix2, workgroup scope); default $COOPMAT_FAMILY, else
      the tuned or measured-faster one the device offers.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    for i, x in enumerate((a, b)):
        if x.ndim == 0:
            raise ValueError(
                f"matmul: Input operand {i} does not have enough dimensions (has 0, gufunc "
                f"core with signature {_SIGNATURE} requires 1)")
    rt = runtime(device)
    pair = _resolve_types(rt, a, b, out_dtype)
    result_dtype = numpy_dtype(pair.result)
    if out_dtype is not None:
        result_dtype = np.dtype(out_dtype)
    elif pair.result != DEFAULT_RESULT[pair.operand]:
        result_dtype = numpy_dtype(DEFAULT_RESULT[pair.operand])  # host cast, see above
    integer = not pair.result.is_float
    if integer:
        for name, val in (("alpha", alpha), ("beta", beta)):
            if not float(val).is_integer():
                raise TypeError(f"matmul: {name}={val!r} must be an integer for an integer result")
        alpha, beta = int(alpha), int(beta)
    else:
        alpha, beta = float(alpha), float(beta)

    a2 = a[np.newaxis, :] if a.ndim == 1 else a
    b2 = b[:, np.newaxis] if b.ndim == 1 else b
    K = a2.shape[-1]
    if b2.shape[-2] != K:
        raise _core_dims_error(1, 0, b2.shape[-2], K)
    M, N = a2.shape[-2], b2.shape[-1]
    try:
        batch_shape = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    except ValueError:
        raise ValueError(
            f"matmul: operands could not be broadcast together with shapes {a.shape} "
            f"{b.shape}") from None
    full_shape = (*batch_shape, M, N)
    shape = full_shape
    if a.ndim == 1:
        shape = (*shape[:-2], shape[-1])
    if b.ndim == 1:
        shape = shape[:-1]

    c_arr = None
    if c is not None and beta != 0:  # BLAS convention: beta == 0 means C is not read
        c_arr = np.asarray(c)
        if c_arr.dtype != result_dtype:
            if not np.can_cast(c_arr.dtype, result_dtype, casting="same_kind"):
                raise TypeError(f"matmul: c has dtype {c_arr.dtype}, which cannot be cast to "
                                f"the result dtype {result_dtype}")
            c_arr = c_arr.astype(result_dtype)
        try:
            c_arr = np.broadcast_to(c_arr, shape)
        except ValueError:
            raise ValueError(f"matmul: c of shape {c_arr.shape} does not broadcast to the "
                             f"result shape {shape}") from None

    batch = math.prod(batch_shape) if batch_shape else 1
    if M * N * K * batch:  # fail before allocating anything for a problem too big
        def operand_bytes(x: np.ndarray, rows: int, cols: int) -> int:
            n = math.prod(x.shape[:-2]) if x.ndim > 2 else 1
            return (batch if n > 1 else 1) * rows * cols * x.itemsize
        check_fits(rt, [operand_bytes(a2, M, K), operand_bytes(b2, K, N),
                        batch * M * N * result_dtype.itemsize * (2 if c is not None else 1)])

    if out is not None:
        if not isinstance(out, np.ndarray):
            raise TypeError("matmul: out must be a numpy array")
        if out.shape != shape:
            raise ValueError(f"matmul: out has shape {out.shape}, the result has shape {shape}")
        if out.dtype != result_dtype:
            raise TypeError(f"matmul: out has dtype {dtype_name(out.dtype)}, the result has "
                            f"dtype {dtype_name(result_dtype)}")
        result = out
    else:
        result = np.empty(shape, dtype=result_dtype)

    if result.size == 0:
        return result
    if K == 0:  # an empty sum: zeros, plus beta * c
        result[...] = 0
        if c_arr is not None:
            result[...] = beta * c_arr if beta != 1 else c_arr
        return result

    def as3d(x: np.ndarray, rows: int, cols: int) -> np.ndarray:
        lead = x.shape[:-2]
        if math.prod(lead) == 1:
            return x.reshape(1, rows, cols) if x.ndim != 3 else x
        if lead == batch_shape:
            return x.reshape(batch, rows, cols)
        return np.broadcast_to(x, (*batch_shape, rows, cols)).reshape(batch, rows, cols)

    a3 = as3d(a2, M, K)
    b3 = as3d(b2, K, N)
    c3 = None
    if c_arr is not None:
        c_full = c_arr.reshape(full_shape)
        c3 = as3d(c_full, M, N)
        c3 = c3.astype(numpy_dtype(pair.result), copy=False)
    out3 = result.reshape(batch, M, N) if result.flags.c_contiguous else None
    target = out3 if out3 is not None else np.empty((batch, M, N), dtype=result_dtype)
    config = config_for(rt.device, pair)
    assert config is not None
    _last.result = run_gemm(rt, config, pair, a3, b3, c3, target, alpha, beta, family)
    if out3 is None:
        np.copyto(result, target.reshape(shape))
    return result


def devices() -> list[Any]:
    """Every Vulkan device, as `python -m coopmat.info` lists it."""
    from coopmat import device as device_layer
    return device_layer.enumerate_devices()


def configs(device: DeviceArg = None, *, shader_f16: bool = True) -> list[Any]:
    """The selected device's GPUSubgroupMatrixConfig list (WebGPU's filter)."""
    from coopmat import device as device_layer
    from coopmat.device.logical import Device
    from coopmat.device.model import PhysicalDeviceInfo
    if isinstance(device, Device):
        info = device.info
    elif isinstance(device, PhysicalDeviceInfo):
        info = device
    else:
        info = device_layer.select_info(device)
    return list(device_layer.support(info, shader_f16=shader_f16).configs)


def supported_dtypes(device: DeviceArg = None) -> list[str]:
    """The operand->result dtype pairs matmul runs on the device, e.g. 'float16->float32'."""
    return [p.describe() for p in supported_pairs(runtime(device).device)]


__all__ = ["ComponentType", "configs", "devices", "last_kernel_time", "matmul",
           "supported_dtypes"]
