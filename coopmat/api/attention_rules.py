"""torch.nn.functional.scaled_dot_product_attention's rules, applied once per call by
coopmat.attention: shapes, heads (grouped-query attention), broadcasting, dtypes, the
mask and the scale. Pure: shapes, strides and dtypes in, an answer or a clear exception
out; nothing here touches a device.

Axes: q is (..., Lq, E), k (..., Lk, E), v (..., Lk, Ev); axis -3, where an operand has
it, is the head axis, and the axes before it broadcast as numpy broadcasts. k and v have
one head count; where it divides q's, each group of q's heads shares one k/v head (as
torch's enable_gqa, which repeats k and v's heads); where q has one head it is shared by
every k/v head. The mask broadcasts to the scores' shape (..., heads, Lq, Lk).
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any, NamedTuple

import numpy as np

from coopmat.codegen.attention import MaskKind
from coopmat.common.dtypes import dtype_name, element, of_dtype
from coopmat.common.enums import ComponentType

NAMES = ("q", "k", "v")


class AttentionShapes(NamedTuple):
    """The sizes of one call: the result is outer + (heads, Lq, Dv) (or (Lq, Dv) where
    no operand has a head axis); each of the kv_heads k/v heads serves `groups` of the
    result's heads."""

    Lq: int
    Lk: int
    D: int
    Dv: int
    outer: tuple[int, ...]
    heads: int
    kv_heads: int
    groups: int
    result: tuple[int, ...]

    @property
    def batch(self) -> int:
        """Entries of the leading axes before the head axis, flattened."""
        return math.prod(self.outer)


class Walk(NamedTuple):
    """How an operand is addressed, in elements: between entries of the flattened outer
    axes, between heads, between rows and between columns (0 where broadcast)."""

    outer: int
    head: int
    row: int
    col: int


def _heads(shape: tuple[int, ...]) -> int:
    return shape[-3] if len(shape) >= 3 else 1


def _mask_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A mask of fewer than two axes, as the (rows, keys) matrix numpy broadcasts it to."""
    return (1,) * (2 - len(shape)) + tuple(shape) if len(shape) < 2 else tuple(shape)


@functools.lru_cache(maxsize=1024)  # a decode loop checks the same shapes every step
def attention_shapes(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...],
                     mask: tuple[int, ...] | None = None) -> AttentionShapes:
    """The shapes' agreement, torch's rules plus grouped-query heads; ValueError naming
    the disagreement otherwise."""
    for name, shape in zip(NAMES, (q, k, v), strict=True):
        if len(shape) < 2:
            raise ValueError(f"attention: {name} must have at least 2 axes (..., L, E), "
                             f"not shape {tuple(shape)}")
    Lq, D = q[-2:]
    Lk, Dk = k[-2:]
    Lv, Dv = v[-2:]
    if Dk != D:
        raise ValueError(f"attention: q and k must have one head dimension E (their last "
                         f"axis): q is {tuple(q)}, k is {tuple(k)}")
    if Lv != Lk:
        raise ValueError(f"attention: k and v must have one length Lk (axis -2): k is "
                         f"{tuple(k)}, v is {tuple(v)}")
    if D == 0:
        raise ValueError("attention: the head dimension E (q's last axis) is 0")
    hq, hk, hv = _heads(q), _heads(k), _heads(v)
    if hk != hv:
        raise ValueError(f"attention: k and v must have one head count (axis -3): k has "
                         f"{hk}, v has {hv}")
    if hq == hk or hk and hq % hk == 0:
        heads, kv_heads = hq, hk
    elif hq == 1:
        heads, kv_heads = hk, hk
    else:
        raise ValueError(f"attention: q has {hq} heads (axis -3) and k and v have {hk}; "
                         f"for grouped-query attention k and v's head count must divide "
                         f"q's")
    m = _mask_shape(mask) if mask is not None else None
    if m is not None:
        hm = _heads(m)
        if hm not in (1, heads):
            if heads != 1:
                raise ValueError(f"attention: the mask of shape {tuple(mask or ())} has "
                                 f"{hm} heads (axis -3), the scores {heads}")
            heads, kv_heads = hm, 1
    leads = [x[:-3] for x in (q, k, v) if len(x) > 3] + \
        ([m[:-3]] if m is not None and len(m) > 3 else [])
    try:
        outer = tuple(np.broadcast_shapes(*leads)) if leads else ()
    except ValueError:
        raise ValueError(f"attention: the leading axes of q {tuple(q)}, k {tuple(k)}, v "
                         f"{tuple(v)}" + (f" and the mask {tuple(mask or ())}" if m else "")
                         + " do not broadcast together") from None
    if m is not None and (m[-2] not in (1, Lq) or m[-1] not in (1, Lk)):
        raise ValueError(f"attention: the mask of shape {tuple(mask or ())} does not "
                         f"broadcast to the scores' shape {(*outer, heads, Lq, Lk)}")
    with_heads = any(len(x) >= 3 for x in (q, k, v)) or (m is not None and len(m) >= 3)
    result = (*outer, heads, Lq, Dv) if with_heads else (Lq, Dv)
    groups = heads // kv_heads if kv_heads else 1
    return AttentionShapes(Lq, Lk, D, Dv, outer, heads, kv_heads, groups, result)


def walk(shape: tuple[int, ...], strides: tuple[int, ...], s: AttentionShapes,
         *, matrix: bool = False) -> Walk | None:
    """How an operand of `shape` and element `strides` is addressed for the call `s`
    (a mask: matrix True, its shape padded as numpy broadcasts it); None where its outer
    axes broadcast over some of the call's outer axes only (no one stride walks them)."""
    if matrix and len(shape) < 2:
        pad = 2 - len(shape)
        shape, strides = (1,) * pad + tuple(shape), (0,) * pad + tuple(strides)
    rows, cols = shape[-2:]
    row = strides[-2] if rows > 1 else 0
    col = strides[-1] if cols > 1 else 0
    head = strides[-3] if len(shape) >= 3 and shape[-3] > 1 else 0
    lead, lead_strides = shape[:-3], strides[:-3]
    if math.prod(lead) <= 1:
        return Walk(0, head, row, col)
    if lead != s.outer[len(s.outer) - len(lead):] or math.prod(lead) != s.batch:
        return None
    live = [(n, st) for n, st in zip(lead, lead_strides, strict=True) if n > 1]
    for (_, outer), (n_inner, inner) in zip(live, live[1:], strict=False):
        if outer != inner * n_inner:
            return None
    return Walk(live[-1][1], head, row, col)


