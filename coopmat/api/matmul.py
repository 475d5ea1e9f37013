"""`coopmat.matmul` and `coopmat.linear`: numpy.matmul on a cooperative-matrix Vulkan
device, the one front of every product.

A call describes each operand once (coopmat.api.operands: a host ndarray, a device Array,
a quantized weight as B), applies numpy's rules once (coopmat.api.rules), asks the policy
once for the result type (policy.resolve; the kernel: dispatch's plan), and hands one
plan to dispatch: a numpy -> numpy product to dispatch.host (staged, run and read back),
a product with an operand on the device to dispatch.queued (queued without waiting). A
repeated call of the same signature takes its kept recipe (`_recipes`, one cache for
every kind) before any of this.
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from coopmat.api import rules
from coopmat.api.array import (
    Array,
    allocation,
    asarray,
    c_strides,
    empty,
    fresh,
    same_runtime,
)
from coopmat.api.fused import host_bias, host_epilogue, host_residual, ops_of
from coopmat.api.operands import USE_WEIGHT, Kind, Operand, QuantizedWeight
from coopmat.codegen import Layout
from coopmat.codegen.traits import EpilogueOps
from coopmat.common.dtypes import dtype_name, numpy_dtype
from coopmat.common.enums import ComponentType
from coopmat.common.errors import DeviceMismatchError
from coopmat.common.lru import Lru
from coopmat.dispatch import pipeline
from coopmat.dispatch.act_quant import q8_1_plan
from coopmat.dispatch.executor import Copy
from coopmat.dispatch.gemm import GemmResult, Plan, check_fits, device_plan, plan_fits
from coopmat.dispatch.host import KeptGemm, kept_gemm, run_gemm
from coopmat.dispatch.memory import Buffer
from coopmat.dispatch.queued import enqueue_product, release_used, stage_small
from coopmat.dispatch.runtime import DeviceArg, Runtime, runtime
from coopmat.dispatch.staging import (
    DIRECT_MAX_BYTES,
    DeviceOperand,
    Staged,
    bindable_offset,
    host_copy_wanted,
    matrix_operand,
)
from coopmat.policy import TypePair, current_options, resolve, result_pairs
from coopmat.policy.act_quant import check_name as check_activation_quant

# Kernel families that take a quantized B.
WEIGHT_FAMILIES = (None, "khr", "gemv")
# Activation dtypes against a quantized weight.
ACTIVATION_DTYPES = ("float16", "bfloat16")

_last = threading.local()


def last_kernel_time() -> float | None:
    """GPU time in seconds (timestamp queries) of this thread's last matmul kernel; None
    where it was not timed: no timestamps on the queue, a product queued on the device
    (an Array result), or a pipelined numpy -> numpy product (dispatch/pipeline.py),
    whose blocks' kernels overlap its copies."""
    r: GemmResult | None = getattr(_last, "result", None)
    return r.kernel_seconds if r else None


def last_kernel_traits() -> Any:
    """The kernel (its traits) of this thread's last matmul; None before the first."""
    r: GemmResult | None = getattr(_last, "result", None)
    return r.traits if r else None


# -- describing operands ----------------------------------------------------------------
def describe(x: Any) -> Operand:
    """x as the front sees it: a device Array, a quantized weight, or a host array."""
    if type(x) is np.ndarray:
        return Operand(Kind.HOST, x, x.shape, x.dtype)
    if isinstance(x, Array):
        return Operand(Kind.DEVICE, x, x.shape, x.dtype)
    if isinstance(x, QuantizedWeight):
        return Operand(Kind.WEIGHT, x, tuple(x.shape), np.dtype(np.uint8))
    host = np.asarray(x)
    return Operand(Kind.HOST, host, host.shape, host.dtype)


