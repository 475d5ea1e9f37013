"""The intel kernel family: an OpenCL kernel (SPIR-V for the OpenCL environment) whose
inner step is SPV_INTEL_subgroup_matrix_multiply_accumulate's
OpSubgroupMatrixMultiplyAccumulateINTEL, the instruction Intel's compute runtime lowers to
DPAS.

The module is a Kernel: capabilities Addresses, Kernel, Int64, Vector16 (B is an
8-vector), Int8 or Int16 for the elements it loads, SubgroupDispatch for the required
sub-group size (ExecutionMode SubgroupSize) and the extension's capability; Physical64
addressing and the OpenCL memory model; SPIR-V 1.2, what the OpenCL 2.2 environment reads.
Its arguments are global pointers to A, B, (C), D and the sizes (IntelKernel lists them).

Each sub-group computes acc_rows x acc_cols results of m x N (intel_traits.IntelTraits).
Per K step, every invocation loads its part of A and of B from global memory, element by
element, at indices clamped into the matrix with OpenCL.std u_min and replaced by zero
past its edges, and packs them as the extension asks: A's columns in the low bits first,
B's rows in 32-bit words (VNNI) for 8- and 16-bit elements. 16-bit floats are moved as
their bits, so the module declares no half type. D is stored per invocation, one column,
m rows, each checked against M and N. Variables naming each packed component (a0_1: row
block 0, component 1; b1_0) are for reading the disassembly.
"""

from __future__ import annotations

from dataclasses import dataclass

from coopmat.codegen.builder import FunctionBuilder, ModuleBuilder
from coopmat.codegen.intel_traits import IntelTraits
from coopmat.codegen.spv import (
    AddressingModel,
    BuiltIn,
    Capability,
    Decoration,
    ExecutionMode,
    ExecutionModel,
    MemoryModel,
    Op,
    OpenCLstd,
    StorageClass,
)

EXTENSION = "SPV_INTEL_subgroup_matrix_multiply_accumulate"
SPIRV_VERSION = (1, 2)  # the newest the OpenCL 2.2 environment accepts


@dataclass(frozen=True)
class _Arg:
    name: str
    id: int


