"""Decoding a SPIR-V module: types, constants, decorations, variables and the entry point's
blocks, ready for machine.py to execute.

Everything at module level goes through one dispatch table (_DECLARE); an opcode missing
from it is refused, as is any capability, extension, decoration or execution mode the
interpreter does not model, so that a module cannot rely on something the interpreter
silently ignores.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from .spec import (
    KNOWN_EXTENSIONS,
    MAGIC,
    AddressingModel,
    Capability,
    Decoration,
    ExecutionMode,
    ExecutionModel,
    FPEncoding,
    MemoryModel,
    Op,
    StorageClass,
)


class InterpreterError(Exception):
    """The module does something the interpreter cannot execute faithfully."""


class Unsupported(InterpreterError):
    """An instruction, operand or feature the interpreter does not implement."""


class UndefinedBehavior(InterpreterError):
    """The specification leaves the result undefined (or forbids what happened)."""


# -- types -----------------------------------------------------------------------------------
@dataclass(eq=False)
class Type:
    id: int


@dataclass(eq=False)
class VoidT(Type):
    pass


@dataclass(eq=False)
class FunctionT(Type):
    pass


@dataclass(eq=False)
class BoolT(Type):
    pass


@dataclass(eq=False)
class IntT(Type):
    width: int
    signed: bool


@dataclass(eq=False)
class FloatT(Type):
    width: int
    encoding: int | None


@dataclass(eq=False)
class VectorT(Type):
    component: Type
    count: int


@dataclass(eq=False)
class ArrayT(Type):
    element: Type
    length: int
    stride: int | None  # ArrayStride; None where the storage class has no explicit layout


@dataclass(eq=False)
class RuntimeArrayT(Type):
    element: Type
    stride: int | None


@dataclass(eq=False)
class StructT(Type):
    members: list[Type]
    offsets: list[int | None]


@dataclass(eq=False)
class PointerT(Type):
    storage: int
    pointee: Type


@dataclass(eq=False)
class CoopMatT(Type):
    component: Type
    scope: int
    rows: int
    cols: int
    use: int


SCALARS = (BoolT, IntT, FloatT)

_FLOAT_DTYPES: dict[tuple[int, int | None], np.dtype] = {
    (16, None): np.dtype(np.float16),
    (32, None): np.dtype(np.float32),
    (64, None): np.dtype(np.float64),
    (16, FPEncoding.BFloat16KHR): np.dtype(ml_dtypes.bfloat16),
    # SPV_EXT_float8 takes both from the OCP "FP8 Formats for Deep Learning" paper: E4M3
    # has no infinities and one NaN per sign (ml_dtypes' "fn" variant), E5M2 is IEEE-like.
    (8, FPEncoding.Float8E4M3EXT): np.dtype(ml_dtypes.float8_e4m3fn),
    (8, FPEncoding.Float8E5M2EXT): np.dtype(ml_dtypes.float8_e5m2),
}


def scalar_of(t: Type) -> Type:
    """The component type of a vector or cooperative matrix; a scalar type itself."""
    if isinstance(t, (VectorT, CoopMatT)):
        return t.component
    return t


def np_dtype(t: Type) -> np.dtype:
    """numpy's dtype for a scalar type (or the component of a vector/matrix)."""
    t = scalar_of(t)
    if isinstance(t, BoolT):
        return np.dtype(np.bool_)
    if isinstance(t, IntT):
        return np.dtype(f"{'i' if t.signed else 'u'}{t.width // 8}")
    if isinstance(t, FloatT):
        try:
            return _FLOAT_DTYPES[(t.width, t.encoding)]
        except KeyError:
            raise Unsupported(f"float type width {t.width} encoding {t.encoding}") from None
    raise Unsupported(f"no scalar dtype for {type(t).__name__}")


def int_dtype(width: int, signed: bool) -> np.dtype:
    return np.dtype(f"{'i' if signed else 'u'}{width // 8}")


def is_fp8(t: Type) -> bool:
    t = scalar_of(t)
    return isinstance(t, FloatT) and t.width == 8


