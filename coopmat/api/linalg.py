"""`coopmat.matmul`: numpy.matmul on a cooperative-matrix Vulkan device."""

from __future__ import annotations

import math
import numbers
import threading
from typing import Any

import numpy as np

from coopmat.api.array import Array
from coopmat.api.fused import check_ops, host_bias, host_epilogue, host_residual, ops_of
from coopmat.api.quantized import QuantizedArray, QuantizedTranspose
from coopmat.common.dtypes import dtype_name, numpy_dtype
from coopmat.common.enums import ComponentType
from coopmat.dispatch.gemm import GemmResult, check_fits, run_gemm
from coopmat.dispatch.runtime import DeviceArg, runtime
from coopmat.dispatch.small import small_calls
from coopmat.policy import Options, TypePair, resolve, result_pairs

_QUANTIZED = (QuantizedArray, QuantizedTranspose)

_SIGNATURE = "(n?,k),(k,m?)->(n?,m?)"
_last = threading.local()


def _array_quick() -> Any:
    """array_matmul.quick (imported on first use: that module builds on this one)."""
    global _quick
    if _quick is None:
        from coopmat.api.array_matmul import quick
        _quick = quick
    return _quick


_quick: Any = None


def last_kernel_time() -> float | None:
    """GPU time in seconds (timestamp queries) of this thread's last matmul kernel; None
    where it was not timed: no timestamps on the queue, or a pipelined numpy -> numpy
    product (dispatch/pipeline.py), whose blocks' kernels overlap its copies."""
    r: GemmResult | None = getattr(_last, "result", None)
    return r.kernel_seconds if r else None


def last_kernel_traits() -> Any:
    r: GemmResult | None = getattr(_last, "result", None)
    return r.traits if r else None


def _core_dims_error(operand: int, dim: int, got: int, want: int) -> ValueError:
    return ValueError(
        f"matmul: Input operand {operand} has a mismatch in its core dimension {dim}, with "
        f"gufunc signature {_SIGNATURE} (size {got} is different from {want})")


