"""Fused attention with VK_NV_cooperative_matrix2's row reductions, per-element operations
and accumulator -> A conversions (traits.family "nv2"): the khr kernel's (attention.py)
staging, key loop and stores, with each key step's softmax kept in registers.

Per key step, for each of a subgroup's row blocks (m rows), with S_j its score blocks
(m x n accumulators, one per n keys):

    S_j = Q K_j^T;  S_j = f(S_j)   per element: scale (base 2), mask, causal, keys past
                                   kend -> -inf (the row's query index comes from a matrix
                                   built once before the loop, so no division per element)
    M' = max(M, reduce_row_max(max_j S_j))    (OpCooperativeMatrixReduceNV, Row: every
                                               column of a row holds the row's value)
    P_j = 2^(S_j - M');  alpha = 2^(M - M')   (per element; M' of -inf counts as 0)
    L = L alpha + reduce_row_sum(sum_j P_j);  O *= alpha (element-wise)
    O += convert(P_j to A) V_j                (OpFConvert: float32 accumulator -> the
                                               operand type's A matrix; n = k)

M and L are accumulator matrices whose rows are constant, held in registers: no scores,
weights or row factors go through shared memory, and a step has the two barriers of the
K and V staging only (the khr kernel has four). At the end O *= 1 / L per element (0 where
L is 0); the result and a split kernel's (m, l) leave through the scratch as in khr.

OpCooperativeMatrixConvertNV changes only a matrix's Use; P changes its component type
too (float32 to float16 or bfloat16), which the spec gives to OpFConvert with the Use
relaxed (SPV_NV_cooperative_matrix2, Conversion Instructions).
"""

from __future__ import annotations

from collections.abc import Callable

from coopmat.codegen.attention import LOG2_E, AttentionEmitter, MaskKind, _Row
from coopmat.codegen.spv import (
    CooperativeMatrixLayout,
    CooperativeMatrixReduce,
    GLSLstd450,
    Op,
)