def device_operand(x: Any, which: int = 0,
                   batch_shape: tuple[int, ...] = ()) -> DeviceOperand:
    """How a device Array (a matrix, or a stack walked by one stride over `batch_shape`)
    or a quantized weight's transpose w.T lies in device memory, as dispatch takes it:
    the seam for tools that time a plan on operands of their own."""
    if isinstance(x, QuantizedWeight):
        if not x.transposed:
            raise ValueError(f"matmul: a quantized weight is B as its transpose; {USE_WEIGHT}")
        return _weight_operand(x.weight)
    return matrix_operand(x.buffer, x.offset_bytes, x.shape, x.element_strides, x.itemsize,
                          batch_shape, which)


def _weight_operand(w: Any) -> DeviceOperand:
    """The N x K weight's blocks as matmul's B (w.T): column-major, K along each line."""
    return DeviceOperand(w.buffer, 0, Staged(Layout.COLUMN_MAJOR, w.shape[1], 0, w.nbytes,
                                             quant=w.format))


# -- the one cache of repeated calls ----------------------------------------------------
class _Recipe:
    """What a call decided, kept per call signature: a repeat pays only for staging its
    operands (if numpy), the result and the submission. run() returns the result, or
    None where the recipe does not fit these operands (the caller goes the long way)."""

    rt: Runtime

    def run(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def release(self) -> None:
        """Give back what the recipe holds (device buffers)."""


class _KeptHost(_Recipe):
    """A small numpy -> numpy product: its prepared GEMM, buffers and all."""

    def __init__(self, rt: Runtime, kept: KeptGemm) -> None:
        self.rt, self.kept = rt, kept

    def run(self, a: Any, b: Any) -> Any:
        if runtime() is not self.rt:  # $COOPMAT_DEVICE names another device now
            return None
        done = self.kept.run(a[np.newaxis], b[np.newaxis])
        if done is None:
            return None
        _last.result = done[1]
        return done[0][0]

    def release(self) -> None:
        self.kept.release()


@dataclass(frozen=True)
class _Bind:
    """How one operand of a kept device product is bound: where it lies (staged), and
    for a small numpy operand the bytes of its device copy; for a quantized weight, a
    weak reference telling a reused id() apart."""

    kind: Kind
    staged: Staged
    stage_bytes: int | None = None
    weight: weakref.ref[Any] | None = None


@dataclass(frozen=True, eq=False)
class _KeptDevice(_Recipe):
    """A product with an operand on the device: the plan and the result's layout."""

    rt: Runtime
    plan: Plan  # what the first call ran: reused while the operands' buffers fit it
    a: _Bind
    b: _Bind
    d: Staged
    shape: tuple[int, ...]
    result_dtype: np.dtype
    strides: tuple[int, ...]  # the result's, C order
    sizes: tuple[int, int]  # the result's (data, allocation) bytes
    host_copy: bool  # the result comes back to host-visible memory too (host_copy_wanted)
    result: GemmResult  # what last_kernel_traits() reports after a call

    def run(self, a: Any, b: Any) -> Any:
        rt = self.rt
        uploads: list[Copy] = []
        used: list[Buffer] = []  # staging and copies of numpy operands, for this call only
        held: list[Array] = []
        operands: list[DeviceOperand] = []
        for x, bind in ((a, self.a), (b, self.b)):
            if bind.kind is Kind.DEVICE:
                if x._storage.rt is not rt or not bindable_offset(x.offset_bytes) or \
                        min(x.element_strides, default=0) < 0:
                    return None  # another device, or a view bound through a copy: the long way
                operands.append(DeviceOperand(x._storage.buffer, x._offset * x.dtype.itemsize,
                                              bind.staged))
            elif bind.kind is Kind.WEIGHT:
                assert bind.weight is not None
                if bind.weight() is not x.weight:
                    return None
                operands.append(_weight_operand(x.weight))
            elif bind.stage_bytes is not None:
                operands.append(DeviceOperand(stage_small(rt, x, bind.stage_bytes, uploads,
                                                          used), 0, bind.staged))
            else:  # a large numpy operand: an Array of its own, held until queued
                held.append(asarray(x, device=rt.device))
                operands.append(DeviceOperand(held[-1].buffer, 0, bind.staged))
        try:
            if not plan_fits(self.plan, operands[0], operands[1]):
                return None  # the long way plans for these buffers (and keeps that plan)
            result = fresh(rt, self.shape, self.result_dtype, self.strides, self.sizes)
            d = DeviceOperand(result._storage.buffer, 0, self.d)
            _enqueue(rt, self.plan, operands[0], operands[1], None, d, uploads, result,
                     self.host_copy)
        finally:
            if used:
                release_used(rt, used)
        _last.result = self.result
        return result


RECIPES = 256
# Of them, at most this many small numpy -> numpy products hold their prepared GEMM's
# buffers (each at most DIRECT_MAX_BYTES of staging and its device copies).
KEPT_HOST = 16
_recipes: Lru[_Recipe] = Lru(RECIPES)
_kept_host: Lru[KeptGemm] = Lru(KEPT_HOST)  # by key: the prepared GEMMs recipes hold
_watched: set[int] = set()  # runtimes whose destruction forgets the recipes
_watch_lock = threading.Lock()


def _signature(x: Any) -> tuple[Any, ...] | None:
    t = type(x)
    if t is np.ndarray:  # a numpy operand's layout picks the staging (and the kernel)
        return ("host", x.shape, x.strides, x.dtype)
    if t is Array:
        return (id(x._storage.rt), x.shape, x._strides, x.dtype, x._offset == 0)
    if isinstance(x, QuantizedWeight) and x.transposed:
        return ("weight", id(x.weight))
    return None


def _key(a: Any, b: Any, alpha: Any, beta: Any, dtype: Any, accumulator: Any,
         family: Any) -> tuple[Any, ...] | None:
    """The call signature a recipe is kept under, or None for calls never kept."""
    # numpy operands inline: the small numpy -> numpy call is the one this path is for
    sa = ("host", a.shape, a.strides, a.dtype) if type(a) is np.ndarray else _signature(a)
    sb = ("host", b.shape, b.strides, b.dtype) if type(b) is np.ndarray else _signature(b)
    if sa is None or sb is None or type(alpha) not in (int, float) or \
            type(beta) not in (int, float):
        return None
    try:
        return (sa, sb, alpha, beta, dtype, accumulator, family, current_options())
    except TypeError:  # an unhashable dtype argument
        return None


def _keep(key: tuple[Any, ...], recipe: _Recipe) -> None:
    rt = recipe.rt
    rt_id = id(rt)
    with _watch_lock:
        if rt_id not in _watched:
            _watched.add(rt_id)
            rt.on_destroy.append(lambda: _forget(rt_id))
    if isinstance(recipe, _KeptHost):  # past KEPT_HOST, the oldest gives its buffers back
        for kept in _kept_host.put(key, recipe.kept):
            kept.release()
    for old in _recipes.put(key, recipe):
        old.release()


def _forget(rt_id: int) -> None:
    """A runtime is being destroyed: its recipes' buffers go back before its pool does."""
    forget_recipes()
    with _watch_lock:
        _watched.discard(rt_id)


def forget_recipes() -> None:
    """Forget every kept recipe (and give back the buffers kept products hold)."""
    for kept in _kept_host.clear():
        kept.release()
    for value in _recipes.clear():
        value.release()


# -- the front --------------------------------------------------------------------------
def matmul(a: Any, b: Any, *, c: Any = None, alpha: float | int = 1, beta: float | int = 0,
           out: Any = None, dtype: Any = None, accumulator: Any = None,
           device: DeviceArg = None, family: str | None = None,
           out_dtype: Any = None, bias: Any = None, activation: Any = None,
           residual: Any = None, activation_quant: str | None = None) -> Any:
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
    - out: written in place; any writeable array of the result's shape that numpy's
      default casting ("same_kind") accepts the result dtype into (a coopmat.Array out:
      of the result dtype, C-contiguous).
    - Where the result lives, one rule: when any of a, b, c, out, bias, residual lives on
      the device (a coopmat.Array, or a quantized weight, which is device memory too), the
      product runs on that device without waiting and returns an Array (numpy operands
      are copied over for the call; out must then be an Array); otherwise numpy in,
      numpy out.
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
      dequantized inside the GEMM (coopmat.api.quantized).
    - activation_quant: None (the default: x exact), or 'q8_1' (opt-in, a q4_0 or q8_0
      weight and float16 x): x quantized to 8-bit blocks of 32 with a float32 scale, as
      llama.cpp's q8_1, by a pass of its own, then multiplied in integers; each result
      is off by up to the sum over K of |w| times half a step of x's block (docs/guide.md,
      Quantized weights).
    """
    key = None
    if c is None and out is None and device is None and out_dtype is None and \
            bias is None and activation is None and residual is None and \
            activation_quant is None:
        key = _key(a, b, alpha, beta, dtype, accumulator, family)
        if key is not None:
            recipe = _recipes.get(key)
            if recipe is not None:
                done = recipe.run(a, b)
                if done is not None:
                    return done
    A, B = describe(a), describe(b)
    if activation_quant is not None:
        check_activation_quant(activation_quant)
        if B.kind is not Kind.WEIGHT:
            raise ValueError(f"matmul: activation_quant={activation_quant!r} multiplies a "
                             f"quantized weight (b = w.T of a coopmat.QuantizedArray w)")
    if A.kind is Kind.WEIGHT:
        raise TypeError(f"matmul: a quantized weight cannot be operand 0 (A); {USE_WEIGHT}")
    if B.kind is Kind.WEIGHT and not B.value.transposed:
        raise ValueError(f"matmul: the quantized weight has shape {B.shape} (N x K) with K "
                         f"along its rows; {USE_WEIGHT}")
    extras = [None if x is None else describe(x) for x in (c, out, bias, residual)]
    dtype = rules.result_dtype_arg(dtype, out_dtype)
    ops = ops_of(bias, activation, residual)
    if A.on_device or B.on_device or any(x is not None and x.on_device for x in extras):
        return _device_product(A, B, *extras, alpha=alpha, beta=beta, dtype=dtype,
                               accumulator=accumulator, device=device, family=family,
                               ops=ops, key=key, activation_quant=activation_quant)
    return _host_product(A.value, B.value, c, alpha, beta, out, dtype, accumulator, device,
                         family, bias, residual, ops, key)


def matmul_to_host(a: Any, b: Any, **kwargs: Any) -> np.ndarray:
    """matmul(a, b, **kwargs) as a numpy array, whatever the operands: what a task that
    takes a numpy chunk and a weight kept on the device and hands back a numpy chunk
    wants (coopmat.dask). A large row-major numpy `a` against an Array `b` (no c, out or
    residual) is pipelined: a's row blocks are written to the device while earlier blocks
    compute and come back into a kept pinned block (dispatch/pipeline.py); anything else
    is matmul(...) then .numpy()."""
    done = _pipelined_to_host(a, b, kwargs)
    if done is not None:
        return done
    y = matmul(a, b, **kwargs)
    return y.numpy() if isinstance(y, Array) else np.asarray(y)


_TO_HOST_KWARGS = frozenset({"dtype", "out_dtype", "accumulator", "family", "alpha", "bias",
                             "activation"})


def _pipelined_to_host(a: Any, b: Any, kwargs: dict[str, Any]) -> np.ndarray | None:
    if type(a) is not np.ndarray or a.ndim != 2 or not isinstance(b, Array) or \
            b.ndim != 2 or not kwargs.keys() <= _TO_HOST_KWARGS or a.shape[1] != b.shape[0]:
        return None
    rt = b.runtime
    M, K = a.shape
    N = b.shape[1]
    bias = kwargs.get("bias")
    options = current_options().with_family(kwargs.get("family"))
    if M * N * K == 0 or not a.flags.c_contiguous or \
            bias is not None and type(bias) is not np.ndarray or \
            options.pipeline == "auto" and pipeline.mapped(rt) and \
            pipeline.way(True, rt.copy_engines, rt.transfers.kept(a)) != "kept":
        # On host-mapped memory the mapped way's writes of x measured no faster than the
        # plain product (docs/design.md, "Dask tasks"): only the copy queues' ways, or
        # when asked.
        return None
    dtype = rules.result_dtype_arg(kwargs.get("dtype"), kwargs.get("out_dtype"))
    pair = resolve(rt.device.info, a.dtype, b.dtype, dtype, kwargs.get("accumulator"))
    result_dtype = numpy_dtype(pair.stored)
    alpha, _ = rules.scalars(pair.result.is_float, kwargs.get("alpha", 1), 0)
    ops = ops_of(bias, kwargs.get("activation"), None)
    rules.check_activation(ops, pair.result.is_float, dtype_name(result_dtype))
    a3 = a.reshape(1, M, K)
    call = _Call(rt)
    try:
        b_op = call.matrix(describe(b), b.shape, (), 1)
        if not pipeline.applies(rt, a3, b_op, None, (1, M, N),
                                a.nbytes + M * N * result_dtype.itemsize, options):
            return None
        epilogue = None
        if ops is not None:
            bias_op = None if bias is None else call.vector(
                describe(host_bias(bias, N, result_dtype)), result_dtype, N)
            epilogue = pipeline.Epilogue(ops, bias_op)
            if call.uploads:  # a staged bias: copied over before the blocks' kernels
                rt.executor.submit(call.uploads, [])
        done = pipeline.run_pipelined(rt, pair, a3, b_op, None, alpha, options, n=N,
                                      epilogue=epilogue)
    finally:
        call.done()
    if done is None:
        return None
    _last.result = done[0]
    return done[1].reshape(M, N)


def linear(x: Any, w: Any, bias: Any = None, activation: Any = None, residual: Any = None, *,
           out: Any = None, **kwargs: Any) -> Any:
    """act(x @ w.T + bias) + residual, as torch.nn.functional.linear followed by an
    activation and a residual add, fused into one GPU kernel.

    - x: (..., in_features); w: (out_features, in_features), as torch stores a Linear's
      weight (a numpy array, a coopmat.Array, a coopmat.QuantizedArray, or anything with
      a `.T` that matmul takes);
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