def attention_dtypes(dtypes: tuple[Any, Any, Any], dtype: Any,
                     operands: tuple[ComponentType, ...],
                     results: tuple[ComponentType, ...],
                     where: str) -> tuple[ComponentType, ComponentType]:
    """(operand type, result type) of q, k, v of `dtypes` and the result dtype asked for
    (None: q's), against what the device runs (`where` names the device in errors)."""
    rows = [of_dtype(d) for d in dtypes]
    names = [r.name if r is not None else _name(d) for r, d in zip(rows, dtypes, strict=True)]
    if len(set(names)) != 1:
        raise TypeError(f"attention: q, k and v must have one dtype, not {names[0]}, "
                        f"{names[1]} and {names[2]}")
    offered = ", ".join(element(t).name for t in operands) or "no dtype"
    row = rows[0]
    if row is None or row.component not in operands:
        raise TypeError(f"attention: unsupported dtype {names[0]}; {where} runs attention "
                        f"on {offered} (float32 accumulation and softmax)")
    if dtype is None:
        return row.component, row.component
    out = of_dtype(dtype)
    if out is None or out.component not in results:
        allowed = ", ".join(element(t).name for t in results)
        raise TypeError(f"attention: unsupported result dtype {_name(dtype)}; {where} "
                        f"writes {allowed}")
    return row.component, out.component


def mask_kind(mask_dtype: Any, operand: ComponentType, on_device: bool) -> MaskKind:
    """A boolean mask (True: the key takes part) or an additive float one, added to the
    scores in q's dtype as torch adds it. A device array mask must be boolean or of q's
    dtype; a numpy one of another float dtype is cast to q's."""
    dt = np.dtype(mask_dtype)
    if dt == np.bool_:
        return MaskKind.BOOL
    row = of_dtype(dt)
    if row is None or not row.is_float:
        raise TypeError(f"attention: the mask must be boolean or floating point, not "
                        f"{dtype_name(dt)}")
    if on_device and row.component != operand:
        raise TypeError(f"attention: a device array mask must be boolean or of q's dtype "
                        f"{element(operand).name}, not {row.name}")
    return MaskKind.ADD


def scale_of(scale: Any, D: int) -> float:
    """The scores' scale: 1 / sqrt(E) by default, as torch."""
    if scale is None:
        return 1.0 / math.sqrt(D)
    if isinstance(scale, bool) or not (isinstance(scale, numbers.Real) or isinstance(
            scale, np.ndarray) and scale.ndim == 0 and scale.dtype.kind in "iuf"):
        raise TypeError(f"attention: scale must be a real number or None, not {scale!r}")
    value = float(scale)
    if not math.isfinite(value):
        raise ValueError(f"attention: scale must be finite, not {value}")
    return value


def _name(d: Any) -> str:
    try:
        return dtype_name(d)
    except TypeError:
        return repr(d)
