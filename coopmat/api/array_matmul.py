"""`coopmat.matmul` when an operand is a device array: queued on that device, result an
Array. Same shapes, dtypes and errors as the numpy path (linalg.py); the kernel choice and
its dispatch are the same too (coopmat.policy, dispatch.gemm.enqueue_gemm)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from coopmat.api.array import Array, allocation, asarray, empty, fresh, same_runtime, staged
from coopmat.api.fused import (
    check_bias_shape,
    check_dtype,
    check_ops,
    check_residual_shape,
    host_epilogue,
)
from coopmat.api.linalg import _last, _scalars, _shapes
from coopmat.codegen import Layout
from coopmat.codegen.traits import EpilogueOps
from coopmat.common.dtypes import dtype_name, numpy_dtype
from coopmat.common.errors import DeviceMismatchError
from coopmat.common.lru import Lru
from coopmat.dispatch.executor import Copy
from coopmat.dispatch.gemm import (
    DIRECT_MAX_BYTES,
    DeviceOperand,
    GemmResult,
    Plan,
    Staged,
    device_plan,
    enqueue_plan,
    plan_fits,
)
from coopmat.dispatch.memory import Buffer
from coopmat.dispatch.runtime import DeviceArg, Runtime, runtime
from coopmat.dispatch.transfer import NewDownload
from coopmat.policy import Options, TypePair, resolve


@dataclass(frozen=True)
class _Recipe:
    """What a call's shapes, strides, dtypes and scalars decide, computed once: a chain
    of products pays only for the result's allocation and the submission."""

    rt: Runtime
    pair: TypePair
    result_dtype: np.dtype
    shape: tuple[int, ...]
    gemm: tuple[int, int, int, int]
    a: Staged
    b: Staged
    d: Staged
    alpha: float | int
    beta: float | int
    options: Options
    plan: Plan  # what the first call ran: reused while the operands' buffers fit it
    strides: tuple[int, ...]  # the result's, C order
    sizes: tuple[int, int]  # the result's (data, allocation) bytes
    host_copy: bool  # the result comes back to host-visible memory too (host_copy_wanted)
    # Per operand: for a small numpy one, the bytes its device copy takes (_stage);
    # None for an Array or a large numpy operand (_on).
    stage_bytes: tuple[int | None, int | None]
    result: GemmResult  # what last_kernel_traits() reports after a call


RECIPES = 256
_recipes: Lru[_Recipe] = Lru(RECIPES)
# The largest result whose product also copies it to host-visible memory when an operand
# came from numpy: the same bound as operands staged in the GEMM's own submission.
HOST_COPY_MAX_BYTES = DIRECT_MAX_BYTES


def host_copy_wanted(result_bytes: int, numpy_operand: bool, unified: bool) -> bool:
    """Whether a product's result should also land in host-visible memory, in the same
    submission: a small result of a call that took a numpy operand is likely read back
    next (a decode step), and the copy then spares `.numpy()` a submission and its round
    trip. Not on unified memory, where the result is host-visible already."""
    return numpy_operand and not unified and 0 < result_bytes <= HOST_COPY_MAX_BYTES


def _signature(x: Any) -> tuple[Any, ...] | None:
    if type(x) is Array:
        return (id(x._storage.rt), x.shape, x._strides, x.dtype, x._offset == 0)
    if type(x) is np.ndarray:  # copied over for the call as a new C-contiguous Array
        return ("host", x.shape, x.dtype)
    return None


def quick(a: Any, b: Any) -> Array | None:
    """a @ b with default arguments by the kept recipe of its signature (an Array and an
    Array or numpy array), or None when there is none yet: linalg.matmul tries this
    first, before any of its checks."""
    sa, sb = _signature(a), _signature(b)
    if sa is None or sb is None or (sa[0] == "host" and sb[0] == "host"):
        return None
    return _fast(a, b, (sa, sb, 1, 0, None, None, None, Options.from_env()))