def type_size(t: Type) -> int:
    """Bytes the type occupies in memory (scalars and vectors tightly packed)."""
    if isinstance(t, (IntT, FloatT)):
        return t.width // 8
    if isinstance(t, VectorT):
        return t.count * type_size(t.component)
    if isinstance(t, ArrayT):
        return t.length * (t.stride if t.stride is not None else type_size(t.element))
    if isinstance(t, StructT):
        if any(o is None for o in t.offsets):
            raise Unsupported("a struct without explicit member offsets in memory")
        return max((o or 0) + type_size(m) for o, m in zip(t.offsets, t.members, strict=True))
    raise Unsupported(f"the size of {type(t).__name__} in memory")


def element_stride(t: ArrayT | RuntimeArrayT) -> int:
    return t.stride if t.stride is not None else type_size(t.element)


def lane_ndim(t: Type) -> int:
    """Dimensions of one invocation's value of type t (0 scalar, 1 vector, 2 matrix)."""
    if isinstance(t, VectorT):
        return 1
    if isinstance(t, CoopMatT):
        return 2
    return 0


# -- instructions of the entry point ------------------------------------------------------
# Opcodes inside a function that have neither a result type nor a result id.
NO_RESULT = frozenset({Op.Store, Op.AtomicStore, Op.ControlBarrier, Op.MemoryBarrier,
                       Op.CooperativeMatrixStoreKHR, Op.LoopMerge, Op.SelectionMerge,
                       Op.Branch, Op.BranchConditional, Op.Switch, Op.Return, Op.ReturnValue,
                       Op.Kill, Op.Unreachable, Op.Nop, Op.Line, Op.FunctionEnd})
TERMINATORS = frozenset({Op.Branch, Op.BranchConditional, Op.Switch, Op.Return,
                         Op.ReturnValue, Op.Kill, Op.Unreachable})


@dataclass(eq=False)
class Ins:
    op: int
    rtype: Type | None
    rid: int
    args: list[int]
    index: int  # position in the function, for messages and barrier identity
    fn: Callable[..., Any] | None = None  # bound by machine.py

    def __repr__(self) -> str:
        try:
            name = Op(self.op).name
        except ValueError:
            name = str(self.op)
        return f"Op{name} #{self.index}" + (f" %{self.rid}" if self.rid else "")


@dataclass(eq=False)
class Block:
    label: int
    phis: list[Ins] = field(default_factory=list)
    body: list[Ins] = field(default_factory=list)
    loop: tuple[int, int] | None = None  # (merge, continue target) of OpLoopMerge
    selection: int | None = None  # merge block of OpSelectionMerge
    term: Ins | None = None


@dataclass
class GlobalVar:
    id: int
    storage: int
    pointee: Type
    initializer: int | None


def decode_words(spirv: bytes) -> tuple[tuple[int, ...], list[tuple[int, list[int]]]]:
    if len(spirv) % 4 or len(spirv) < 20:
        raise InterpreterError("a SPIR-V module is a whole number of words, at least 5")
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    if words[0] != MAGIC:
        raise InterpreterError("not a little-endian SPIR-V module")
    out, i = [], 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if count == 0 or i + count > len(words):
            raise InterpreterError(f"malformed instruction at word {i}")
        out.append((op, list(words[i + 1:i + count])))
        i += count
    return words[:5], out


def decode_string(words: list[int]) -> tuple[str, int]:
    """A literal string and the number of words it takes."""
    raw = struct.pack(f"<{len(words)}I", *words)
    end = raw.index(b"\0")
    return raw[:end].decode(), end // 4 + 1


KNOWN_DECORATIONS = frozenset({
    Decoration.SpecId, Decoration.Block, Decoration.ArrayStride, Decoration.BuiltIn,
    Decoration.Restrict, Decoration.NonWritable, Decoration.NonReadable, Decoration.Binding,
    Decoration.DescriptorSet, Decoration.Offset,
    # Allows lower precision; computing at full precision is one valid implementation.
    Decoration.RelaxedPrecision})


@dataclass(eq=False)
class Function:
    id: int
    return_type: Type
    params: list[int]  # ids of the OpFunctionParameter results
    first_label: int
    blocks: dict[int, Block]


# Evaluates an OpSpecConstantOp: (module, result type, result id, opcode, operands) -> value.
SpecOpEvaluator = Callable[["Module", Type, int, int, list[int]], np.ndarray]