def matmul(a: Any, b: Any, *, c: Any = None, alpha: float | int = 1, beta: float | int = 0,
           out: Any = None, dtype: Any = None, accumulator: Any = None,
           device: DeviceArg = None, family: str | None = None,
           out_dtype: Any = None, bias: Any = None, activation: Any = None,
           residual: Any = None) -> Any:
    """alpha * (a @ b) + beta * c on the GPU, with numpy.matmul's shape rules; with a fused
    epilogue, act(alpha * (a @ b) + beta * c + bias) + residual.

    - a, b: float16, int8, uint8, bfloat16 (ml_dtypes.bfloat16) or, where the device offers
      them, float8 (ml_dtypes.float8_e4m3fn, float8_e5m2) arrays of one dtype; 1-D operands
      are promoted as numpy does (1-D @ 1-D gives a numpy scalar), N-D ones batched with
      broadcasting.
    - dtype (out_dtype is an alias): the result dtype. Default: float16 -> float16 (numpy's
      result dtype, accumulated in float32 and rounded once, as numpy does), int8 -> int32,
      uint8 -> uint32, bfloat16 and float8 -> float32. dtype=np.float32 keeps the float32
      accumulator.
    - accumulator: the accumulation type; np.float16 opts float16 operands into
      half-precision accumulation (faster on some GPUs, much less accurate at large K).
    - c: optional, broadcastable to the result's shape; alpha and beta scale the product
      and c (integers for integer results).
    - out: written in place; any array of the result's shape that numpy's default casting
      ("same_kind") accepts the result dtype into (a coopmat.Array out: of the result
      dtype, C-contiguous).
    - Device arrays: when any of a, b, c, out is a coopmat.Array the product runs on that
      array's device without waiting and returns an Array (numpy operands are copied
      over for the call); otherwise numpy in, numpy out.
    - device: index, name substring, or a device object; default $COOPMAT_DEVICE or the
      first discrete GPU with VK_KHR_cooperative_matrix.
    - family: force a kernel family, 'khr' (VK_KHR_cooperative_matrix, subgroup scope),
      'nv2' (VK_NV_cooperative_matrix2, workgroup scope), 'rows' (few rows, B streamed)
      or 'gemv' (few rows against a column-major B such as x @ w.T, no cooperative
      matrices); default $COOPMAT_FAMILY, else the tuned or measured-faster one the
      device offers.
    - bias: shape (N,), added to every row; activation: None, 'relu', 'gelu_tanh'
      (torch's gelu(approximate='tanh')) or 'silu' (float results only); residual: the
      result's shape, added after the activation. Fused into the kernel and computed on
      the float32 accumulator (integer results: in their own type), rounded to the result
      dtype once. bias and residual are cast to the result dtype ("same_kind", as c).
      See also coopmat.linear.
    - Quantized weights: b may be w.T for a coopmat.QuantizedArray w (GGUF q8_0/q4_0
      blocks, N x K) and a float16 (or bfloat16) x of shape (..., K): a linear layer,
      dequantized inside the GEMM (coopmat/quant_matmul.py).
    """
    defaults = c is None and out is None and dtype is None and out_dtype is None and \
        accumulator is None and device is None and family is None and bias is None and \
        activation is None and residual is None and type(alpha) is int and alpha == 1 \
        and type(beta) is int and beta == 0
    # Two matrices that fit (shape errors: the long way): a repeated small product keeps
    # its prepared GEMM (dispatch/small.py).
    plain = defaults and type(a) is np.ndarray and type(b) is np.ndarray and \
        a.ndim == 2 and b.ndim == 2 and a.shape[1] == b.shape[0]
    if plain:
        key = (a.shape, a.strides, a.dtype, b.shape, b.strides, b.dtype, Options.from_env())
        calls = small_calls(runtime())
        done = calls.run(key, a[np.newaxis], b[np.newaxis])
        if done is not None:
            _last.result = done[1]
            return done[0][0]
    elif defaults:  # a repeated device-array product keeps its recipe (array_matmul.py)
        kept = _array_quick()(a, b)
        if kept is not None:
            return kept
    ops = ops_of(bias, activation, residual)
    if isinstance(a, _QUANTIZED) or isinstance(b, _QUANTIZED):
        from coopmat.api.quant_matmul import matmul_quantized
        return matmul_quantized(a, b, c=c, alpha=alpha, beta=beta, out=out,
                                dtype=_result_dtype_arg(dtype, out_dtype),
                                accumulator=accumulator, device=device, family=family,
                                bias=bias, residual=residual, ops=ops)
    if any(isinstance(x, Array) for x in (a, b, c, out, bias, residual)):
        from coopmat.api.array_matmul import matmul_arrays
        return matmul_arrays(a, b, c=c, alpha=alpha, beta=beta, out=out,
                             dtype=_result_dtype_arg(dtype, out_dtype),
                             accumulator=accumulator, device=device, family=family,
                             bias=bias, residual=residual, ops=ops)
    a = np.asarray(a)
    b = np.asarray(b)
    # Shape errors come before any device is opened.
    M, N, K, batch_shape, full_shape, shape = _shapes(a.shape, b.shape)
    dtype = _result_dtype_arg(dtype, out_dtype)
    options = Options.from_env().with_family(family)
    rt = runtime(device)
    pair = resolve(rt.device.info, a.dtype, b.dtype, dtype, accumulator)
    result_dtype = numpy_dtype(pair.stored)
    alpha, beta = _scalars(pair, alpha, beta)
    check_ops(ops, pair.result.is_float, dtype_name(result_dtype))
    bias_arr = host_bias(bias, N if b.ndim > 1 else 1, result_dtype) \
        if bias is not None else None
    res_arr = host_residual(residual, shape, result_dtype) if residual is not None else None
    a2 = a[np.newaxis, :] if a.ndim == 1 else a
    b2 = b[:, np.newaxis] if b.ndim == 1 else b

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
            raise TypeError("matmul: out must be a numpy array or a coopmat.Array")
        if out.shape != shape:
            raise ValueError(f"matmul: out has shape {out.shape}, the result has shape {shape}")
        if out.dtype != result_dtype and not np.can_cast(result_dtype, out.dtype,
                                                         casting="same_kind"):
            raise TypeError(f"matmul: cannot cast the result from dtype "
                            f"{dtype_name(result_dtype)} to out's {dtype_name(out.dtype)} "
                            f"with casting rule 'same_kind'")
        result = out
    else:  # made by the GEMM's download (a large one: a kept pinned block)
        result = None
    if math.prod(shape) == 0 or K == 0:
        if result is None:
            result = np.empty(shape, dtype=result_dtype)
        if result.size == 0:
            return _finish(result, out)
    if K == 0:  # an empty sum: zeros, plus beta * c
        assert result is not None
        result[...] = 0
        if c_arr is not None:
            result[...] = beta * c_arr if beta != 1 else c_arr
        if ops is not None:
            result[...] = host_epilogue(result.astype(result_dtype), ops, bias_arr, res_arr)
        return _finish(result, out)

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
        c3 = c3.astype(result_dtype, copy=False)
    target: np.ndarray | None = None
    direct = result is not None and result.flags.c_contiguous and result.dtype == result_dtype
    if result is not None:
        target = result.reshape(batch, M, N) if direct else np.empty((batch, M, N),
                                                                      dtype=result_dtype)
    res3 = res_arr.reshape(batch, M, N) if res_arr is not None else None
    _last.result, made = run_gemm(rt, pair, a3, b3, c3, target, alpha, beta, options,
                                  bias=bias_arr, residual=res3, ops=ops)
    if plain and batch == 1 and M * N:
        calls.keep(key, rt, pair, a3, b3, options)
    if result is None:
        result = made.reshape(shape)
    elif not direct:
        np.copyto(result, made.reshape(shape), casting="same_kind")
    return _finish(result, out)