# -- numpy in, numpy out ----------------------------------------------------------------
def _host_product(a: np.ndarray, b: np.ndarray, c: Any, alpha: Any, beta: Any, out: Any,
                  dtype: Any, accumulator: Any, device: DeviceArg, family: str | None,
                  bias: Any, residual: Any, ops: EpilogueOps | None,
                  key: tuple[Any, ...] | None) -> Any:
    # Shape errors come before any device is opened.
    M, N, K, batch_shape, full_shape, shape = rules.shapes(a.shape, b.shape)
    options = current_options().with_family(family)
    rt = runtime(device)
    pair = resolve(rt.device.info, a.dtype, b.dtype, dtype, accumulator)
    result_dtype = numpy_dtype(pair.stored)
    alpha, beta = rules.scalars(pair.result.is_float, alpha, beta)
    rules.check_activation(ops, pair.result.is_float, dtype_name(result_dtype))
    bias_arr = host_bias(bias, N if b.ndim > 1 else 1, result_dtype) \
        if bias is not None else None
    res_arr = host_residual(residual, shape, result_dtype) if residual is not None else None
    a2 = a[np.newaxis, :] if a.ndim == 1 else a
    b2 = b[:, np.newaxis] if b.ndim == 1 else b

    c_arr = None
    if c is not None and beta != 0:  # BLAS convention: beta == 0 means C is not read
        c_arr = np.asarray(c)
        rules.check_into_result("c", c_arr.dtype, result_dtype)
        c_arr = c_arr.astype(result_dtype, copy=False)
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

    result: np.ndarray | None = None  # None: made by the GEMM's download
    if out is not None:
        rules.check_out(describe(out), shape, result_dtype, device_result=False)
        result = out
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
    if key is not None and a.ndim == 2 and b.ndim == 2 and batch == 1:
        # A small product that repeats: prepared once, run, and kept for the repeats.
        kept = kept_gemm(rt, pair, a3, b3, alpha, beta, options)
        if kept is not None:
            done = kept.run(a3, b3, load=False)
            assert done is not None  # nobody else holds it yet
            _last.result = done[1]
            _keep(key, _KeptHost(rt, kept))
            return done[0][0]
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
    if result is None:
        result = made.reshape(shape)
    elif not direct:
        np.copyto(result, made.reshape(shape), casting="same_kind")
    return _finish(result, out)