class Module:
    """A decoded module. `spec_constants` maps SpecId -> value (as vkCreateComputePipelines'
    VkSpecializationInfo would give it); other specialization constants keep their
    defaults. `spec_op` evaluates OpSpecConstantOp (machine.py lends its handlers)."""

    def __init__(self, spirv: bytes, spec_constants: Mapping[int, Any] | None = None,
                 spec_op: SpecOpEvaluator | None = None) -> None:
        header, insts = decode_words(spirv)
        self.version = ((header[1] >> 16) & 0xFF, (header[1] >> 8) & 0xFF)
        self.spec_values = dict(spec_constants or {})
        self.spec_op = spec_op
        self.capabilities: set[int] = set()
        self.extensions: set[str] = set()
        self.types: dict[int, Type] = {}
        self.constants: dict[int, np.ndarray] = {}
        self.value_types: dict[int, Type] = {}  # result id -> type, for every value
        self.decorations: dict[int, dict[int, list[int]]] = {}
        self.member_decorations: dict[tuple[int, int], dict[int, list[int]]] = {}
        self.variables: dict[int, GlobalVar] = {}
        self.entry: tuple[int, str, list[int]] | None = None
        self.execution_model: int = ExecutionModel.GLCompute
        self.addressing: int = AddressingModel.Logical
        # entry point -> execution mode -> its literals (or ids, for LocalSizeId)
        self.modes: dict[int, dict[int, list[int]]] = {}
        self.ext_imports: dict[int, str] = {}  # OpExtInstImport result id -> set name
        self.names: dict[int, str] = {}
        self.functions: dict[int, Function] = {}
        self.blocks: dict[int, Block] = {}  # of every function (labels are module-unique)
        fn_insts: list[tuple[int, list[int]]] = []
        index = 0
        for op, w in insts:
            index += 1
            if op == Op.Function or fn_insts:
                fn_insts.append((op, w))
                if op == Op.FunctionEnd:
                    self._decode_function(fn_insts, index - len(fn_insts))
                    fn_insts = []
                continue
            handler = _DECLARE.get(op)
            if handler is None:
                raise Unsupported(f"module-level instruction {_opname(op)}")
            handler(self, w)
        if fn_insts:
            raise InterpreterError("a function without OpFunctionEnd")
        if self.entry is None:
            raise InterpreterError("no OpEntryPoint")
        entry = self.functions.get(self.entry[0])
        # An OpenCL kernel's arguments are its parameters (Interpreter.dispatch_kernel).
        kernel = self.execution_model == ExecutionModel.Kernel
        if entry is None or not isinstance(entry.return_type, VoidT) or (
                entry.params and not kernel):
            raise InterpreterError("the entry point is not a void function without "
                                   "parameters")
        self.first_label: int = entry.first_label
        self.local_size: tuple[int, int, int] = self._local_size()

    # -- helpers ------------------------------------------------------------------------
    def decoration(self, target: int, dec: int) -> list[int] | None:
        return self.decorations.get(target, {}).get(dec)

    def const_value(self, id_: int) -> Any:
        """The value of a constant instruction (raise where `id_` is not one)."""
        if id_ not in self.constants:
            raise UndefinedBehavior(f"%{id_} must be a constant instruction")
        return self.constants[id_]

    def const_int(self, id_: int) -> int:
        return int(self.const_value(id_))

    def _scalar_literal(self, t: Type, words: list[int]) -> np.ndarray:
        dt = np_dtype(t)
        if isinstance(t, IntT):
            if t.width == 64:
                raw = words[0] | (words[1] << 32)
            else:
                raw = words[0] & ((1 << t.width) - 1)
            return np.array(raw, dtype=int_dtype(t.width, False)).view(dt)
        if isinstance(t, FloatT):
            if t.width == 64:
                return np.array(words[0] | (words[1] << 32), np.uint64).view(dt)
            bits = words[0] & ((1 << t.width) - 1)
            return np.array(bits, dtype=int_dtype(t.width, False)).view(dt)
        raise Unsupported(f"a literal of {type(t).__name__}")

    def _literal_words_of(self, t: Type, value: Any) -> list[int]:
        """Encode a specialization value the way VkSpecializationInfo bytes would be read."""
        dt = np_dtype(t)
        raw = np.array(value).astype(dt).view(int_dtype(dt.itemsize * 8, False))
        v = int(raw)
        return [v & 0xFFFFFFFF, v >> 32] if dt.itemsize == 8 else [v]

    def _decode_function(self, insts: list[tuple[int, list[int]]], first_index: int) -> None:
        head = insts[0][1]
        ret_type, fn_id = self.types.get(head[0]), head[1]
        if ret_type is None:
            raise InterpreterError(f"function %{fn_id}: %{head[0]} is not a type")
        params: list[int] = []
        blocks: dict[int, Block] = {}
        first_label: int | None = None
        block: Block | None = None
        for index, (op, w) in enumerate(insts[1:], start=first_index + 1):
            if op == Op.FunctionEnd:
                break
            if op == Op.FunctionParameter:
                if blocks:
                    raise InterpreterError("OpFunctionParameter after the first block")
                params.append(w[1])
                self.value_types[w[1]] = self.types[w[0]]
                continue
            if op == Op.Label:
                if block is not None:
                    raise InterpreterError(f"block %{block.label} has no terminator")
                block = Block(w[0])
                blocks[w[0]] = block
                if first_label is None:
                    first_label = w[0]
                continue
            if op == Op.Line or op == Op.Nop:
                continue
            if block is None:
                raise InterpreterError(f"{_opname(op)} outside a block")
            if op in NO_RESULT:
                ins = Ins(op, None, 0, w, index)
            else:
                rtype = self.types.get(w[0])
                if rtype is None:
                    raise InterpreterError(f"{_opname(op)}: %{w[0]} is not a type")
                ins = Ins(op, rtype, w[1], w[2:], index)
                self.value_types[w[1]] = rtype
            if op == Op.LoopMerge:
                block.loop = (w[0], w[1])
            elif op == Op.SelectionMerge:
                block.selection = w[0]
            elif op == Op.Phi:
                if block.body:
                    raise InterpreterError("OpPhi after other instructions of its block")
                block.phis.append(ins)
            elif op in TERMINATORS:
                block.term = ins
                block = None
            else:
                block.body.append(ins)
        if block is not None:
            raise InterpreterError(f"block %{block.label} has no terminator")
        if first_label is None:
            raise Unsupported(f"function %{fn_id} without a body")
        self.functions[fn_id] = Function(fn_id, ret_type, params, first_label, blocks)
        self.blocks.update(blocks)

    def _local_size(self) -> tuple[int, int, int]:
        assert self.entry is not None
        modes = self.modes.get(self.entry[0], {})
        if ExecutionMode.LocalSize in modes:
            x, y, z = modes[ExecutionMode.LocalSize]
        elif ExecutionMode.LocalSizeId in modes:
            x, y, z = (self.const_int(i) for i in modes[ExecutionMode.LocalSizeId])
        else:
            # (An OpenCL kernel without reqd_work_group_size takes its size at enqueue
            # time; the interpreter asks for it in the module.)
            raise InterpreterError("the entry point has no LocalSize or LocalSizeId")
        return (x, y, z)

    def required_subgroup_size(self) -> int | None:
        """The entry point's ExecutionMode SubgroupSize (SubgroupDispatch), if any."""
        assert self.entry is not None
        lits = self.modes.get(self.entry[0], {}).get(ExecutionMode.SubgroupSize)
        return lits[0] if lits else None


