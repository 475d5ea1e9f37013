"""Instructions of Kernel modules (the OpenCL environment): pointer arithmetic on global
memory (OpPtrAccessChain) and the OpenCL.std extended instructions the kernels use.

Written from the SPIR-V 1.6 specification (OpPtrAccessChain: "Element is treated as a
signed count of elements E, relative to the original Base element B"; outside Uniform,
StorageBuffer and PushConstant storage "the implementation calculates the element's
address", here the size of a scalar or vector element, packed) and the OpenCL Extended
Instruction Set specification (u_min: the smaller of two unsigned integers).
"""

from __future__ import annotations

import numpy as np

from .machine import EXT_SETS, Mask, Ptr, Run, Wave, _int_type, _rtype, _setter, handles
from .memory import Memory
from .module import (
    FloatT,
    Ins,
    IntT,
    Module,
    PointerT,
    UndefinedBehavior,
    Unsupported,
    VectorT,
    int_dtype,
    scalar_of,
    type_size,
)
from .spec import Op, OpenCLstd, StorageClass

OPENCL_STD = "OpenCL.std"


@handles(Op.PtrAccessChain, Op.InBoundsPtrAccessChain)
def _ptr_access_chain(ins: Ins, mod: Module) -> Run:
    base_id, element_id = ins.args[0], ins.args[1]
    base_t = mod.value_types.get(base_id)
    if not isinstance(base_t, PointerT):
        raise UndefinedBehavior(f"{ins}: Base is not a pointer")
    if base_t.storage != StorageClass.CrossWorkgroup:
        raise Unsupported(f"{ins} into storage class {base_t.storage}")
    if len(ins.args) > 2:
        raise Unsupported(f"{ins} with indexes after Element")
    pointee = base_t.pointee
    if not isinstance(pointee, (IntT, FloatT)) and not (
            isinstance(pointee, VectorT) and pointee.count != 3):
        # (a 3-component vector takes the space of 4 in OpenCL, which is not modelled)
        raise Unsupported(f"{ins} over elements of {type(pointee).__name__}")
    rt = _rtype(ins)
    if not isinstance(rt, PointerT) or rt.pointee is not pointee or \
            rt.storage != base_t.storage:
        raise UndefinedBehavior(f"{ins}: the result type is not the type of Base")
    it = _int_type(mod.value_types[element_id], ins)
    sdt = int_dtype(it.width, True)  # a signed count of elements
    stride = type_size(pointee)
    put = _setter(ins)

    def run(w: Wave, mask: Mask) -> None:
        b: Ptr = w.values[base_id]
        if not isinstance(b.target, Memory):
            raise Unsupported(f"{ins} on a variable")
        count = np.asarray(w.values[element_id]).astype(sdt).astype(np.int64)
        put(w, Ptr(b.target, pointee, b.offset + count * stride), mask)
    return run


def _u_min(ins: Ins, mod: Module, operands: list[int]) -> Run:
    t = _int_type(_rtype(ins), ins)
    for o in operands:
        ot = mod.value_types.get(o)
        if ot is None or type(ot) is not type(_rtype(ins)) or \
                getattr(scalar_of(ot), "width", 0) != t.width:
            raise UndefinedBehavior(f"{ins}: u_min's operands must have the result's type")
    udt = int_dtype(t.width, False)
    x, y = operands
    put = _setter(ins)

    def run(w: Wave, mask: Mask) -> None:
        v = w.values
        put(w, np.minimum(v[x].astype(udt, copy=False), v[y].astype(udt, copy=False)), mask)
    return run


EXT_SETS[OPENCL_STD] = {OpenCLstd.u_min: _u_min}
