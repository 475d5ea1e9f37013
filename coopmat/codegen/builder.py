"""A small SPIR-V module builder: ids, types, constants, decorations, variables, functions.

It writes the binary form directly. Types and constants are deduplicated, because SPIR-V
forbids two identical non-aggregate type declarations; structs are the exception (each
carries its own decorations). The logical layout of a module (section order) is fixed
by `assemble`, so callers may declare things in any order.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from coopmat.codegen.spv import (
    MAGIC,
    AddressingModel,
    Capability,
    Decoration,
    ExecutionMode,
    ExecutionModel,
    MemoryModel,
    Op,
    StorageClass,
)

Operand = int | str


def encode_string(s: str) -> list[int]:
    """A literal string: UTF-8, nul-terminated, padded to whole words (little-endian)."""
    raw = s.encode() + b"\0"
    raw += b"\0" * (-len(raw) % 4)
    return list(struct.unpack(f"<{len(raw) // 4}I", raw))


def instruction(op: int, *operands: Operand) -> list[int]:
    words: list[int] = []
    for o in operands:
        if isinstance(o, str):
            words += encode_string(o)
        else:
            words.append(int(o) & 0xFFFFFFFF)
    return [((len(words) + 1) << 16) | int(op), *words]


@dataclass(frozen=True)
class ScalarInfo:
    """What a scalar type is, so constants of it can be encoded."""

    kind: str  # "int", "float", "bfloat", "encoded" or "bool"
    width: int
    signed: bool = False


class ModuleBuilder:
    def __init__(self, version: tuple[int, int] = (1, 6)) -> None:
        self.version = version
        self._next_id = 1
        self._capabilities: dict[int, None] = {}
        self._extensions: dict[str, None] = {}
        self._imports: dict[str, int] = {}
        self._entry: list[list[int]] = []
        self._modes: list[list[int]] = []
        self._names: list[list[int]] = []
        self._annotations: list[list[int]] = []
        self._globals: list[list[int]] = []
        self._functions: list[list[int]] = []
        self._dedup: dict[tuple[object, ...], int] = {}
        self._scalars: dict[int, ScalarInfo] = {}
        self.interface: list[int] = []  # every global variable (SPIR-V 1.4+ entry points)
        # PhysicalStorageBuffer64 where the module uses buffer addresses (pointers of
        # storage class PhysicalStorageBuffer).
        self.addressing = AddressingModel.Logical
        # OpenCL for Kernel modules (the intel family); Vulkan for every compute shader.
        self.memory_model = MemoryModel.Vulkan

    # -- ids and module-level declarations ---------------------------------------------
    def new_id(self) -> int:
        i = self._next_id
        self._next_id += 1
        return i

    def capability(self, *caps: Capability) -> None:
        for c in caps:
            self._capabilities[int(c)] = None

    def extension(self, name: str) -> None:
        self._extensions[name] = None

    def ext_inst_import(self, name: str) -> int:
        """The id of an extended instruction set (e.g. "GLSL.std.450"), imported once."""
        if name not in self._imports:
            self._imports[name] = self.new_id()
        return self._imports[name]

    def name(self, target: int, text: str) -> None:
        self._names.append(instruction(Op.Name, target, text))

    def member_name(self, struct_id: int, member: int, text: str) -> None:
        self._names.append(instruction(Op.MemberName, struct_id, member, text))

    def decorate(self, target: int, decoration: Decoration, *literals: int) -> None:
        self._annotations.append(instruction(Op.Decorate, target, decoration, *literals))

    def member_decorate(self, struct_id: int, member: int, decoration: Decoration,
                        *literals: int) -> None:
        self._annotations.append(
            instruction(Op.MemberDecorate, struct_id, member, decoration, *literals))

    def _declare(self, key: tuple[object, ...], op: Op, *operands: Operand,
                 result_type: int | None = None) -> int:
        """Emit a type/constant declaration once per key; return its id."""
        if key in self._dedup:
            return self._dedup[key]
        rid = self.new_id()
        head = (result_type, rid) if result_type is not None else (rid,)
        self._globals.append(instruction(op, *head, *operands))
        self._dedup[key] = rid
        return rid

    # -- types --------------------------------------------------------------------------
    def type_void(self) -> int:
        return self._declare(("void",), Op.TypeVoid)

    def type_bool(self) -> int:
        t = self._declare(("bool",), Op.TypeBool)
        self._scalars[t] = ScalarInfo("bool", 1)
        return t

    def type_int(self, width: int, signed: bool) -> int:
        t = self._declare(("int", width, signed), Op.TypeInt, width, int(signed))
        self._scalars[t] = ScalarInfo("int", width, signed)
        return t

    def type_float(self, width: int, encoding: int | None = None) -> int:
        extra = () if encoding is None else (encoding,)
        t = self._declare(("float", width, encoding), Op.TypeFloat, width, *extra)
        # Constants of encoded floats: bfloat16 is float32's top half; other encodings
        # (float8) only ever appear as OpConstantNull, which needs no literal.
        kind = "float" if encoding is None else "bfloat" if width == 16 else "encoded"
        self._scalars[t] = ScalarInfo(kind, width)
        return t

    def type_vector(self, component: int, count: int) -> int:
        return self._declare(("vec", component, count), Op.TypeVector, component, count)

    def type_array(self, element: int, length: int) -> int:
        n = self.const_u32(length)
        return self._declare(("array", element, n), Op.TypeArray, element, n)

    def type_runtime_array(self, element: int, stride: int) -> int:
        """A runtime array with its ArrayStride (only valid in explicitly laid out storage)."""
        key = ("rtarray", element, stride)
        fresh = key not in self._dedup
        t = self._declare(key, Op.TypeRuntimeArray, element)
        if fresh:
            self.decorate(t, Decoration.ArrayStride, stride)
        return t

    def type_struct(self, members: Sequence[int]) -> int:
        rid = self.new_id()  # never deduplicated: each struct has its own decorations
        self._globals.append(instruction(Op.TypeStruct, rid, *members))
        return rid

    def type_pointer(self, storage: StorageClass, pointee: int) -> int:
        return self._declare(("ptr", int(storage), pointee), Op.TypePointer, storage, pointee)

    def type_function(self, ret: int, *params: int) -> int:
        return self._declare(("fn", ret, *params), Op.TypeFunction, ret, *params)

    def type_coopmat(self, component: int, scope: int, rows: int, cols: int, use: int) -> int:
        ids = (self.const_u32(scope), self.const_u32(rows), self.const_u32(cols),
               self.const_u32(use))
        return self._declare(("coopmat", component, *ids), Op.TypeCooperativeMatrixKHR,
                             component, *ids)

    def type_tensor_layout(self, dim: int, clamp_mode: int) -> int:
        """SPV_NV_tensor_addressing's OpTypeTensorLayoutNV (dimensions, TensorClampMode)."""
        d, c = self.const_u32(dim), self.const_u32(clamp_mode)
        return self._declare(("tensor_layout", d, c), Op.TypeTensorLayoutNV, d, c)

    def type_tensor_view(self, dim: int, has_dimensions: bool,
                         permutation: Sequence[int]) -> int:
        """OpTypeTensorViewNV; `permutation` reorders the view's coordinates (see the spec)."""
        if sorted(permutation) != list(range(dim)):
            raise ValueError(f"{permutation} is not a permutation of range({dim})")
        d, h = self.const_u32(dim), self.const_bool(has_dimensions)
        ps = [self.const_u32(p) for p in permutation]
        return self._declare(("tensor_view", d, h, *ps), Op.TypeTensorViewNV, d, h, *ps)

    # -- constants ----------------------------------------------------------------------
    def _literal_words(self, type_id: int, value: float | int) -> list[int]:
        info = self._scalars[type_id]
        if info.kind == "float" and info.width == 32:
            return [struct.unpack("<I", struct.pack("<f", float(value)))[0]]
        if info.kind == "float" and info.width == 16:
            return [struct.unpack("<H", struct.pack("<e", float(value)))[0]]
        if info.kind == "bfloat":
            return [struct.unpack("<I", struct.pack("<f", float(value)))[0] >> 16]
        if info.kind == "int" and info.width <= 32:
            v = int(value) & ((1 << info.width) - 1)
            if info.signed and v >> (info.width - 1):  # sign-extend narrow types to 32 bits
                v |= (0xFFFFFFFF << info.width) & 0xFFFFFFFF
            return [v]
        raise ValueError(f"no literal encoding for {info}")

    def constant(self, type_id: int, value: float | int) -> int:
        words = self._literal_words(type_id, value)
        return self._declare(("const", type_id, *words), Op.Constant, *words,
                             result_type=type_id)

    def const_u32(self, value: int) -> int:
        return self.constant(self.type_int(32, False), value)

    def const_bool(self, value: bool) -> int:
        op = Op.ConstantTrue if value else Op.ConstantFalse
        return self._declare(("bool", value), op, result_type=self.type_bool())

    def const_null(self, type_id: int) -> int:
        return self._declare(("null", type_id), Op.ConstantNull, result_type=type_id)

    def const_composite(self, type_id: int, parts: Sequence[int]) -> int:
        return self._declare(("composite", type_id, *parts), Op.ConstantComposite, *parts,
                             result_type=type_id)

    def spec_constant(self, type_id: int, default: int, spec_id: int) -> int:
        """A scalar specialization constant (never deduplicated: SpecId makes it unique)."""
        rid = self.new_id()
        words = self._literal_words(type_id, default)
        self._globals.append(instruction(Op.SpecConstant, type_id, rid, *words))
        self.decorate(rid, Decoration.SpecId, spec_id)
        return rid

    # -- variables, entry points, functions ---------------------------------------------
    def variable(self, pointee: int, storage: StorageClass, name: str | None = None) -> int:
        ptr = self.type_pointer(storage, pointee)
        rid = self.new_id()
        self._globals.append(instruction(Op.Variable, ptr, rid, storage))
        self.interface.append(rid)
        if name:
            self.name(rid, name)
        return rid

    def entry_point(self, model: ExecutionModel, fn: int, name: str) -> None:
        self._entry.append(instruction(Op.EntryPoint, model, fn, name, *self.interface))

    def execution_mode(self, fn: int, mode: ExecutionMode, *literals: int) -> None:
        self._modes.append(instruction(Op.ExecutionMode, fn, mode, *literals))

    def function(self, ret: int, fn_type: int,
                 params: Sequence[int] = ()) -> FunctionBuilder:
        return FunctionBuilder(self, ret, fn_type, params)

    def add_function(self, words: list[int]) -> None:
        self._functions.append(words)

    def assemble(self) -> bytes:
        major, minor = self.version
        words = [MAGIC, (major << 16) | (minor << 8), 0, self._next_id, 0]
        words += [w for c in self._capabilities for w in instruction(Op.Capability, c)]
        words += [w for e in self._extensions for w in instruction(Op.Extension, e)]
        words += [w for n, i in self._imports.items() for w in instruction(Op.ExtInstImport, i, n)]
        words += instruction(Op.MemoryModel, self.addressing, self.memory_model)
        for section in (self._entry, self._modes, self._names, self._annotations,
                        self._globals, self._functions):
            for inst in section:
                words += inst
        return struct.pack(f"<{len(words)}I", *words)


