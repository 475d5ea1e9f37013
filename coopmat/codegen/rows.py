"""The few-rows GEMM kernel on VK_KHR_cooperative_matrix: stream B at memory bandwidth.

For decode shapes (M = 1..64 rows, B a K x N weight) the product is bound by reading B
once; the tiled kernel stages B through shared memory with a barrier per K step, which
leaves too few bytes in flight. Here B never touches shared memory. Per workgroup (a
column strip [n0, n0 + tile_n) of D and row block WorkgroupId.y, batch WorkgroupId.z):

    S subgroups split K: subgroup s takes k steps s, s + S, s + 2S, ...; its steps go in
    groups of U (`unroll`), and each group's B fragments (U x NF) are loaded straight from
    global memory with cooperative-matrix loads (either layout of B).
    A, small and read by every workgroup, is staged in shared memory kc elements of K at a
    time by the whole workgroup (zero outside M x K), in two stages, one barrier a chunk.

    prologue: A chunk 0 -> stage 0; B fragments of group 0 -> registers; barrier
    per whole chunk c (stage c & 1):
        load A chunk c + 1 into registers                  (consumed at the chunk's end)
        per group g: load the NEXT group's B fragments     (the one after the last group
                         of this chunk is the next chunk's first: loads cross the barrier)
                     load its A fragments from shared, multiply-accumulate
        registers -> A stage (c + 1) & 1; barrier
    tail (K not a multiple of kc): the remaining k steps one at a time, each guarded
    reduction: per fragment, the S partial sums through shared memory, then per element
        D = alpha * acc + beta * C in D's type, rows < M only   (`_epilogue_element`)

Why this shape (improvements on the brief it was built from): the B loads of the next
group are issued before the current group multiplies and are carried across the chunk
barrier, so a subgroup always has U x NF fragment loads in flight, including while it
waits at the barrier; A's global loads for the next chunk are issued first in a chunk and
stored to shared only at its end, so their latency hides behind the multiplies. The
reduction goes one fragment at a time so its scratch (S x m x n accumulators) stays small
next to the A stages. Rows past tile_m go to further row blocks (WorkgroupId.y), so any M
is correct, although each row block reads B again (the policy uses this for M <= 64).

Preconditions (abi.rows_violation; the policy checks them): N % tile_n == 0, K % k == 0,
B's leading dimension and batch stride aligned for cooperative-matrix loads; the aligned
variant also reads A 16 bytes at a time (row-major A, K and lda multiples of the vector).
"""

from __future__ import annotations

from coopmat.codegen import abi
from coopmat.codegen.epilogue import Epilogue, Types
from coopmat.codegen.plan import SHARED_PAD_BYTES, element_bytes
from coopmat.codegen.shader import ShaderContext
from coopmat.codegen.spv import (
    BuiltIn,
    Capability,
    CooperativeMatrixLayout,
    CooperativeMatrixUse,
    Op,
    Scope,
)
from coopmat.codegen.traits import Layout, RowsTraits
from coopmat.codegen.types import (
    RESULT_TYPES,
    scalar_type,
    signedness_operands,
    type_capabilities,
    type_extension,
)
from coopmat.common.enums import ComponentType


