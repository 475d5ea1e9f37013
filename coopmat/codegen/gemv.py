"""The gemv kernel: a few rows of D against a column-major B, at memory bandwidth, without
cooperative matrices (GemvTraits; issue #16).

Decode-shaped products (M = 1..8 rows against a float16 weight) are bound by reading B
once. B is column-major (the linear layer's weight, stored N x K and used as x @ w.T), so
each of its columns is contiguous along K. Per workgroup (a strip of S * C columns from
n0 = WorkgroupId.x * S * C, rows m0 = WorkgroupId.y * R .. m0 + R - 1, batch
WorkgroupId.z):

    subgroup s owns columns n0 + s C .. n0 + s C + C - 1; lane l of it, per step of
    subgroup_size * U 16-byte units of K (8 elements each):
        for u < U: load unit (step + u * subgroup_size + l) of each of its C columns of B
                   and of each of the R rows of A                    (all loads first)
        for u < U, rows r, columns j: acc[r][j] += A[r] . B[j] over the unit's 8 elements
    remainder (K not a multiple of 8 * subgroup_size * U): one unit per lane at a time,
        units past K read unit 0 and count as zero (subgroup-uniform control flow)
    then per (r, j): the lane's 4-wide float32 sum, summed across the subgroup
        (OpGroupNonUniformFAdd, Reduce); lane (r C + j) % subgroup_size applies the
        epilogue to D[m0 + r, n0 + s C + j] where it lies inside M x N:
        act(alpha * acc + beta * C + bias) + residual, rounded once to D's type.

A subgroup thus reads subgroup_size * 16 contiguous bytes of each column per load, and
each lane keeps U * C 16-byte loads of B in flight. Columns past N and rows past M load a
clamped (valid) column or row, whose sums are never stored: no branches around the loads.
A (R rows, a few KiB) is read by every workgroup and stays in cache; it is not staged in
shared memory. No shared memory and no barriers at all.

Elements are converted to float32 as they are used (widen.py), so a bfloat16 kernel needs
no bfloat16 feature unless D holds one. A and B go through the same mapping, so a unit's
dot product pairs the right elements.

Preconditions (abi.gemv_violation; the policy checks them): K, lda, ldb and the batch
strides of A and B multiples of 8 elements (16-byte loads); A row-major and B
column-major (both contiguous along K; GemvTraits.check_tile).

A quantized B (GemvTraits.b_quant: GGUF q8_0 / q4_0 blocks) is gemv_quant.py's: this
kernel with a whole block of a column, instead of 16 bytes, per lane and load.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from coopmat.codegen import abi
from coopmat.codegen.epilogue import (
    Epilogue,
    Types,
    buffer_element_ops,
    epilogue_buffers,
)
from coopmat.codegen.plan import element_bytes
from coopmat.codegen.shader import Buffer, ShaderContext
from coopmat.codegen.spv import (
    BuiltIn,
    Capability,
    GroupOperation,
    Op,
    Scope,
)
from coopmat.codegen.traits import GEMV_VECTOR, GemvTraits, gemv_lane_elems
from coopmat.codegen.types import scalar_type, type_capabilities, type_extension
from coopmat.codegen.widen import UNIT_BYTES, UnitWidener
from coopmat.common.enums import ComponentType

Loaded = TypeVar("Loaded")  # what one load step gives the K loop's accumulation


class GemvEmitter:
    """The gemv kernel for a float B; gemv_quant.QuantGemvEmitter replaces the parts
    that read B (`_b_buffer`, `_b_setup`, `_b_column`, `_k_loop`) for a quantized one."""

    def __init__(self, t: GemvTraits) -> None:
        t.check_tile()
        self.t = t
        self.s = ShaderContext()
        self.lane_elems = gemv_lane_elems(t.b_quant)  # elements of K per lane and load

    # -- declarations -------------------------------------------------------------------
    def _declare(self) -> None:
        t, s = self.t, self.s
        mb = s.mb
        ext = type_extension(t.stored_type)
        if ext:
            mb.extension(ext)
        mb.capability(*sorted(required_capabilities(t)))
        self.widener = UnitWidener(s, t.a_type)
        self.f32, self.vec4, self.uvec4 = self.widener.f32, self.widener.vec4, self.widener.uvec4
        self.o_el = scalar_type(mb, t.stored_type)
        self.zero_unit = mb.const_null(self.uvec4)
        self.A = s.storage_buffer(abi.BINDING_A, self.uvec4, UNIT_BYTES, True, "A",
                                  restrict=True)
        self.B = self._b_buffer()
        ob = element_bytes(t.stored_type)
        self.D = s.storage_buffer(abi.BINDING_D, self.o_el, ob, False, "D")
        self.C = s.storage_buffer(abi.BINDING_C, self.o_el, ob, True, "C") if t.has_c else None
        self.bias, self.residual = epilogue_buffers(s, t.ops, self.o_el, ob)
        s.push_constants(abi.PUSH_FIELDS, [s.u32] * 11 + [self.f32, self.f32, s.u32])

    def _b_buffer(self) -> Buffer:
        return self.s.storage_buffer(abi.BINDING_B, self.uvec4, UNIT_BYTES, True, "B",
                                     restrict=True)

    def _b_setup(self, batch: int) -> None:
        """What B's columns are addressed from (before any column is)."""
        self.base_b = self.s.mul(batch, self.P["batch_stride_b"])

    def _b_column(self, col: int) -> int:
        """Where column `col` of B starts, in 16-byte units."""
        s = self.s
        return s.shr(s.add(self.base_b, s.mul(col, self.P["ldb"])),
                     s.c(GEMV_VECTOR.bit_length() - 1))

    # -- runtime values -------------------------------------------------------------------
    def _setup(self) -> None:
        s, t = self.s, self.t
        v3 = s.mb.type_vector(s.u32, 3)
        wg = s.builtin(BuiltIn.WorkgroupId, v3)
        self.sgid = s.builtin(BuiltIn.SubgroupId, s.u32)
        self.lane = s.builtin(BuiltIn.SubgroupLocalInvocationId, s.u32)
        wx, wy, batch = (s.f.op(Op.CompositeExtract, s.u32, wg, i) for i in range(3))
        P = self.P = {name: s.param(name) for name in abi.PUSH_FIELDS}
        self.m0 = s.mul(wy, s.c(t.rows))
        # Subgroup sgid takes columns group sgid / Q and K stretch sgid % Q (Q = k_splits).
        group, stretch = ((s.udiv(self.sgid, s.c(t.k_splits)), s.umod(self.sgid, s.c(t.k_splits)))
                          if t.k_splits > 1 else (self.sgid, None))
        self.col0 = s.add(s.mul(wx, s.c(t.tile.tile_n)), s.mul(group, s.c(t.cols)))
        # Which unit of a workgroup-wide stretch of K this lane loads.
        self.k_lane = self.lane if stretch is None else \
            s.add(s.mul(stretch, s.c(t.subgroup_size)), self.lane)
        self.base_c = s.mul(batch, P["batch_stride_c"])
        self.base_d = s.mul(batch, P["batch_stride_d"])
        shift = s.c(GEMV_VECTOR.bit_length() - 1)
        # K in lane loads: K % 8 == 0 (a precondition), a quantized B's K % 32 == 0.
        self.k_units = s.shr(P["K"], s.c(self.lane_elems.bit_length() - 1))
        last_row = s.f.op(Op.ISub, s.u32, P["M"], s.c(1))
        last_col = s.f.op(Op.ISub, s.u32, P["N"], s.c(1))
        base_a = s.mul(batch, P["batch_stride_a"])
        self._b_setup(batch)
        # Where each row of A (in 16-byte units) and column of B (`_b_column`) starts,
        # clamped inside the matrix: the sums of rows and columns past it are computed but
        # never stored.
        self.a_row = []
        for r in range(t.rows):
            row = s.add(self.m0, s.c(r))
            row = s.select(s.u32, s.lt(row, P["M"]), row, last_row)
            self.a_row.append(s.shr(s.add(base_a, s.mul(row, P["lda"])), shift))
        self.b_col = []
        for j in range(t.cols):
            col = s.add(self.col0, s.c(j))
            col = s.select(s.u32, s.lt(col, P["N"]), col, last_col)
            self.b_col.append(self._b_column(col))
        self.epilogue = Epilogue(s, float_result=True, acc_el=self.f32, acc_is_f32=True,
                                 alpha=P["alpha"], beta=P["beta"])
        self.element_ops = buffer_element_ops(
            s, t.ops, float_result=True, stored_el=self.o_el, bias=self.bias,
            residual=self.residual, base_d=self.base_d, ldd=P["ldd"])

    # -- arithmetic ------------------------------------------------------------------------
    def _widen(self, unit: int) -> tuple[int, int]:
        """A 16-byte unit (uvec4) as two float32 vec4s (widen.py)."""
        return self.widener.widen(unit)

    def _widened(self, half: int) -> tuple[int, ...]:
        """Which of a unit's 8 elements `_widen`'s vec4 number `half` holds, in order."""
        return self.widener.order(half)

    def _accumulate(self, accs: list[list[int]],
                    units: tuple[list[int], list[int]]) -> None:
        """accs[r][j] += the products of one unit of A's row r and B's column j."""
        f, v = self.s.f, self.vec4
        a_units, b_units = units
        a = [self._widen(x) for x in a_units]
        b = [self._widen(x) for x in b_units]
        for r in range(self.t.rows):
            for j in range(self.t.cols):
                acc = accs[r][j]
                for half in (0, 1):
                    acc = f.op(Op.FAdd, v, acc, f.op(Op.FMul, v, a[r][half], b[j][half]))
                accs[r][j] = acc

    def _load_accs(self) -> list[list[int]]:
        return [[self.s.f.op(Op.Load, self.vec4, var) for var in row] for row in self.acc_vars]

    def _store_accs(self, accs: list[list[int]]) -> None:
        for row_vars, row_vals in zip(self.acc_vars, accs, strict=True):
            for var, val in zip(row_vars, row_vals, strict=True):
                self.s.f.emit(Op.Store, var, val)

    def _units(self, unit: int, valid: int | None = None) -> tuple[list[int], list[int]]:
        """Unit `unit` of every row of A and column of B; where `valid` is false, unit 0
        is read and zeros returned."""
        s = self.s
        if valid is not None:
            unit = s.select(s.u32, valid, unit, s.c(0))
        b = [s.buffer_load(self.B, s.add(base, unit)) for base in self.b_col]
        a = [s.buffer_load(self.A, s.add(base, unit)) for base in self.a_row]
        if valid is not None:
            b = [s.select(self.uvec4, valid, x, self.zero_unit) for x in b]
            a = [s.select(self.uvec4, valid, x, self.zero_unit) for x in a]
        return a, b

    # -- the K loop ---------------------------------------------------------------------------
    def _k_loop(self) -> None:
        self._walk_k(self._units, self._accumulate)

    def _walk_k(self, load: Callable[[int, int | None], Loaded],
                accumulate: Callable[[list[list[int]], Loaded], None]) -> None:
        """The K loop over lane loads ("units": 16 bytes of a float B, a block of a
        quantized one): `load(unit, valid)` emits the loads of one unit for every row and
        column (zeros where `valid`, a bool id, is false), `accumulate(accs, loaded)` its
        products into the sums. With t.prefetch, step i + 1's loads are issued before step
        i's products (`_prefetched_steps`)."""
        s, f, t = self.s, self.s.f, self.t
        width = t.subgroup_size * t.k_splits  # units of K the workgroup's lanes load at once
        step = width * t.unroll  # units of K per step of the workgroup
        full = s.udiv(self.k_units, s.c(step))
        it_var = f.local(s.u32, s.c(0))

        def loads_at(k0: int, valid: int | None = None) -> list[Loaded]:
            return [load(s.add(k0, s.c(u * width)), valid) for u in range(t.unroll)]

        def accumulate_all(loads: list[Loaded]) -> None:
            accs = self._load_accs()
            for loaded in loads:
                accumulate(accs, loaded)
            self._store_accs(accs)

        if t.prefetch:
            body = self._prefetched_steps(loads_at, accumulate_all, it_var, full, step)
        else:
            def body() -> None:
                it = f.op(Op.Load, s.u32, it_var)
                accumulate_all(loads_at(s.add(s.mul(it, s.c(step)), self.k_lane)))

        f.while_(lambda: s.lt(f.op(Op.Load, s.u32, it_var), full), body,
                 lambda: f.emit(Op.Store, it_var, s.add(f.op(Op.Load, s.u32, it_var),
                                                        s.c(1))))
        # The remainder: fewer than `step` units, `width` at a time.
        k_var = f.local(s.u32)
        f.emit(Op.Store, k_var, s.mul(full, s.c(step)))

        def tail() -> None:
            unit = s.add(f.op(Op.Load, s.u32, k_var), self.k_lane)
            accumulate_all([load(unit, s.lt(unit, self.k_units))])

        f.while_(lambda: s.lt(f.op(Op.Load, s.u32, k_var), self.k_units), tail,
                 lambda: f.emit(Op.Store, k_var, s.add(f.op(Op.Load, s.u32, k_var),
                                                       s.c(width))))

    def _prefetched_steps(self, loads_at: Callable[..., list[Loaded]],
                          accumulate_all: Callable[[list[Loaded]], None], it_var: int,
                          full: int, step: int) -> Callable[[], None]:
        """Software pipelining of the full steps: step 0's loads before the loop (unit 0,
        zeros, where there is no full step), then in step i the loads of step i + 1 (of
        step i again in the last, whose values go unused: always in bounds, no branch)
        into Function variables, then step i's products from the values loaded a step
        earlier, so the loads stay in flight across the products (policy.gemv_tiles.prefetches
        says where that measured faster)."""
        s, f = self.s, self.s.f
        first = loads_at(self.k_lane, s.lt(s.c(0), full))
        flat = [x for loaded in first for x in self._flat(loaded)]
        carried = [f.local(ty) for ty, _ in flat]
        for var, (_, value) in zip(carried, flat, strict=True):
            f.emit(Op.Store, var, value)
        per = len(flat) // len(first)

        def body() -> None:
            it = f.op(Op.Load, s.u32, it_var)
            values = [f.op(Op.Load, ty, var) for var, (ty, _) in zip(carried, flat, strict=True)]
            current = [self._unflat(values[i:i + per]) for i in range(0, len(values), per)]
            after = s.add(it, s.c(1))
            nxt = s.select(s.u32, s.lt(after, full), after, it)
            ahead = [x for loaded in loads_at(s.add(s.mul(nxt, s.c(step)), self.k_lane))
                     for x in self._flat(loaded)]
            for var, (_, value) in zip(carried, ahead, strict=True):
                f.emit(Op.Store, var, value)
            accumulate_all(current)

        return body

    def _flat(self, loaded: Any) -> list[tuple[int, int]]:
        """One unit's loads as (type, value) pairs, to carry in variables; `_unflat`
        undoes it."""
        a, b = loaded
        return [(self.uvec4, x) for x in (*a, *b)]

    def _unflat(self, values: list[int]) -> Any:
        rows = self.t.rows
        return values[:rows], values[rows:]

    # -- reduction and epilogue -----------------------------------------------------------
    def _store(self, row: int, col: int, acc: int) -> None:
        """D[row, col] = act(alpha * acc + beta * C[row, col] + bias) + residual, rounded
        once to D's type (in bounds)."""
        s, P = self.s, self.P

        def load_c(out_type: int) -> int:
            assert self.C is not None
            return s.buffer_load(self.C, s.add(self.base_c, s.add(s.mul(row, P["ldc"]), col)))

        value = self.epilogue.element(Types(self.f32, self.o_el), acc,
                                      load_c if self.C is not None else None,
                                      self.element_ops, row, col)
        s.buffer_store(self.D, s.add(self.base_d, s.add(s.mul(row, P["ldd"]), col)), value)

    def _lane_sum(self, acc: int) -> int:
        """One lane's part of a result: the sum of its vec4 accumulator."""
        f = self.s.f
        parts = [f.op(Op.CompositeExtract, self.f32, acc, i) for i in range(4)]
        return f.op(Op.FAdd, self.f32, f.op(Op.FAdd, self.f32, parts[0], parts[1]),
                    f.op(Op.FAdd, self.f32, parts[2], parts[3]))

    def _reduce_and_store(self) -> None:
        s, f, t = self.s, self.s.f, self.t
        accs = self._load_accs()
        totals = [[f.op(Op.GroupNonUniformFAdd, self.f32, s.c(Scope.Subgroup),
                        GroupOperation.Reduce, self._lane_sum(accs[r][j]))
                   for j in range(t.cols)] for r in range(t.rows)]
        first = None
        if t.k_splits > 1:
            totals, first = self._add_stretches(totals)
        for r in range(t.rows):
            row = s.add(self.m0, s.c(r))
            for j in range(t.cols):
                col = s.add(self.col0, s.c(j))
                owner = (r * t.cols + j) % t.subgroup_size
                ok = s.and_(f.op(Op.IEqual, s.bool, self.lane, s.c(owner)),
                            s.and_(s.lt(row, self.P["M"]), s.lt(col, self.P["N"])))
                if first is not None:
                    ok = s.and_(ok, first)

                def store(row: int = row, col: int = col, total: int = totals[r][j]) -> None:
                    self._store(row, col, total)

                f.if_(ok, store)

    def _add_stretches(self, totals: list[list[int]]) -> tuple[list[list[int]], int]:
        """The sums of the Q subgroups sharing columns added in stretch order through
        shared memory (each subgroup's lane 0 writes its own; after a workgroup barrier
        every subgroup adds its group's, in uniform control flow): the added sums and
        whether this subgroup is its group's first, which alone stores them."""
        s, f, t = self.s, self.s.f, self.t
        q, subgroups = t.k_splits, t.tile.subgroups
        sums = s.shared_array(self.f32, t.rows * t.cols * subgroups, "stretch_sums")

        def write() -> None:
            for r in range(t.rows):
                for j in range(t.cols):
                    s.shared_store(sums, s.add(s.c((r * t.cols + j) * subgroups), self.sgid),
                                   totals[r][j])

        f.if_(f.op(Op.IEqual, s.bool, self.lane, s.c(0)), write)
        s.barrier(Scope.Workgroup)
        stretch = s.umod(self.sgid, s.c(q))
        group_first = f.op(Op.ISub, s.u32, self.sgid, stretch)
        added = []
        for r in range(t.rows):
            row = []
            for j in range(t.cols):
                at = s.add(s.c((r * t.cols + j) * subgroups), group_first)
                total = s.shared_load(sums, at)
                for k in range(1, q):
                    total = f.op(Op.FAdd, self.f32, total,
                                 s.shared_load(sums, s.add(at, s.c(k))))
                row.append(total)
            added.append(row)
        return added, f.op(Op.IEqual, s.bool, stretch, s.c(0))

    # -- the module ---------------------------------------------------------------------
    def build(self) -> bytes:
        self._declare()
        self._setup()
        s, t = self.s, self.t
        zero = s.mb.const_null(self.vec4)
        self.acc_vars = [[s.f.local(self.vec4, zero) for _ in range(t.cols)]
                         for _ in range(t.rows)]
        self._k_loop()
        self._reduce_and_store()
        return s.compute_module(t.invocations)


def required_capabilities(t: GemvTraits) -> set[Capability]:
    caps = {Capability.Shader, Capability.VulkanMemoryModel, Capability.GroupNonUniform,
            Capability.GroupNonUniformArithmetic}
    # float16 A and B converted in registers; a quantized B's float16 scales.
    if t.a_type == ComponentType.FLOAT16 or t.b_quant is not None:
        caps.add(Capability.Float16)
    caps.update(type_capabilities(t.stored_type, in_storage_buffer=True))
    return caps
