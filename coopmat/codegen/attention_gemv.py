"""Split decode attention without cooperative matrices (traits.family "gemv"): the first
pass for a few query rows against a long key range, reading K and V straight from memory
as gemv.py reads a weight, and leaving the partial states that attention_combine.py merges
(the khr kernel's split workspace: unnormalised float32 O, (m, l) base 2 per row).

A matrix kernel at decode wastes most of its rows (4 grouped heads of one query fill 4 of
16) and stages every key through shared memory; this kernel has no shared memory and no
barriers. One subgroup a workgroup, rows [r0, r0 + rows) of one kv head (attention.py's
rows: groups x Lq), keys [kbeg, kend) of one slice (attention.py's key range). In steps of
sg = subgroup_size keys from k0:

    scores: key groups of L = lanes_per_row lanes (G = sg / L groups). Lane p of group g
        reads units p, p + L, ... (16 bytes each) of keys k0 + g + G i for i < L, so L
        lanes read a key's row whole and contiguous, and dots each with the same units of
        every row's q (registers, scaled by scale log2(e) once). A transposing reduction
        over the group (log2 L rounds of OpGroupNonUniformShuffleXor, each halving the
        values a lane holds) leaves lane p with the score of key k0 + g + G p, all rows.
    softmax, per row: -inf past kend and, where causal, past the row's query; the step's
        max over the subgroup (OpGroupNonUniformFMax); m' = max(m, it); p = 2^(s - m');
        alpha = 2^(m - m') (m' of -inf counts as 0); each lane keeps its share of l.
    P V: value groups of LV lanes (the value row's units rounded up to a power of two, at
        most sg; GV = sg / LV groups). Lane pv of group gv reads units pv, pv + LV, ... of
        the value rows of keys k0 + gv + GV i for i < LV and takes each key's p from the
        lane that scored it (OpGroupNonUniformShuffle); O = O alpha + sum p v, float32.

At the end the value groups' O meet (shuffles), l is summed over the subgroup, the first
value group stores O and lane 0 each row's (m, l). Loads of keys past kend read key
kend - 1 (their p is 0) and loads of rows past the tile's last read its last row (stored to
the workspace's padding rows, which the merge never reads), so no load leaves its binding.
"""

from __future__ import annotations

from collections.abc import Callable

from coopmat.codegen.attention import (
    BINDING_COUNTERS,
    BINDING_K,
    BINDING_ML,
    BINDING_O,
    BINDING_Q,
    BINDING_RESULT,
    BINDING_V,
    PUSH_FIELDS,
    AttentionEmitter,
    required_capabilities,
)
from coopmat.codegen.shader import Buffer
from coopmat.codegen.spv import (
    GLSLstd450,
    GroupOperation,
    LoopControl,
    MemoryAccess,
    MemorySemantics,
    Op,
    Scope,
)
from coopmat.codegen.types import scalar_type, type_extension
from coopmat.codegen.widen import UNIT_ELEMS, UnitWidener
from coopmat.common.dtypes import element

_UNIT_BYTES = 16
# fused_merge: slots whose loads the last workgroup keeps in flight at a time.
MERGE_UNROLL = 16
_AVAILABLE = MemoryAccess.MakePointerAvailable | MemoryAccess.NonPrivatePointer
_VISIBLE = MemoryAccess.MakePointerVisible | MemoryAccess.NonPrivatePointer