class FunctionBuilder:
    """The body of one function, with structured control flow helpers.

    Function-scope variables are collected apart and placed at the top of the first
    block, where SPIR-V requires them.
    """

    def __init__(self, module: ModuleBuilder, ret: int, fn_type: int,
                 params: Sequence[int] = ()) -> None:
        """`params`: the parameters' type ids; their ids are in `self.params`."""
        self.m = module
        self.id = module.new_id()
        self._head = instruction(Op.Function, ret, self.id, 0, fn_type)
        self.params = [module.new_id() for _ in params]
        for t, pid in zip(params, self.params, strict=True):
            self._head += instruction(Op.FunctionParameter, t, pid)
        self._first_label = instruction(Op.Label, module.new_id())
        self._locals: list[list[int]] = []
        self._body: list[list[int]] = []

    def op(self, opcode: Op, result_type: int, *operands: Operand) -> int:
        rid = self.m.new_id()
        self._body.append(instruction(opcode, result_type, rid, *operands))
        return rid

    def emit(self, opcode: Op, *operands: Operand) -> None:
        self._body.append(instruction(opcode, *operands))

    def local(self, pointee: int, init: int | None = None) -> int:
        ptr = self.m.type_pointer(StorageClass.Function, pointee)
        rid = self.m.new_id()
        extra = () if init is None else (init,)
        self._locals.append(instruction(Op.Variable, ptr, rid, StorageClass.Function, *extra))
        return rid

    def label(self, label_id: int) -> None:
        self._body.append(instruction(Op.Label, label_id))

    def if_(self, cond: int, then: Callable[[], None],
            otherwise: Callable[[], None] | None = None) -> None:
        """A structured selection: `then()` runs where cond holds, `otherwise()` elsewhere."""
        then_l, merge_l = self.m.new_id(), self.m.new_id()
        else_l = self.m.new_id() if otherwise else merge_l
        self.emit(Op.SelectionMerge, merge_l, 0)
        self.emit(Op.BranchConditional, cond, then_l, else_l)
        self.label(then_l)
        then()
        self.emit(Op.Branch, merge_l)
        if otherwise:
            self.label(else_l)
            otherwise()
            self.emit(Op.Branch, merge_l)
        self.label(merge_l)

    def while_(self, cond: Callable[[], int], body: Callable[[], None],
               step: Callable[[], None], control: int = 0) -> None:
        """A structured loop: header, condition block, body, continue block (`step`);
        `control`: the LoopMerge's LoopControl mask (a hint such as DontUnroll)."""
        header, check, body_l, cont, merge = (self.m.new_id() for _ in range(5))
        self.emit(Op.Branch, header)
        self.label(header)
        self.emit(Op.LoopMerge, merge, cont, control)
        self.emit(Op.Branch, check)
        self.label(check)
        self.emit(Op.BranchConditional, cond(), body_l, merge)
        self.label(body_l)
        body()
        self.emit(Op.Branch, cont)
        self.label(cont)
        step()
        self.emit(Op.Branch, header)
        self.label(merge)

    def finish(self, value: int | None = None) -> None:
        """Close the function with OpReturn (OpReturnValue `value` where given) and hand it
        to the module."""
        if value is None:
            self.emit(Op.Return)
        else:
            self.emit(Op.ReturnValue, value)
        words = self._head + self._first_label
        for inst in self._locals + self._body:
            words += inst
        words += instruction(Op.FunctionEnd)
        self.m.add_function(words)