class RowsPlan:
    """The rows kernel's A staging geometry and shared-memory use (no code generation)."""

    def __init__(self, t: RowsTraits) -> None:
        t.check_tile()
        self.traits = t
        self.v = abi.rows_a_vector_elems(t)  # A elements per unit
        self.unit_bytes = self.v * element_bytes(t.a_type)
        self.units_per_row = t.kc // self.v
        self.stride_units = self.units_per_row + max(1, SHARED_PAD_BYTES // self.unit_bytes)
        self.stage_units = t.tile.tile_m * self.stride_units
        self.total_units = t.tile.tile_m * self.units_per_row  # one chunk of A
        if self.total_units % t.invocations:
            raise ValueError(f"the rows kernel's A chunk of {self.total_units} units "
                             f"({t.tile.tile_m} x {t.kc}) does not split over "
                             f"{t.invocations} invocations")
        self.units_per_invocation = self.total_units // t.invocations
        self.groups = t.kc // (t.k * t.splits * t.unroll)  # groups of U steps per chunk
        self.scratch_elems = t.splits * t.m * t.n

    @property
    def shared_bytes(self) -> int:
        t = self.traits
        return (2 * self.stage_units * self.unit_bytes
                + self.scratch_elems * element_bytes(t.result_type))


class RowsEmitter:
    def __init__(self, plan: RowsPlan) -> None:
        self.plan = plan
        self.t = plan.traits
        self.s = ShaderContext()

    # -- declarations -------------------------------------------------------------------
    def _declare(self) -> None:
        t, s, p = self.t, self.s, self.plan
        mb = s.mb
        if t.result_type not in RESULT_TYPES:
            raise ValueError(f"unsupported result type {t.result_type!r}")
        mb.extension("SPV_KHR_cooperative_matrix")
        for ext in dict.fromkeys(type_extension(ct) for ct in (t.a_type, t.b_type)):
            if ext:
                mb.extension(ext)
        mb.capability(*sorted(required_capabilities(t)))
        self.a_el = scalar_type(mb, t.a_type)
        self.b_el = scalar_type(mb, t.b_type)
        self.r_el = scalar_type(mb, t.result_type)
        self.o_el = scalar_type(mb, t.stored_type)
        sub = int(Scope.Subgroup)
        self.mat_a = mb.type_coopmat(self.a_el, sub, t.m, t.k, CooperativeMatrixUse.MatrixA)
        self.mat_b = mb.type_coopmat(self.b_el, sub, t.k, t.n, CooperativeMatrixUse.MatrixB)
        self.mat_acc = mb.type_coopmat(self.r_el, sub, t.m, t.n,
                                       CooperativeMatrixUse.MatrixAccumulator)
        self.float_result = t.result_type.is_float
        alpha_t = mb.type_float(32) if self.float_result else self.r_el
        # A moves as single elements or as 16-byte vectors of 32-bit words (aligned).
        self.a_unit = self.a_el if p.v == 1 else s.mb.type_vector(
            s.u32, p.unit_bytes // 4)
        self.A = s.storage_buffer(abi.BINDING_A, self.a_unit, p.unit_bytes, True, "A",
                                  restrict=True)
        self.B = s.storage_buffer(abi.BINDING_B, self.b_el, element_bytes(t.b_type), True,
                                  "B", restrict=True)
        ob = element_bytes(t.stored_type)
        self.D = s.storage_buffer(abi.BINDING_D, self.o_el, ob, False, "D")
        self.C = s.storage_buffer(abi.BINDING_C, self.o_el, ob, True, "C") if t.has_c else None
        self.a_shared = s.shared_array(self.a_unit, 2 * p.stage_units, "A_shared")
        self.scratch = s.shared_array(self.r_el, p.scratch_elems, "partials")
        s.push_constants(abi.PUSH_FIELDS, [s.u32] * 11 + [alpha_t, alpha_t, s.u32])

    # -- runtime values -------------------------------------------------------------------
    def _setup(self) -> None:
        s, t, p = self.s, self.t, self.plan
        v3 = s.mb.type_vector(s.u32, 3)
        wg = s.builtin(BuiltIn.WorkgroupId, v3)
        self.tid = s.builtin(BuiltIn.LocalInvocationIndex, s.u32)
        self.sgid = s.builtin(BuiltIn.SubgroupId, s.u32)
        wx, wy, batch = (s.f.op(Op.CompositeExtract, s.u32, wg, i) for i in range(3))
        P = self.P = {name: s.param(name) for name in abi.PUSH_FIELDS}
        self.m0 = s.mul(wy, s.c(t.tile.tile_m))
        self.n0 = s.mul(wx, s.c(t.tile.tile_n))
        self.base_a = s.mul(batch, P["batch_stride_a"])
        base_b = s.mul(batch, P["batch_stride_b"])
        self.base_c = s.mul(batch, P["batch_stride_c"])
        self.base_d = s.mul(batch, P["batch_stride_d"])
        self.k_steps = s.udiv(P["K"], s.c(t.k))  # K % k == 0 (a precondition)
        self.full_chunks = s.udiv(P["K"], s.c(t.kc))
        # Where fragment column j of B starts for k step 0: the part of its address that
        # does not move along K.
        self.b_col = []
        for j in range(t.nf):
            col = s.add(self.n0, s.c(j * t.n))
            if t.b_layout == Layout.ROW_MAJOR:
                self.b_col.append(s.add(base_b, col))
            else:
                self.b_col.append(s.add(base_b, s.mul(col, P["ldb"])))
        # This subgroup's k steps within a chunk start at s: its A fragments at s * k.
        self.a_sub_off = s.mul(self.sgid, s.c(t.k // p.v))
        self.epilogue = Epilogue(s, float_result=self.float_result, acc_el=self.r_el,
                                 acc_is_f32=t.result_type == ComponentType.FLOAT32,
                                 alpha=P["alpha"], beta=P["beta"])

    # -- B: cooperative-matrix loads straight from global memory --------------------------
    def _b_fragment(self, ks: int, j: int) -> int:
        """B's k x n fragment at k step `ks` (runtime) and fragment column j."""
        s, t = self.s, self.t
        k_off = s.mul(ks, s.c(t.k))
        if t.b_layout == Layout.ROW_MAJOR:
            index = s.add(s.mul(k_off, self.P["ldb"]), self.b_col[j])
        else:
            index = s.add(self.b_col[j], k_off)
        return s.coop_load_buffer(self.mat_b, self.B, index, t.b_layout.value, self.P["ldb"])

    def _b_group(self, ks0: int, clamp: bool) -> list[list[int]]:
        """The B fragments of one group: steps ks0 + S u (u < U), every column. `clamp`:
        steps past K load step 0 instead (a look-ahead whose values go unused)."""
        s, t = self.s, self.t
        out = []
        for u in range(t.unroll):
            ks = s.add(ks0, s.c(u * t.splits))
            if clamp:
                ks = s.select(s.u32, s.lt(ks, self.k_steps), ks, s.c(0))
            out.append([self._b_fragment(ks, j) for j in range(t.nf)])
        return out

    # -- A: global -> registers -> shared, and fragments from shared ----------------------
    def _a_unit_load(self, chunk: int, r: int) -> int:
        """This invocation's r-th unit of A's chunk `chunk` (runtime); zero outside M x K."""
        s, t, p, P = self.s, self.t, self.plan, self.P
        u = s.add(self.tid, s.c(r * t.invocations))
        k0 = s.mul(chunk, s.c(t.kc))
        row, kk = self._a_unit_coords(u)
        grow, gk = s.add(self.m0, row), s.add(k0, kk)
        if t.a_layout == Layout.ROW_MAJOR:
            index = s.add(s.mul(grow, P["lda"]), gk)
        else:
            index = s.add(s.mul(gk, P["lda"]), grow)
        index = s.add(self.base_a, index)
        if p.v > 1:  # K, lda and the batch stride are multiples of the vector
            index = s.shr(index, s.c(p.v.bit_length() - 1))
        inside = s.and_(s.lt(grow, P["M"]), s.lt(gk, P["K"]))
        value = s.buffer_load(self.A, s.select(s.u32, inside, index, s.c(0)))
        return s.select(self.a_unit, inside, value, s.mb.const_null(self.a_unit))

    def _a_unit_coords(self, u: int) -> tuple[int, int]:
        """(row, k offset) of unit u of a chunk: consecutive units run along A's
        contiguous dimension, so a subgroup's loads are coalesced."""
        s, t, p = self.s, self.t, self.plan
        if t.a_layout == Layout.ROW_MAJOR:
            row = s.udiv(u, s.c(p.units_per_row))
            return row, s.mul(s.umod(u, s.c(p.units_per_row)), s.c(p.v))
        return s.umod(u, s.c(t.tile.tile_m)), s.udiv(u, s.c(t.tile.tile_m))

    def _a_unit_store(self, stage: int, r: int, value: int) -> None:
        s, t, p = self.s, self.t, self.plan
        u = s.add(self.tid, s.c(r * t.invocations))
        row, kk = self._a_unit_coords(u)
        kunit = s.udiv(kk, s.c(p.v)) if p.v > 1 else kk
        index = s.add(s.mul(stage, s.c(p.stage_units)),
                      s.add(s.mul(row, s.c(p.stride_units)), kunit))
        s.shared_store(self.a_shared, index, value)

    def _a_fragment(self, stage_off: int, i: int, kunit: int) -> int:
        """A's m x k fragment of row fragment i at unit offset `kunit` (runtime) of the
        stage starting at `stage_off`; shared A is row-major whatever A's layout."""
        s, p = self.s, self.plan
        index = s.add(stage_off, s.add(s.c(i * self.t.m * p.stride_units), kunit))
        return s.coop_load_shared(self.mat_a, self.a_shared, index,
                                  CooperativeMatrixLayout.RowMajor, s.c(p.stride_units))

    # -- multiply ------------------------------------------------------------------------
    def _mma(self, accs: list[list[int]], a: list[int], b: list[int]) -> None:
        s, t = self.s, self.t
        flags = signedness_operands(t.a_type, t.b_type, t.c_type, t.result_type)
        extra = (flags,) if flags else ()
        for j in range(t.nf):
            for i in range(t.row_frags):
                accs[i][j] = s.f.op(Op.CooperativeMatrixMulAddKHR, self.mat_acc, a[i], b[j],
                                    accs[i][j], *extra)

    def _load_accs(self) -> list[list[int]]:
        return [[self.s.f.op(Op.Load, self.mat_acc, v) for v in row] for row in self.acc_vars]

    def _store_accs(self, accs: list[list[int]]) -> None:
        for row_vars, row_vals in zip(self.acc_vars, accs, strict=True):
            for var, val in zip(row_vars, row_vals, strict=True):
                self.s.f.emit(Op.Store, var, val)

    def _k_loop(self) -> None:
        s, f, t, p = self.s, self.s.f, self.t, self.plan
        steps_per_chunk = t.kc // t.k
        group_steps = t.splits * t.unroll
        # prologue: A chunk 0 -> stage 0, group 0's B fragments -> registers.
        for r in range(p.units_per_invocation):
            self._a_unit_store(s.c(0), r, self._a_unit_load(s.c(0), r))
        b_vars = [[f.local(self.mat_b) for _ in range(t.nf)] for _ in range(t.unroll)]
        for row_vars, row_vals in zip(b_vars, self._b_group(self.sgid, clamp=True),
                                      strict=True):
            for var, val in zip(row_vars, row_vals, strict=True):
                f.emit(Op.Store, var, val)
        s.barrier(Scope.Workgroup)
        c_var = f.local(s.u32, s.c(0))

        def chunk() -> None:
            c = f.op(Op.Load, s.u32, c_var)
            phase = f.op(Op.BitwiseAnd, s.u32, c, s.c(1))
            # Past the last chunk every unit lies outside K and reads as zero: no branch.
            next_a = [self._a_unit_load(s.add(c, s.c(1)), r)
                      for r in range(p.units_per_invocation)]
            ks_base = s.add(s.mul(c, s.c(steps_per_chunk)), self.sgid)
            stage_off = s.mul(phase, s.c(p.stage_units))
            accs = self._load_accs()
            cur = [[f.op(Op.Load, self.mat_b, v) for v in row] for row in b_vars]
            for g in range(p.groups):
                # The next group's loads go first: they are in flight during this one's
                # multiplies (after the last group: the next chunk's first group).
                nxt = self._b_group(s.add(ks_base, s.c((g + 1) * group_steps)),
                                    clamp=g == p.groups - 1)
                for u in range(t.unroll):
                    local = (g * group_steps + u * t.splits) * t.k // p.v
                    kunit = s.add(self.a_sub_off, s.c(local))
                    a = [self._a_fragment(stage_off, i, kunit) for i in range(t.row_frags)]
                    self._mma(accs, a, cur[u])
                cur = nxt
            self._store_accs(accs)
            for row_vars, row_vals in zip(b_vars, cur, strict=True):
                for var, val in zip(row_vars, row_vals, strict=True):
                    f.emit(Op.Store, var, val)
            # The other stage was last read in the previous chunk, before its barrier.
            other = s.f.op(Op.ISub, s.u32, s.c(1), phase)
            for r, value in enumerate(next_a):
                self._a_unit_store(other, r, value)
            s.barrier(Scope.Workgroup)

        def step() -> None:
            f.emit(Op.Store, c_var, s.add(f.op(Op.Load, s.u32, c_var), s.c(1)))

        f.while_(lambda: s.lt(f.op(Op.Load, s.u32, c_var), self.full_chunks), chunk, step)
        self._tail(steps_per_chunk)

    def _tail(self, steps_per_chunk: int) -> None:
        """The k steps of a last, partial chunk (staged by the loop's last iteration or
        the prologue), one per iteration: subgroup-uniform control flow, no barriers."""
        s, f, t, p = self.s, self.s.f, self.t, self.plan
        first = s.mul(self.full_chunks, s.c(steps_per_chunk))
        stage_off = s.mul(f.op(Op.BitwiseAnd, s.u32, self.full_chunks, s.c(1)),
                          s.c(p.stage_units))
        ks_var = f.local(s.u32)
        f.emit(Op.Store, ks_var, s.add(first, self.sgid))

        def body() -> None:
            ks = f.op(Op.Load, s.u32, ks_var)
            b = [self._b_fragment(ks, j) for j in range(t.nf)]
            local = s.mul(s.f.op(Op.ISub, s.u32, ks, first), s.c(t.k // p.v))
            a = [self._a_fragment(stage_off, i, local) for i in range(t.row_frags)]
            accs = self._load_accs()
            self._mma(accs, a, b)
            self._store_accs(accs)

        def step() -> None:
            f.emit(Op.Store, ks_var, s.add(f.op(Op.Load, s.u32, ks_var), s.c(t.splits)))

        f.while_(lambda: s.lt(f.op(Op.Load, s.u32, ks_var), self.k_steps), body, step)

    # -- reduction and epilogue -----------------------------------------------------------
    def _epilogue_element(self, row: int, col: int, acc: int) -> None:
        """D[row, col] = alpha * acc + beta * C[row, col], rounded once to D's type.

        One element of the result, in bounds (row < M, col < N), with its accumulated
        value in the accumulator's type: the place for per-element fused operations
        (bias, activation, residual) to go."""
        s, P = self.s, self.P

        def load_c(out_type: int) -> int:
            assert self.C is not None
            return s.buffer_load(self.C, s.add(self.base_c, s.add(s.mul(row, P["ldc"]), col)))

        value = self.epilogue.apply(Types(self.r_el, self.o_el), acc,
                                    load_c if self.C is not None else None, matrix=False)
        s.buffer_store(self.D, s.add(self.base_d, s.add(s.mul(row, P["ldd"]), col)), value)

    def _reduce_and_store(self) -> None:
        """Per fragment: every subgroup's partial sum to shared memory, then each element
        summed over the subgroups and stored by one invocation. Row fragments wholly past
        M are skipped (a workgroup-uniform branch, so its barriers are legal)."""
        s, t, f = self.s, self.t, self.s.f
        frag = t.m * t.n
        add = Op.FAdd if self.float_result else Op.IAdd
        inv = t.invocations
        for i in range(t.row_frags):
            row0 = s.add(self.m0, s.c(i * t.m))

            def block(i: int = i, row0: int = row0) -> None:
                for j in range(t.nf):
                    acc = f.op(Op.Load, self.mat_acc, self.acc_vars[i][j])
                    s.coop_store_shared(self.scratch, s.mul(self.sgid, s.c(frag)), acc,
                                        CooperativeMatrixLayout.RowMajor, s.c(t.n))
                    s.barrier(Scope.Workgroup)
                    for e in range(-(-frag // inv)):
                        idx = s.add(self.tid, s.c(e * inv))
                        row = s.add(row0, s.udiv(idx, s.c(t.n)))
                        col = s.add(self.n0, s.add(s.c(j * t.n), s.umod(idx, s.c(t.n))))
                        ok = s.lt(row, self.P["M"])
                        if (e + 1) * inv > frag:  # the last pass may have idle invocations
                            ok = s.and_(ok, s.lt(idx, s.c(frag)))

                        def store(idx: int = idx, row: int = row, col: int = col) -> None:
                            total = s.shared_load(self.scratch, idx)
                            for sg in range(1, t.splits):
                                part = s.shared_load(self.scratch, s.add(idx, s.c(sg * frag)))
                                total = f.op(add, self.r_el, total, part)
                            self._epilogue_element(row, col, total)

                        f.if_(ok, store)
                    s.barrier(Scope.Workgroup)  # the scratch is free for the next fragment

            if i == 0:
                block()  # row block origins are < M: the grid has no empty row blocks
            else:
                f.if_(s.lt(row0, self.P["M"]), block)

    # -- the module ---------------------------------------------------------------------
    def build(self) -> bytes:
        self._declare()
        self._setup()
        s, t = self.s, self.t
        zero = s.mb.const_composite(self.mat_acc, [s.mb.const_null(self.r_el)])
        self.acc_vars = [[s.f.local(self.mat_acc, zero) for _ in range(t.nf)]
                         for _ in range(t.row_frags)]
        self._k_loop()
        self._reduce_and_store()
        return s.compute_module(t.invocations)


def required_capabilities(t: RowsTraits) -> set[Capability]:
    caps = {Capability.Shader, Capability.VulkanMemoryModel, Capability.CooperativeMatrixKHR,
            Capability.GroupNonUniform}
    caps.update(type_capabilities(t.a_type, in_storage_buffer=abi.rows_a_vector_elems(t) == 1))
    caps.update(type_capabilities(t.b_type, in_storage_buffer=True))
    caps.update(type_capabilities(t.result_type, in_storage_buffer=False))
    caps.update(type_capabilities(t.stored_type, in_storage_buffer=True))
    return caps


def emit_rows_gemm(t: RowsTraits) -> bytes:
    return RowsEmitter(RowsPlan(t)).build()