class Nv2AttentionEmitter(AttentionEmitter):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._fns: dict[str, int] = {}

    # -- functions the matrix instructions call --------------------------------------------
    def _function(self, key: str, params: list[int], body: Callable[[list[int]], int]) -> int:
        """A module function returning float32, made once per key; `body` emits its code
        (the ShaderContext helpers write into it meanwhile) and returns the result."""
        if key in self._fns:
            return self._fns[key]
        s, mb = self.s, self.s.mb
        fb = mb.function(self.f32, mb.type_function(self.f32, *params), params)
        main, s.f = s.f, fb
        try:
            fb.finish(body(fb.params))
        finally:
            s.f = main
        self._fns[key] = fb.id
        return fb.id

    def _use(self, m: int) -> int:
        """The max an exponent subtracts: 0 where nothing was seen yet (-inf)."""
        s = self.s
        empty = s.f.op(Op.FOrdEqual, s.bool, m, self.neg_inf)
        return s.select(self.f32, empty, self._fconst(0.0), m)

    def _combine(self, op: str) -> int:
        f32 = self.f32
        if op == "max":
            return self._function("max2", [f32, f32],
                                  lambda p: self._ext(GLSLstd450.FMax, p[0], p[1]))
        return self._function("add2", [f32, f32], lambda p: self._fop(Op.FAdd, p[0], p[1]))

    def _per_element(self, key: str, matrix: int, extras: list[int], extra_types: list[int],
                     body: Callable[[list[int]], int]) -> int:
        """OpCooperativeMatrixPerElementOpNV on `matrix` with `extras`; `body` gets the
        function's parameters (row, column, element, *extras)."""
        u32 = self.s.u32
        fn = self._function(key, [u32, u32, self.f32, *extra_types], body)
        return self.s.f.op(Op.CooperativeMatrixPerElementOpNV, self.mat_acc, matrix, fn,
                           *extras)

    def _reduce_rows(self, matrix: int, op: str) -> int:
        return self.s.f.op(Op.CooperativeMatrixReduceNV, self.mat_acc, matrix,
                           int(CooperativeMatrixReduce.Row), self._combine(op))

    def _max(self, a: int, b: int) -> int:
        f32 = self.f32
        return self._per_element("pe_max", a, [b], [f32],
                                 lambda p: self._ext(GLSLstd450.FMax, p[2], p[3]))

    # -- per-row state ---------------------------------------------------------------------
    def _rows(self) -> list[_Row]:
        """The lanes' rows (the stores use them), and per row block: the running max and
        sum as matrices, and the rows' query (and q head) indices as matrices."""
        rows = super()._rows()
        s, t, f = self.s, self.t, self.s.f
        zero = s.mb.const_composite(self.mat_acc, [s.mb.const_null(self.f32)])
        minus = s.mb.const_composite(self.mat_acc, [self.neg_inf])
        self.m_vars, self.l_vars, self.queries, self.heads = [], [], [], []
        for i in range(t.rows // t.m):
            self.m_vars.append(f.local(self.mat_acc, minus))
            self.l_vars.append(f.local(self.mat_acc, zero))
            first = s.add(self.r0, s.add(self.sg_row, s.c(i * t.m)))
            self.queries.append(self._per_element(
                "query", zero, [first], [s.u32], lambda p: self._row_index(p, head=False)))
            if t.mask is not None:
                self.heads.append(self._per_element(
                    "head", zero, [first, self.kv_head], [s.u32, s.u32],
                    lambda p: self._row_index(p, head=True)))
        return rows

    def _row_index(self, p: list[int], head: bool) -> int:
        """The row's query index (head False) or q head (head True) as a float."""
        s = self.s
        R = s.add(p[3], p[0])
        Rc = s.select(s.u32, s.lt(R, s.mul(s.param("groups"), s.param("Lq"))), R, s.c(0))
        value = s.add(s.mul(p[4], s.param("groups")), s.udiv(Rc, s.param("Lq"))) if head \
            else s.umod(Rc, s.param("Lq"))
        return s.f.op(Op.ConvertUToF, self.f32, value)

    def _score(self, p: list[int]) -> int:
        """One score, base 2, with the mask, causal and the key range applied. Parameters:
        row, column, score, query index, [q head], first key of the block, kend, [outer]."""
        s, t = self.s, self.t
        col, x, query = p[1], p[2], p[3]
        rest = p[4:]
        head = rest.pop(0) if t.mask is not None else None
        key0, kend = rest[0], rest[1]
        j = s.add(key0, col)
        x = self._fop(Op.FMul, x, s.param("scale_log2"))
        if t.mask is not None:
            assert head is not None and self.mask_buf is not None
            outer = rest[2]
            last = s.f.op(Op.ISub, s.u32, s.param("Lk"), s.c(1))
            jc = s.select(s.u32, s.lt(j, s.param("Lk")), j, last)
            at = s.add(s.add(s.param("m_base"), s.mul(outer, s.param("m_outer"))), s.add(
                s.mul(s.f.op(Op.ConvertFToU, s.u32, head), s.param("m_head")),
                s.add(s.mul(s.f.op(Op.ConvertFToU, s.u32, query), s.param("m_row")),
                      s.mul(jc, s.param("m_col")))))
            raw = s.buffer_load(self.mask_buf, at)
            if t.mask is MaskKind.BOOL:
                keep = s.f.op(Op.INotEqual, s.bool, raw, s.mb.const_null(self.u8))
                x = s.select(self.f32, keep, x, self.neg_inf)
            else:
                add = self._fop(Op.FMul, s.f.op(Op.FConvert, self.f32, raw),
                                self._fconst(LOG2_E))
                x = self._fop(Op.FAdd, x, add)
        causal = s.f.op(Op.INotEqual, s.bool, s.f.op(Op.BitwiseAnd, s.u32, s.param("flags"),
                                                       s.c(1)), s.c(0))
        later = s.f.op(Op.FOrdLessThan, s.bool, query, s.f.op(Op.ConvertUToF, self.f32, j))
        x = s.select(self.f32, s.and_(causal, later), self.neg_inf, x)
        return s.select(self.f32, s.lt(j, kend), x, self.neg_inf)

    # -- a key step ------------------------------------------------------------------------
    def _step(self, qf: list[list[int]], rows: list[_Row], acc_vars: list[list[int]],
              k0: int, fast: bool) -> None:
        """S, the softmax and O += P V for one key step. In a split kernel without
        prefetch, a subgroup past the rows skips it (it only stages K and V; the step has
        no barrier); elsewhere such a branch measured slower than the idle multiplies."""
        t = self.t
        if t.subgroups > 1 and t.split and not t.prefetch:
            self.s.f.if_(self.has_rows, lambda: self._multiply(qf, acc_vars, k0, fast))
        else:
            self._multiply(qf, acc_vars, k0, fast)

    def _multiply(self, qf: list[list[int]], acc_vars: list[list[int]], k0: int,
                  fast: bool) -> None:
        """fast (see _fast): the scores stay raw, the row max is taken before scaling and
        each exponent is one fma(s, scale, -m)."""
        s, t = self.s, self.t
        stride = t.tile_stride // t.unit
        zero = s.mb.const_composite(self.mat_acc, [s.mb.const_null(self.f32)])
        blocks = t.keys // t.n
        ks = [s.coop_load_shared(
            self.mat_b, self.tiles, s.c((j * t.n * t.tile_stride + kk) // t.unit),
            CooperativeMatrixLayout.ColumnMajor, s.c(stride))
            for j in range(blocks) for kk in range(0, t.head_dim_padded, t.k)]
        per = t.head_dim_padded // t.k
        u32, f32 = s.u32, self.f32
        c = self.P["scale_log2"]
        weights: list[list[int]] = []
        for i, row_vars in enumerate(acc_vars):
            scores = []
            for j in range(blocks):
                acc = zero
                for a, b in zip(qf[i], ks[j * per:(j + 1) * per], strict=True):
                    acc = s.f.op(Op.CooperativeMatrixMulAddKHR, self.mat_acc, a, b, acc)
                if fast:
                    scores.append(acc)
                    continue
                extras = [self.queries[i]] + ([self.heads[i]] if t.mask is not None else []) \
                    + [s.add(k0, s.c(j * t.n)), self.kend] \
                    + ([self.outer] if t.mask is not None else [])
                types = [f32] + ([f32] if t.mask is not None else []) + [u32, u32] + \
                    ([u32] if t.mask is not None else [])
                scores.append(self._per_element("score", acc, extras, types, self._score))
            # Blocks meet element-wise first: one row reduction a step, not one a block.
            top = scores[0]
            for sc in scores[1:]:
                top = self._max(top, sc)
            top = self._reduce_rows(top, "max")
            m_old = self._load(self.mat_acc, self.m_vars[i])
            if fast:  # a finite max: nothing to guard against -inf
                m_new = self._per_element(
                    "max_scaled", m_old, [top, c], [f32, f32],
                    lambda p: self._ext(GLSLstd450.FMax, p[2], self._fop(Op.FMul, p[3], p[4])))
                alpha = self._per_element(
                    "alpha_fast", m_old, [m_new], [f32],
                    lambda p: self._ext(GLSLstd450.Exp2, self._fop(Op.FSub, p[2], p[3])))
                ps = [self._per_element(
                    "exp_fast", sc, [m_new, c], [f32, f32],
                    lambda p: self._ext(GLSLstd450.Exp2, self._ext(
                        GLSLstd450.Fma, p[2], p[4], self._fop(Op.FNegate, p[3]))))
                    for sc in scores]
            else:
                m_new = self._max(m_old, top)
                alpha = self._per_element(
                    "alpha", m_old, [m_new], [f32],
                    lambda p: self._ext(GLSLstd450.Exp2,
                                        self._fop(Op.FSub, p[2], self._use(p[3]))))
                ps = [self._per_element(
                    "exp", sc, [m_new], [f32],
                    lambda p: self._ext(GLSLstd450.Exp2,
                                        self._fop(Op.FSub, p[2], self._use(p[3]))))
                    for sc in scores]
            total = ps[0]
            for p_j in ps[1:]:
                total = s.f.op(Op.FAdd, self.mat_acc, total, p_j)
            total = self._reduce_rows(total, "add")
            l_old = self._load(self.mat_acc, self.l_vars[i])
            self._store(self.l_vars[i], s.f.op(Op.FAdd, self.mat_acc, s.f.op(
                Op.FMul, self.mat_acc, l_old, alpha), total))
            self._store(self.m_vars[i], m_new)
            for var in row_vars:
                self._store(var, s.f.op(Op.FMul, self.mat_acc, self._load(self.mat_acc, var),
                                        alpha))
            weights.append([s.f.op(Op.FConvert, self.mat_a, p_j) for p_j in ps])
        vbase = t.keys * t.tile_stride
        vstride = t.value_stride // t.unit
        for j in range(blocks):
            for v in range(len(acc_vars[0])):
                b = s.coop_load_shared(
                    self.mat_b, self.tiles,
                    s.c((vbase + j * t.k * t.value_stride + v * t.n) // t.unit),
                    CooperativeMatrixLayout.RowMajor, s.c(vstride))
                for i, row_vars in enumerate(acc_vars):
                    var = row_vars[v]
                    self._store(var, s.f.op(Op.CooperativeMatrixMulAddKHR, self.mat_acc,
                                            weights[i][j], b, self._load(self.mat_acc, var)))

    # -- the end ---------------------------------------------------------------------------
    def _normalise(self, rows: list[_Row], acc_vars: list[list[int]]) -> None:
        s = self.s
        for i, row_vars in enumerate(acc_vars):
            inv = self._per_element(
                "inverse", self._load(self.mat_acc, self.l_vars[i]), [], [],
                lambda p: s.select(self.f32, s.f.op(Op.FOrdLessThan, s.bool,
                                                    self._fconst(0.0), p[2]),
                                   self._fop(Op.FDiv, self._fconst(1.0), p[2]),
                                   self._fconst(0.0)))
            for var in row_vars:
                self._store(var, s.f.op(Op.FMul, self.mat_acc, self._load(self.mat_acc, var),
                                        inv))

    def _row_stats(self, rows: list[_Row]) -> list[tuple[int, int]]:
        """Each lane row's (m, l), read from column 0 of the M and L matrices stored to
        the scratch in turn."""
        s, t = self.s, self.t
        out: list[list[int]] = [[] for _ in rows]
        for mats in (self.m_vars, self.l_vars):
            self._barrier()  # the scratch is free
            for i, var in enumerate(mats):
                at = s.mul(s.add(self.sg_row, s.c(i * t.m)), s.c(t.scratch_stride))
                s.coop_store_shared(self.S_sh, at, self._load(self.mat_acc, var),
                                    CooperativeMatrixLayout.RowMajor, s.c(t.scratch_stride))
            self._barrier()
            for k, row in enumerate(rows):
                srow = s.add(self.sg_row, row.local)
                out[k].append(s.shared_load(self.S_sh, s.mul(srow, s.c(t.scratch_stride))))
        return [(pair[0], pair[1]) for pair in out]