def _opname(op: int) -> str:
    try:
        return f"Op{Op(op).name}"
    except ValueError:
        return f"opcode {op}"


# -- module-level declarations ----------------------------------------------------------------
def _capability(m: Module, w: list[int]) -> None:
    try:
        Capability(w[0])
    except ValueError:
        raise Unsupported(f"capability {w[0]}") from None
    m.capabilities.add(w[0])


def _extension(m: Module, w: list[int]) -> None:
    name, _ = decode_string(w)
    if name not in KNOWN_EXTENSIONS:
        raise Unsupported(f"extension {name}")
    m.extensions.add(name)


def _memory_model(m: Module, w: list[int]) -> None:
    kernel = Capability.Kernel in m.capabilities
    if kernel:
        # The OpenCL environment: physical addressing and the OpenCL memory model.
        if w[0] not in (AddressingModel.Physical32, AddressingModel.Physical64) or \
                w[1] != MemoryModel.OpenCL:
            raise Unsupported(f"a Kernel module with addressing model {w[0]}, memory model "
                              f"{w[1]}")
        if Capability.Addresses not in m.capabilities:
            raise UndefinedBehavior("physical addressing needs the Addresses capability")
        m.addressing = w[0]
        return
    if w[0] != AddressingModel.Logical or w[1] not in (MemoryModel.Vulkan, MemoryModel.GLSL450):
        raise Unsupported(f"addressing model {w[0]}, memory model {w[1]}")
    if w[1] != MemoryModel.Vulkan and Capability.CooperativeMatrixKHR in m.capabilities:
        raise UndefinedBehavior("SPV_KHR_cooperative_matrix requires the Vulkan memory model")


