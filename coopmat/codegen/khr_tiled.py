"""The tiled GEMM kernel on VK_KHR_cooperative_matrix (subgroup-scope matrices).

Shape of the generated shader, per workgroup (tile_m x tile_n of D, batch = WorkgroupId.z):

    prefetch K-step 0 of A and B into registers           (buffering 2 and 4)
    for k0 in 0, tile_k, ...:
        barrier; registers -> shared; barrier
        prefetch K-step k0 + tile_k into registers        (in flight during the multiply)
        per k step of the cooperative matrix: load A and B fragments from shared,
            multiply-accumulate into this subgroup's grid of accumulators

Buffering 3 keeps two copies (stages) of the shared tiles and needs one barrier per step:

    prefetch K-step 0; registers -> stage 0; prefetch K-step tile_k; barrier
    for k0 in 0, tile_k, ...:                             (stage s = step number & 1)
        registers (K-step k0 + tile_k) -> stage s ^ 1     (last read before the barrier
                                                           that ended the previous step)
        prefetch K-step k0 + 2 tile_k into registers
        multiply from stage s
        barrier                                           (stage s ^ 1 written, s read)

Buffering 3 and 4 multiply a k step as: load its A fragments, then per B fragment load it
and multiply-accumulate it with every A fragment, so one B fragment is live at a time.
    per accumulator: D = alpha * acc + beta * C (epilogue.py), rounded to D's type
        workgroup tile inside D (and C/D aligned): direct cooperative-matrix load/store
        workgroup tile straddling an edge: each block through a per-subgroup shared
            scratch, then element by element with bounds checks
        with fused operations (traits.ops: bias, activation, residual): on whole
            matrices where the tile is direct (bias a stride-0 matrix load, residual a
            matrix load, the activation on the invocation's components), per element
            (epilogue.ElementOps) on the scratch path at edges
        D of a type the device lists no accumulator matrix of (traits.out_matrix False:
            float16 D of a float32 accumulator on Intel Xe-HPG): every tile takes the
            scratch path likewise, rounding each element, and no such matrix is declared

Global loads of A and B are bounds-checked: an out-of-range unit reads index 0 instead
(always in the buffer) and is replaced by zero, so the shader never reads outside the
matrix and the zero padding makes partial K steps and edge tiles exact. The exact variant
(M, N, K whole multiples of the tile) drops those checks and the edge epilogue; its
look-ahead loads past the last K step read a margin that the dispatcher allocates after
each operand (abi.overread_elems).

A quantized B (traits.b_quant: GGUF q8_0/q4_0 blocks, quant.py) is dequantized unit by
unit in that global load, so registers and shared memory hold plain operand values.
"""

from __future__ import annotations

from collections.abc import Callable

from coopmat.codegen import abi
from coopmat.codegen.epilogue import (
    Epilogue,
    Types,
    buffer_element_ops,
    epilogue_buffers,
)
from coopmat.codegen.plan import KernelPlan, StagePlan, element_bytes
from coopmat.codegen.quant import QuantReader
from coopmat.codegen.shader import Buffer, ShaderContext, SharedArray
from coopmat.codegen.spv import (
    BuiltIn,
    Capability,
    CooperativeMatrixLayout,
    CooperativeMatrixUse,
    LoopControl,
    MemoryAccess,
    MemorySemantics,
    Op,
    Scope,
    StorageClass,
)
from coopmat.codegen.traits import Layout
from coopmat.codegen.types import (
    RESULT_TYPES,
    scalar_type,
    signedness_operands,
    type_capabilities,
    type_extension,
)
from coopmat.common.enums import ComponentType
from coopmat.common.quant_formats import quant_format

# The fused epilogue loads a block's residual this many blocks before storing it
# (_residuals): a larger lead hides more latency and holds more registers.
RESIDUAL_AHEAD = 1
# A split-K's finishing workgroup issues this many vec4 loads of partials an invocation
# before summing them (_split_epilogue), so that they overlap; more measured no faster.
SPLIT_FINISH_LOADS = 16


class _Operand:
    """Per-operand (A or B) state while emitting."""

    def __init__(self, stage: StagePlan, buf: Buffer, shared: SharedArray, unit: int,
                 zero: int, mat_type: int, layout: Layout) -> None:
        self.stage, self.buf, self.shared, self.unit = stage, buf, shared, unit
        self.zero, self.mat_type, self.layout = zero, mat_type, layout
        self.regs: list[int] = []
        self.regs2: list[int] = []  # buffering 5's second set
        # Buffering 3: runtime offsets (in units) of the stage being read / written.
        self.read_off: int | None = None
        self.write_off: int | None = None
        # Runtime values set at the top of main():
        self.base = 0  # batch offset (elements)
        self.ld = 0
        self.outer0 = 0  # workgroup tile origin along A's M or B's N dimension
        self.k_is_inner = False  # K is the contiguous dimension (lines run along M/N)
        self.outer_limit = 0
        self.inner_limit = 0


