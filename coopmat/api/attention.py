"""`coopmat.attention`: torch.nn.functional.scaled_dot_product_attention on a
cooperative-matrix Vulkan device, one fused kernel (attention_rules says the rules).

One more operation on the matmul front: operands are described as matmul describes them
(coopmat.api.operands), numpy operands go to the device as a product's do (small ones in
the call's own submission: matmul._Call), the result follows matmul's rule (an Array
where any operand lives on the device, else numpy), and the run is queued on the
device's stream (coopmat.dispatch.attention) with a small result's copy to host memory
riding in the same submission.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from coopmat.api import attention_rules as rules
from coopmat.api.array import Array, allocation, c_strides, empty, fresh, same_runtime
from coopmat.api.matmul import _Call, describe
from coopmat.api.operands import Kind, Operand
from coopmat.codegen.attention import MaskKind
from coopmat.common.dtypes import numpy_dtype
from coopmat.common.enums import ComponentType
from coopmat.common.errors import DeviceMismatchError
from coopmat.common.lru import Lru
from coopmat.dispatch import attention as run
from coopmat.dispatch.executor import Copy
from coopmat.dispatch.queued import drop_host_copy
from coopmat.dispatch.runtime import DeviceArg, Runtime, runtime
from coopmat.dispatch.staging import host_copy_wanted
from coopmat.policy.attention import (
    AttentionChoice,
    AttentionProblem,
    attention_operands,
    attention_results,
)
from coopmat.policy.options import get_options

_last = threading.local()


def last_attention_choice() -> AttentionChoice | None:
    """The kernel choice (traits, key slices) of this thread's last attention call."""
    return getattr(_last, "choice", None)


def attention(q: Any, k: Any, v: Any, *, mask: Any = None, causal: bool = False,
              scale: float | None = None, dtype: Any = None,
              device: DeviceArg = None) -> Any:
    """softmax(q @ k^T * scale + mask) @ v, as torch.nn.functional.scaled_dot_product_attention
    (dropout aside), in one kernel that never writes the scores.

    - q (..., Lq, E), k (..., Lk, E), v (..., Lk, Ev): float16 or, where the device offers
      it, bfloat16, one dtype. Axis -3 is the head axis where present; the axes before it
      broadcast as numpy's. Where k and v have fewer heads than q and their count divides
      q's, each k/v head serves a group of q's heads (grouped-query attention, torch's
      enable_gqa); a q of one head is shared by every k/v head.
    - mask: broadcastable to (..., heads, Lq, Lk); boolean (True: the key takes part) or
      floating point (added to the scores, in q's dtype as torch adds it).
    - causal: key j is seen by query i where j <= i (top-left aligned, torch's is_causal);
      with a mask, both apply.
    - scale: the scores' factor, default 1 / sqrt(E).
    - dtype: the result dtype, default q's; float32 keeps the float32 result. Scores,
      softmax and the products accumulate in float32; the weights are rounded to q's
      dtype before they multiply v (as torch's fused kernels do).
    - A row whose every score is masked out gives 0, as torch gives on the CPU (2.5+).
    - Where the result lives: an Array when any of q, k, v, mask is a coopmat.Array (the
      run is queued on its device without waiting), else numpy.
    - device: as matmul's (index, name substring or device object), for numpy operands.
    """
    key = _key(q, k, v, mask, causal, scale, dtype, device)
    if key is not None:
        kept = _kept.get(key)
        if kept is not None:
            result = kept.run(q, k, v, mask)
            if result is not None:
                return result
    Q, K, V = describe(q), describe(k), describe(v)
    M = describe(mask) if mask is not None else None
    described = [x for x in (Q, K, V, M) if x is not None]
    for x in described:
        if x.kind is Kind.WEIGHT:
            raise TypeError("attention: a quantized weight is not an attention operand")
    s = rules.attention_shapes(Q.shape, K.shape, V.shape, M.shape if M else None)
    if not isinstance(causal, bool | np.bool_):
        raise TypeError(f"attention: causal must be True or False, not {causal!r}")
    factor = rules.scale_of(scale, s.D)
    residents = [x.value for x in described if x.kind is Kind.DEVICE]
    rt = _runtime(residents, device)
    info = rt.device.info
    where = f"device {info.index} ({info.name})"
    operand, out = rules.attention_dtypes((Q.dtype, K.dtype, V.dtype), dtype,
                                          *_device_types(rt), where)
    kind = rules.mask_kind(M.dtype, operand, M.kind is Kind.DEVICE) if M else None
    result_dtype = numpy_dtype(out)
    on_device = bool(residents)
    result = empty(s.result, result_dtype, device=rt.device)
    if result.size == 0 or s.Lk == 0:  # no keys: every row fully masked, as torch: 0
        if result.size:
            rt.transfers.fill_zero(result.buffer, 0, result.nbytes)
        return result if on_device else result.numpy()
    recipe = _run(rt, s, Q, K, V, M, kind, operand, out, factor, bool(causal), result)
    if key is not None and recipe is not None:
        _kept.put(key, recipe)
    return result if on_device else result.numpy()