def _fast(a: Any, b: Any, key: tuple[Any, ...]) -> Array | None:
    """The cached way through for products of an Array (and an Array or a numpy array)
    with no c or out."""
    r = _recipes.get(key)
    if r is None:
        return None
    rt = r.rt
    uploads: list[Copy] = []
    used: list[Buffer] = []  # staging and copies of numpy operands, for this call only
    held: list[Array] = []
    operands: list[DeviceOperand] = []
    for x, staged_as, stage_bytes in ((a, r.a, r.stage_bytes[0]), (b, r.b, r.stage_bytes[1])):
        if type(x) is Array:
            if x._storage.rt is not rt:
                return None  # same shapes on another device: the long way names the error
            operands.append(DeviceOperand(x._storage.buffer, x._offset * x.dtype.itemsize,
                                     staged_as))
        elif stage_bytes is not None:
            operands.append(DeviceOperand(_stage(rt, x, stage_bytes, uploads, used), 0, staged_as))
        else:  # a large numpy operand: an Array of its own, held until the call is queued
            held.append(_on(rt, x, uploads))
            operands.append(DeviceOperand(held[-1].buffer, 0, staged_as))
    plan = r.plan
    try:
        if not plan_fits(plan, operands[0], operands[1]):
            return None  # the long way plans for these buffers (and keeps that plan)
        result = fresh(rt, r.shape, r.result_dtype, r.strides, r.sizes)
        d = DeviceOperand(result._storage.buffer, 0, r.d)
        _enqueue(rt, plan, operands[0], operands[1], None, d, uploads, result, r.host_copy)
    finally:
        for buf in used:
            rt.pool.recycle(buf)
    _last.result = r.result
    return result


def _stage(rt: Runtime, host: np.ndarray, nbytes: int, uploads: list[Copy],
           used: list[Buffer]) -> Buffer:
    """A small numpy operand in a device buffer of `nbytes` for one call, C-contiguous:
    written where the kernel reads it (pool.direct_kind), else to host-visible staging
    and copied over by the call's own submission. The buffers go on `used`, for the
    caller to give back once the call is queued."""
    direct = rt.pool.direct_kind()
    stage = rt.pool.acquire(direct or rt.pool.kinds()[1], nbytes if direct else host.nbytes)
    used.append(stage)
    assert stage.mapped is not None
    np.copyto(stage.mapped[:host.nbytes].view(host.dtype).reshape(host.shape), host)
    if direct:
        return stage
    dev = rt.pool.acquire(rt.pool.kinds()[0], nbytes)
    used.append(dev)
    uploads.append(Copy(stage, dev, host.nbytes))
    return dev


def _enqueue(rt: Runtime, plan: Plan, a: DeviceOperand, b: DeviceOperand,
             c: DeviceOperand | None, d: DeviceOperand, uploads: list[Copy], result: Array,
             host_copy: bool, bias: DeviceOperand | None = None,
             residual: DeviceOperand | None = None) -> None:
    """Queue the plan into `result` (C-contiguous, from offset 0 of its storage when
    host_copy: then a copy of its bytes goes to host-visible memory in the same
    submission)."""
    storage = result._storage
    storage.written()
    if not host_copy:
        enqueue_plan(rt, plan, a, b, c, d, uploads, bias=bias, residual=residual)
        return
    # A kept pinned block that .numpy() hands over as it is, else a pool buffer.
    target = rt.transfers.small_download(storage.nbytes)
    host: Buffer | NewDownload
    if target is not None:
        host, copy = target, Copy(storage.buffer, target.dst, storage.nbytes, 0, target.offset)
    else:
        buf = rt.pool.acquire(rt.pool.kinds()[2], storage.nbytes)
        host, copy = buf, Copy(storage.buffer, buf, storage.nbytes)
    try:
        ticket = enqueue_plan(rt, plan, a, b, c, d, uploads, bias=bias, residual=residual,
                              downloads=[copy])
    except BaseException:
        storage.drop_host(host)
        raise
    storage.host = (host, ticket)


