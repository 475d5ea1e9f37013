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
    softmax, per row: the mask's value for the key (as attention.py reads it); -inf past
        kend and, where causal, past the row's query; the step's max over the subgroup
        (OpGroupNonUniformFMax); m' = max(m, it); p = 2^(s - m');
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

from coopmat.codegen.attention import (
    BINDING_K,
    BINDING_ML,
    BINDING_O,
    BINDING_Q,
    BINDING_V,
    PUSH_FIELDS,
    AttentionEmitter,
    _Row,
    required_capabilities,
)
from coopmat.codegen.shader import Buffer
from coopmat.codegen.spv import GLSLstd450, GroupOperation, LoopControl, Op, Scope
from coopmat.codegen.widen import UNIT_BYTES, UNIT_ELEMS, UnitWidener


def row_lanes(dim: int, subgroup_size: int) -> int:
    """Lanes that read one row of `dim` elements, a K row (L: traits.lanes_per_row, the
    policy's choice) or a V row (LV): its 16-byte units rounded up to a power of two, at
    most the subgroup."""
    units = -(-dim // UNIT_ELEMS)
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
        self.Q = s.storage_buffer(BINDING_Q, self.uvec4, UNIT_BYTES, True, "q", restrict=True)
        self.K = s.storage_buffer(BINDING_K, self.uvec4, UNIT_BYTES, True, "k", restrict=True)
        self.V = s.storage_buffer(BINDING_V, self.uvec4, UNIT_BYTES, True, "v", restrict=True)
        self.O = s.storage_buffer(BINDING_O, self.f32, 4, False, "o", restrict=True)
        self.ml = s.storage_buffer(BINDING_ML, self.f32, 4, False, "ml", restrict=True)
        self._declare_mask()
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
        self.LV = row_lanes(t.value_dim, sg)
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
        self.mask_rows: list[_Row] = []  # where the mask's row of each row starts
        for r in range(t.rows):
            R = self._min(s.add(self.r0, s.c(r)), last)
            self.query.append(self._row_query(R)[1])
            if t.mask is not None:
                self.mask_rows.append(_Row(s.c(r), self.query[-1], self._row_offset(R, "m"),
                                           0, 0, R))
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
        s, t, f = self.s, self.t, self.s.f
        j = s.add(k0, self.own_key)
        inside = s.lt(j, self.kend)
        zero = self._fconst(0.0)
        jc = self._min(j, self._sub(self.P["Lk"], s.c(1)))  # where the mask is read
        ps, alphas = [], []
        for r, score in enumerate(scores):
            if t.mask is not None:
                score = self._mask_value(self.mask_rows[r], jc, score)
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
    def _store_state(self) -> None:
        s, t, f, P = self.s, self.t, self.s.f, self.P
        wz = s.add(s.mul(self.outer, P["kv_heads"]), self.kv_head)
        slot = s.add(s.mul(wz, P["splits"]), self.split_index)
        first_row = s.add(s.mul(slot, P["rows_pad"]), self.r0)
        ld = t.value_dim_padded
        sums = []
        for r in range(t.rows):
            sums.append(self._subgroup(Op.GroupNonUniformFAdd,
                                       self._load(self.f32, self.l_vars[r])))
            for unit_vars in self.o_vars[r]:
                for var in unit_vars:
                    value = self._load(self.vec4, var)
                    h = self.LV
                    while h < t.subgroup_size:  # the value groups' shares of this unit
                        value = f.op(Op.FAdd, self.vec4, value, f.op(
                            Op.GroupNonUniformShuffleXor, self.vec4, s.c(Scope.Subgroup),
                            value, s.c(h)))
                        h *= 2
                    self._store(var, value)

        def store_o() -> None:
            for r in range(t.rows):
                row_at = s.mul(s.add(first_row, s.c(r)), s.c(ld))
                for (u, valid), unit_vars in zip(self.v_units, self.o_vars[r], strict=True):
                    at = s.add(row_at, s.mul(u, s.c(UNIT_ELEMS)))

                    def write(at: int = at, unit_vars: list[int] = unit_vars) -> None:
                        for h, var in enumerate(unit_vars):
                            value = self._load(self.vec4, var)
                            for c, e in enumerate(self.widener.order(h)):
                                s.buffer_store(self.O, s.add(at, s.c(e)), f.op(
                                    Op.CompositeExtract, self.f32, value, c))

                    if valid is None:
                        write()
                    else:
                        f.if_(valid, write)

        def store_ml() -> None:
            for r in range(t.rows):
                at = s.mul(s.add(first_row, s.c(r)), s.c(2))
                s.buffer_store(self.ml, at, self._load(self.f32, self.m_vars[r]))
                s.buffer_store(self.ml, s.add(at, s.c(1)), sums[r])

        f.if_(f.op(Op.IEqual, s.bool, self.gv, s.c(0)), store_o)
        f.if_(f.op(Op.IEqual, s.bool, self.lane, s.c(0)), store_ml)

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
        k_var = f.local(s.u32)
        self._store(k_var, self.kbeg)
        regs: list[list[int]] = []
        if t.prefetch:
            first = self._k_loads(self.kbeg)
            regs = [[f.local(self.uvec4) for _ in units] for units in first]
            self._store_all(regs, first)

        def body() -> None:
            k0 = self._load(s.u32, k_var)
            if t.prefetch:  # this step's V and the next step's K in flight with its math
                k_units = [[self._load(self.uvec4, var) for var in row] for row in regs]
                v_units = self._v_loads(k0)
                self._store_all(regs, self._k_loads(s.add(k0, s.c(t.keys))))
            else:
                k_units = self._k_loads(k0)
            ps, alphas = self._weights(k0, self._key_scores(k_units))
            self._accumulate_pv(v_units if t.prefetch else self._v_loads(k0), ps, alphas)

        f.while_(lambda: s.lt(self._load(s.u32, k_var), self.kend), body,
                 lambda: self._store(k_var, s.add(self._load(s.u32, k_var), s.c(t.keys))),
                 LoopControl.DontUnroll)
        self._store_state()
        return s.compute_module(t.invocations)