# -- repeated calls --------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class _Recipe:
    """What a call on device arrays decided (the kernel choice, how each operand is
    walked, the result's layout), kept per call signature: a decode loop's repeat pays
    for the result and the submission only."""

    rt: Runtime
    choice: AttentionChoice
    sizes: run.Sizes
    walks: tuple[tuple[int, int, int, int] | None, ...]  # q, k, v, mask: (outer, head, row, col)
    o_walk: tuple[int, int, int]
    shape: tuple[int, ...]
    result_dtype: np.dtype
    strides: tuple[int, ...]
    alloc: tuple[int, int]  # the result's (data, allocation) bytes
    factor: float
    causal: bool

    def run(self, q: Array, k: Array, v: Array, mask: Array | None) -> Array | None:
        """The result, queued; None where an operand lies elsewhere (another device)."""
        rt = self.rt
        ops: list[run.Operand | None] = []
        for x, walk in zip((q, k, v, mask), self.walks, strict=True):
            if x is None or walk is None:
                ops.append(None)
                continue
            if x._storage.rt is not rt:
                return None
            ops.append(run.Operand(x._storage.buffer, x.offset_bytes, x.dtype.itemsize, *walk))
        result = fresh(rt, self.shape, self.result_dtype, self.strides, self.alloc)
        result._storage.written()
        o = run.Operand(result._storage.buffer, 0, self.result_dtype.itemsize, *self.o_walk)
        qo, ko, vo, mo = ops
        assert qo is not None and ko is not None and vo is not None
        run.enqueue_attention(rt, self.choice, self.sizes, qo, ko, vo, o, mo, self.factor,
                              self.causal)
        _last.choice = self.choice
        return result


RECIPES = 256
_kept: Lru[_Recipe] = Lru(RECIPES)


def _key(q: Any, k: Any, v: Any, mask: Any, causal: Any, scale: Any, dtype: Any,
         device: Any) -> tuple[Any, ...] | None:
    """The signature a recipe is kept under: device arrays only (their runtime, shape,
    strides, dtype and offset), the call's scalars and the options; None otherwise."""
    arrays = (q, k, v) if mask is None else (q, k, v, mask)
    if device is not None or any(type(x) is not Array for x in arrays) or \
            type(causal) is not bool or not (scale is None or type(scale) is float):
        return None
    try:
        return (*((id(x._storage.rt), x.shape, x._strides, x.dtype, x._offset)
                  for x in arrays), mask is None, causal, scale, dtype, get_options())
    except TypeError:  # an unhashable dtype argument
        return None


_Types = tuple[tuple[ComponentType, ...], tuple[ComponentType, ...]]
# Each entry holds its runtime, so the id() it is kept under is never another's.
_types: dict[int, tuple[Runtime, _Types]] = {}


def _device_types(rt: Runtime) -> _Types:
    """(operand types, result types) attention runs on rt's device, asked once."""
    kept = _types.get(id(rt))
    if kept is not None:
        return kept[1]
    info = rt.device.info
    types = (attention_operands(info), attention_results(info))
    _types[id(rt)] = (rt, types)
    return types


def _runtime(residents: list[Array], device: DeviceArg) -> Runtime:
    if not residents:
        return runtime(device)
    rt = same_runtime(residents)
    if device is not None and runtime(device) is not rt:
        raise DeviceMismatchError(
            f"device={device!r} is not the device the operands live on "
            f"({rt.device.info.index}: {rt.device.info.name})")
    return rt


