"""A reference interpreter for the nv2 family's SPIR-V modules, written from the specs.

No CPU driver runs workgroup-scope matrices with tensor addressing, so this executes a
generated module the way SPV_NV_cooperative_matrix2 / SPV_NV_tensor_addressing define it
(the addressing pseudo-code of "Tensor Layout and View": matrixCoordToTensorElement[WithView],
clamp mode Constant, discarded out-of-bounds stores), one workgroup at a time, with numpy
for the matrices. It understands only the instructions the nv2 generator emits and raises
on anything else, so it checks the emitted code, not a re-description of it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coopmat.codegen.spv import (
    Decoration,
    GLSLstd450,
    Op,
    StorageClass,
    TensorAddressingOperands,
)

try:
    import ml_dtypes

    BF16: Any = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    BF16 = None

MASK = 0xFFFFFFFF


@dataclass
class Layout:
    clamp_mode: int
    dim: int
    dims: list[int] = field(default_factory=list)
    strides: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    spans: list[int] = field(default_factory=list)
    clamp_value: int = 0

    def copy(self) -> Layout:
        return Layout(self.clamp_mode, self.dim, list(self.dims), list(self.strides),
                      list(self.offsets), list(self.spans), self.clamp_value)


@dataclass(frozen=True)
class View:
    dim: int
    has_dimensions: bool
    permutation: tuple[int, ...]


def _decode(spirv: bytes) -> list[tuple[int, list[int]]]:
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    out, i = [], 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        out.append((op, list(words[i + 1:i + count])))
        i += count
    return out


class Nv2Emulator:
    def __init__(self, spirv: bytes) -> None:
        self.types: dict[int, tuple[Any, ...]] = {}
        self.consts: dict[int, Any] = {}
        self.globals: dict[int, tuple[int, int]] = {}  # var -> (storage class, pointee)
        self.bindings: dict[int, int] = {}
        self.builtins: dict[int, int] = {}
        self.body: list[tuple[int, list[int]]] = []
        self.entry = 0
        in_fn = False
        for op, w in _decode(spirv):
            if op == Op.Function:
                in_fn = True
            if in_fn:
                self.body.append((op, w))
                continue
            if op == Op.EntryPoint:
                self.entry = w[1]
            self._declare(op, w)
        self.labels = {w[0]: i for i, (op, w) in enumerate(self.body) if op == Op.Label}
        # Each function's first instruction and parameters (the per-element function of
        # the fused epilogue is called by OpCooperativeMatrixPerElementOpNV).
        self.functions: dict[int, tuple[int, list[int]]] = {}
        for i, (op, w) in enumerate(self.body):
            if op == Op.Function:
                fid = w[1]
                self.functions[fid] = (i, [])
            elif op == Op.FunctionParameter:
                self.functions[fid][1].append(w[1])
        self.loads = {0: 0, 1: 0}  # tensor loads run, by clamp mode (Undefined, Constant)

    # -- module-level declarations ------------------------------------------------------
    def _declare(self, op: int, w: list[int]) -> None:
        t = self.types
        if op == Op.TypeInt:
            t[w[0]] = ("int", w[1], bool(w[2]))
        elif op == Op.TypeFloat:
            t[w[0]] = ("float", w[1], w[2] if len(w) > 2 else None)
        elif op == Op.TypeBool:
            t[w[0]] = ("bool",)
        elif op == Op.TypeVector:
            t[w[0]] = ("vec", w[1], w[2])
        elif op == Op.TypeCooperativeMatrixKHR:
            scope, rows, cols, use = (self.consts[x] for x in w[2:6])
            t[w[0]] = ("coopmat", w[1], scope, rows, cols, use)
        elif op == Op.TypeTensorLayoutNV:
            t[w[0]] = ("layout", self.consts[w[1]], self.consts[w[2]])
        elif op == Op.TypeTensorViewNV:
            t[w[0]] = ("view", self.consts[w[1]], self.consts[w[2]],
                       tuple(self.consts[x] for x in w[3:]))
        elif op in (Op.TypeStruct, Op.TypeRuntimeArray, Op.TypePointer, Op.TypeVoid,
                    Op.TypeFunction, Op.TypeArray):
            t[w[0]] = ("other", op, *w[1:])
        elif op == Op.Constant:
            self.consts[w[1]] = self._scalar_from_words(w[0], w[2:])
        elif op in (Op.ConstantTrue, Op.ConstantFalse):
            self.consts[w[1]] = op == Op.ConstantTrue
        elif op == Op.ConstantNull:
            self.consts[w[1]] = 0
        elif op == Op.ConstantComposite:
            kind = t[w[0]]
            assert kind[0] == "coopmat" and len(w) == 3, kind
            self.consts[w[1]] = self._splat(w[0], self.consts[w[2]])
        elif op == Op.Variable:
            ptr = t[w[0]]
            self.globals[w[1]] = (ptr[2], ptr[3])
        elif op == Op.Decorate:
            if w[1] == Decoration.Binding:
                self.bindings[w[0]] = w[2]
            elif w[1] == Decoration.BuiltIn:
                self.builtins[w[0]] = w[2]
        elif op in (Op.Capability, Op.Extension, Op.ExtInstImport, Op.MemoryModel,
                    Op.EntryPoint,
                    Op.ExecutionMode, Op.Name, Op.MemberName, Op.MemberDecorate):
            pass
        else:
            raise NotImplementedError(f"module-level opcode {op}")

    def _scalar_from_words(self, type_id: int, words: list[int]) -> Any:
        kind = self.types[type_id]
        if kind[0] == "int":
            v = words[0]
            return v - (1 << 32) if kind[2] and v >> 31 else v
        if kind[0] == "float" and kind[1] == 32:
            return float(np.frombuffer(struct.pack("<I", words[0]), np.float32)[0])
        if kind[0] == "float":
            dt = BF16 if kind[2] is not None else np.float16
            return float(np.frombuffer(struct.pack("<H", words[0] & 0xFFFF), dt)[0])
        raise NotImplementedError(kind)

    def dtype(self, type_id: int) -> np.dtype:
        kind = self.types[type_id]
        if kind[0] == "float":
            if kind[2] is not None:
                return BF16
            return np.dtype(np.float16 if kind[1] == 16 else np.float32)
        if kind[0] == "int":
            return np.dtype(f"{'i' if kind[2] else 'u'}{kind[1] // 8}")
        raise NotImplementedError(kind)

    def _splat(self, mat_type: int, value: Any) -> np.ndarray:
        _, comp, _, rows, cols, _ = self.types[mat_type]
        return np.full((rows, cols), value, dtype=self.dtype(comp))

    # -- tensor addressing (SPV_NV_cooperative_matrix2, "Tensor Layout and View") --------
    @staticmethod
    def _element_index(layout: Layout, view: View | None, rows: int,
                       cols: int) -> tuple[np.ndarray, np.ndarray]:
        """(tensor element index, in-bounds mask) for every (row, col) of the matrix."""
        r, c = np.meshgrid(np.arange(rows, dtype=np.int64), np.arange(cols, dtype=np.int64),
                           indexing="ij")
        index = r * cols + c  # matrixCoordToLinear (no clip: the default clip is everything)
        if view is not None:
            assert not view.has_dimensions
            dims = layout.spans
            coord = [None] * view.dim
            for d in range(view.dim - 1, -1, -1):  # linearToViewCoord
                i = view.permutation[d]
                coord[i] = index % dims[i]
                index = index // dims[i]
            stride = [0] * view.dim  # viewCoordToLinear with strides matching the span
            stride[-1] = 1
            for d in range(view.dim - 2, -1, -1):
                stride[d] = stride[d + 1] * layout.spans[d + 1]
            index = sum(coord[d] * stride[d] for d in range(view.dim))
        span_coord = [None] * layout.dim
        for d in range(layout.dim - 1, -1, -1):  # linearToSpanCoord
            span_coord[d] = index % layout.spans[d]
            index = index // layout.spans[d]
        inside = np.ones((rows, cols), bool)
        linear = np.zeros((rows, cols), np.int64)
        for d in range(layout.dim):  # spanCoordToTensorCoord, tensorCoordToLinear
            t = span_coord[d] + layout.offsets[d]
            t = ((t + 2 ** 31) % 2 ** 32) - 2 ** 31  # int32 coordinates
            inside &= (t >= 0) & (t < layout.dims[d])
            linear += np.where(inside, t, 0) * layout.strides[d]  # blockSize 1
        return linear, inside

    def _tensor_operands(self, w: list[int]) -> View | None:
        assert w[0] == 0, "memory operands"
        if w[1] == TensorAddressingOperands.TensorView:
            return self.values[w[2]]
        assert w[1] == 0, f"tensor addressing operands {w[1]}"
        return None

    # -- execution ------------------------------------------------------------------------
    def run(self, buffers: dict[int, np.ndarray], push: bytes,
            workgroup: tuple[int, int, int]) -> None:
        """Execute main() for one workgroup; buffers are numpy arrays by binding."""
        self.values: dict[int, Any] = dict(self.consts)
        memory: dict[int, Any] = {}
        pc = self.functions[self.entry][0]
        steps = 0
        while True:
            steps += 1
            assert steps < 10_000_000
            op, w = self.body[pc]
            pc += 1
            if op in (Op.Function, Op.Label, Op.LoopMerge, Op.SelectionMerge):
                continue
            if op == Op.Return:
                return
            if op == Op.Branch:
                pc = self.labels[w[0]]
                continue
            if op == Op.BranchConditional:
                pc = self.labels[w[1] if self.values[w[0]] else w[2]]
                continue
            if op == Op.Variable:
                memory[w[1]] = self.values[w[3]] if len(w) > 3 else None
                continue
            if op == Op.Store:
                memory[w[0]] = self.values[w[1]]
                continue
            if op == Op.CooperativeMatrixStoreTensorNV:
                self._store_tensor(buffers, w)
                continue
            self.values[w[1]] = self._compute(op, w, memory, buffers, push, workgroup)

    def _compute(self, op: int, w: list[int], memory: dict[int, Any],
                 buffers: dict[int, np.ndarray], push: bytes,
                 workgroup: tuple[int, int, int]) -> Any:
        v, rt = self.values, w[0]
        a = w[2:]
        if op == Op.Load:
            ptr = a[0]
            if ptr in memory:
                return memory[ptr]
            if ptr in self.builtins:
                return workgroup
            if isinstance(v.get(ptr), tuple) and v[ptr][0] == "buffer":
                _, binding, index = v[ptr]  # a scalar load, or one per element of a tile
                return buffers[binding][index]  # IndexError: read outside the buffer
            if isinstance(v.get(ptr), tuple) and v[ptr][0] == "push":
                member = v[ptr][1]
                raw = push[4 * member:4 * member + 4]
                kind = self.types[rt]
                if kind[0] == "float":
                    return struct.unpack("<f", raw)[0]
                return struct.unpack("<i" if kind[2] else "<I", raw)[0]
            raise NotImplementedError(f"load from {ptr}")
        if op == Op.AccessChain:
            base = a[0]
            sc, _ = self.globals[base]
            if sc == StorageClass.PushConstant:
                return ("push", v[a[1]])
            assert sc == StorageClass.StorageBuffer and v[a[1]] == 0
            return ("buffer", self.bindings[base], v[a[2]])
        if op == Op.CompositeExtract:
            return v[a[0]][a[1]]
        if op in (Op.IAdd, Op.IMul, Op.ISub):
            x, y = v[a[0]], v[a[1]]
            f = {Op.IAdd: np.add, Op.IMul: np.multiply, Op.ISub: np.subtract}[op]
            if self.types[rt][0] == "coopmat":
                return f(x.astype(np.int64), y.astype(np.int64)).astype(x.dtype)
            if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
                res = f(np.asarray(x, np.int64), np.asarray(y, np.int64)) & MASK
                return np.where(res >> 31, res - (1 << 32), res) if self.types[rt][2] else res
            res = {Op.IAdd: x + y, Op.IMul: x * y, Op.ISub: x - y}[op] & MASK
            return res - (1 << 32) if self.types[rt][2] and res >> 31 else res
        if op == Op.IEqual:
            return v[a[0]] == v[a[1]]
        if op == Op.INotEqual:
            return v[a[0]] != v[a[1]]
        if op == Op.ULessThan:
            return (v[a[0]] & MASK) < (v[a[1]] & MASK)
        if op == Op.ULessThanEqual:
            return (v[a[0]] & MASK) <= (v[a[1]] & MASK)
        if op == Op.LogicalAnd:
            return np.logical_and(v[a[0]], v[a[1]])
        if op == Op.BitwiseAnd:
            return v[a[0]] & v[a[1]] & MASK
        if op in (Op.UDiv, Op.UMod):
            x, y = v[a[0]] & MASK, v[a[1]] & MASK
            return x // y if op == Op.UDiv else x % y
        if op == Op.Select:
            if isinstance(v[a[0]], np.ndarray):
                return np.where(v[a[0]], v[a[1]], v[a[2]])
            return v[a[1]] if v[a[0]] else v[a[2]]
        if op == Op.FConvert:
            if isinstance(v[a[0]], np.ndarray):
                return v[a[0]].astype(self._elem_dtype(rt))
            return float(np.array(v[a[0]], np.float32).astype(self.dtype(rt)))
        if op == Op.CompositeConstruct:
            return self._splat(rt, v[a[0]])
        if op in (Op.FAdd, Op.FMul, Op.FDiv):
            # Computed in float64 and rounded once: the correctly rounded result.
            dt = self._elem_dtype(rt)
            x, y = np.asarray(v[a[0]], np.float64), np.asarray(v[a[1]], np.float64)
            with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
                res = x + y if op == Op.FAdd else x * y if op == Op.FMul else x / y
            return res.astype(dt)
        if op == Op.FOrdLessThan:
            return np.asarray(v[a[0]]) < np.asarray(v[a[1]])
        if op == Op.ExtInst:
            inst, args = GLSLstd450(a[1]), [np.asarray(v[x], np.float64) for x in a[2:]]
            with np.errstate(over="ignore"):
                if inst == GLSLstd450.Exp2:
                    return np.exp2(args[0]).astype(self._elem_dtype(rt))
                if inst == GLSLstd450.FMin:
                    return np.minimum(args[0], args[1]).astype(self._elem_dtype(rt))
            raise NotImplementedError(f"GLSL.std.450 {inst.name}")
        if op == Op.CooperativeMatrixPerElementOpNV:
            return self._per_element(v[a[0]], a[1], [v[x] for x in a[2:]], buffers, push,
                                     workgroup)
        if op == Op.MatrixTimesScalar:
            dt = self.dtype(self.types[rt][1])
            return (v[a[0]].astype(np.float64) * float(v[a[1]])).astype(dt)
        if op == Op.CooperativeMatrixMulAddKHR:
            x, y, c = v[a[0]], v[a[1]], v[a[2]]
            dt = self.dtype(self.types[rt][1])
            if dt.kind == "f":
                prod = x.astype(np.float64) @ y.astype(np.float64) + c.astype(np.float64)
            else:
                prod = x.astype(np.int64) @ y.astype(np.int64) + c.astype(np.int64)
            return prod.astype(dt)
        if op == Op.CreateTensorLayoutNV:
            _, dim, clamp = self.types[rt]
            return Layout(clamp, dim, [0] * dim, [0] * dim, [0] * dim, [0] * dim, 0)
        if op == Op.TensorLayoutSetDimensionNV:
            lay = v[a[0]].copy()
            lay.dims = [v[x] for x in a[1:]]
            lay.spans = list(lay.dims)
            lay.offsets = [0] * lay.dim
            lay.strides = [1] * lay.dim
            for d in range(lay.dim - 2, -1, -1):
                lay.strides[d] = lay.strides[d + 1] * lay.dims[d + 1]
            return lay
        if op == Op.TensorLayoutSetStrideNV:
            lay = v[a[0]].copy()
            lay.strides = [v[x] for x in a[1:]]
            for d in range(lay.dim - 1):  # the spec's "must": outer strides cover the inner
                assert lay.strides[d] >= lay.strides[d + 1] * lay.dims[d + 1], lay
            return lay
        if op == Op.TensorLayoutSetClampValueNV:
            lay = v[a[0]].copy()
            lay.clamp_value = v[a[1]]
            return lay
        if op == Op.TensorLayoutSliceNV:
            lay = v[a[0]].copy()
            for d in range(lay.dim):
                lay.offsets[d] += v[a[1 + 2 * d]]
                lay.spans[d] = v[a[2 + 2 * d]]
            return lay
        if op == Op.CreateTensorViewNV:
            _, dim, has_dims, perm = self.types[rt]
            return View(dim, has_dims, perm)
        if op == Op.CooperativeMatrixLoadTensorNV:
            return self._load_tensor(rt, a, buffers)
        raise NotImplementedError(f"opcode {op}")

    def _elem_dtype(self, type_id: int) -> np.dtype:
        """The element dtype of a scalar type or of a cooperative matrix type."""
        kind = self.types[type_id]
        return self.dtype(kind[1] if kind[0] == "coopmat" else type_id)

    def _per_element(self, mat: np.ndarray, fid: int, extras: list[Any],
                     buffers: dict[int, np.ndarray], push: bytes,
                     workgroup: tuple[int, int, int]) -> np.ndarray:
        """OpCooperativeMatrixPerElementOpNV: the function called on every element, with
        its row and column in the matrix, the element and the extra operands. Run once on
        whole arrays of rows, columns and elements (the function is straight-line code:
        the generator emits no branches there), which is the same per element."""
        start, params = self.functions[fid]
        rows, cols = np.meshgrid(np.arange(mat.shape[0], dtype=np.int64),
                                 np.arange(mat.shape[1], dtype=np.int64), indexing="ij")
        for pid, value in zip(params, [rows, cols, mat, *extras], strict=True):
            self.values[pid] = value
        pc = start
        while True:
            op, w = self.body[pc]
            pc += 1
            if op in (Op.Function, Op.FunctionParameter, Op.Label):
                continue
            if op == Op.ReturnValue:
                return np.broadcast_to(self.values[w[0]], mat.shape).astype(mat.dtype)
            assert op not in (Op.Branch, Op.BranchConditional, Op.Return, Op.Store), \
                f"opcode {op} in a per-element function"
            self.values[w[1]] = self._compute(op, w, {}, buffers, push, workgroup)

    def _load_tensor(self, mat_type: int, a: list[int],
                     buffers: dict[int, np.ndarray]) -> np.ndarray:
        _, binding, base = self.values[a[0]]
        obj, layout = self.values[a[1]], self.values[a[2]]
        view = self._tensor_operands(a[3:])
        assert layout.clamp_mode in (0, 1), "the generator uses clamp modes Undefined, Constant"
        rows, cols = obj.shape
        index, inside = self._element_index(layout, view, rows, cols)
        self.loads[layout.clamp_mode] += 1
        # Undefined: the spec leaves coordinates outside the tensor undefined; the generator
        # must only use it where the whole slice lies inside.
        assert layout.clamp_mode or inside.all(), "unclamped load outside the tensor"
        # 16-byte aligned base (SPV_NV_cooperative_matrix2's Pointer requirement).
        assert base * obj.dtype.itemsize % 16 == 0, f"unaligned Pointer (element {base})"
        buf = buffers[binding]
        out = np.full((rows, cols), layout.clamp_value, dtype=obj.dtype)
        out[inside] = buf[base + index[inside]]  # IndexError: read outside the buffer
        return out

    def _store_tensor(self, buffers: dict[int, np.ndarray], w: list[int]) -> None:
        _, binding, base = self.values[w[0]]
        value, layout = self.values[w[1]], self.values[w[2]]
        view = self._tensor_operands(w[3:])
        rows, cols = value.shape
        index, inside = self._element_index(layout, view, rows, cols)
        buffers[binding][base + index[inside]] = value[inside]  # outside: discarded