def _result_dtype_arg(dtype: Any, out_dtype: Any) -> Any:
    if dtype is not None and out_dtype is not None and np.dtype(dtype) != np.dtype(out_dtype):
        raise TypeError("matmul: dtype and out_dtype (its alias) disagree")
    return dtype if dtype is not None else out_dtype


def _scalars(pair: TypePair, alpha: float | int, beta: float | int) -> tuple[Any, Any]:
    """alpha and beta as the kernel takes them: integers for integer results."""
    for name, val in (("alpha", alpha), ("beta", beta)):
        # Python and numpy real scalars, and 0-d real arrays; not strings or complex.
        if not (isinstance(val, numbers.Real) or isinstance(val, np.ndarray)
                and val.ndim == 0 and val.dtype.kind in "biuf"):
            raise TypeError(f"matmul: {name} must be a real number, not {val!r}")
    if not pair.result.is_float:
        for name, val in (("alpha", alpha), ("beta", beta)):
            if not float(val).is_integer():
                raise TypeError(f"matmul: {name}={val!r} must be an integer for an integer result")
        return int(alpha), int(beta)
    return float(alpha), float(beta)


def _shapes(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[
        int, int, int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """numpy.matmul's shape rules: (M, N, K, batch shape, shape with both matrix axes,
    result shape)."""
    for i, x in enumerate((a_shape, b_shape)):
        if len(x) == 0:
            raise ValueError(
                f"matmul: Input operand {i} does not have enough dimensions (has 0, gufunc "
                f"core with signature {_SIGNATURE} requires 1)")
    a2 = (1, *a_shape) if len(a_shape) == 1 else a_shape
    b2 = (*b_shape, 1) if len(b_shape) == 1 else b_shape
    K = a2[-1]
    if b2[-2] != K:
        raise _core_dims_error(1, 0, b2[-2], K)
    M, N = a2[-2], b2[-1]
    try:
        batch_shape = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        raise ValueError(
            f"matmul: operands could not be broadcast together with shapes {a_shape} "
            f"{b_shape}") from None
    full_shape = (*batch_shape, M, N)
    shape = full_shape
    if len(a_shape) == 1:
        shape = (*shape[:-2], shape[-1])
    if len(b_shape) == 1:
        shape = shape[:-1]
    return M, N, K, tuple(batch_shape), full_shape, shape


def _finish(result: np.ndarray, out: np.ndarray | None) -> Any:
    """numpy's return convention: 1-D @ 1-D gives a scalar of the result type (an array
    only when the caller gave out=)."""
    if result.ndim == 0 and out is None:
        return result[()]
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
    names = (f"{dtype_name(numpy_dtype(p.operand))}->{dtype_name(numpy_dtype(p.stored))}"
             for p in result_pairs(runtime(device).device.info))
    return list(dict.fromkeys(names))


def linear(x: Any, w: Any, bias: Any = None, activation: Any = None, residual: Any = None, *,
           out: Any = None, **kwargs: Any) -> Any:
    """act(x @ w.T + bias) + residual, as torch.nn.functional.linear followed by an
    activation and a residual add, fused into one GPU kernel.

    - x: (..., in_features); w: (out_features, in_features), as torch stores a Linear's
      weight (a numpy array, a coopmat.Array, or anything with a `.T` that matmul takes);
    - bias: (out_features,); activation: None, 'relu', 'gelu_tanh' (torch's
      gelu(approximate='tanh')) or 'silu'; residual: the result's shape (..., out_features);
    - result dtype, devices and the other keyword arguments (dtype, accumulator, device,
      family) as matmul's: it is matmul(x, w.T, bias=bias, activation=activation,
      residual=residual, out=out, **kwargs).
    """
    if not hasattr(w, "T"):
        w = np.asarray(w)
    if getattr(w, "ndim", 2) != 2:
        raise ValueError(f"linear: w must be 2-D (out_features, in_features), not of shape "
                         f"{tuple(np.shape(w))}")
    return matmul(x, w.T, bias=bias, activation=activation, residual=residual, out=out,
                  **kwargs)


__all__ = ["ComponentType", "TypePair", "configs", "devices", "last_kernel_time", "linear",
           "matmul", "supported_dtypes"]
