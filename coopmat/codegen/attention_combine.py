"""The second pass of split (flash-decoding) attention: merge the partial softmax states
that a split attention kernel (attention.py, traits.split) left per slice of the keys.

Slice s of a row holds m_s (its running max, base 2), l_s (its sum of 2^(score - m_s))
and O_s (the sum of those weights times V's rows). The merged row is

    m = max_s m_s;  w_s = 2^(m_s - m);  l = sum_s l_s w_s;  o = sum_s O_s w_s / l

(0 where l is 0: no key was seen, a fully masked row), rounded once to the result type.

One workgroup (traits.invocations of them) merges COLS consecutive elements of one row,
so that its time does not grow a dependent load per slice; invocation i takes element
i mod COLS and every slice_lanes-th slice from i / COLS. No subgroup operations: any
device runs it. Two ways, by the slice count (a push constant, so the branch is uniform):
- at most UNROLL x slice_lanes slices (decode's usual count): each invocation loads its
  slices' O, m and l in one round, the row's max meets in shared memory once, and each
  invocation sums O_s w_s and l_s w_s over its slices; the slice_lanes partial sums meet
  in shared memory. One round of global loads in all.
- more: the slices' m first (a slice an invocation, reduced through shared memory); then,
  as many slices at a time as there are invocations, w_s and l_s w_s in shared memory and
  each invocation sums O_s w_s over its slices of them, UNROLL loads in flight.

Bindings: 0 = the partial O (float32, per slot (kv head, slice) rows_pad rows of ws_ld
elements), 1 = (m, l) per slot and row, 2 = o.
Push constants (u32): see PUSH_FIELDS; `count` is the number of workgroups (merged rows
times column blocks, workgroup_count); o is addressed as the attention kernel addresses
it (o_base + outer o_outer + head o_head + query o_ld + d).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from coopmat.codegen.shader import ShaderContext, folded_grid, folded_push_constants
from coopmat.codegen.spv import BuiltIn, Capability, GLSLstd450, LoopControl, Op, Scope
from coopmat.codegen.types import scalar_type, type_capabilities, type_extension, vulkan_features
from coopmat.common.dtypes import element
from coopmat.common.enums import ComponentType

PUSH_FIELDS = ("count", "groups_x", "value_dim", "ws_ld", "Lq", "groups", "kv_heads",
               "rows_pad", "splits", "o_base", "o_ld", "o_outer", "o_head")
COLS = 32  # elements of a row one workgroup merges: one 128-byte line of a slice's O
INVOCATIONS = (256, 512)  # workgroup sizes the merge is written for
UNROLL = 8  # independent loads of O an invocation keeps in flight
FOLD = 32  # the (m, l) reductions fold a workgroup's values in FOLD groups, then FOLD values
BINDING_PARTIAL, BINDING_ML, BINDING_OUT = 0, 1, 2


@dataclass(frozen=True)
class CombineTraits:
    out: ComponentType
    invocations: int = 256  # one of INVOCATIONS; also the slices weighed at once

    def describe(self) -> str:
        return f"attn-combine-out{element(self.out).short}-i{self.invocations}"

    @property
    def slice_lanes(self) -> int:
        """Invocations that share an element, each every slice_lanes-th slice."""
        return self.invocations // COLS

    @property
    def storage_checks(self) -> bool:
        return True


def _capabilities(out: ComponentType) -> set[Capability]:
    return {Capability.Shader, Capability.VulkanMemoryModel,
            *type_capabilities(out, in_storage_buffer=True)}


def merged_at_once(invocations: int) -> int:
    """The most slices a workgroup of `invocations` merges in one round of loads."""
    return UNROLL * (invocations // COLS)


def workgroup_count(rows: int, value_dim: int) -> int:
    """Workgroups that merge `rows` rows (kv heads x rows of each) of value_dim elements."""
    return rows * -(-value_dim // COLS)


@dataclass(frozen=True)
class CombineKernel:
    traits: CombineTraits
    spirv: bytes
    features: tuple[str, ...]
    push_constant_size: int = 4 * len(PUSH_FIELDS)
    required_subgroup_size: int | None = None
    bindings: tuple[int, ...] = (BINDING_PARTIAL, BINDING_ML, BINDING_OUT)

    @property
    def local_size(self) -> tuple[int, int, int]:
        return (self.traits.invocations, 1, 1)

    @property
    def shared_memory_bytes(self) -> int:
        return 4 * (3 * self.traits.invocations + FOLD)

    @staticmethod
    def workgroups(count: int) -> tuple[int, int, int]:
        """The grid of `count` workgroups (workgroup_count)."""
        return folded_grid(count)

    @staticmethod
    def push_constants(values: dict[str, int]) -> bytes:
        return folded_push_constants("attention merge", PUSH_FIELDS, values)


def _emit(traits: CombineTraits) -> bytes:
    s = ShaderContext()
    mb, f = s.mb, s.f
    type_ext = type_extension(traits.out)
    if type_ext:
        mb.extension(type_ext)
    mb.capability(*sorted(_capabilities(traits.out)))
    glsl = mb.ext_inst_import("GLSL.std.450")
    f32 = mb.type_float(32)
    out_el = scalar_type(mb, traits.out)
    partial = s.storage_buffer(BINDING_PARTIAL, f32, 4, True, "partial", restrict=True)
    ml = s.storage_buffer(BINDING_ML, f32, 4, True, "ml", restrict=True)
    out = s.storage_buffer(BINDING_OUT, out_el, element(traits.out).itemsize, False, "o",
                           restrict=True)
    group, lanes = traits.invocations, traits.slice_lanes
    weights = s.shared_array(f32, group, "weights")
    sums = s.shared_array(f32, group, "sums")  # the partial sums of each element
    fold = s.shared_array(f32, group, "fold")
    folded = s.shared_array(f32, FOLD, "folded")
    s.push_constants(PUSH_FIELDS, [s.u32] * len(PUSH_FIELDS))
    P = {name: s.param(name) for name in PUSH_FIELDS}
    wg = s.builtin(BuiltIn.WorkgroupId, mb.type_vector(s.u32, 3))
    tid = s.builtin(BuiltIn.LocalInvocationIndex, s.u32)
    wx, wy = (f.op(Op.CompositeExtract, s.u32, wg, i) for i in range(2))
    wg_index = s.add(s.mul(wy, P["groups_x"]), wx)
    neg_inf, zero = mb.constant(f32, float("-inf")), mb.constant(f32, 0.0)

    def fop(op: Op, *args: int) -> int:
        return f.op(op, f32, *args)

    def ext(inst: GLSLstd450, *args: int) -> int:
        return f.op(Op.ExtInst, f32, glsl, inst, *args)

    def fadd(a: int, b: int) -> int:
        return fop(Op.FAdd, a, b)

    def fmax(a: int, b: int) -> int:
        return ext(GLSLstd450.FMax, a, b)

    def load(var: int) -> int:
        return f.op(Op.Load, f32, var)

    def count_loop(start: int, bound: Callable[[int], int], step: int,
                   body: Callable[[int], None]) -> None:
        """for (i = start; bound(i); i += step) body(i), not unrolled."""
        i_var = f.local(s.u32)
        f.emit(Op.Store, i_var, start)
        f.while_(lambda: bound(f.op(Op.Load, s.u32, i_var)),
                 lambda: body(f.op(Op.Load, s.u32, i_var)),
                 lambda: f.emit(Op.Store, i_var, s.add(f.op(Op.Load, s.u32, i_var), s.c(step))),
                 LoopControl.DontUnroll)

    def reduce(value: int, combine: Callable[[int, int], int]) -> int:
        """`value` combined over the workgroup's invocations, in every invocation."""
        s.shared_store(fold, tid, value)
        s.barrier(Scope.Workgroup)

        def first() -> None:
            base = s.mul(tid, s.c(group // FOLD))
            acc = s.shared_load(fold, base)
            for k in range(1, group // FOLD):
                acc = combine(acc, s.shared_load(fold, s.add(base, s.c(k))))
            s.shared_store(folded, tid, acc)

        f.if_(s.lt(tid, s.c(FOLD)), first)
        s.barrier(Scope.Workgroup)
        acc = s.shared_load(folded, s.c(0))
        for k in range(1, FOLD):
            acc = combine(acc, s.shared_load(folded, s.c(k)))
        return acc

    def body() -> None:
        blocks = s.udiv(s.add(P["value_dim"], s.c(COLS - 1)), s.c(COLS))
        rest, col = s.udiv(wg_index, blocks), s.umod(wg_index, blocks)
        lane, slice_lane = s.umod(tid, s.c(COLS)), s.udiv(tid, s.c(COLS))
        d = s.add(s.mul(col, s.c(COLS)), lane)
        rows = s.mul(P["groups"], P["Lq"])
        R, slot0 = s.umod(rest, rows), s.mul(s.udiv(rest, rows), P["splits"])
        splits = P["splits"]
        first_row = s.add(s.mul(slot0, P["rows_pad"]), R)  # slice 0's row in the workspace
        ml_at = s.mul(first_row, s.c(2))
        ml_step = s.mul(P["rows_pad"], s.c(2))
        o_step = s.mul(P["rows_pad"], P["ws_ld"])

        d_ok = s.lt(d, P["value_dim"])

        def write(l_val: int) -> None:
            """Column `lane`'s sum over the slice lanes' partial sums (in `sums`) over
            l_val, rounded to o (0 where l_val is 0: no key was seen)."""
            o_sum = s.shared_load(sums, lane)
            for g in range(1, lanes):
                o_sum = fadd(o_sum, s.shared_load(sums, s.add(lane, s.c(g * COLS))))
            seen = f.op(Op.FOrdLessThan, s.bool, zero, l_val)
            value = s.select(f32, seen, fop(Op.FDiv, o_sum, l_val), zero)
            if out_el != f32:
                value = f.op(Op.FConvert, out_el, value)
            zz = s.udiv(rest, rows)
            outer, kv = s.udiv(zz, P["kv_heads"]), s.umod(zz, P["kv_heads"])
            head = s.add(s.mul(kv, P["groups"]), s.udiv(R, P["Lq"]))
            at = s.add(P["o_base"], s.add(
                s.add(s.mul(outer, P["o_outer"]), s.mul(head, P["o_head"])),
                s.add(s.mul(s.umod(R, P["Lq"]), P["o_ld"]), d)))
            s.buffer_store(out, at, value)

        def at_once() -> None:
            """Every slice's O, m and l loaded together (UNROLL slices an invocation at
            most): one round of loads, then the max and the sums each through shared
            memory once."""
            js = [s.add(slice_lane, s.c(u * lanes)) if u else slice_lane
                  for u in range(UNROLL)]
            inside = [s.lt(j, splits) for j in js]
            safe = [s.select(s.u32, ok, j, s.c(0)) for ok, j in zip(inside, js, strict=True)]
            d_safe = s.select(s.u32, d_ok, d, s.c(0))
            o_base = s.add(s.mul(first_row, P["ws_ld"]), d_safe)
            o_s = [s.buffer_load(partial, s.add(o_base, s.mul(j, o_step))) for j in safe]
            ats = [s.add(ml_at, s.mul(j, ml_step)) for j in safe]
            m_s = [s.select(f32, ok, s.buffer_load(ml, at), neg_inf)
                   for ok, at in zip(inside, ats, strict=True)]
            l_s = [s.buffer_load(ml, s.add(at, s.c(1))) for at in ats]
            top = m_s[0]
            for m_u in m_s[1:]:
                top = fmax(top, m_u)
            s.shared_store(fold, tid, top)
            s.barrier(Scope.Workgroup)
            m = s.shared_load(fold, s.c(0))
            for g in range(1, lanes):
                m = fmax(m, s.shared_load(fold, s.c(g * COLS)))
            m_use = s.select(f32, f.op(Op.FOrdEqual, s.bool, m, neg_inf), zero, m)
            acc, l_sum = zero, zero
            for ok, o_u, m_u, l_u in zip(inside, o_s, m_s, l_s, strict=True):
                w = ext(GLSLstd450.Exp2, fop(Op.FSub, m_u, m_use))
                # selected, not multiplied by a zero weight: a slice past the end reads
                # slice 0 again, and its values must add nothing
                acc = fadd(acc, s.select(f32, ok, fop(Op.FMul, o_u, w), zero))
                l_sum = fadd(l_sum, s.select(f32, ok, fop(Op.FMul, l_u, w), zero))
            s.shared_store(sums, tid, acc)
            s.shared_store(weights, tid, l_sum)  # this way weighs in registers: free here
            s.barrier(Scope.Workgroup)

            def finish() -> None:
                l_val = s.shared_load(weights, s.c(0))
                for g in range(1, lanes):
                    l_val = fadd(l_val, s.shared_load(weights, s.c(g * COLS)))
                write(l_val)

            f.if_(s.and_(s.lt(tid, s.c(COLS)), d_ok), finish)

        def in_chunks() -> None:
            """Any number of slices: the max first, then as many slices at a time as
            the workgroup has invocations, their weights through shared memory."""
            o_at = s.add(s.mul(first_row, P["ws_ld"]), d)
            m_var = f.local(f32, neg_inf)
            count_loop(tid, lambda i: s.lt(i, splits), group, lambda i: f.emit(
                Op.Store, m_var, fmax(load(m_var), s.buffer_load(ml, s.add(ml_at, s.mul(
                    i, ml_step))))))
            m = reduce(load(m_var), fmax)
            m_use = s.select(f32, f.op(Op.FOrdEqual, s.bool, m, neg_inf), zero, m)

            l_var = f.local(f32, zero)
            accs = [f.local(f32, zero) for _ in range(UNROLL)]

            def chunk(c0: int) -> None:
                sl = s.add(c0, tid)

                def weigh() -> None:
                    at = s.add(ml_at, s.mul(sl, ml_step))
                    w = ext(GLSLstd450.Exp2, fop(Op.FSub, s.buffer_load(ml, at), m_use))
                    l_s = s.buffer_load(ml, s.add(at, s.c(1)))
                    f.emit(Op.Store, l_var, fadd(load(l_var), fop(Op.FMul, l_s, w)))
                    s.shared_store(weights, tid, w)

                f.if_(s.lt(sl, splits), weigh)
                s.barrier(Scope.Workgroup)
                left = f.op(Op.ISub, s.u32, splits, c0)
                n = s.select(s.u32, s.lt(left, s.c(group)), left, s.c(group))

                def terms(j: int) -> None:
                    """Slices j, j + lanes, ... (UNROLL of them) of the chunk; those past
                    its end read slice j again and add nothing, so that every pass keeps
                    UNROLL loads in flight."""
                    js = [s.add(j, s.c(u * lanes)) for u in range(UNROLL)]
                    inside = [s.lt(ju, n) for ju in js]
                    js = [j] + [s.select(s.u32, ok, ju, j)
                                for ok, ju in zip(inside[1:], js[1:], strict=True)]
                    o_s = [s.buffer_load(partial, s.add(o_at, s.mul(s.add(c0, ju), o_step)))
                           for ju in js]
                    for u, ju in enumerate(js):
                        term = fop(Op.FMul, o_s[u], s.shared_load(weights, ju))
                        if u:
                            term = s.select(f32, inside[u], term, zero)
                        f.emit(Op.Store, accs[u], fadd(load(accs[u]), term))

                f.if_(d_ok, lambda: count_loop(slice_lane, lambda j: s.lt(j, n),
                                               UNROLL * lanes, terms))
                s.barrier(Scope.Workgroup)  # the next chunk's weights replace these

            count_loop(s.c(0), lambda c0: s.lt(c0, splits), group, chunk)
            l_val = reduce(load(l_var), fadd)
            acc = load(accs[0])
            for a in accs[1:]:
                acc = fadd(acc, load(a))
            s.shared_store(sums, tid, acc)
            s.barrier(Scope.Workgroup)
            f.if_(s.and_(s.lt(tid, s.c(COLS)), d_ok), lambda: write(l_val))

        # splits is a push constant: the branch is uniform, its barriers are safe
        f.if_(s.le(splits, s.c(merged_at_once(group))), at_once, in_chunks)

    f.if_(s.lt(wg_index, P["count"]), body)  # uniform in a workgroup: its barriers are safe
    return s.compute_module(group)


@functools.cache
def combine_kernel(out: ComponentType, invocations: int = 256) -> CombineKernel:
    """The merge rounding to `out`, in workgroups of `invocations` (one of INVOCATIONS)."""
    if invocations not in INVOCATIONS:
        raise ValueError(f"attention merge: {invocations} invocations is none of {INVOCATIONS}")
    traits = CombineTraits(out, invocations)
    caps = _capabilities(out)
    return CombineKernel(traits, _emit(traits),
                         tuple(sorted(set(vulkan_features(caps)) | set(element(out).features)
                                      if out != ComponentType.FLOAT32 else vulkan_features(caps))))
