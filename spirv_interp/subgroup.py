"""Subgroup operations and integer dot products, written from the SPIR-V 1.6 specification
(its non-uniform instructions; OpSDot, OpUDot and OpSUDot, core since 1.6, from
SPV_KHR_integer_dot_product):

- OpGroupNonUniform{IAdd, FAdd, IMul, FMul, SMin, UMin, FMin, SMax, UMax, FMax} with the
  Reduce group operation at Subgroup scope: every active invocation of a subgroup gets the
  operation over the Value of the active invocations of its subgroup (its tangle). Float
  sums and products are formed in lane order, each step rounded to the type (the
  specification leaves the order to the implementation). FMin/FMax return the other
  operand where one is a NaN, as GLSL.std.450's FMin/FMax may.
- OpGroupNonUniformShuffle / ShuffleXor: the Value of the invocation whose
  SubgroupLocalInvocationId is Id (own id xor Mask); reading an inactive invocation or one
  past the subgroup is undefined, and reported.
- OpSDot, OpUDot, OpSUDot with PackedVectorFormat4x8Bit: two 32-bit integers each holding
  four 8-bit components (component i in bits 8i .. 8i + 7), signed or unsigned as the
  opcode says (SUDot: Vector 1 signed, Vector 2 unsigned); the sum of the four products,
  wrapped to the result's width.

Scans, clustered reductions, other scopes and unpacked dot-product vectors are refused
when the module is loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .machine import Mask, Run, Wave, _int_type, _rtype, _setter, handles
from .module import (
    BoolT,
    FloatT,
    Ins,
    IntT,
    Module,
    UndefinedBehavior,
    Unsupported,
    int_dtype,
    lane_ndim,
    np_dtype,
    scalar_of,
)
from .spec import GroupOperation, Op, PackedVectorFormat, Scope


def _subgroup_scope(ins: Ins, mod: Module) -> None:
    scope = mod.constants.get(ins.args[0])
    if scope is None or int(np.asarray(scope)) != Scope.Subgroup:
        raise Unsupported(f"{ins}: an execution scope other than Subgroup")


def _by_subgroup(w: Wave, value: Any, ins: Ins) -> np.ndarray:
    """The value with one entry per invocation, shaped (subgroups, lanes) + its own shape."""
    v = w.lanes(value, _rtype(ins))
    return v.reshape((w.S, w.sg) + v.shape[1:])


def _identity(op: int, dt: np.dtype) -> Any:
    if op in (Op.GroupNonUniformIAdd, Op.GroupNonUniformFAdd):
        return dt.type(0)
    if op in (Op.GroupNonUniformIMul, Op.GroupNonUniformFMul):
        return dt.type(1)
    if op == Op.GroupNonUniformFMin:
        return dt.type(np.inf)
    if op == Op.GroupNonUniformFMax:
        return dt.type(-np.inf)
    info = np.iinfo(dt)
    return dt.type(info.max if op in (Op.GroupNonUniformSMin, Op.GroupNonUniformUMin)
                   else info.min)


_STEPS: dict[Op, Callable[[Any, Any], Any]] = {
    Op.GroupNonUniformIAdd: np.add, Op.GroupNonUniformFAdd: np.add,
    Op.GroupNonUniformIMul: np.multiply, Op.GroupNonUniformFMul: np.multiply,
    Op.GroupNonUniformSMin: np.minimum, Op.GroupNonUniformUMin: np.minimum,
    Op.GroupNonUniformSMax: np.maximum, Op.GroupNonUniformUMax: np.maximum,
    Op.GroupNonUniformFMin: np.fmin, Op.GroupNonUniformFMax: np.fmax,
}
_SIGNED: dict[Op, bool] = {Op.GroupNonUniformSMin: True, Op.GroupNonUniformSMax: True,
           Op.GroupNonUniformUMin: False, Op.GroupNonUniformUMax: False}
_FLOAT_OPS = {Op.GroupNonUniformFAdd, Op.GroupNonUniformFMul, Op.GroupNonUniformFMin,
              Op.GroupNonUniformFMax}


@handles(*_STEPS)
def _reduce(ins: Ins, mod: Module) -> Run:
    _subgroup_scope(ins, mod)
    if len(ins.args) != 3:
        raise Unsupported(f"{ins}: a clustered operation")
    if ins.args[1] != GroupOperation.Reduce:
        raise Unsupported(f"{ins}: group operation {ins.args[1]} (only Reduce)")
    t = scalar_of(_rtype(ins))
    if ins.op in _FLOAT_OPS:
        if not isinstance(t, FloatT):
            raise UndefinedBehavior(f"{ins} needs a floating-point value")
        dt = np_dtype(t)
    else:
        it = _int_type(_rtype(ins), ins)
        dt = int_dtype(it.width, _SIGNED.get(Op(ins.op), it.signed))
    step, ident = _STEPS[Op(ins.op)], _identity(ins.op, dt)
    x = ins.args[2]
    put = _setter(ins)

    def run(w: Wave, mask: Mask) -> None:
        v = _by_subgroup(w, w.values[x], ins).astype(dt)
        act = mask.lanes.reshape((w.S, w.sg) + (1,) * (v.ndim - 2))
        v = np.where(act, v, ident)
        total = v[:, 0]
        for lane in range(1, w.sg):  # lane order, each step rounded to the type
            total = step(total, v[:, lane]).astype(dt)
        out = total[w.subgroup].astype(np_dtype(t), copy=False)
        put(w, out, mask)
    return run


@handles(Op.GroupNonUniformShuffle, Op.GroupNonUniformShuffleXor)
def _shuffle(ins: Ins, mod: Module) -> Run:
    _subgroup_scope(ins, mod)
    x, sel = ins.args[1], ins.args[2]
    if not isinstance(scalar_of(mod.value_types[sel]), IntT):
        raise UndefinedBehavior(f"{ins}: the id or mask must be an integer")
    if isinstance(scalar_of(_rtype(ins)), BoolT) and lane_ndim(_rtype(ins)):
        raise Unsupported(f"{ins} of Boolean vectors")
    xor = ins.op == Op.GroupNonUniformShuffleXor
    put = _setter(ins)

    def run(w: Wave, mask: Mask) -> None:
        chosen = np.broadcast_to(np.asarray(w.values[sel]).astype(np.int64), (w.n,))
        src = (w.lane.astype(np.int64) ^ chosen) if xor else chosen
        bad = (src < 0) | (src >= w.sg)
        at = w.subgroup * w.sg + np.where(bad, 0, src)
        if w.active(mask, bad | ~mask.lanes[at]):
            raise UndefinedBehavior(f"{ins} reads an inactive invocation or one past the "
                                    f"subgroup")
        put(w, w.lanes(w.values[x], _rtype(ins))[at], mask)
    return run


# (Vector 1 signed, Vector 2 signed)
_DOT_SIGNS: dict[Op, tuple[bool, bool]] = {Op.SDot: (True, True), Op.UDot: (False, False),
                                           Op.SUDot: (True, False)}


@handles(*_DOT_SIGNS)
def _dot(ins: Ins, mod: Module) -> Run:
    rt = _int_type(_rtype(ins), ins)
    if lane_ndim(_rtype(ins)):
        raise UndefinedBehavior(f"{ins}: the result must be a scalar integer")
    if len(ins.args) != 3 or ins.args[2] != PackedVectorFormat.PackedVectorFormat4x8Bit:
        raise Unsupported(f"{ins}: only 4 x 8-bit packed vectors")
    for a in ins.args[:2]:
        t = mod.value_types[a]
        if not isinstance(t, IntT) or t.width != 32:
            raise UndefinedBehavior(f"{ins}: packed vectors are 32-bit integer scalars")
    signs = _DOT_SIGNS[Op(ins.op)]
    x, y = ins.args[0], ins.args[1]
    dt = np_dtype(rt)
    wrap = int_dtype(rt.width, False)
    put = _setter(ins)

    def components(v: Any, signed: bool) -> np.ndarray:
        u = np.asarray(v).astype(np.uint32)[..., None] >> np.arange(0, 32, 8, dtype=np.uint32)
        b = (u & np.uint32(0xFF)).astype(np.int64)
        return np.where(b >= 128, b - 256, b) if signed else b

    def run(w: Wave, mask: Mask) -> None:
        total = (components(w.values[x], signs[0])
                 * components(w.values[y], signs[1])).sum(axis=-1)
        put(w, total.astype(np.int64).astype(wrap).astype(dt), mask)
    return run