def _entry_point(m: Module, w: list[int]) -> None:
    if m.entry is not None:
        raise Unsupported("more than one entry point")
    kernel = Capability.Kernel in m.capabilities
    if w[0] != (ExecutionModel.Kernel if kernel else ExecutionModel.GLCompute):
        raise Unsupported(f"execution model {w[0]}"
                          f"{' in a Kernel module' if kernel else ''}")
    name, used = decode_string(w[2:])
    m.entry = (w[1], name, w[2 + used:])
    m.execution_model = w[0]


def _execution_mode(m: Module, w: list[int]) -> None:
    if w[1] == ExecutionMode.SubgroupSize:
        # An OpenCL kernel's required sub-group size (intel_reqd_sub_group_size).
        if Capability.SubgroupDispatch not in m.capabilities:
            raise UndefinedBehavior("ExecutionMode SubgroupSize needs SubgroupDispatch")
    elif w[1] != ExecutionMode.LocalSize:
        raise Unsupported(f"execution mode {w[1]}")
    m.modes.setdefault(w[0], {})[w[1]] = w[2:]


def _execution_mode_id(m: Module, w: list[int]) -> None:
    """OpExecutionModeId: the operands are ids (LocalSizeId: specialization constants)."""
    if w[1] != ExecutionMode.LocalSizeId:
        raise Unsupported(f"execution mode {w[1]}")
    m.modes.setdefault(w[0], {})[w[1]] = w[2:]


def _name(m: Module, w: list[int]) -> None:
    m.names[w[0]] = decode_string(w[1:])[0]


def _ignore(m: Module, w: list[int]) -> None:
    """Debug information: no effect on execution."""


def _ext_inst_import(m: Module, w: list[int]) -> None:
    """Importing an instruction set is harmless; OpExtInst runs only the instructions
    machine.py implements (of OpenCL.std), and refuses the rest when the module loads."""
    m.ext_imports[w[0]] = decode_string(w[1:])[0]


def _spec_constant_op(m: Module, w: list[int]) -> None:
    if m.spec_op is None:
        raise Unsupported("OpSpecConstantOp")
    _set_constant(m, w[0], w[1], m.spec_op(m, m.types[w[0]], w[1], w[2], w[3:]))


def _decorate(m: Module, w: list[int]) -> None:
    if w[1] not in KNOWN_DECORATIONS:
        raise Unsupported(f"decoration {w[1]} on %{w[0]}")
    m.decorations.setdefault(w[0], {})[w[1]] = w[2:]


def _member_decorate(m: Module, w: list[int]) -> None:
    if w[2] not in KNOWN_DECORATIONS:
        raise Unsupported(f"decoration {w[2]} on member {w[1]} of %{w[0]}")
    m.member_decorations.setdefault((w[0], w[1]), {})[w[2]] = w[3:]


def _type(cls: Callable[..., Type]) -> Callable[[Module, list[int]], None]:
    def declare(m: Module, w: list[int]) -> None:
        m.types[w[0]] = cls(m, w)
    return declare


def _int_type(m: Module, w: list[int]) -> Type:
    width, signed = w[1], bool(w[2])
    need = {8: Capability.Int8, 16: Capability.Int16, 64: Capability.Int64}.get(width)
    if width not in (8, 16, 32, 64):
        raise Unsupported(f"integer width {width}")
    if need is not None and need not in m.capabilities and not _storage_only(m, width):
        raise UndefinedBehavior(f"{width}-bit integers need capability {need.name}")
    return IntT(w[0], width, signed)