def _batch_stride(x: Array, batch_shape: tuple[int, ...]) -> int | None:
    """One element stride that walks x's batch axes in C order (0: shared by every batch
    entry); None where they cannot be walked with one stride."""
    lead = x.shape[:-2]
    strides = x.element_strides[:-2]
    if math.prod(lead) <= 1:
        return 0
    if lead != batch_shape[len(batch_shape) - len(lead):] or math.prod(lead) != math.prod(
            batch_shape):
        return None  # broadcast over some batch axes only
    live = [(n, s) for n, s in zip(lead, strides, strict=True) if n > 1]
    for (_, outer), (n_inner, inner) in zip(live, live[1:], strict=False):
        if outer != inner * n_inner:
            return None
    return live[-1][1]


def _operand(x: Array, batch_shape: tuple[int, ...], which: int) -> DeviceOperand:
    """How the matrix operand x lies in its buffer."""
    rows, cols = x.shape[-2:]
    sr, sc = x.element_strides[-2:]
    if cols == 1 or sc == 1:
        layout, ld = Layout.ROW_MAJOR, (sr if rows > 1 else cols)
    elif rows == 1 or sr == 1:
        layout, ld = Layout.COLUMN_MAJOR, (sc if cols > 1 else rows)
    else:
        raise ValueError(
            f"matmul: operand {which}'s strides {x.strides} are neither row- nor "
            f"column-major in its last two axes; pass coopmat.asarray(np.asarray(x)) for "
            f"a contiguous copy")
    bstride = _batch_stride(x, batch_shape)
    if bstride is None or min(x.element_strides, default=0) < 0:
        raise ValueError(
            f"matmul: operand {which} of shape {x.shape} and strides {x.strides} is "
            f"broadcast over only some batch axes (or reversed); device arrays need one "
            f"stride for all batch axes")
    lines, length = (rows, cols) if layout is Layout.ROW_MAJOR else (cols, rows)
    batch = math.prod(batch_shape) if bstride else 1
    span = (batch - 1) * bstride + (lines - 1) * ld + length
    return DeviceOperand(x.buffer, x.offset_bytes,
                         Staged(layout, ld, bstride, span * x.itemsize))


def _stage_bytes(rt: Runtime, x: Any) -> int | None:
    """For a numpy operand small enough to go over in the call's own submission, the
    bytes of its device copy (data and margin); None otherwise."""
    if isinstance(x, Array):
        return None
    host = np.asarray(x)
    if host.nbytes > DIRECT_MAX_BYTES or host.nbytes == 0:
        return None
    return allocation(rt, host.shape, host.dtype)[1]


def _on(rt: Runtime, x: Any, uploads: list[Copy], dtype: Any = None) -> Array:
    """x as an Array on rt's device: numpy operands are copied over for the call, small
    ones by a copy command in the GEMM's own submission (appended to `uploads`)."""
    if isinstance(x, Array):
        if x.runtime is not rt:
            raise DeviceMismatchError(
                f"operands live on different devices: {x.device.info.index} "
                f"({x.device.info.name}) and {rt.device.info.index} ({rt.device.info.name})")
        return x
    host = np.asarray(x, dtype=dtype)
    if host.nbytes > DIRECT_MAX_BYTES or host.nbytes == 0:
        return asarray(host, device=rt.device)
    sizes = allocation(rt, host.shape, host.dtype)
    direct = rt.pool.direct_kind()
    if direct:  # written where the kernel reads it
        return staged(host, rt, direct, sizes[1])
    stage = staged(host, rt)
    arr = fresh(rt, host.shape, host.dtype, stage._strides, sizes)
    uploads.append(Copy(stage.buffer, arr.buffer, host.nbytes))
    arr._keep = stage  # the staging memory goes back to the pool with arr
    return arr