def _place(call: _Call, x: Operand, s: rules.AttentionShapes, name: str, dtype: np.dtype,
           matrix: bool = False) -> run.Operand:
    """x in device memory, addressed for the call: a device array where it lies (a copy
    where its rows are not contiguous or it runs backwards), a numpy one copied over
    (broadcast to the outer axes first where no one stride walks them)."""
    if x.kind is Kind.DEVICE:
        arr = x.value
        if arr.runtime is not call.rt:
            raise DeviceMismatchError(f"attention: {name} lives on another device")
        strides = arr.element_strides
        if min(strides, default=0) < 0 or not matrix and len(arr.shape) and \
                arr.shape[-1] > 1 and strides[-1] != 1:
            arr = arr.copy()
        call.held.append(arr)
        walk = rules.walk(arr.shape, arr.element_strides, s, matrix=matrix)
        if walk is None:
            raise ValueError(f"attention: the device array {name} of shape {arr.shape} is "
                             f"broadcast over only some of the leading axes {s.outer}; "
                             f"device arrays need one stride for all of them")
        return run.Operand(arr.buffer, arr.offset_bytes, arr.itemsize, *walk)
    host = np.asarray(x.value)
    if host.dtype != dtype:
        host = host.astype(dtype)
    if rules.walk(host.shape, c_strides(host.shape), s, matrix=matrix) is None:
        lead = len(host.shape) - 3
        host = np.broadcast_to(host, (*s.outer, *host.shape[lead:]))
    buf, offset, strides = call.on_device(Operand(Kind.HOST, host, host.shape, host.dtype))
    walk = rules.walk(host.shape, strides, s, matrix=matrix)
    assert walk is not None
    return run.Operand(buf, offset, host.dtype.itemsize, *walk)


def _run(rt: Runtime, s: rules.AttentionShapes, Q: Operand, K: Operand, V: Operand,
         M: Operand | None, kind: MaskKind | None, operand: ComponentType, out: ComponentType,
         factor: float, causal: bool, result: Array) -> _Recipe | None:
    """Queue the run; returns its recipe where every operand is a device array bound
    as it lies (no copy made for the call), else None."""
    op_dtype = numpy_dtype(operand)
    call = _Call(rt)
    try:
        q, k, v = (_place(call, x, s, name, op_dtype)
                   for x, name in ((Q, "q"), (K, "k"), (V, "v")))
        mask = None
        if M is not None:
            mask_dtype = np.dtype(np.bool_) if kind is MaskKind.BOOL else op_dtype
            mask = _place(call, M, s, "mask", mask_dtype, matrix=True)
        o = run.Operand(result.buffer, result.offset_bytes, result.itemsize,
                        s.heads * s.Lq * s.Dv, s.Lq * s.Dv, s.Dv)
        sizes = run.Sizes(s.Lq, s.Lk, s.groups, s.kv_heads, s.batch)
        aligned = all(x.aligned() for x in (q, k, v))
        problem = AttentionProblem(operand, out, s.D, s.Dv,
                                   sizes.rows, s.Lk, sizes.z, kind, aligned, causal)
        options = get_options()
        choice = run.attention_choice(rt, problem, options.attention_splits,
                                      options.attention_tile)
        _last.choice = choice
        numpy_operand = any(x.kind is Kind.HOST for x in (Q, K, V, M) if x is not None)
        storage = result._storage
        storage.written()
        host_copy = host_copy_wanted(storage.nbytes, numpy_operand, rt.pool.unified)
        downloads: list[Copy] = []
        target = rt.transfers.small_download(storage.nbytes) if host_copy else None
        if target is not None:
            downloads.append(Copy(result.buffer, target.dst, storage.nbytes, 0, target.offset))
        try:
            ticket = run.enqueue_attention(rt, choice, sizes, q, k, v, o, mask, factor, causal,
                                           call.uploads, downloads)
        except BaseException:
            if target is not None:
                drop_host_copy(rt, target)
            raise
        if target is not None:
            storage.host = (target, ticket)
            return None
        given = [x for x in (Q, K, V, M) if x is not None]
        bound = [x for x in (q, k, v, mask) if x is not None]
        if any(x.kind is not Kind.DEVICE or b.buffer is not x.value.buffer or
               b.offset != x.value.offset_bytes for x, b in zip(given, bound, strict=True)):
            return None
        walks = tuple(None if x is None else (x.outer, x.head, x.row, x.col)
                      for x in (q, k, v, mask))
        return _Recipe(rt, choice, sizes, walks, (o.outer, o.head, o.row), result.shape,
                       result.dtype, result.element_strides,
                       allocation(rt, result.shape, result.dtype), factor, causal)
    finally:
        call.done()


__all__ = ["attention", "last_attention_choice"]