def _finish(result: np.ndarray, out: np.ndarray | None) -> Any:
    """numpy's return convention: 1-D @ 1-D gives a scalar of the result type (an array
    only when the caller gave out=)."""
    if result.ndim == 0 and out is None:
        return result[()]
    return result


# -- an operand on the device: queued, an Array result ----------------------------------
class _Call:
    """The device buffers one queued call binds: numpy operands copied over for it
    (small ones by copies in its own submission: `uploads`), given back once queued.

    Every buffer the call binds is held here until `done()`, after the submission: a
    buffer given back sooner (an Array dying) waits only for the work submitted so far
    (Stream.defer), not for this call's, so another call could take it and write it
    before this call's kernel reads it."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.uploads: list[Copy] = []
        self.used: list[Buffer] = []  # staging of small numpy operands
        # The Arrays it binds: device operands (a reshape's copy included) and large
        # numpy operands' copies.
        self.held: list[Array] = []

    def stage_bytes(self, host: np.ndarray) -> int | None:
        """For a numpy operand small enough to go over in the call's own submission, the
        bytes of its device copy (data and margin); None otherwise."""
        if host.nbytes > DIRECT_MAX_BYTES or host.nbytes == 0:
            return None
        return allocation(self.rt, host.shape, host.dtype)[1]

    def on_device(self, x: Operand, dtype: Any = None) -> tuple[Buffer, int, Any]:
        """(buffer, byte offset, element strides) of the operand on rt's device: an Array
        where it lies, a numpy one as a C-contiguous copy made for the call."""
        if x.kind is Kind.DEVICE:
            arr = x.value
            if arr.runtime is not self.rt:
                raise DeviceMismatchError(
                    f"operands live on different devices: {arr.device.info.index} "
                    f"({arr.device.info.name}) and {self.rt.device.info.index} "
                    f"({self.rt.device.info.name})")
            if not bindable_offset(arr.offset_bytes) or min(arr.element_strides, default=0) < 0:
                arr = arr.copy()  # a view no kernel binds as it is: from where, or reversed
            self.held.append(arr)
            return arr.buffer, arr.offset_bytes, arr.element_strides
        host = np.ascontiguousarray(x.value, dtype=dtype)
        nbytes = self.stage_bytes(host)
        strides = c_strides(host.shape)
        if nbytes is not None:
            return stage_small(self.rt, host, nbytes, self.uploads, self.used), 0, strides
        self.held.append(asarray(host, device=self.rt.device))
        return self.held[-1].buffer, 0, self.held[-1].element_strides

    def matrix(self, x: Operand, shape: tuple[int, ...], batch_shape: tuple[int, ...],
               which: int) -> DeviceOperand:
        """The operand, viewed as `shape` (its matrix form), as dispatch takes it."""
        if x.kind is Kind.DEVICE and x.value.shape != shape:
            arr = x.value.reshape(shape)
            x = Operand(Kind.DEVICE, arr, arr.shape, arr.dtype)
        buf, offset, strides = self.on_device(x)
        if x.kind is Kind.HOST and x.shape != shape:  # the C-contiguous copy, reshaped
            strides = c_strides(shape)
        return matrix_operand(buf, offset, shape, strides, x.dtype.itemsize, batch_shape,
                              which)

    def vector(self, x: Operand, dtype: np.dtype, line: int) -> DeviceOperand:
        """bias (line: its length) or residual (line: N), row-major lines of the result
        dtype."""
        buf, offset, _ = self.on_device(x, None if x.kind is Kind.DEVICE else dtype)
        return DeviceOperand(buf, offset, Staged(Layout.ROW_MAJOR, line, 0,
                                                 math.prod(x.shape) * dtype.itemsize))

    def done(self) -> None:
        """Give back what the call staged and let go of what it held, once it is queued
        (or failed to be)."""
        used, self.used = self.used, []
        release_used(self.rt, used)
        self.held.clear()


def _device_product(A: Operand, B: Operand, C: Operand | None, out: Operand | None,
                    bias: Operand | None, residual: Operand | None, *, alpha: Any, beta: Any,
                    dtype: Any, accumulator: Any, device: DeviceArg, family: str | None,
                    ops: EpilogueOps | None, key: tuple[Any, ...] | None,
                    activation_quant: str | None = None) -> Array:
    weight = B.kind is Kind.WEIGHT
    residents = [x.value for x in (A, B, C, out, bias, residual)
                 if x is not None and x.kind is Kind.DEVICE]
    if weight:
        if C is not None and beta != 0:
            raise TypeError("matmul: c and beta are not supported with a quantized B")
        if family not in WEIGHT_FAMILIES:
            raise ValueError(f"matmul: a quantized B runs on the khr or gemv kernel families "
                             f"only, not {family!r}")
        residents.append(B.value.weight)
    rt = same_runtime(residents)
    if device is not None and runtime(device) is not rt:
        raise DeviceMismatchError(
            f"device={device!r} is not the device the operands live on "
            f"({rt.device.info.index}: {rt.device.info.name})")
    if weight:
        M, N, K, batch_shape, full_shape, shape = rules.weight_shapes(A.shape, B.value.weight.shape)
        if dtype_name(A.dtype) not in ACTIVATION_DTYPES:
            raise TypeError(f"matmul: activations for a quantized weight are float16 (or "
                            f"bfloat16 where the device offers it), not "
                            f"{dtype_name(A.dtype)}; cast x first")
    else:
        M, N, K, batch_shape, full_shape, shape = rules.shapes(A.shape, B.shape)
    options = current_options().with_family(family)
    pair = resolve(rt.device.info, A.dtype, A.dtype if weight else B.dtype, dtype, accumulator)
    result_dtype = numpy_dtype(pair.stored)
    alpha, beta = rules.scalars(pair.result.is_float, alpha, beta)
    rules.check_epilogue(ops, pair.result.is_float, result_dtype, bias, residual,
                         N if len(B.shape) > 1 else 1, shape)
    if out is not None:
        rules.check_out(out, shape, result_dtype, device_result=True)
        result = out.value
    else:
        result = empty(shape, result_dtype, device=rt.device)
    if C is not None and beta != 0:  # BLAS convention: beta == 0 means C is not read
        rules.check_into_result("c", C.dtype, result_dtype)
        if C.kind is Kind.DEVICE:
            if C.dtype != result_dtype:
                raise TypeError(f"matmul: a device array c must have the result dtype "
                                f"{dtype_name(result_dtype)}, not {dtype_name(C.dtype)}")
            if C.shape != shape and C.shape != shape[-2:]:
                raise ValueError(f"matmul: a device array c must have the result's shape "
                                 f"{shape} (or its last two axes), not {C.shape}")
        else:
            try:
                host_c = np.broadcast_to(C.value.astype(result_dtype, copy=False), shape)
            except ValueError:
                raise ValueError(f"matmul: c of shape {C.shape} does not broadcast to the "
                                 f"result shape {shape}") from None
            C = Operand(Kind.HOST, host_c, shape, result_dtype)
    else:
        C = None

    if result.size == 0:
        return result
    if K == 0:  # an empty sum: zeros, plus beta * c
        host = np.zeros(shape, result_dtype)
        if C is not None:
            host[...] = beta * (C.value.numpy() if C.kind is Kind.DEVICE else C.value)
        if ops is not None:
            host[...] = host_epilogue(
                host, ops,
                None if bias is None else np.asarray(bias.value).astype(result_dtype),
                None if residual is None else np.asarray(residual.value).astype(result_dtype))
        result._storage.written()
        rt.transfers.upload(host, result.buffer, result.offset_bytes)
        return result

    call = _Call(rt)
    try:
        if weight:  # x's leading axes are the GEMM's M rows, as numpy broadcasts w.T
            M = math.prod(A.shape[:-1])
            a_op = call.matrix(A, (M, K), (), 0)
            b_op = _weight_operand(B.value.weight)
            c_op = None
            gemm = (1, M, N, K)
            d_op = DeviceOperand(result.buffer, result.offset_bytes,
                                 Staged(Layout.ROW_MAJOR, N, 0, M * N * result_dtype.itemsize))
        else:
            a_op = call.matrix(A, (1, K) if len(A.shape) == 1 else A.shape, batch_shape, 0)
            b_op = call.matrix(B, (K, 1) if len(B.shape) == 1 else B.shape, batch_shape, 1)
            c_op = None
            if C is not None:
                c_op = call.matrix(C, full_shape if C.shape == shape else C.shape,
                                   batch_shape, 2)
            batch = math.prod(batch_shape) if batch_shape else 1
            gemm = (batch, M, N, K)
            d_op = DeviceOperand(result.buffer, result.offset_bytes,
                                 Staged(Layout.ROW_MAJOR, N, M * N if batch > 1 else 0,
                                        batch * M * N * result_dtype.itemsize))
        bias_op = call.vector(bias, result_dtype, math.prod(bias.shape)) \
            if bias is not None else None
        res_op = call.vector(residual, result_dtype, N) if residual is not None else None
        plan = q8_1_plan(rt, pair, a_op, b_op, gemm, alpha, options, ops) \
            if activation_quant is not None else \
            device_plan(rt, pair, a_op, b_op, c_op, gemm, alpha, beta, options, ops)
        numpy_operand = not (A.on_device and B.on_device)
        host_copy = result.offset_bytes == 0 and host_copy_wanted(
            result._storage.nbytes, numpy_operand, rt.pool.unified)
        _enqueue(rt, plan, a_op, b_op, c_op, d_op, call.uploads, result, host_copy,
                 bias_op, res_op)
    finally:
        call.done()
    _last.result = GemmResult(None, plan.traits, plan.choice.split_k)
    # A device operand whose matrix form is a copy (a reshape that strides do not allow)
    # is not where a repeat would bind it: such a call is not kept.
    own = all(x.kind is not Kind.DEVICE or op.buffer is x.value.buffer
              for x, op in ((A, a_op), (B, b_op)))
    if key is not None and own and out is None:
        _keep(key, _KeptDevice(rt, plan, _bind(call, A, a_op), _bind(call, B, b_op),
                               d_op.staged, shape, result_dtype, result._strides,
                               allocation(rt, shape, result_dtype), host_copy,
                               _last.result))
    return result


def _bind(call: _Call, x: Operand, op: DeviceOperand) -> _Bind:
    if x.kind is Kind.WEIGHT:
        return _Bind(Kind.WEIGHT, op.staged, weight=weakref.ref(x.value.weight))
    if x.kind is Kind.HOST:
        return _Bind(Kind.HOST, op.staged, call.stage_bytes(np.asarray(x.value)))
    return _Bind(Kind.DEVICE, op.staged)


def _enqueue(rt: Runtime, plan: Plan, a: DeviceOperand, b: DeviceOperand,
             c: DeviceOperand | None, d: DeviceOperand, uploads: list[Copy], result: Array,
             host_copy: bool, bias: DeviceOperand | None = None,
             residual: DeviceOperand | None = None) -> None:
    """Queue the plan into `result` (C-contiguous, from offset 0 of its storage when
    host_copy: then a copy of its bytes goes to host-visible memory in the same
    submission, which `.numpy()` reads)."""
    storage = result._storage
    storage.written()
    kept = enqueue_product(rt, plan, a, b, c, d, uploads,
                           storage.nbytes if host_copy else 0, bias, residual)
    if kept is not None:
        storage.host = kept


# -- what the device offers -------------------------------------------------------------
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


__all__ = ["ComponentType", "TypePair", "configs", "device_operand", "devices",
           "last_kernel_time", "last_kernel_traits", "linear", "matmul", "supported_dtypes"]