def check_epilogue(ops: EpilogueOps | None, float_result: bool, result_dtype: np.dtype,
                   bias: Any, residual: Any, bias_n: int, shape: tuple[int, ...]) -> None:
    """The fused epilogue's arguments against the result: activation on a float result,
    bias of shape (bias_n,), residual of the result's shape, dtypes castable to the result
    (device arrays: already the result dtype, C-contiguous)."""
    check_ops(ops, float_result, dtype_name(result_dtype))
    if bias is not None:
        check_bias_shape(tuple(np.shape(bias)), bias_n)
    if residual is not None:
        check_residual_shape(tuple(np.shape(residual)), shape)
    for what, x in (("bias", bias), ("residual", residual)):
        if isinstance(x, Array) and (x.dtype != result_dtype or not x.is_c_contiguous):
            raise TypeError(f"matmul: a device array {what} must be C-contiguous and of the "
                            f"result dtype {dtype_name(result_dtype)}, not "
                            f"{dtype_name(x.dtype)}")
        if x is not None and not isinstance(x, Array):
            check_dtype(what, np.asarray(x).dtype, result_dtype)


def epilogue_operands(rt: Runtime, bias: Any, residual: Any, N: int, result_dtype: np.dtype,
                      uploads: list[Copy]) -> tuple[DeviceOperand | None, DeviceOperand | None]:
    """The fused epilogue's operands on rt's device: bias (its elements) and residual,
    laid out like D (rows of N); numpy ones copied over for the call."""
    bias_op = res_op = None
    if bias is not None:
        bias_arr = _on(rt, bias, uploads, result_dtype)
        bias_op = DeviceOperand(bias_arr.buffer, bias_arr.offset_bytes,
                                Staged(Layout.ROW_MAJOR, bias_arr.size, 0, bias_arr.nbytes))
    if residual is not None:
        res_arr = _on(rt, np.ascontiguousarray(residual, dtype=result_dtype)
                      if not isinstance(residual, Array) else residual, uploads)
        res_op = DeviceOperand(res_arr.buffer, res_arr.offset_bytes,
                               Staged(Layout.ROW_MAJOR, N, 0, res_arr.nbytes))
    return bias_op, res_op