def _storage_only(m: Module, width: int) -> bool:
    cap = {8: Capability.StorageBuffer8BitAccess, 16: Capability.StorageBuffer16BitAccess}
    return width in cap and cap[width] in m.capabilities


def _float_type(m: Module, w: list[int]) -> Type:
    width = w[1]
    encoding = w[2] if len(w) > 2 else None
    if (width, encoding) not in _FLOAT_DTYPES:
        raise Unsupported(f"float width {width} encoding {encoding}")
    needs: dict[int | None, Capability | None] = {
        None: {16: Capability.Float16, 64: Capability.Float64}.get(width),
        FPEncoding.BFloat16KHR: Capability.BFloat16TypeKHR,
        FPEncoding.Float8E4M3EXT: Capability.Float8EXT,
        FPEncoding.Float8E5M2EXT: Capability.Float8EXT}
    need = needs[encoding]
    if need is not None and need not in m.capabilities and not (
            encoding is None and _storage_only(m, width)):
        raise UndefinedBehavior(f"this float type needs capability {need.name}")
    return FloatT(w[0], width, encoding)


def _array_stride(m: Module, type_id: int) -> int | None:
    s = m.decoration(type_id, Decoration.ArrayStride)
    return s[0] if s else None


def _vector_type(m: Module, w: list[int]) -> Type:
    if w[2] in (8, 16) and Capability.Kernel in m.capabilities and \
            Capability.Vector16 not in m.capabilities:
        raise UndefinedBehavior(f"a {w[2]}-component vector in a Kernel module needs Vector16")
    return VectorT(w[0], m.types[w[1]], w[2])


def _struct_type(m: Module, w: list[int]) -> Type:
    members = [m.types[i] for i in w[1:]]
    offsets = []
    for i in range(len(members)):
        off = m.member_decorations.get((w[0], i), {}).get(Decoration.Offset)
        offsets.append(off[0] if off else None)
    return StructT(w[0], members, offsets)


def _coopmat_type(m: Module, w: list[int]) -> Type:
    comp = m.types[w[1]]
    if not isinstance(comp, (IntT, FloatT)):
        raise UndefinedBehavior("a cooperative matrix's component type must be numerical")
    if isinstance(comp, FloatT) and comp.encoding == FPEncoding.BFloat16KHR and \
            Capability.BFloat16CooperativeMatrixKHR not in m.capabilities:
        raise UndefinedBehavior("bfloat16 cooperative matrices need "
                                "BFloat16CooperativeMatrixKHR")
    if is_fp8(comp) and Capability.Float8CooperativeMatrixEXT not in m.capabilities:
        raise UndefinedBehavior("float8 cooperative matrices need Float8CooperativeMatrixEXT")
    scope, rows, cols, use = (m.const_int(i) for i in w[2:6])
    return CoopMatT(w[0], comp, scope, rows, cols, use)


_TYPE_BUILDERS: dict[int, Callable[[Module, list[int]], Type]] = {
    Op.TypeVoid: lambda m, w: VoidT(w[0]),
    Op.TypeBool: lambda m, w: BoolT(w[0]),
    Op.TypeInt: _int_type,
    Op.TypeFloat: _float_type,
    Op.TypeVector: lambda m, w: _vector_type(m, w),
    Op.TypeArray: lambda m, w: ArrayT(w[0], m.types[w[1]], m.const_int(w[2]),
                                      _array_stride(m, w[0])),
    Op.TypeRuntimeArray: lambda m, w: RuntimeArrayT(w[0], m.types[w[1]],
                                                    _array_stride(m, w[0])),
    Op.TypeStruct: _struct_type,
    Op.TypePointer: lambda m, w: PointerT(w[0], w[1], m.types[w[2]]),
    Op.TypeFunction: lambda m, w: FunctionT(w[0]),
    Op.TypeCooperativeMatrixKHR: _coopmat_type,
}


def _set_constant(m: Module, type_id: int, rid: int, value: np.ndarray) -> None:
    m.constants[rid] = value
    m.value_types[rid] = m.types[type_id]


def _constant(m: Module, w: list[int]) -> None:
    _set_constant(m, w[0], w[1], m._scalar_literal(m.types[w[0]], w[2:]))