class IntelEmitter:
    def __init__(self, traits: IntelTraits) -> None:
        traits.check()
        self.t = traits
        ty = traits.type
        mb = self.mb = ModuleBuilder(SPIRV_VERSION)
        mb.addressing = AddressingModel.Physical64
        mb.memory_model = MemoryModel.OpenCL
        mb.capability(Capability.Addresses, Capability.Kernel, Capability.Int64,
                      Capability.Vector16, Capability.SubgroupDispatch,
                      Capability.SubgroupMatrixMultiplyAccumulateINTEL)
        mb.extension(EXTENSION)
        self.ocl = mb.ext_inst_import("OpenCL.std")
        # The OpenCL environment asks every integer type to be declared without sign.
        self.bool = mb.type_bool()
        self.u32 = mb.type_int(32, False)
        self.u64 = mb.type_int(64, False)
        self.f32 = mb.type_float(32)
        self.void = mb.type_void()
        if ty.bits == 8:
            mb.capability(Capability.Int8)
        if ty.bits == 16 or traits.a_packing.component_bits == 16:
            mb.capability(Capability.Int16)
        # A's and B's elements in memory: their bits, or float32 for tf32.
        self.elem = self.f32 if ty.bits == 32 else mb.type_int(ty.bits, False)
        pack = traits.a_packing
        self.a_comp = self.f32 if ty.bits == 32 else mb.type_int(pack.component_bits, False)
        self.a_type = self._vector(self.a_comp, pack.components)
        self.b_comp = self.f32 if ty.bits == 32 else self.u32
        self.b_type = self._vector(self.b_comp, traits.b_components)
        self.acc_comp = self.f32 if ty.is_float else self.u32
        self.acc_type = self._vector(self.acc_comp, traits.m)
        self.f: FunctionBuilder | None = None

    def _vector(self, component: int, count: int) -> int:
        """A scalar where one component (the instruction's M of 1), else a vector."""
        return component if count == 1 else self.mb.type_vector(component, count)

    # -- arithmetic on 32-bit unsigned indices ---------------------------------------------
    @property
    def fn(self) -> FunctionBuilder:
        assert self.f is not None
        return self.f

    def c(self, value: int) -> int:
        return self.mb.const_u32(value)

    def add(self, a: int, b: int) -> int:
        return self.fn.op(Op.IAdd, self.u32, a, b)

    def mul(self, a: int, b: int) -> int:
        return self.fn.op(Op.IMul, self.u32, a, b)

    def lt(self, a: int, b: int) -> int:
        return self.fn.op(Op.ULessThan, self.bool, a, b)

    def both(self, a: int, b: int) -> int:
        return self.fn.op(Op.LogicalAnd, self.bool, a, b)

    def umin(self, a: int, b: int) -> int:
        return self.fn.op(Op.ExtInst, self.u32, self.ocl, OpenCLstd.u_min, a, b)

    def clamp(self, index: int, bound_minus_one: int) -> int:
        return self.umin(index, bound_minus_one)

    def element_pointer(self, base: int, pointee: int, index: int) -> int:
        ptr = self.mb.type_pointer(StorageClass.CrossWorkgroup, pointee)
        wide = self.fn.op(Op.UConvert, self.u64, index)
        return self.fn.op(Op.PtrAccessChain, ptr, base, wide)

    def load(self, base: int, pointee: int, index: int) -> int:
        return self.fn.op(Op.Load, pointee, self.element_pointer(base, pointee, index))

    def builtin(self, which: BuiltIn, type_id: int) -> int:
        var = self.mb.variable(type_id, StorageClass.Input, which.name)
        self.mb.decorate(var, Decoration.BuiltIn, which)
        return self.fn.op(Op.Load, type_id, var)

    # -- the kernel ---------------------------------------------------------------------
    def build(self) -> bytes:
        t, mb = self.t, self.mb
        ptr = {e: mb.type_pointer(StorageClass.CrossWorkgroup, e)
               for e in (self.elem, self.acc_comp)}
        args = [("A", ptr[self.elem]), ("B", ptr[self.elem])]
        args += [("C", ptr[self.acc_comp])] if t.has_c else []
        args += [("D", ptr[self.acc_comp])]
        args += [(n, self.u32) for n in ("M", "N", "K", "lda", "ldb")]
        args += [("ldc", self.u32)] if t.has_c else []
        args += [("ldd", self.u32)]
        fn_type = mb.type_function(self.void, *(a[1] for a in args))
        self.f = mb.function(self.void, fn_type, [a[1] for a in args])
        arg = {name: pid for (name, _), pid in zip(args, self.f.params, strict=True)}
        for name, pid in arg.items():
            mb.name(pid, name)
        self._body(arg)
        self.fn.finish()
        mb.entry_point(ExecutionModel.Kernel, self.fn.id, t.entry_point)
        mb.execution_mode(self.fn.id, ExecutionMode.LocalSize, t.invocations, 1, 1)
        mb.execution_mode(self.fn.id, ExecutionMode.SubgroupSize, t.subgroup_size)
        return mb.assemble()

    def _body(self, arg: dict[str, int]) -> None:
        t, mb, f = self.t, self.mb, self.fn
        v3 = mb.type_vector(self.u64, 3)
        group = self.builtin(BuiltIn.WorkgroupId, v3)
        gx = f.op(Op.UConvert, self.u32, f.op(Op.CompositeExtract, self.u64, group, 0))
        gy = f.op(Op.UConvert, self.u32, f.op(Op.CompositeExtract, self.u64, group, 1))
        sub = self.builtin(BuiltIn.SubgroupId, self.u32)
        lane = self.builtin(BuiltIn.SubgroupLocalInvocationId, self.u32)
        sub_m = f.op(Op.UDiv, self.u32, sub, self.c(t.subgroups_n))
        sub_n = f.op(Op.UMod, self.u32, sub, self.c(t.subgroups_n))
        row0 = self.add(self.mul(gy, self.c(t.tile_m)), self.mul(sub_m, self.c(t.m * t.acc_rows)))
        col0 = self.add(self.mul(gx, self.c(t.tile_n)),
                        self.mul(sub_n, self.c(t.subgroup_size * t.acc_cols)))
        size = {n: arg[n] for n in ("M", "N", "K")}
        last = {n: f.op(Op.ISub, self.u32, v, self.c(1)) for n, v in size.items()}
        # This invocation's column of D in each accumulator column.
        cols = [self.add(col0, self.add(self.c(j * t.subgroup_size), lane))
                for j in range(t.acc_cols)]
        rows = [self.add(row0, self.c(i * t.m)) for i in range(t.acc_rows)]

        accs = [[f.local(self.acc_type) for _ in cols] for _ in rows]
        for i, r in enumerate(rows):
            for j, col in enumerate(cols):
                init = self._load_c(arg, r, col, size, last) if t.has_c else \
                    mb.const_null(self.acc_type)
                f.emit(Op.Store, accs[i][j], init)

        k0 = f.local(self.u32, self.c(0))

        def body() -> None:
            k = f.op(Op.Load, self.u32, k0)
            a = [self._load_a(arg, i, r, k, lane, size, last) for i, r in enumerate(rows)]
            b = [self._load_b(arg, j, col, k, size, last) for j, col in enumerate(cols)]
            k_dim = self.c(t.k)
            for i in range(len(rows)):
                for j in range(len(cols)):
                    acc = f.op(Op.Load, self.acc_type, accs[i][j])
                    acc = f.op(Op.SubgroupMatrixMultiplyAccumulateINTEL, self.acc_type, k_dim,
                               a[i], b[j], acc, t.type.operands)
                    f.emit(Op.Store, accs[i][j], acc)

        f.while_(lambda: self.lt(f.op(Op.Load, self.u32, k0), size["K"]), body,
                 lambda: f.emit(Op.Store, k0, self.add(f.op(Op.Load, self.u32, k0),
                                                       self.c(t.k))))
        for i, r in enumerate(rows):
            for j, col in enumerate(cols):
                self._store_d(arg, f.op(Op.Load, self.acc_type, accs[i][j]), r, col, size)

    # -- operands -----------------------------------------------------------------------
    def _checked(self, base: int, pointee: int, zero: int, row: int, col: int, ld: int,
                 rows: tuple[int, int], cols: tuple[int, int]) -> int:
        """Element (row, col) of a row-major matrix, or zero outside it: the index is
        clamped into the matrix (rows/cols: its size and size - 1), so the load itself
        always stays inside the buffer."""
        f = self.fn
        inside = self.both(self.lt(row, rows[0]), self.lt(col, cols[0]))
        index = self.add(self.mul(self.clamp(row, rows[1]), ld), self.clamp(col, cols[1]))
        value = self.load(base, pointee, index)
        return f.op(Op.Select, pointee, inside, value, zero)

    def _pack(self, parts: list[int], word: int, bits: int, name: str) -> int:
        """parts[0] in the low bits, each next one `bits` higher."""
        f = self.fn
        out = None
        for q, part in enumerate(parts):
            wide = part if word == self.elem else f.op(Op.UConvert, word, part)
            if q:
                wide = f.op(Op.ShiftLeftLogical, word, wide, self.c(q * bits))
            out = wide if out is None else f.op(Op.BitwiseOr, word, out, wide)
        assert out is not None
        self.mb.name(out, name)
        return out

    def _compose(self, type_id: int, parts: list[int]) -> int:
        return parts[0] if len(parts) == 1 else self.fn.op(Op.CompositeConstruct, type_id,
                                                            *parts)

    def _zero(self) -> int:
        return self.mb.constant(self.elem, 0)

    def _load_a(self, arg: dict[str, int], i: int, row0: int, k0: int, lane: int,
                size: dict[str, int], last: dict[str, int]) -> int:
        """This invocation's part of A for row block i at K step k0 (the extension's
        "Mapping Matrix Data to Invocations")."""
        t, f = self.t, self.fn
        pack, bits = t.a_packing, t.type.bits
        m_rows, k_cols = (size["M"], last["M"]), (size["K"], last["K"])
        comps = []
        if pack.spread == 1:
            # N <= K: columns lane * c .. lane * c + c - 1, low bits first.
            first = self.add(k0, self.mul(lane, self.c(pack.columns)))
            cols = [self.add(first, self.c(q)) for q in range(pack.columns)]
            for r in range(t.m):
                row = self.add(row0, self.c(r))
                parts = [self._checked(arg["A"], self.elem, self._zero(), row, col, arg["lda"],
                                       m_rows, k_cols) for col in cols]
                comps.append(self._pack(parts, self.a_comp, bits, f"a{i}_{r}"))
        else:
            # N > K: column lane % K; invocations lane // K pass rows lane // K, + spread ..
            k = self.c(t.k)
            col = self.add(k0, f.op(Op.UMod, self.u32, lane, k))
            first_row = self.add(row0, f.op(Op.UDiv, self.u32, lane, k))
            for c in range(pack.components):
                row = self.add(first_row, self.c(c * pack.spread))
                value = self._checked(arg["A"], self.elem, self._zero(), row, col, arg["lda"],
                                      m_rows, k_cols)
                self.mb.name(value, f"a{i}_{c}")
                comps.append(value)
        return self._compose(self.a_type, comps)

    def _load_b(self, arg: dict[str, int], j: int, col: int, k0: int,
                size: dict[str, int], last: dict[str, int]) -> int:
        """This invocation's column of B at K step k0: K rows, packed into 32-bit words
        (lower rows in lower bits) for 8- and 16-bit elements."""
        t = self.t
        per = t.b_rows_per_component
        k_rows, n_cols = (size["K"], last["K"]), (size["N"], last["N"])
        comps = []
        for c in range(t.b_components):
            parts = [self._checked(arg["B"], self.elem, self._zero(),
                                   self.add(k0, self.c(c * per + q)), col, arg["ldb"],
                                   k_rows, n_cols) for q in range(per)]
            comps.append(self._pack(parts, self.b_comp, t.type.bits, f"b{j}_{c}"))
        return self._compose(self.b_type, comps)

    def _load_c(self, arg: dict[str, int], row0: int, col: int, size: dict[str, int],
                last: dict[str, int]) -> int:
        t = self.t
        zero = self.mb.constant(self.acc_comp, 0)
        comps = [self._checked(arg["C"], self.acc_comp, zero, self.add(row0, self.c(r)), col,
                               arg["ldc"], (size["M"], last["M"]), (size["N"], last["N"]))
                 for r in range(t.m)]
        return self._compose(self.acc_type, comps)

    def _store_d(self, arg: dict[str, int], acc: int, row0: int, col: int,
                 size: dict[str, int]) -> None:
        t, f = self.t, self.fn
        col_ok = self.lt(col, size["N"])
        for r in range(t.m):
            row = self.add(row0, self.c(r))
            value = acc if t.m == 1 else f.op(Op.CompositeExtract, self.acc_comp, acc, r)

            def store(row: int = row, value: int = value) -> None:
                index = self.add(self.mul(row, arg["ldd"]), col)
                f.emit(Op.Store, self.element_pointer(arg["D"], self.acc_comp, index), value)

            f.if_(self.both(self.lt(row, size["M"]), col_ok), store)


def emit_intel_gemm(traits: IntelTraits) -> bytes:
    """The SPIR-V module of an intel-family kernel."""
    return IntelEmitter(traits).build()