def matmul_arrays(a: Any, b: Any, *, c: Any, alpha: float | int, beta: float | int,
                  out: Any, dtype: Any, accumulator: Any, device: DeviceArg,
                  family: str | None, bias: Any = None, residual: Any = None,
                  ops: EpilogueOps | None = None) -> Any:
    key = None
    if c is None and out is None and device is None and ops is None:
        sa, sb = _signature(a), _signature(b)
        if sa is not None and sb is not None and (sa[0] != "host" or sb[0] != "host"):
            key = (sa, sb, alpha, beta, dtype, accumulator, family, Options.from_env())
            done = _fast(a, b, key)
            if done is not None:
                return done
    arrays = [x for x in (a, b, c, out, bias, residual) if isinstance(x, Array)]
    rt = same_runtime(arrays)
    if device is not None and runtime(device) is not rt:
        raise DeviceMismatchError(
            f"device={device!r} is not the device the operands live on "
            f"({rt.device.info.index}: {rt.device.info.name})")
    a_shape, b_shape = tuple(np.shape(a)), tuple(np.shape(b))
    M, N, K, batch_shape, full_shape, shape = _shapes(a_shape, b_shape)
    options = Options.from_env().with_family(family)
    a_dtype = a.dtype if isinstance(a, Array) else np.asarray(a).dtype
    b_dtype = b.dtype if isinstance(b, Array) else np.asarray(b).dtype
    pair = resolve(rt.device.info, a_dtype, b_dtype, dtype, accumulator)
    result_dtype = numpy_dtype(pair.stored)
    alpha, beta = _scalars(pair, alpha, beta)
    check_epilogue(ops, pair.result.is_float, result_dtype, bias, residual,
                   N if len(b_shape) > 1 else 1, shape)

    if out is not None:
        if not isinstance(out, Array):
            raise TypeError("matmul: out must be a coopmat.Array when an operand is one")
        if out.shape != shape:
            raise ValueError(f"matmul: out has shape {out.shape}, the result has shape {shape}")
        if out.dtype != result_dtype:
            raise TypeError(f"matmul: out has dtype {dtype_name(out.dtype)}; a device array "
                            f"out must have the result dtype {dtype_name(result_dtype)}")
        if not out.is_c_contiguous:
            raise ValueError("matmul: a device array out must be C-contiguous")
        result = out
    else:
        result = empty(shape, result_dtype, device=rt.device)

    uploads: list[Copy] = []
    A, B = _on(rt, a, uploads), _on(rt, b, uploads)
    A2 = A.reshape(1, K) if A.ndim == 1 else A
    B2 = B.reshape(K, 1) if B.ndim == 1 else B
    C: Array | None = None
    if c is not None and beta != 0:  # BLAS convention: beta == 0 means C is not read
        c_dtype = c.dtype if isinstance(c, Array) else np.asarray(c).dtype
        if c_dtype != result_dtype and not np.can_cast(c_dtype, result_dtype, "same_kind"):
            raise TypeError(f"matmul: c has dtype {c_dtype}, which cannot be cast to the "
                            f"result dtype {result_dtype}")
        if isinstance(c, Array):
            if c.dtype != result_dtype:
                raise TypeError(f"matmul: a device array c must have the result dtype "
                                f"{dtype_name(result_dtype)}, not {dtype_name(c.dtype)}")
            if c.shape != shape and c.shape != shape[-2:]:
                raise ValueError(f"matmul: a device array c must have the result's shape "
                                 f"{shape} (or its last two axes), not {c.shape}")
            C = c
        else:
            try:
                host_c = np.broadcast_to(np.asarray(c).astype(result_dtype, copy=False), shape)
            except ValueError:
                raise ValueError(f"matmul: c of shape {np.shape(c)} does not broadcast to the "
                                 f"result shape {shape}") from None
            C = asarray(np.ascontiguousarray(host_c), device=rt.device)

    if result.size == 0:
        return result
    if K == 0:  # an empty sum: zeros, plus beta * c
        host = np.zeros(shape, result_dtype)
        if C is not None:
            host[...] = beta * C.numpy()
        if ops is not None:
            host[...] = host_epilogue(
                host, ops, None if bias is None else np.asarray(bias).astype(result_dtype),
                None if residual is None else np.asarray(residual).astype(result_dtype))
        result._storage.written()
        rt.transfers.upload(host, result.buffer, result.offset_bytes)
        return result
    bias_op, res_op = epilogue_operands(rt, bias, residual, N, result_dtype, uploads)

    full = (*batch_shape, M, N)
    a_op = _operand(A2, batch_shape, 0)
    b_op = _operand(B2, batch_shape, 1)
    c_op = _operand(C.reshape(full) if C.shape == shape else C, batch_shape, 2) \
        if C is not None else None
    batch = math.prod(batch_shape) if batch_shape else 1
    d_op = DeviceOperand(result.buffer, result.offset_bytes,
                         Staged(Layout.ROW_MAJOR, N, M * N if batch > 1 else 0,
                                batch * M * N * result_dtype.itemsize))
    plan = device_plan(rt, pair, a_op, b_op, c_op, (batch, M, N, K), alpha, beta, options,
                       ops)
    numpy_operand = not (isinstance(a, Array) and isinstance(b, Array))
    host_copy = result.offset_bytes == 0 and host_copy_wanted(
        result._storage.nbytes, numpy_operand, rt.pool.unified)
    _enqueue(rt, plan, a_op, b_op, c_op, d_op, uploads, result, host_copy, bias_op, res_op)
    _last.result = GemmResult(None, plan.traits, plan.choice.split_k)
    if key is not None:
        _recipes.put(key, _Recipe(rt, pair, result_dtype, shape, (batch, M, N, K),
                                  a_op.staged, b_op.staged, d_op.staged, alpha, beta,
                                  options, plan, result._strides,
                                  allocation(rt, shape, result_dtype), host_copy,
                                  (_stage_bytes(rt, a), _stage_bytes(rt, b)),
                                  _last.result))
    return result