def _spec_constant(m: Module, w: list[int]) -> None:
    spec_id = m.decoration(w[1], Decoration.SpecId)
    words = w[2:]
    if spec_id is not None and spec_id[0] in m.spec_values:
        words = m._literal_words_of(m.types[w[0]], m.spec_values[spec_id[0]])
    _set_constant(m, w[0], w[1], m._scalar_literal(m.types[w[0]], words))


def _bool_constant(value: bool, spec: bool) -> Callable[[Module, list[int]], None]:
    def declare(m: Module, w: list[int]) -> None:
        v = value
        spec_id = m.decoration(w[1], Decoration.SpecId) if spec else None
        if spec_id is not None and spec_id[0] in m.spec_values:
            v = bool(m.spec_values[spec_id[0]])
        _set_constant(m, w[0], w[1], np.array(v))
    return declare


def _zero(t: Type) -> np.ndarray:
    if isinstance(t, SCALARS):
        return np.zeros((), np_dtype(t))
    if isinstance(t, VectorT):
        return np.zeros(t.count, np_dtype(t))
    if isinstance(t, CoopMatT):
        return np.zeros((t.rows, t.cols), np_dtype(t))
    raise Unsupported(f"a null constant of {type(t).__name__}")


def _constant_null(m: Module, w: list[int]) -> None:
    _set_constant(m, w[0], w[1], _zero(m.types[w[0]]))


def _constant_composite(m: Module, w: list[int]) -> None:
    t = m.types[w[0]]
    parts = [m.const_value(i) for i in w[2:]]
    if isinstance(t, VectorT) and len(parts) == t.count:
        value = np.array([p[()] for p in parts], np_dtype(t))
    elif isinstance(t, CoopMatT) and len(parts) == 1:
        # SPV_KHR_cooperative_matrix: one constituent, replicated to every element.
        value = np.full((t.rows, t.cols), parts[0], np_dtype(t))
    else:
        raise Unsupported(f"a constant composite of {type(t).__name__}")
    _set_constant(m, w[0], w[1], value)


def _variable(m: Module, w: list[int]) -> None:
    ptr = m.types[w[0]]
    if not isinstance(ptr, PointerT) or ptr.storage != w[2]:
        raise InterpreterError(f"OpVariable %{w[1]}: type is not a pointer to storage {w[2]}")
    if w[2] not in (StorageClass.Input, StorageClass.Workgroup, StorageClass.StorageBuffer,
                    StorageClass.PushConstant, StorageClass.Private):
        raise Unsupported(f"variables in storage class {w[2]}")
    m.variables[w[1]] = GlobalVar(w[1], w[2], ptr.pointee, w[3] if len(w) > 3 else None)
    m.value_types[w[1]] = ptr


_DECLARE: dict[int, Callable[[Module, list[int]], None]] = {
    Op.Capability: _capability,
    Op.Extension: _extension,
    Op.MemoryModel: _memory_model,
    Op.EntryPoint: _entry_point,
    Op.ExecutionMode: _execution_mode,
    Op.ExecutionModeId: _execution_mode_id,
    Op.Name: _name,
    Op.MemberName: _ignore,
    Op.Source: _ignore,
    Op.SourceContinued: _ignore,
    Op.SourceExtension: _ignore,
    Op.String: _ignore,
    Op.ModuleProcessed: _ignore,
    Op.Decorate: _decorate,
    Op.MemberDecorate: _member_decorate,
    **{op: _type(build) for op, build in _TYPE_BUILDERS.items()},
    Op.Constant: _constant,
    Op.SpecConstant: _spec_constant,
    Op.ConstantTrue: _bool_constant(True, spec=False),
    Op.ConstantFalse: _bool_constant(False, spec=False),
    Op.SpecConstantTrue: _bool_constant(True, spec=True),
    Op.SpecConstantFalse: _bool_constant(False, spec=True),
    Op.ConstantNull: _constant_null,
    Op.ConstantComposite: _constant_composite,
    Op.SpecConstantComposite: _constant_composite,
    Op.SpecConstantOp: _spec_constant_op,
    Op.ExtInstImport: _ext_inst_import,
    Op.Variable: _variable,
}
