"""Shader-writing conveniences on top of the module builder.

`ShaderContext` owns one compute module and its main function, and offers the handful of
operations the kernels are written in: 32-bit index arithmetic, push-constant reads,
storage-buffer and workgroup-memory access (with the Vulkan memory model operands that
workgroup sharing needs), barriers and cooperative-matrix instructions.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from coopmat.codegen.builder import FunctionBuilder, ModuleBuilder
from coopmat.codegen.spv import (
    BuiltIn,
    Capability,
    Decoration,
    ExecutionMode,
    ExecutionModel,
    MemoryAccess,
    MemorySemantics,
    Op,
    Scope,
    StorageClass,
    TensorAddressingOperands,
)

# Workgroup memory is shared between invocations, so its accesses are non-private and
# make their writes available / reads visible at workgroup scope (as glslang does for
# `shared` under the Vulkan memory model); barriers then order them.
_SHARED_STORE = MemoryAccess.MakePointerAvailable | MemoryAccess.NonPrivatePointer
_SHARED_LOAD = MemoryAccess.MakePointerVisible | MemoryAccess.NonPrivatePointer


# The least maxComputeWorkGroupCount[0] Vulkan guarantees: longer 1-D grids fold into y.
MAX_GROUPS_X = 65535


def folded_grid(groups: int) -> tuple[int, int, int]:
    """A grid of at least `groups` workgroups, at most MAX_GROUPS_X along x (a kernel
    numbers its workgroup y * x + x and drops those past its count)."""
    x = min(groups, MAX_GROUPS_X)
    return (x, -(-groups // x), 1)


def folded_push_constants(kernel: str, fields: tuple[str, ...],
                          values: dict[str, int]) -> bytes:
    """`fields` as 32-bit unsigned push constants (absent ones 0), with groups_x the x of
    folded_grid(values["count"]); ValueError naming `kernel` and the field that does not
    fit 32 bits."""
    values = {**values, "groups_x": folded_grid(values["count"])[0]}
    for name in fields:
        if not 0 <= int(values.get(name, 0)) < 1 << 32:
            raise ValueError(f"{kernel}: {name} = {values[name]} does not fit the kernel's "
                             f"32-bit indices")
    return struct.pack(f"<{len(fields)}I", *(int(values.get(n, 0)) for n in fields))


@dataclass(frozen=True)
class Buffer:
    """A storage buffer declared as `struct { T data[]; }`."""

    var: int
    elem: int  # element type id


@dataclass(frozen=True)
class SharedArray:
    var: int
    elem: int


class ShaderContext:
    def __init__(self) -> None:
        self.mb = ModuleBuilder((1, 6))
        mb = self.mb
        mb.capability(Capability.Shader, Capability.VulkanMemoryModel)
        self.void = mb.type_void()
        self.bool = mb.type_bool()
        self.u32 = mb.type_int(32, False)
        self.f = FunctionBuilder(mb, self.void, mb.type_function(self.void))
        self._push: tuple[int, list[int], tuple[str, ...]] | None = None

    def compute_module(self, invocations: int) -> bytes:
        """Close the function and assemble the module: a compute entry point "main" whose
        workgroup is `invocations` x 1 x 1."""
        self.f.finish()
        self.mb.entry_point(ExecutionModel.GLCompute, self.f.id, "main")
        self.mb.execution_mode(self.f.id, ExecutionMode.LocalSize, invocations, 1, 1)
        return self.mb.assemble()

    # -- constants and arithmetic on 32-bit unsigned indices ----------------------------
    def c(self, value: int) -> int:
        return self.mb.const_u32(value)

    def add(self, a: int, b: int) -> int:
        return self.f.op(Op.IAdd, self.u32, a, b)

    def mul(self, a: int, b: int) -> int:
        return self.f.op(Op.IMul, self.u32, a, b)

    def udiv(self, a: int, b: int) -> int:
        return self.f.op(Op.UDiv, self.u32, a, b)

    def umod(self, a: int, b: int) -> int:
        return self.f.op(Op.UMod, self.u32, a, b)

    def shr(self, a: int, b: int) -> int:
        return self.f.op(Op.ShiftRightLogical, self.u32, a, b)

    def lt(self, a: int, b: int) -> int:
        return self.f.op(Op.ULessThan, self.bool, a, b)

    def le(self, a: int, b: int) -> int:
        return self.f.op(Op.ULessThanEqual, self.bool, a, b)

    def and_(self, a: int, b: int) -> int:
        return self.f.op(Op.LogicalAnd, self.bool, a, b)

    def scale_matrix(self, mat_type: int, mat: int, factor: int, is_float: bool) -> int:
        """factor * mat for a cooperative matrix: OpMatrixTimesScalar for floats, an
        element-wise IMul by a splat for integers (which have no matrix-times-scalar)."""
        if is_float:
            return self.f.op(Op.MatrixTimesScalar, mat_type, mat, factor)
        splat = self.f.op(Op.CompositeConstruct, mat_type, factor)
        return self.f.op(Op.IMul, mat_type, mat, splat)

    def select(self, type_id: int, cond: int, a: int, b: int) -> int:
        return self.f.op(Op.Select, type_id, cond, a, b)

    # -- inputs -------------------------------------------------------------------------
    def builtin(self, which: BuiltIn, type_id: int) -> int:
        """Declare an Input builtin and load it."""
        var = self.mb.variable(type_id, StorageClass.Input, which.name)
        self.mb.decorate(var, Decoration.BuiltIn, which)
        if which in (BuiltIn.SubgroupId, BuiltIn.SubgroupLocalInvocationId):
            self.mb.capability(Capability.GroupNonUniform)
        return self.f.op(Op.Load, type_id, var)

    def push_constants(self, fields: tuple[str, ...], types: list[int]) -> None:
        """Declare the push-constant block: one 4-byte member per field."""
        mb = self.mb
        block = mb.type_struct(types)
        mb.decorate(block, Decoration.Block)
        for i, name in enumerate(fields):
            mb.member_decorate(block, i, Decoration.Offset, 4 * i)
            mb.member_name(block, i, name)
        var = mb.variable(block, StorageClass.PushConstant, "params")
        self._push = (var, types, fields)

    def param(self, name: str) -> int:
        assert self._push is not None, "push constants not declared"
        var, types, fields = self._push
        i = fields.index(name)
        ptr_t = self.mb.type_pointer(StorageClass.PushConstant, types[i])
        ptr = self.f.op(Op.AccessChain, ptr_t, var, self.c(i))
        return self.f.op(Op.Load, types[i], ptr)

    # -- storage buffers ----------------------------------------------------------------
    def storage_buffer(self, binding: int, elem: int, elem_bytes: int, readonly: bool,
                       name: str, restrict: bool = False) -> Buffer:
        """`restrict` promises no other binding aliases this one (never for C, which a
        caller may bind to the same memory as D for an in-place update)."""
        mb = self.mb
        block = mb.type_struct([mb.type_runtime_array(elem, elem_bytes)])
        mb.decorate(block, Decoration.Block)
        mb.member_decorate(block, 0, Decoration.Offset, 0)
        if readonly:
            mb.member_decorate(block, 0, Decoration.NonWritable)
        var = mb.variable(block, StorageClass.StorageBuffer, name)
        mb.decorate(var, Decoration.DescriptorSet, 0)
        mb.decorate(var, Decoration.Binding, binding)
        if restrict:
            mb.decorate(var, Decoration.Restrict)
        return Buffer(var, elem)

    def buffer_ptr(self, buf: Buffer, index: int) -> int:
        ptr_t = self.mb.type_pointer(StorageClass.StorageBuffer, buf.elem)
        return self.f.op(Op.AccessChain, ptr_t, buf.var, self.c(0), index)

    def buffer_load(self, buf: Buffer, index: int) -> int:
        return self.f.op(Op.Load, buf.elem, self.buffer_ptr(buf, index))

    def buffer_store(self, buf: Buffer, index: int, value: int) -> None:
        self.f.emit(Op.Store, self.buffer_ptr(buf, index), value)

    # -- workgroup memory ---------------------------------------------------------------
    def shared_array(self, elem: int, length: int, name: str) -> SharedArray:
        arr = self.mb.type_array(elem, length)
        return SharedArray(self.mb.variable(arr, StorageClass.Workgroup, name), elem)

    def shared_ptr(self, arr: SharedArray, index: int) -> int:
        ptr_t = self.mb.type_pointer(StorageClass.Workgroup, arr.elem)
        return self.f.op(Op.AccessChain, ptr_t, arr.var, index)

    def shared_load(self, arr: SharedArray, index: int) -> int:
        return self.f.op(Op.Load, arr.elem, self.shared_ptr(arr, index), _SHARED_LOAD,
                         self.c(Scope.Workgroup))

    def shared_store(self, arr: SharedArray, index: int, value: int) -> None:
        self.f.emit(Op.Store, self.shared_ptr(arr, index), value, _SHARED_STORE,
                    self.c(Scope.Workgroup))

    def barrier(self, scope: Scope) -> None:
        """Execution + workgroup-memory barrier among the invocations of `scope`."""
        sem = MemorySemantics.AcquireRelease | MemorySemantics.WorkgroupMemory
        self.f.emit(Op.ControlBarrier, self.c(scope), self.c(scope), self.c(sem))

    # -- cooperative matrices -----------------------------------------------------------
    def coop_load_buffer(self, mat_type: int, buf: Buffer, index: int, layout: int,
                         stride: int) -> int:
        return self.f.op(Op.CooperativeMatrixLoadKHR, mat_type, self.buffer_ptr(buf, index),
                         self.c(layout), stride)

    def coop_store_buffer(self, buf: Buffer, index: int, value: int, layout: int,
                          stride: int) -> None:
        self.f.emit(Op.CooperativeMatrixStoreKHR, self.buffer_ptr(buf, index), value,
                    self.c(layout), stride)

    def coop_load_shared(self, mat_type: int, arr: SharedArray, index: int, layout: int,
                         stride: int) -> int:
        return self.f.op(Op.CooperativeMatrixLoadKHR, mat_type, self.shared_ptr(arr, index),
                         self.c(layout), stride, _SHARED_LOAD, self.c(Scope.Workgroup))

    def coop_store_shared(self, arr: SharedArray, index: int, value: int, layout: int,
                          stride: int) -> None:
        self.f.emit(Op.CooperativeMatrixStoreKHR, self.shared_ptr(arr, index), value,
                    self.c(layout), stride, _SHARED_STORE, self.c(Scope.Workgroup))

    # -- tensor layouts and views (SPV_NV_tensor_addressing) ----------------------------
    def tensor_layout(self, layout_type: int, dims: list[int], strides: list[int] | None = None,
                      clamp_value: int | None = None) -> int:
        """A fresh layout with `dims` (outermost first), then `strides` if given.

        OpTensorLayoutSetDimensionNV also sets packed strides and zero offsets, so it goes
        first; the clamp value is a 32-bit id (the bits of the element value)."""
        f = self.f
        layout = f.op(Op.CreateTensorLayoutNV, layout_type)
        layout = f.op(Op.TensorLayoutSetDimensionNV, layout_type, layout, *dims)
        if strides is not None:
            layout = f.op(Op.TensorLayoutSetStrideNV, layout_type, layout, *strides)
        if clamp_value is not None:
            layout = f.op(Op.TensorLayoutSetClampValueNV, layout_type, layout, clamp_value)
        return layout

    def tensor_slice(self, layout_type: int, layout: int,
                     ranges: list[tuple[int, int]]) -> int:
        """OpTensorLayoutSliceNV: (offset, span) per dimension, outermost first."""
        operands = [x for pair in ranges for x in pair]
        return self.f.op(Op.TensorLayoutSliceNV, layout_type, layout, *operands)

    def tensor_view(self, view_type: int) -> int:
        return self.f.op(Op.CreateTensorViewNV, view_type)

    @staticmethod
    def _tensor_operands(view: int | None) -> tuple[int, ...]:
        if view is None:
            return (int(MemoryAccess.NONE), int(TensorAddressingOperands.NONE))
        return (int(MemoryAccess.NONE), int(TensorAddressingOperands.TensorView), view)

    def coop_load_tensor(self, mat_type: int, buf: Buffer, index: int, obj: int, layout: int,
                         view: int | None = None) -> int:
        """OpCooperativeMatrixLoadTensorNV from &buf[index]; `obj` supplies clipped elements."""
        return self.f.op(Op.CooperativeMatrixLoadTensorNV, mat_type, self.buffer_ptr(buf, index),
                         obj, layout, *self._tensor_operands(view))

    def coop_store_tensor(self, buf: Buffer, index: int, value: int, layout: int,
                          view: int | None = None) -> None:
        self.f.emit(Op.CooperativeMatrixStoreTensorNV, self.buffer_ptr(buf, index), value,
                    layout, *self._tensor_operands(view))