def value_lanes(value_dim: int, subgroup_size: int) -> int:
    """LV: lanes that read one value row (its 16-byte units, rounded up to a power of
    two, at most the subgroup)."""
    units = -(-value_dim // UNIT_ELEMS)
    return min(subgroup_size, 1 << (units - 1).bit_length())


class GemvAttentionEmitter(AttentionEmitter):
    # -- declarations -------------------------------------------------------------------
    def _declare(self) -> None:
        s, t, mb = self.s, self.t, self.s.mb
        mb.capability(*sorted(required_capabilities(t)))
        self.glsl = mb.ext_inst_import("GLSL.std.450")
        self.widener = UnitWidener(s, t.operand)
        self.f32, self.vec4, self.uvec4 = self.widener.f32, self.widener.vec4, \
            self.widener.uvec4
        self.zero_unit = mb.const_null(self.uvec4)
        self.zero4 = mb.const_null(self.vec4)
        self.Q = s.storage_buffer(BINDING_Q, self.uvec4, _UNIT_BYTES, True, "q", restrict=True)
        self.K = s.storage_buffer(BINDING_K, self.uvec4, _UNIT_BYTES, True, "k", restrict=True)
        self.V = s.storage_buffer(BINDING_V, self.uvec4, _UNIT_BYTES, True, "v", restrict=True)
        self.O = s.storage_buffer(BINDING_O, self.f32, 4, False, "o", restrict=True)
        self.ml = s.storage_buffer(BINDING_ML, self.f32, 4, False, "ml", restrict=True)
        if t.subgroups > 1:  # the subgroups' states: (m, l) per row, then O
            self.sm_stats = s.shared_array(self.f32, t.subgroups * t.rows * 2, "stats")
            self.sm_o = s.shared_array(self.f32, t.subgroups * t.rows * t.value_dim, "o")
        if t.fused_merge:
            ext = type_extension(t.out)
            if ext:
                mb.extension(ext)
            self.out_el = scalar_type(mb, t.out)
            self.result = s.storage_buffer(BINDING_RESULT, self.out_el,
                                           element(t.out).itemsize, False, "result")
            self.counters = s.storage_buffer(BINDING_COUNTERS, s.u32, 4, False, "counters")
            self.sm_flag = s.shared_array(s.u32, 1, "last")
        types = [self.f32 if name == "scale_log2" else s.u32 for name in PUSH_FIELDS]
        s.push_constants(PUSH_FIELDS, types)

    # -- helpers ------------------------------------------------------------------------
    def _subgroup(self, op: Op, value: int) -> int:
        s = self.s
        return s.f.op(op, self.f32, s.c(Scope.Subgroup), GroupOperation.Reduce, value)

    def _lane_units(self, lane: int, lanes: int, units: int) -> list[tuple[int, int | None]]:
        """(unit, in-range condition or None) of the units lane `lane` of a group of
        `lanes` reads from a row of `units` units: lane, lane + lanes, ..."""
        s = self.s
        out: list[tuple[int, int | None]] = []
        for c in range(-(-units // lanes)):
            u = s.add(lane, s.c(c * lanes)) if c else lane
            whole = (c + 1) * lanes <= units  # every lane's unit c lies in the row
            out.append((u, None if whole else s.lt(u, s.c(units))))
        return out

    def _load_unit(self, buf: Buffer, row_at: int, unit: int, valid: int | None) -> int:
        """Unit `unit` of the row starting at unit `row_at` (zeros where `valid` is
        false, after reading the row's unit 0)."""
        s = self.s
        if valid is not None:
            unit = s.select(s.u32, valid, unit, s.c(0))
        value = s.buffer_load(buf, s.add(row_at, unit))
        if valid is not None:
            value = s.select(self.uvec4, valid, value, self.zero_unit)
        return value

    def _key_row(self, k0: int, kk: int, off8: int, ld8: int) -> int:
        """Where key k0 + kk's row starts (16-byte units), clamped below kend."""
        s = self.s
        j = self._min(s.add(k0, kk), self._sub(self.kend, s.c(1)))
        return s.add(off8, s.mul(j, ld8))

    def _dot(self, a: tuple[int, int], b: tuple[int, int]) -> int:
        f = self.s.f
        return self._fop(Op.FAdd, f.op(Op.Dot, self.f32, a[0], b[0]),
                         f.op(Op.Dot, self.f32, a[1], b[1]))

    # -- setup ----------------------------------------------------------------------------
    def _setup_lanes(self) -> None:
        s, t, P = self.s, self.t, self.P
        sg, L = t.subgroup_size, t.lanes_per_row
        self.G = sg // L
        self.LV = value_lanes(t.value_dim, sg)
        self.GV = sg // self.LV
        self.p = s.umod(self.lane, s.c(L))
        self.g = s.udiv(self.lane, s.c(L))
        self.pv = s.umod(self.lane, s.c(self.LV))
        self.gv = s.udiv(self.lane, s.c(self.LV))
        self.own_key = s.add(self.g, s.mul(self.p, s.c(self.G)))
        self.v_keys = [s.add(self.gv, s.c(self.GV * i)) for i in range(self.LV)]
        shift = s.c(3)  # elements -> 16-byte units (every offset a multiple of 8)
        self.k_off8, self.v_off8 = s.shr(self.k_off, shift), s.shr(self.v_off, shift)
        self.k_ld8, self.v_ld8 = s.shr(P["k_ld"], shift), s.shr(P["v_ld"], shift)
        self.k_units = self._lane_units(self.p, L, t.head_dim // UNIT_ELEMS)
        self.v_units = self._lane_units(self.pv, self.LV, t.value_dim // UNIT_ELEMS)

    def _load_q(self) -> None:
        """Each row's query (its lane's units, scaled by scale log2(e)) and index."""
        s, t, P = self.s, self.t, self.P
        last = self._sub(self.rows_total, s.c(1))
        self.q: list[list[tuple[int, int]]] = []
        self.query: list[int] = []
        for r in range(t.rows):
            R = self._min(s.add(self.r0, s.c(r)), last)
            self.query.append(self._row_query(R)[1])
            at = s.shr(self._row_offset(R, "q"), s.c(3))
            units = []
            for u, valid in self.k_units:
                lo, hi = self.widener.widen(self._load_unit(self.Q, at, u, valid))
                units.append(tuple(s.f.op(Op.VectorTimesScalar, self.vec4, x, P["scale_log2"])
                                   for x in (lo, hi)))
            self.q.append(units)  # type: ignore[arg-type]

    # -- one step -------------------------------------------------------------------------
    def _k_loads(self, k0: int) -> list[list[int]]:
        """This lane's units of K for the step at k0 (keys k0 + g + G i)."""
        s = self.s
        rows = [self._key_row(k0, s.add(self.g, s.c(self.G * i)), self.k_off8, self.k_ld8)
                for i in range(self.t.lanes_per_row)]
        return [[self._load_unit(self.K, at, u, valid) for u, valid in self.k_units]
                for at in rows]

    def _v_loads(self, k0: int) -> list[list[int]]:
        """This lane's units of V for the step at k0 (keys k0 + gv + GV i)."""
        return [[self._load_unit(self.V, self._key_row(k0, kk, self.v_off8, self.v_ld8), u,
                                 valid) for u, valid in self.v_units] for kk in self.v_keys]

    def _key_scores(self, loads: list[list[int]]) -> list[int]:
        """The score (base 2, before checks) of key k0 + own_key for every row, from the
        step's K units (_k_loads)."""
        s, t = self.s, self.t
        L = t.lanes_per_row
        parts: list[list[int]] = [[] for _ in range(t.rows)]
        for units in loads:
            k = [self.widener.widen(x) for x in units]
            for r in range(t.rows):
                total = self._dot(self.q[r][0], k[0])
                for c in range(1, len(k)):
                    total = self._fop(Op.FAdd, total, self._dot(self.q[r][c], k[c]))
                parts[r].append(total)
        h = L // 2
        while h:
            upper = s.f.op(Op.INotEqual, s.bool, s.f.op(Op.BitwiseAnd, s.u32, self.p, s.c(h)),
                           s.c(0))
            for r in range(t.rows):
                vals = parts[r]
                new = []
                for i in range(h):
                    lo, hi = vals[i], vals[i + h]
                    send = s.select(self.f32, upper, lo, hi)
                    keep = s.select(self.f32, upper, hi, lo)
                    got = s.f.op(Op.GroupNonUniformShuffleXor, self.f32, s.c(Scope.Subgroup),
                                 send, s.c(h))
                    new.append(self._fop(Op.FAdd, keep, got))
                parts[r] = new
            h //= 2
        return [vals[0] for vals in parts]

    def _weights(self, k0: int, scores: list[int]) -> tuple[list[int], list[int]]:
        """(p, alpha) of every row; updates m and this lane's share of l."""
        s, f = self.s, self.s.f
        j = s.add(k0, self.own_key)
        inside = s.lt(j, self.kend)
        zero = self._fconst(0.0)
        ps, alphas = [], []
        for r, score in enumerate(scores):
            hidden = s.and_(self.causal, f.op(Op.UGreaterThan, s.bool, j, self.query[r]))
            seen = s.and_(inside, f.op(Op.LogicalNot, s.bool, hidden))
            x = s.select(self.f32, seen, score, self.neg_inf)
            m_old = self._load(self.f32, self.m_vars[r])
            m_new = self._ext(GLSLstd450.FMax, m_old, self._subgroup(Op.GroupNonUniformFMax, x))
            empty = f.op(Op.FOrdEqual, s.bool, m_new, self.neg_inf)
            m_use = s.select(self.f32, empty, zero, m_new)
            p = self._ext(GLSLstd450.Exp2, self._fop(Op.FSub, x, m_use))
            alpha = self._ext(GLSLstd450.Exp2, self._fop(Op.FSub, m_old, m_use))
            l_old = self._load(self.f32, self.l_vars[r])
            self._store(self.l_vars[r], self._fop(Op.FAdd, self._fop(Op.FMul, l_old, alpha), p))
            self._store(self.m_vars[r], m_new)
            ps.append(p)
            alphas.append(alpha)
        return ps, alphas

    def _accumulate_pv(self, loads: list[list[int]], ps: list[int],
                       alphas: list[int]) -> None:
        s, t, f = self.s, self.t, self.s.f
        G, L = self.G, t.lanes_per_row
        acc = [[[f.op(Op.VectorTimesScalar, self.vec4, self._load(self.vec4, var), alphas[r])
                 for var in unit_vars] for unit_vars in row_vars]
               for r, row_vars in enumerate(self.o_vars)]
        for kk, units in zip(self.v_keys, loads, strict=True):
            # The lane that scored key kk: group kk mod G, lane kk / G of it.
            owner = s.add(s.mul(s.umod(kk, s.c(G)), s.c(L)), s.udiv(kk, s.c(G)))
            v = [self.widener.widen(x) for x in units]
            for r in range(t.rows):
                p = f.op(Op.GroupNonUniformShuffle, self.f32, s.c(Scope.Subgroup), ps[r], owner)
                for c, pair in enumerate(v):
                    for h, x in enumerate(pair):
                        acc[r][c][h] = f.op(Op.FAdd, self.vec4, acc[r][c][h],
                                            f.op(Op.VectorTimesScalar, self.vec4, x, p))
        for row_vars, row_acc in zip(self.o_vars, acc, strict=True):
            for unit_vars, unit_acc in zip(row_vars, row_acc, strict=True):
                for var, value in zip(unit_vars, unit_acc, strict=True):
                    self._store(var, value)

    def _store_all(self, variables: list[list[int]], values: list[list[int]]) -> None:
        for row_vars, row_vals in zip(variables, values, strict=True):
            for var, value in zip(row_vars, row_vals, strict=True):
                self._store(var, value)

    # -- the end --------------------------------------------------------------------------
    def _ws_store(self, buf: Buffer, at: int, value: int) -> None:
        """A store to the workspace; where another workgroup merges it (fused_merge),
        made available to the whole dispatch."""
        s = self.s
        if not self.t.fused_merge:
            s.buffer_store(buf, at, value)
            return
        s.f.emit(Op.Store, s.buffer_ptr(buf, at), value, _AVAILABLE, s.c(Scope.QueueFamily))

    def _slot_row(self, slot_index: int, r: int) -> int:
        """Row r (an id) of the tile in workspace slot (kv head, slot_index)."""
        s, P = self.s, self.P
        wz = s.add(s.mul(self.outer, P["kv_heads"]), self.kv_head)
        slot = s.add(s.mul(wz, P["splits"]), slot_index)
        return s.add(s.mul(slot, P["rows_pad"]), s.add(self.r0, r))

    def _reduce_state(self) -> list[int]:
        """Each row's l summed over the subgroup (returned) and O summed over the value
        groups (in place: every lane of a group then holds its units' sums)."""
        s, t, f = self.s, self.t, self.s.f
        sums = []
        for r in range(t.rows):
            sums.append(self._subgroup(Op.GroupNonUniformFAdd,
                                       self._load(self.f32, self.l_vars[r])))
            for unit_vars in self.o_vars[r]:
                for var in unit_vars:
                    value = self._load(self.vec4, var)
                    h = self.LV
                    while h < t.subgroup_size:
                        value = f.op(Op.FAdd, self.vec4, value, f.op(
                            Op.GroupNonUniformShuffleXor, self.vec4, s.c(Scope.Subgroup),
                            value, s.c(h)))
                        h *= 2
                    self._store(var, value)
        return sums

    def _write_units(self, write: Callable[[int, int, int], None]) -> None:
        """write(r, d, value) for every element of O this lane holds (the first value
        group's lanes: their units' elements)."""
        s, t, f = self.s, self.t, self.s.f

        def units() -> None:
            for r in range(t.rows):
                for (u, valid), unit_vars in zip(self.v_units, self.o_vars[r], strict=True):
                    d0 = s.mul(u, s.c(UNIT_ELEMS))

                    def one(r: int = r, d0: int = d0, unit_vars: list[int] = unit_vars) -> None:
                        for h, var in enumerate(unit_vars):
                            value = self._load(self.vec4, var)
                            for c, e in enumerate(self.widener.order(h)):
                                write(r, s.add(d0, s.c(e)),
                                      f.op(Op.CompositeExtract, self.f32, value, c))

                    if valid is None:
                        one()
                    else:
                        f.if_(valid, one)

        f.if_(f.op(Op.IEqual, s.bool, self.gv, s.c(0)), units)

    def _store_slot(self, sums: list[int]) -> None:
        """One subgroup: its state is the workgroup's slot."""
        s, t, f = self.s, self.t, self.s.f
        ld = t.value_dim_padded
        self._write_units(lambda r, d, v: self._ws_store(
            self.O, s.add(s.mul(self._slot_row(self.split_index, s.c(r)), s.c(ld)), d), v))

        def store_ml() -> None:
            for r in range(t.rows):
                at = s.mul(self._slot_row(self.split_index, s.c(r)), s.c(2))
                self._ws_store(self.ml, at, self._load(self.f32, self.m_vars[r]))
                self._ws_store(self.ml, s.add(at, s.c(1)), sums[r])

        f.if_(f.op(Op.IEqual, s.bool, self.lane, s.c(0)), store_ml)

    def _merge_subgroups(self, sums: list[int]) -> None:
        """Several subgroups: their states meet in shared memory and the workgroup's
        invocations merge them, an element each at a time, into the workgroup's slot."""
        s, t, f = self.s, self.t, self.s.f
        R, Dv, S = t.rows, t.value_dim, t.subgroups
        stats, values = self.sm_stats, self.sm_o  # (m, l) per (subgroup, row); O
        base = s.mul(self.sgid, s.c(R))
        self._write_units(lambda r, d, v: s.shared_store(
            values, s.add(s.mul(s.add(base, s.c(r)), s.c(Dv)), d), v))

        def store_ml() -> None:
            for r in range(R):
                at = s.mul(s.add(base, s.c(r)), s.c(2))
                s.shared_store(stats, at, self._load(self.f32, self.m_vars[r]))
                s.shared_store(stats, s.add(at, s.c(1)), sums[r])

        f.if_(f.op(Op.IEqual, s.bool, self.lane, s.c(0)), store_ml)
        self._barrier()
        ld = t.value_dim_padded
        zero = self._fconst(0.0)
        for e0 in range(0, R * Dv, t.invocations):
            e = s.add(self.tid, s.c(e0))

            def element(e: int = e) -> None:
                r, d = s.udiv(e, s.c(Dv)), s.umod(e, s.c(Dv))
                ms = [s.shared_load(stats, s.mul(s.add(s.c(g * R), r), s.c(2)))
                      for g in range(S)]
                m = ms[0]
                for x in ms[1:]:
                    m = self._ext(GLSLstd450.FMax, m, x)
                empty = f.op(Op.FOrdEqual, s.bool, m, self.neg_inf)
                m_use = s.select(self.f32, empty, zero, m)
                o_sum, l_sum = zero, zero
                for g in range(S):
                    w = self._ext(GLSLstd450.Exp2, self._fop(Op.FSub, ms[g], m_use))
                    row = s.add(s.c(g * R), r)
                    o_g = s.shared_load(values, s.add(s.mul(row, s.c(Dv)), d))
                    l_g = s.shared_load(stats, s.add(s.mul(row, s.c(2)), s.c(1)))
                    o_sum = self._fop(Op.FAdd, o_sum, self._fop(Op.FMul, o_g, w))
                    l_sum = self._fop(Op.FAdd, l_sum, self._fop(Op.FMul, l_g, w))
                slot_row = self._slot_row(self.split_index, r)
                self._ws_store(self.O, s.add(s.mul(slot_row, s.c(ld)), d), o_sum)

                def store_ml() -> None:
                    at = s.mul(slot_row, s.c(2))
                    self._ws_store(self.ml, at, m)
                    self._ws_store(self.ml, s.add(at, s.c(1)), l_sum)

                f.if_(f.op(Op.IEqual, s.bool, d, s.c(0)), store_ml)

            if e0 + t.invocations <= R * Dv:
                element()
            else:
                f.if_(s.lt(e, s.c(R * Dv)), element)

    def _ws_load(self, buf: Buffer, at: int) -> int:
        """A load of another workgroup's slot, made visible to this one."""
        s = self.s
        return s.f.op(Op.Load, buf.elem, s.buffer_ptr(buf, at), _VISIBLE,
                      s.c(Scope.QueueFamily))

    def _merge_slices(self) -> None:
        """fused_merge: the workgroup counts its arrival at its tile (one counter per kv
        head and row tile); the last of the tile's `splits` workgroups merges their slots
        and writes o, and sets the counter back to 0. The slots' stores are released by
        the barrier and the atomic add and acquired by the last workgroup's, as the
        Vulkan memory model asks (khr_tiled.py's split-K does the same)."""
        s, t, f, P = self.s, self.t, self.s.f, self.P
        qf = s.c(Scope.QueueFamily)
        sem = s.c(MemorySemantics.AcquireRelease | MemorySemantics.UniformMemory
                  | MemorySemantics.WorkgroupMemory)
        f.emit(Op.ControlBarrier, s.c(Scope.Workgroup), qf, sem)
        wz = s.add(s.mul(self.outer, P["kv_heads"]), self.kv_head)
        index = s.add(s.mul(wz, self.row_tiles), s.udiv(self.r0, s.c(t.block_rows)))

        def arrive() -> None:
            counter = s.buffer_ptr(self.counters, index)
            before = f.op(Op.AtomicIAdd, s.u32, counter, qf,
                          s.c(MemorySemantics.AcquireRelease | MemorySemantics.UniformMemory),
                          s.c(1))
            last = f.op(Op.IEqual, s.bool, before, self._sub(P["splits"], s.c(1)))
            f.if_(last, lambda: f.emit(Op.AtomicStore, counter, qf,
                                       s.c(MemorySemantics.NONE), s.c(0)))
            s.shared_store(self.sm_flag, s.c(0), s.select(s.u32, last, s.c(1), s.c(0)))

        f.if_(f.op(Op.IEqual, s.bool, self.tid, s.c(0)), arrive)
        f.emit(Op.ControlBarrier, s.c(Scope.Workgroup), qf, sem)
        flag = s.shared_load(self.sm_flag, s.c(0))
        f.if_(f.op(Op.INotEqual, s.bool, flag, s.c(0)), self._final_merge)

    def _final_merge(self) -> None:
        """Every slot of the tile merged, four elements of a row an invocation, MERGE_UNROLL
        slots' loads in flight at a time: m = max m_s, o = sum O_s 2^(m_s - m) /
        sum l_s 2^(m_s - m) (0 where that sum is 0), rounded once to o's type."""
        s, t, f, P = self.s, self.t, self.s.f, self.P
        R, quad_cols = t.rows, t.value_dim // 4
        quads, ld = R * quad_cols, t.value_dim_padded
        zero = self._fconst(0.0)
        for q0 in range(0, quads, t.invocations):
            q = s.add(self.tid, s.c(q0))

            def quad(q: int = q) -> None:
                r = s.udiv(q, s.c(quad_cols))
                d0 = s.mul(s.umod(q, s.c(quad_cols)), s.c(4))
                m_var = f.local(self.f32, self.neg_inf)
                l_var = f.local(self.f32, zero)
                o_vars = [f.local(self.f32, zero) for _ in range(4)]
                c_var = f.local(s.u32, s.c(0))

                def chunk() -> None:
                    c0 = self._load(s.u32, c_var)
                    loaded = []
                    for j in range(MERGE_UNROLL):
                        slot = s.add(c0, s.c(j))
                        valid = s.lt(slot, P["splits"])
                        row = self._slot_row(s.select(s.u32, valid, slot, s.c(0)), r)
                        m_j = self._ws_load(self.ml, s.mul(row, s.c(2)))
                        l_j = self._ws_load(self.ml, s.add(s.mul(row, s.c(2)), s.c(1)))
                        at = s.add(s.mul(row, s.c(ld)), d0)
                        o_j = [self._ws_load(self.O, s.add(at, s.c(c))) for c in range(4)]
                        loaded.append((s.select(self.f32, valid, m_j, self.neg_inf), l_j, o_j))
                    m_old = self._load(self.f32, m_var)
                    m_new = m_old
                    for m_j, _, _ in loaded:
                        m_new = self._ext(GLSLstd450.FMax, m_new, m_j)
                    empty = f.op(Op.FOrdEqual, s.bool, m_new, self.neg_inf)
                    m_use = s.select(self.f32, empty, zero, m_new)
                    alpha = self._ext(GLSLstd450.Exp2, self._fop(Op.FSub, m_old, m_use))
                    l_sum = self._fop(Op.FMul, self._load(self.f32, l_var), alpha)
                    o_sums = [self._fop(Op.FMul, self._load(self.f32, v), alpha)
                              for v in o_vars]
                    for m_j, l_j, o_j in loaded:
                        w = self._ext(GLSLstd450.Exp2, self._fop(Op.FSub, m_j, m_use))
                        l_sum = self._fop(Op.FAdd, l_sum, self._fop(Op.FMul, l_j, w))
                        o_sums = [self._fop(Op.FAdd, acc, self._fop(Op.FMul, x, w))
                                  for acc, x in zip(o_sums, o_j, strict=True)]
                    self._store(m_var, m_new)
                    self._store(l_var, l_sum)
                    for v, value in zip(o_vars, o_sums, strict=True):
                        self._store(v, value)

                f.while_(lambda: s.lt(self._load(s.u32, c_var), P["splits"]), chunk,
                         lambda: self._store(c_var, s.add(self._load(s.u32, c_var),
                                                          s.c(MERGE_UNROLL))),
                         LoopControl.DontUnroll)
                R_all = s.add(self.r0, r)

                def write() -> None:
                    l_val = self._load(self.f32, l_var)
                    seen = f.op(Op.FOrdLessThan, s.bool, zero, l_val)
                    at = s.add(self._row_offset(R_all, "o"), d0)
                    for c, v in enumerate(o_vars):
                        value = s.select(self.f32, seen,
                                         self._fop(Op.FDiv, self._load(self.f32, v), l_val), zero)
                        if self.out_el != self.f32:
                            value = f.op(Op.FConvert, self.out_el, value)
                        s.buffer_store(self.result, s.add(at, s.c(c)), value)

                f.if_(s.lt(R_all, self.rows_total), write)

            if q0 + t.invocations <= quads:
                quad()
            else:
                f.if_(s.lt(q, s.c(quads)), quad)

    # -- the module -------------------------------------------------------------------------
    def build(self) -> bytes:
        self._declare()
        s, t, f = self.s, self.t, self.s.f
        self._setup()
        self._setup_lanes()
        self._load_q()
        self.m_vars = [f.local(self.f32, self.neg_inf) for _ in range(t.rows)]
        self.l_vars = [f.local(self.f32, self._fconst(0.0)) for _ in range(t.rows)]
        self.o_vars = [[[f.local(self.vec4, self.zero4) for _ in range(2)]
                        for _ in self.v_units] for _ in range(t.rows)]
        # Subgroup g of the workgroup walks steps g, g + subgroups, ... of the slice.
        stride = t.keys * t.subgroups
        start = s.add(self.kbeg, s.mul(self.sgid, s.c(t.keys))) if t.subgroups > 1 \
            else self.kbeg
        k_var = f.local(s.u32)
        self._store(k_var, start)
        regs: list[list[int]] = []
        if t.prefetch:
            first = self._k_loads(start)
            regs = [[f.local(self.uvec4) for _ in units] for units in first]
            self._store_all(regs, first)

        def body() -> None:
            k0 = self._load(s.u32, k_var)
            if t.prefetch:  # this step's V and the next step's K in flight with its math
                k_units = [[self._load(self.uvec4, var) for var in row] for row in regs]
                v_units = self._v_loads(k0)
                self._store_all(regs, self._k_loads(s.add(k0, s.c(stride))))
            else:
                k_units = self._k_loads(k0)
            ps, alphas = self._weights(k0, self._key_scores(k_units))
            self._accumulate_pv(v_units if t.prefetch else self._v_loads(k0), ps, alphas)

        f.while_(lambda: s.lt(self._load(s.u32, k_var), self.kend), body,
                 lambda: self._store(k_var, s.add(self._load(s.u32, k_var), s.c(stride))),
                 LoopControl.DontUnroll)
        sums = self._reduce_state()
        if t.subgroups > 1:
            self._merge_subgroups(sums)
        else:
            self._store_slot(sums)
        if t.fused_merge:
            self._merge_slices()
        return s.compute_module(t.invocations)