class TiledGemmEmitter:
    def __init__(self, plan: KernelPlan) -> None:
        self.plan = plan
        self.t = plan.traits
        self.s = ShaderContext()
        self.caps: set[Capability] = set()

    # -- declarations -------------------------------------------------------------------
    def _declare_types(self) -> None:
        t, mb = self.t, self.s.mb
        if t.result_type not in RESULT_TYPES:
            raise ValueError(f"unsupported result type {t.result_type!r}")
        mb.extension("SPV_KHR_cooperative_matrix")
        for type_ext in dict.fromkeys(type_extension(ct) for ct in (t.a_type, t.b_type)):
            if type_ext:
                mb.extension(type_ext)
        self.caps = required_capabilities(self.plan)
        mb.capability(*sorted(self.caps))
        self.a_el = scalar_type(mb, t.a_type)
        self.b_el = scalar_type(mb, t.b_type)
        self.r_el = scalar_type(mb, t.result_type)
        sub = int(Scope.Subgroup)
        self.mat_a = mb.type_coopmat(self.a_el, sub, t.m, t.k, CooperativeMatrixUse.MatrixA)
        self.mat_b = mb.type_coopmat(self.b_el, sub, t.k, t.n, CooperativeMatrixUse.MatrixB)
        self.mat_acc = mb.type_coopmat(self.r_el, sub, t.m, t.n,
                                       CooperativeMatrixUse.MatrixAccumulator)
        # C and D in memory: the accumulator's type, or a narrower one (out_type), as a
        # matrix only where the device lists one (KhrTraits.out_matrix): an unlisted
        # matrix type is undefined behaviour even if never used.
        self.o_el = scalar_type(mb, t.stored_type)
        self.mat_out = mb.type_coopmat(self.o_el, sub, t.m, t.n,
                                       CooperativeMatrixUse.MatrixAccumulator) \
            if t.out_matrix and t.split_k == 1 else None  # a split-K stores D by element
        self.float_result = t.result_type.is_float
        self.alpha_t = mb.type_float(32) if self.float_result else self.r_el

    def _unit_type(self, stage: StagePlan, elem: int) -> int:
        if not stage.unit_words:
            return elem
        if stage.unit_words == 1:
            return self.s.u32
        return self.s.mb.type_vector(self.s.u32, stage.unit_words)

    def _declare_resources(self) -> None:
        s, t, p = self.s, self.t, self.plan
        ops = []
        for name, stage, elem, ct, binding, lay, mat in (
                ("A", p.a, self.a_el, t.a_type, abi.BINDING_A, t.a_layout, self.mat_a),
                ("B", p.b, self.b_el, t.b_type, abi.BINDING_B, t.b_layout, self.mat_b)):
            unit = self._unit_type(stage, elem)
            unit_bytes = 4 * stage.unit_words if stage.unit_words else element_bytes(ct)
            if name == "B" and t.b_quant is not None:  # GGUF blocks, read as words
                buf = s.storage_buffer(binding, s.u32, 4, True, name, restrict=True)
            else:
                buf = s.storage_buffer(binding, unit, unit_bytes, True, name, restrict=True)
            sh = s.shared_array(unit, p.stages * stage.shared_units, f"{name}_shared")
            ops.append(_Operand(stage, buf, sh, unit, s.mb.const_null(unit), mat, lay))
        self.A, self.B = ops
        ob = element_bytes(t.stored_type)
        self.D = s.storage_buffer(abi.BINDING_D, self.o_el, ob, False, "D")
        self.C = s.storage_buffer(abi.BINDING_C, self.o_el, ob, True, "C") if t.has_c else None
        self.bias, self.residual = epilogue_buffers(s, t.ops, self.o_el, ob)
        self.scratch = (s.shared_array(self.r_el, t.tile.subgroups * p.scratch_elems, "scratch")
                        if p.scratch_elems else None)
        if t.split_k > 1:  # the float32 accumulator's partials, the tiles' arrival counts
            # as vec4s: the finishing workgroup reads four partials of a row at once
            self.partials = s.storage_buffer(abi.BINDING_PARTIALS,
                                             s.mb.type_vector(self.r_el, 4), 16, False,
                                             "partials", restrict=True)
            self.counters = s.storage_buffer(abi.BINDING_COUNTERS, s.u32, 4, False,
                                             "counters", restrict=True)
            self.finishes = s.shared_array(s.u32, 1, "finishes")
            # D again as vectors of four: the finish stores a row's four results at once
            # where D's rows allow it (FLAG_DIRECT_CD), as one element a store was a
            # good part of its time (docs/design.md, Split-K).
            self.D4 = s.storage_buffer(abi.BINDING_D, s.mb.type_vector(self.o_el, 4), 4 * ob,
                                       False, "D4") \
                if abi.cd_alignment_elems(t) % 4 == 0 else None
        types = [s.u32] * 11 + [self.alpha_t, self.alpha_t, s.u32]
        s.push_constants(abi.PUSH_FIELDS, types)

    # -- setup of runtime values --------------------------------------------------------
    def _setup(self) -> None:
        s, t, tile = self.s, self.t, self.t.tile
        v3 = s.mb.type_vector(s.u32, 3)
        wg = s.builtin(BuiltIn.WorkgroupId, v3)
        self.tid = s.builtin(BuiltIn.LocalInvocationIndex, s.u32)
        self.sgid = s.builtin(BuiltIn.SubgroupId, s.u32)
        self.lane = s.builtin(BuiltIn.SubgroupLocalInvocationId, s.u32)
        wx, wy, batch = (s.f.op(Op.CompositeExtract, s.u32, wg, i) for i in range(3))
        self.wx, self.wy = wx, wy
        # A specialized kernel has its sizes and strides as constants: the compiler folds
        # them into the address arithmetic.
        fixed = dict(zip(abi.SPECIALIZED_FIELDS, t.specialized, strict=True)) \
            if t.specialized else {}
        P = {name: s.c(fixed[name]) if name in fixed else s.param(name)
             for name in abi.PUSH_FIELDS}
        self.P = P
        self.m0 = s.mul(wy, s.c(tile.tile_m))
        self.n0 = s.mul(wx, s.c(tile.tile_n))
        # A split-K's z is its slice of K; its C and D are one matrix.
        self.slice = batch
        self.base_d = s.mul(batch, P["batch_stride_d"]) if t.split_k == 1 else s.c(0)
        self.base_c = s.mul(batch, P["batch_stride_c"]) if t.split_k == 1 else s.c(0)
        sg_m = s.udiv(self.sgid, s.c(tile.subgroups_n))
        sg_n = s.umod(self.sgid, s.c(tile.subgroups_n))
        wm, wn = tile.tile_m // tile.subgroups_m, tile.tile_n // tile.subgroups_n
        self.sg_row = s.mul(sg_m, s.c(wm))  # subgroup block origin inside the tile
        self.sg_col = s.mul(sg_n, s.c(wn))
        self.epilogue = Epilogue(s, float_result=self.float_result, acc_el=self.r_el,
                                 acc_is_f32=t.result_type == ComponentType.FLOAT32,
                                 alpha=P["alpha"], beta=P["beta"])
        self.element_ops = buffer_element_ops(
            s, t.ops, float_result=self.float_result, stored_el=self.o_el, bias=self.bias,
            residual=self.residual, base_d=self.base_d, ldd=P["ldd"], work_el=self.r_el)
        # A: lines are rows (row-major, K inner) or K columns (column-major, M inner).
        A, B = self.A, self.B
        A.base, A.ld = s.mul(batch, P["batch_stride_a"]), P["lda"]
        A.k_is_inner = t.a_layout == Layout.ROW_MAJOR
        A.outer0 = self.m0
        A.outer_limit, A.inner_limit = (P["M"], P["K"]) if A.k_is_inner else (P["K"], P["M"])
        B.base, B.ld = s.mul(batch, P["batch_stride_b"]), P["ldb"]
        B.k_is_inner = t.b_layout == Layout.COLUMN_MAJOR
        B.outer0 = self.n0
        B.outer_limit, B.inner_limit = (P["N"], P["K"]) if B.k_is_inner else (P["K"], P["N"])
        self.quant: QuantReader | None = None
        if t.b_quant is not None:
            self.quant = QuantReader(s, quant_format(t.b_quant), B.buf, self.b_el, B.unit,
                                     t.b_quant_unit, B.ld, B.base,
                                     held_magic=t.b_quant_held_magic)
        # Invocation i's r-th unit of a quantized B is unit i + r x invocations of the
        # tile, lines (B's columns) of tile_k / b_quant_unit units.
        self.quant_units = (B.stage.total_units * B.stage.unit_elems // t.b_quant_unit
                            // B.stage.invocations)

    # -- global -> registers -> shared --------------------------------------------------
    def _unit_coords(self, op: _Operand, r: int) -> tuple[int, int]:
        """(line, element offset within the line) of this invocation's r-th unit."""
        s, st = self.s, op.stage
        u = s.add(self.tid, s.c(r * st.invocations))
        line = s.udiv(u, s.c(st.units_per_line))
        col = s.mul(s.umod(u, s.c(st.units_per_line)), s.c(st.unit_elems))
        return line, col

    def _global_unit(self, op: _Operand, k0: int, r: int) -> int:
        """Load one unit of the operand's tile at K offset k0, zero outside the matrix."""
        s, st = self.s, op.stage
        line, col = self._unit_coords(op, r)
        if op.k_is_inner:
            outer, inner = s.add(op.outer0, line), s.add(k0, col)
        else:
            outer, inner = s.add(k0, line), s.add(op.outer0, col)
        # Rows past M read row M - 1, columns past N column N - 1; never stored.
        limit = (self.P["M"] if op is self.A and self.t.clamp_rows else
                 self.P["N"] if op is self.B and self.t.clamp_cols else None)
        if limit is not None:
            if op.k_is_inner:
                outer = self._clamp(outer, limit, 1)
            else:  # M or N is contiguous: the last whole unit (aligned_ok: whole units)
                inner = self._clamp(inner, limit, st.unit_elems)
        index = s.add(s.add(op.base, s.mul(outer, op.ld)), inner)
        if st.unit_elems > 1:  # aligned variant: every term is a multiple of the vector
            index = s.shr(index, s.c(st.unit_elems.bit_length() - 1))
        if self.t.exact:  # every tile lies inside the matrix
            return s.buffer_load(op.buf, index)
        inside = s.and_(s.lt(outer, op.outer_limit), s.lt(inner, op.inner_limit))
        safe = s.select(s.u32, inside, index, s.c(0))
        value = s.buffer_load(op.buf, safe)
        return s.select(op.unit, inside, value, op.zero)

    def _clamp(self, x: int, limit: int, unit: int) -> int:
        """min(x, limit - unit): the last unit before `limit` for every x past it."""
        s = self.s
        return s.select(s.u32, s.lt(x, limit), x, s.f.op(Op.ISub, s.u32, limit, s.c(unit)))

    def _quant_coords(self, r: int) -> tuple[int, int, int, int]:
        """(n, k offset within the K step, line, unit column in shared memory) of this
        invocation's r-th unit of a quantized B."""
        s, B, q = self.s, self.B, self.t.b_quant_unit
        per_line = self.t.tile.tile_k // q
        g = s.add(self.tid, s.c(r * B.stage.invocations))
        line, col = s.udiv(g, s.c(per_line)), s.mul(s.umod(g, s.c(per_line)), s.c(q))
        return s.add(B.outer0, line), col, line, s.udiv(col, s.c(B.stage.unit_elems))

    def _quant_fetch(self, n: int, k: int) -> list[int]:
        """The raw words of a quantized B's unit at (n, k) (`_quant_coords`)."""
        s, B = self.s, self.B
        assert self.quant is not None
        inside = None if self.t.exact else s.and_(s.lt(n, B.outer_limit),
                                                  s.lt(k, B.inner_limit))
        return self.quant.fetch(n, k, inside)

    def _stage_quant(self, k0: int) -> None:
        """A quantized B's units of the K step at k0 -> shared memory, decoded from the
        raw words the prefetch left in registers (or loaded now, without buffering)."""
        s, B = self.s, self.B
        assert self.quant is not None
        per = self.quant.fetched_words
        for r in range(self.quant_units):
            n, col, line, unit_col = self._quant_coords(r)
            k = s.add(k0, col)
            if B.regs:
                words = [s.f.op(Op.Load, s.u32, v) for v in B.regs[r * per:(r + 1) * per]]
            else:
                words = self._quant_fetch(n, k)
            first = s.add(s.mul(line, s.c(B.stage.stride_units)), unit_col)
            if B.write_off is not None:
                first = s.add(B.write_off, first)
            for i, unit in enumerate(self.quant.decode(words, n, k)):
                s.shared_store(B.shared, s.add(first, s.c(i)) if i else first, unit)

    def _shared_index(self, op: _Operand, r: int) -> int:
        s, st = self.s, op.stage
        line, col = self._unit_coords(op, r)
        unit_col = s.udiv(col, s.c(st.unit_elems)) if st.unit_elems > 1 else col
        index = s.add(s.mul(line, s.c(st.stride_units)), unit_col)
        return index if op.write_off is None else s.add(op.write_off, index)

    @property
    def _k_loop_control(self) -> int:
        return LoopControl.DontUnroll if self.t.k_loop_rolled else LoopControl.NONE

    def _prefetch(self, k0: int) -> None:
        """Registers <- the K step at k0. Near the end of the loop k0 lies past K: the
        exact variant then reads unchecked beyond the matrix, into the margin the
        dispatcher allocates after each operand (abi.overread_elems); the values are
        never stored. A guard here (a select or a branch on k0) measured slower: the
        look-ahead addresses stop being plain induction variables."""
        for op in (self.A, self.B):
            if op is self.B and self.quant is not None:  # raw words: decoded when staged
                coords = [self._quant_coords(r) for r in range(self.quant_units)]
                values = [w for n, col, _, _ in coords
                          for w in self._quant_fetch(n, self.s.add(k0, col))]
            else:
                values = [self._global_unit(op, k0, r) for r in range(len(op.regs))]
            for reg, value in zip(op.regs, values, strict=True):
                self.s.f.emit(Op.Store, reg, value)

    def _stage_to_shared(self, k0: int) -> None:
        """Shared memory <- K step k0: from the registers where the prefetch filled them
        (a quantized B's are decoded here, and where its scale sits depends on k0), else
        loaded now."""
        s = self.s
        for op in (self.A, self.B):
            if op is self.B and self.quant is not None:
                self._stage_quant(k0)
                continue
            for r in range(op.stage.units_per_invocation):
                if op.regs:
                    value = s.f.op(Op.Load, op.unit, op.regs[r])
                else:
                    value = self._global_unit(op, k0, r)
                s.shared_store(op.shared, self._shared_index(op, r), value)

    # -- multiply ------------------------------------------------------------------------
    def _fragment(self, op: _Operand, kk: int, offset: int) -> int:
        """Load the fragment at K offset kk (constant) and M/N offset `offset` (runtime)."""
        s, st = self.s, op.stage
        stride = s.c(st.stride_units)
        if op.k_is_inner:  # lines run along M/N
            index = s.add(s.mul(offset, stride), s.c(kk // st.unit_elems))
        else:  # lines run along K
            unit_off = s.udiv(offset, s.c(st.unit_elems)) if st.unit_elems > 1 else offset
            index = s.add(s.c(kk * st.stride_units), unit_off)
        if op.read_off is not None:
            index = s.add(op.read_off, index)
        # Shared memory keeps the global orientation, so the operand's layout applies.
        return s.coop_load_shared(op.mat_type, op.shared, index, op.layout.value, stride)

    def _mul_operands(self) -> int:
        t = self.t
        return signedness_operands(t.a_type, t.b_type, t.c_type, t.result_type)

    def _multiply(self) -> None:
        s, t = self.s, self.t
        accs = [[s.f.op(Op.Load, self.mat_acc, v) for v in row] for row in self.acc_vars]
        flags = self._mul_operands()
        if t.tile.buffering in (3, 4):
            self._multiply_streamed(accs, flags)
        else:
            self._multiply_all_fragments(accs, flags)
        for row_vars, row_vals in zip(self.acc_vars, accs, strict=True):
            for var, val in zip(row_vars, row_vals, strict=True):
                s.f.emit(Op.Store, var, val)

    def _multiply_all_fragments(self, accs: list[list[int]], flags: int) -> None:
        """Per k step: every A and B fragment, then the multiply-accumulates."""
        s, t, p = self.s, self.t, self.plan
        for kk in range(0, t.tile.tile_k, t.k):
            a = [self._fragment(self.A, kk, s.add(self.sg_row, s.c(i * t.m)))
                 for i in range(p.acc_rows)]
            b = [self._fragment(self.B, kk, s.add(self.sg_col, s.c(j * t.n)))
                 for j in range(p.acc_cols)]
            for i in range(p.acc_rows):
                for j in range(p.acc_cols):
                    extra = (flags,) if flags else ()
                    accs[i][j] = s.f.op(Op.CooperativeMatrixMulAddKHR, self.mat_acc, a[i],
                                        b[j], accs[i][j], *extra)

    def _multiply_streamed(self, accs: list[list[int]], flags: int) -> None:
        """Per k step: the A fragments, then one B fragment at a time against all of them
        (accumulators updated down a column), so at most acc_rows + 1 fragments are live."""
        s, t, p = self.s, self.t, self.plan
        extra = (flags,) if flags else ()
        for kk in range(0, t.tile.tile_k, t.k):
            a = [self._fragment(self.A, kk, s.add(self.sg_row, s.c(i * t.m)))
                 for i in range(p.acc_rows)]
            for j in range(p.acc_cols):
                b = self._fragment(self.B, kk, s.add(self.sg_col, s.c(j * t.n)))
                for i in range(p.acc_rows):
                    accs[i][j] = s.f.op(Op.CooperativeMatrixMulAddKHR, self.mat_acc, a[i], b,
                                        accs[i][j], *extra)

    def _sub(self, a: int, b: int) -> int:
        return self.s.f.op(Op.ISub, self.s.u32, a, b)

    def _set_stage(self, phase: int | None) -> None:
        """Buffering 3: read stage `phase` (0 or 1, runtime), write the other one;
        None: write stage 0 (the prologue)."""
        s = self.s
        for op in (self.A, self.B):
            units = s.c(op.stage.shared_units)
            if phase is None:
                op.read_off = op.write_off = None
            else:
                op.read_off = s.mul(phase, units)
                op.write_off = self._sub(units, op.read_off)

    def _k_loop_two_stages(self) -> None:
        """Buffering 3: one barrier per K step, alternating between two shared stages."""
        s, f, tile = self.s, self.s.f, self.t.tile
        k_var = f.local(s.u32, s.c(0))
        phase_var = f.local(s.u32, s.c(0))
        tk = s.c(tile.tile_k)
        self._prefetch(s.c(0))
        self._set_stage(None)
        self._stage_to_shared(s.c(0))  # registers (K step 0) -> stage 0
        self._prefetch(tk)
        s.barrier(Scope.Workgroup)  # stage 0 is in shared memory

        def body() -> None:
            k0 = f.op(Op.Load, s.u32, k_var)
            phase = f.op(Op.Load, s.u32, phase_var)
            self._set_stage(phase)
            # Registers hold K step k0 + tile_k; the stage they go to was last read by the
            # previous step's multiply, which the barrier ending that step has ordered.
            self._stage_to_shared(s.add(k0, tk))
            self._prefetch(s.add(k0, s.c(2 * tile.tile_k)))
            self._multiply()
            s.barrier(Scope.Workgroup)  # this step's stores visible, its reads done
            f.emit(Op.Store, phase_var, self._sub(s.c(1), phase))

        def step() -> None:
            f.emit(Op.Store, k_var, s.add(f.op(Op.Load, s.u32, k_var), tk))

        f.while_(lambda: s.lt(f.op(Op.Load, s.u32, k_var), self.P["K"]), body, step,
                 self._k_loop_control)
        for op in (self.A, self.B):
            op.read_off = op.write_off = None

    def _k_loop_two_register_sets(self) -> None:
        """Buffering 5: buffering 2's loop, two K steps a pass, each step's loads issued
        two steps before it is staged, into alternate register sets. Twice the bytes in
        flight per invocation, and each load has two multiplies to arrive: few-row tiles
        stream B and wait on memory latency, not on the tensor cores."""
        s, f, tile = self.s, self.s.f, self.t.tile
        k_var = f.local(s.u32, s.c(0))
        tk = s.c(tile.tile_k)
        sets = [(self.A.regs, self.B.regs), (self.A.regs2, self.B.regs2)]

        def use(i: int) -> None:
            self.A.regs, self.B.regs = sets[i]

        for i in (0, 1):
            use(i)
            self._prefetch(s.c(i * tile.tile_k))

        def half(i: int, k0: int) -> None:
            use(i)
            self._step(k0, 2 * tile.tile_k)

        def body() -> None:
            k0 = f.op(Op.Load, s.u32, k_var)
            half(0, k0)
            k1 = s.add(k0, tk)
            f.if_(s.lt(k1, self.P["K"]), lambda: half(1, k1))  # K / tile_k may be odd

        def step() -> None:
            f.emit(Op.Store, k_var, s.add(f.op(Op.Load, s.u32, k_var), s.c(2 * tile.tile_k)))

        f.while_(lambda: s.lt(f.op(Op.Load, s.u32, k_var), self.P["K"]), body, step,
                 self._k_loop_control)
        use(0)

    def _step(self, k0: int, ahead: int) -> None:
        """One K step of the one-stage loops: stage K step k0 (a runtime value) into shared
        memory, issue the loads of the step `ahead` elements of K further (0: none),
        multiply."""
        s = self.s
        s.barrier(Scope.Workgroup)  # the previous step's fragments have been read
        self._stage_to_shared(k0)
        s.barrier(Scope.Workgroup)  # this step's tile is in shared memory
        if ahead:
            self._prefetch(s.add(k0, s.c(ahead)))
        self._multiply()

    def _k_loop(self) -> None:
        s, f, tile = self.s, self.s.f, self.t.tile
        if tile.buffering == 3:
            self._k_loop_two_stages()
            return
        if tile.buffering == 5:
            self._k_loop_two_register_sets()
            return
        k_var = f.local(s.u32, s.c(0))
        if tile.buffering in (2, 4):
            self._prefetch(s.c(0))

        def body() -> None:
            k0 = f.op(Op.Load, s.u32, k_var)
            self._step(k0, tile.tile_k if tile.buffering in (2, 4) else 0)

        def step() -> None:
            f.emit(Op.Store, k_var, s.add(f.op(Op.Load, s.u32, k_var), s.c(tile.tile_k)))

        f.while_(lambda: s.lt(f.op(Op.Load, s.u32, k_var), self.P["K"]), body, step,
                 self._k_loop_control)

    # -- epilogue -------------------------------------------------------------------------
    def _store_direct(self, acc: int, i0: int, j0: int) -> None:
        s, P = self.s, self.P
        row = CooperativeMatrixLayout.RowMajor

        def load_c(mat_type: int) -> int:
            c_index = s.add(self.base_c, s.add(s.mul(i0, P["ldc"]), j0))
            assert self.C is not None
            return s.coop_load_buffer(mat_type, self.C, c_index, row, P["ldc"])

        assert self.mat_out is not None  # not t.scratch_epilogue
        res = self.epilogue.apply(Types(self.mat_acc, self.mat_out), acc,
                                  load_c if self.C is not None else None, matrix=True)
        d_index = s.add(self.base_d, s.add(s.mul(i0, P["ldd"]), j0))
        s.coop_store_buffer(self.D, d_index, res, row, P["ldd"])

    def _residuals(self, blocks: list[tuple[int, int, int]]) -> Callable[[int], int | None]:
        """Block b's residual matrix, loaded RESIDUAL_AHEAD blocks before b is stored: the
        residual may be D's own memory (it is not restrict), so no load can move above an
        earlier block's store, and loaded just before its own use each block waited out a
        global load's latency (docs/design.md, Kernels). Call in block order."""
        s, P = self.s, self.P
        loaded: dict[int, int] = {}
        row = CooperativeMatrixLayout.RowMajor

        def load(b: int) -> None:
            if b < len(blocks) and b not in loaded:
                assert self.residual is not None and self.mat_out is not None
                _, i0, j0 = blocks[b]
                loaded[b] = s.coop_load_buffer(self.mat_out, self.residual, s.add(
                    self.base_d, s.add(s.mul(i0, P["ldd"]), j0)), row, P["ldd"])

        def residual(b: int) -> int | None:
            if self.residual is None:
                return None
            for ahead in range(b, b + 1 + RESIDUAL_AHEAD):
                load(ahead)
            return loaded.pop(b)
        return residual

    def _store_fused(self, acc: int, i0: int, j0: int, res: int | None) -> None:
        """The fused epilogue on whole matrices, stored directly (interior tiles): bias as
        a matrix whose rows all read bias[j0:j0 + n] (stride 0), the residual `res` as a
        matrix addressed like D (from _residuals), and the activation on this
        invocation's components of the accumulator (OpCooperativeMatrixLengthKHR of them;
        an activation is element-wise, so which elements they are does not matter). No
        shared memory, no barriers, no per-element addressing: the per-element form's
        cost varied widely from build to build, this form's was nil."""
        s, f, P, t = self.s, self.s.f, self.P, self.t
        eops, ops, mat_out = self.element_ops, t.ops, self.mat_out
        assert eops is not None and ops is not None
        assert mat_out is not None  # not t.scratch_epilogue
        row = CooperativeMatrixLayout.RowMajor
        add = Op.FAdd if self.float_result else Op.IAdd
        types = Types(self.mat_acc, mat_out)

        def load_c(mat_type: int) -> int:
            assert self.C is not None
            return s.coop_load_buffer(mat_type, self.C, s.add(self.base_c, s.add(
                s.mul(i0, P["ldc"]), j0)), row, P["ldc"])

        def widened(mat: int) -> int:
            if mat_out == self.mat_acc:
                return mat
            return f.op(Op.FConvert if self.float_result else Op.SConvert, self.mat_acc, mat)

        value = self.epilogue.combine(types, acc, load_c if self.C is not None else None,
                                      matrix=True)
        d_index = s.add(self.base_d, s.add(s.mul(i0, P["ldd"]), j0))
        if self.bias is not None:
            bias = s.coop_load_buffer(mat_out, self.bias, j0, row, s.c(0))
            value = f.op(add, self.mat_acc, value, widened(bias))
        if ops.activation is not None:
            var = f.local(self.mat_acc)
            f.emit(Op.Store, var, value)
            ptr_t = s.mb.type_pointer(StorageClass.Function, self.r_el)
            length = f.op(Op.CooperativeMatrixLengthKHR, s.u32, self.mat_acc)
            i_var = f.local(s.u32, s.c(0))

            def body() -> None:
                ptr = f.op(Op.AccessChain, ptr_t, var, f.op(Op.Load, s.u32, i_var))
                x = f.op(Op.Load, self.r_el, ptr)
                f.emit(Op.Store, ptr, eops.convert(eops.activate(eops.convert(
                    x, self.r_el, eops.work)), eops.work, self.r_el))

            f.while_(lambda: s.lt(f.op(Op.Load, s.u32, i_var), length), body,
                     lambda: f.emit(Op.Store, i_var,
                                    s.add(f.op(Op.Load, s.u32, i_var), s.c(1))))
            value = f.op(Op.Load, self.mat_acc, var)
        if res is not None:
            value = f.op(add, self.mat_acc, value, widened(res))
        if mat_out != self.mat_acc:
            value = f.op(Op.FConvert if self.float_result else Op.SConvert, mat_out,
                         value)
        s.coop_store_buffer(self.D, d_index, value, row, P["ldd"])

    def _store_checked(self, acc: int, i0: int, j0: int, *, checked: bool = True) -> None:
        """Through this subgroup's scratch: store the block, then copy element-wise (with
        the fused operations where the kernel has them).

        Runs in workgroup-uniform control flow, so it can use workgroup barriers (a
        subgroup barrier would do, but lavapipe treats those as workgroup barriers too,
        and the reference interpreter runs workgroup barriers only; see _epilogue).
        `checked`: skip elements outside M x N (False only where no tile straddles an
        edge).
        """
        s, t, P = self.s, self.t, self.P
        n_el = self.plan.scratch_elems
        scratch = self.scratch
        assert scratch is not None  # only the exact variant has none, and no edges
        base = s.mul(self.sgid, s.c(n_el))
        s.coop_store_shared(scratch, base, acc, CooperativeMatrixLayout.RowMajor,
                            s.c(t.n))
        s.barrier(Scope.Workgroup)
        def element(idx: int) -> None:
            gi = s.add(i0, s.udiv(idx, s.c(t.n)))
            gj = s.add(j0, s.umod(idx, s.c(t.n)))

            def copy(idx: int = idx, gi: int = gi, gj: int = gj) -> None:
                self._finish_element(s.shared_load(scratch, s.add(base, idx)), gi, gj)

            if checked:
                s.f.if_(s.and_(s.lt(gi, P["M"]), s.lt(gj, P["N"])), copy)
            else:
                copy()

        for e in range(n_el // t.subgroup_size):
            element(s.add(self.lane, s.c(e * t.subgroup_size)))
        s.barrier(Scope.Workgroup)  # the scratch is free for the next block

    def _finished_value(self, acc_v: int, gi: int, gj: int) -> int:
        """D[gi, gj]'s value from its accumulator value acc_v (the accumulator's type):
        alpha, beta * C, the fused operations, rounded once to D's type."""
        s, P = self.s, self.P

        def load_c(el: int) -> int:
            assert self.C is not None
            return s.buffer_load(self.C, s.add(self.base_c, s.add(s.mul(gi, P["ldc"]), gj)))

        return self.epilogue.element(Types(self.r_el, self.o_el), acc_v,
                                     load_c if self.C is not None else None,
                                     self.element_ops, gi, gj)

    def _finish_element(self, acc_v: int, gi: int, gj: int) -> None:
        """D[gi, gj] from its accumulator value acc_v (_finished_value), stored."""
        s, P = self.s, self.P
        s.buffer_store(self.D, s.add(self.base_d, s.add(s.mul(gi, P["ldd"]), gj)),
                       self._finished_value(acc_v, gi, gj))

    def _finish_vector(self, total: int, gi: int, quad: int) -> None:
        """D[gi, n0 + 4 quad ...] from a vec4 of summed partials (the accumulator's type),
        each element finished by _finished_value, stored as one vector. D's rows start on
        16-byte boundaries (FLAG_DIRECT_CD) and a split's D is one matrix."""
        s, P, f = self.s, self.P, self.s.f
        vec = s.mb.type_vector(self.o_el, 4)
        gj0 = s.add(self.n0, s.mul(quad, s.c(4)))
        values = [self._finished_value(f.op(Op.CompositeExtract, self.r_el, total, c), gi,
                                       s.add(gj0, s.c(c))) for c in range(4)]
        at = s.add(s.mul(gi, s.shr(P["ldd"], s.c(2))), s.shr(gj0, s.c(2)))
        assert self.D4 is not None
        s.buffer_store(self.D4, at, f.op(Op.CompositeConstruct, vec, *values))

    def _split_epilogue(self) -> None:
        """A split-K's end (KhrTraits.split_k = S): store this slice's accumulators to the
        workspace, count this workgroup's arrival at its tile, and if it is the tile's
        last (S - 1 arrived before it) sum the S partials of each element of the tile, in
        slice order, and finish them into D; it also sets the tile's counter back to 0
        for the next dispatch.

        The partials cross workgroups: their stores make themselves available and their
        loads make themselves visible at queue-family scope (every workgroup of the
        dispatch), and the barriers and the atomic add order them (release by the
        storing workgroup, acquire by the finishing one), as the Vulkan memory model asks.
        """
        s, t, P, f = self.s, self.t, self.P, self.s.f
        tile = t.tile
        qf = s.c(Scope.QueueFamily)
        tiles_x = s.udiv(s.add(P["N"], s.c(tile.tile_n - 1)), s.c(tile.tile_n))
        tiles_y = s.udiv(s.add(P["M"], s.c(tile.tile_m - 1)), s.c(tile.tile_m))
        # abi.split_layout, in vec4s (tile_n is a multiple of the matrices' n, 8 or more)
        ldp4 = s.mul(tiles_x, s.c(tile.tile_n // 4))
        stride_p4 = s.mul(s.mul(tiles_y, s.c(tile.tile_m)), ldp4)
        store = MemoryAccess.MakePointerAvailable | MemoryAccess.NonPrivatePointer
        load = MemoryAccess.MakePointerVisible | MemoryAccess.NonPrivatePointer
        base = s.mul(self.slice, stride_p4)
        for acc, i0, j0 in self._blocks():  # padded to whole tiles: no bounds to check
            at = s.add(base, s.add(s.mul(i0, ldp4), s.shr(j0, s.c(2))))
            f.emit(Op.CooperativeMatrixStoreKHR, s.buffer_ptr(self.partials, at), acc,
                   s.c(CooperativeMatrixLayout.RowMajor), ldp4, store, qf)
        sem = s.c(MemorySemantics.AcquireRelease | MemorySemantics.UniformMemory
                  | MemorySemantics.WorkgroupMemory)
        f.emit(Op.ControlBarrier, s.c(Scope.Workgroup), qf, sem)

        def arrive() -> None:
            counter = s.buffer_ptr(self.counters, s.add(s.mul(self.wy, tiles_x), self.wx))
            before = f.op(Op.AtomicIAdd, s.u32, counter, qf,
                          s.c(MemorySemantics.AcquireRelease | MemorySemantics.UniformMemory),
                          s.c(1))
            last = f.op(Op.IEqual, s.bool, before, s.c(t.split_k - 1))
            f.if_(last, lambda: f.emit(Op.AtomicStore, counter, qf,
                                       s.c(MemorySemantics.NONE), s.c(0)))
            s.shared_store(self.finishes, s.c(0), s.select(s.u32, last, s.c(1), s.c(0)))

        f.if_(f.op(Op.IEqual, s.bool, self.tid, s.c(0)), arrive)
        f.emit(Op.ControlBarrier, s.c(Scope.Workgroup), qf, sem)

        def finish() -> None:
            vec4 = s.mb.type_vector(self.r_el, 4)
            quads, per_row = tile.tile_m * tile.tile_n // 4, tile.tile_n // 4
            if quads % self.plan.invocations:
                raise ValueError(f"a split-K tile of {quads} vec4s does not spread evenly "
                                 f"over {self.plan.invocations} invocations")
            # Four partials of a row a load, SPLIT_FINISH_LOADS of them issued before any
            # is summed: the finishing workgroup is often alone on its multiprocessor, and
            # one load waited for at a time would leave it idle.
            batch = max(1, SPLIT_FINISH_LOADS // t.split_k)
            firsts = range(0, quads, self.plan.invocations)

            def run(checked: bool, vector: bool = False) -> None:
                for b0 in range(0, len(firsts), batch):
                    group = []
                    for e in firsts[b0:b0 + batch]:
                        q = s.add(self.tid, s.c(e))
                        gi = s.add(self.m0, s.udiv(q, s.c(per_row)))
                        quad = s.umod(q, s.c(per_row))  # the vec4's place in its tile row
                        at = s.add(s.mul(gi, ldp4), s.add(s.shr(self.n0, s.c(2)), quad))
                        parts = [f.op(Op.Load, vec4, s.buffer_ptr(
                            self.partials, s.add(s.mul(s.c(sl), stride_p4), at)), load, qf)
                            for sl in range(t.split_k)]  # inside the padded workspace
                        group.append((gi, quad, parts))
                    for gi, quad, parts in group:
                        total = parts[0]
                        for x in parts[1:]:
                            total = f.op(Op.FAdd, vec4, total, x)
                        if vector:
                            self._finish_vector(total, gi, quad)
                            continue
                        for c in range(4):
                            gj = s.add(self.n0, s.add(s.mul(quad, s.c(4)), s.c(c)))
                            value = f.op(Op.CompositeExtract, self.r_el, total, c)

                            def element(v: int = value, gi: int = gi, gj: int = gj) -> None:
                                self._finish_element(v, gi, gj)

                            if checked:
                                f.if_(s.and_(s.lt(gi, P["M"]), s.lt(gj, P["N"])), element)
                            else:
                                element()

            def unchecked() -> None:
                if self.D4 is None:
                    run(False)
                    return
                if t.aligned:
                    run(False, vector=True)
                    return
                flag = f.op(Op.BitwiseAnd, s.u32, P["flags"], s.c(abi.FLAG_DIRECT_CD))
                f.if_(f.op(Op.INotEqual, s.bool, flag, s.c(0)),
                      lambda: run(False, vector=True), lambda: run(False))

            if not t.edges:
                unchecked()
                return
            # Whole tiles (the workgroup's choice, uniform) store without checks.
            interior = s.and_(s.le(s.add(self.m0, s.c(tile.tile_m)), P["M"]),
                              s.le(s.add(self.n0, s.c(tile.tile_n)), P["N"]))
            f.if_(interior, unchecked, lambda: run(True))

        finishes = s.shared_load(self.finishes, s.c(0))
        f.if_(f.op(Op.INotEqual, s.bool, finishes, s.c(0)), finish)

    def _blocks(self) -> list[tuple[int, int, int]]:
        """(accumulator, row, column) of each of this subgroup's blocks of D."""
        s, t, p = self.s, self.t, self.plan
        out = []
        for i in range(p.acc_rows):
            for j in range(p.acc_cols):
                i0 = s.add(self.m0, s.add(self.sg_row, s.c(i * t.m)))
                j0 = s.add(self.n0, s.add(self.sg_col, s.c(j * t.n)))
                out.append((s.f.op(Op.Load, self.mat_acc, self.acc_vars[i][j]), i0, j0))
        return out

    def _epilogue(self) -> None:
        """Interior workgroups store directly; edge workgroups go element by element.

        The choice is per workgroup (not per block) so that the edge path's barriers are
        in workgroup-uniform control flow. With traits.scratch_epilogue (a D type with no
        listed matrix) every workgroup goes element by element, with workgroup barriers
        (a few per tile, against two per K step), which the reference interpreter
        (tests/spirv_interp, workgroup-scope barriers only) runs for every recorded list.
        """
        s, t, P = self.s, self.t, self.P
        tile = t.tile
        if t.scratch_epilogue:
            for acc, i0, j0 in self._blocks():
                self._store_checked(acc, i0, j0, checked=t.edges)
            return
        def direct() -> None:
            blocks = self._blocks()
            if t.ops is None:
                for acc, i0, j0 in blocks:
                    self._store_direct(acc, i0, j0)
                return
            residual = self._residuals(blocks)
            for b, (acc, i0, j0) in enumerate(blocks):
                self._store_fused(acc, i0, j0, residual(b))

        if not t.edges:  # no workgroup straddles an edge
            direct()
            return
        interior = s.and_(s.le(s.add(self.m0, s.c(tile.tile_m)), P["M"]),
                          s.le(s.add(self.n0, s.c(tile.tile_n)), P["N"]))
        if not t.aligned:  # the general variant checks C/D alignment at run time
            flag = s.f.op(Op.BitwiseAnd, s.u32, P["flags"], s.c(abi.FLAG_DIRECT_CD))
            interior = s.and_(interior, s.f.op(Op.INotEqual, s.bool, flag, s.c(0)))

        def edge() -> None:
            for acc, i0, j0 in self._blocks():
                self._store_checked(acc, i0, j0)

        s.f.if_(interior, direct, edge)

    def _registers(self, op: _Operand) -> list[int]:
        """Function variables for one K step of the operand's prefetched units (a quantized
        B's raw words, decoded when staged)."""
        s = self.s
        if op is self.B and self.quant is not None:
            return [s.f.local(s.u32) for _ in range(self.quant_units * self.quant.fetched_words)]
        return [s.f.local(op.unit) for _ in range(op.stage.units_per_invocation)]

    # -- the module ---------------------------------------------------------------------
    def build(self) -> bytes:
        self._declare_types()
        self._declare_resources()
        s, p = self.s, self.plan
        self._setup()
        zero = s.mb.const_null(self.r_el)
        acc_zero = s.mb.const_composite(self.mat_acc, [zero])
        self.acc_vars = [[s.f.local(self.mat_acc, acc_zero) for _ in range(p.acc_cols)]
                         for _ in range(p.acc_rows)]
        if p.tile.buffering in (2, 3, 4, 5):
            for op in (self.A, self.B):
                op.regs = self._registers(op)
                if p.tile.buffering == 5:  # a second set, one K step further ahead
                    op.regs2 = self._registers(op)
        self._k_loop()
        if self.t.split_k > 1:
            self._split_epilogue()
        else:
            self._epilogue()
        return s.compute_module(p.invocations)


def required_capabilities(plan: KernelPlan) -> set[Capability]:
    t = plan.traits
    caps = {Capability.Shader, Capability.VulkanMemoryModel, Capability.CooperativeMatrixKHR,
            Capability.GroupNonUniform}
    for ct, stage in ((t.a_type, plan.a), (t.b_type, plan.b)):
        caps.update(type_capabilities(ct, in_storage_buffer=not stage.unit_words))
    caps.update(type_capabilities(t.result_type, in_storage_buffer=False))
    caps.update(type_capabilities(t.stored_type, in_storage_buffer=True))
    if t.b_quant is not None:  # the blocks' float16 scales
        caps.add(Capability.Float16)
    return caps


def emit_tiled_gemm(plan: KernelPlan) -> bytes:
    return TiledGemmEmitter(plan).build()
