"""The second pass of split (flash-decoding) attention: merge the partial softmax states
that a split attention kernel (attention.py, traits.split) left per slice of the keys.

Slice s of a row holds m_s (its running max, base 2), l_s (its sum of 2^(score - m_s))
and O_s (the sum of those weights times V's rows). The merged row is

    m = max_s m_s;  w_s = 2^(m_s - m);  l = sum_s l_s w_s;  o = sum_s O_s w_s / l

(0 where l is 0: no key was seen, a fully masked row), rounded once to the result type.
Each invocation computes one element of o, walking the slices twice (max, then sums).

Bindings: 0 = the partial O (float32, per slot (kv head, slice) rows_pad rows of ws_ld
elements), 1 = (m, l) per slot and row, 2 = o.
Push constants (u32): see PUSH_FIELDS; o is addressed as the attention kernel addresses
it (o_base + outer o_outer + head o_head + query o_ld + d).
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

from coopmat.codegen.shader import ShaderContext
from coopmat.codegen.spv import BuiltIn, Capability, GLSLstd450, LoopControl, Op
from coopmat.codegen.types import scalar_type, type_capabilities, type_extension, vulkan_features
from coopmat.common.dtypes import element
from coopmat.common.enums import ComponentType

PUSH_FIELDS = ("count", "groups_x", "value_dim", "ws_ld", "Lq", "groups", "kv_heads",
               "rows_pad", "splits", "o_base", "o_ld", "o_outer", "o_head")
GROUP = 256
MAX_GROUPS_X = 65535  # the least maxComputeWorkGroupCount[0] Vulkan guarantees
BINDING_PARTIAL, BINDING_ML, BINDING_OUT = 0, 1, 2


@dataclass(frozen=True)
class CombineTraits:
    out: ComponentType

    def describe(self) -> str:
        return f"attn-combine-out{element(self.out).short}"

    @property
    def storage_checks(self) -> bool:
        return True


def _capabilities(out: ComponentType) -> set[Capability]:
    return {Capability.Shader, Capability.VulkanMemoryModel,
            *type_capabilities(out, in_storage_buffer=True)}


@dataclass(frozen=True)
class CombineKernel:
    traits: CombineTraits
    spirv: bytes
    features: tuple[str, ...]
    local_size: tuple[int, int, int] = (GROUP, 1, 1)
    push_constant_size: int = 4 * len(PUSH_FIELDS)
    required_subgroup_size: int | None = None
    shared_memory_bytes: int = 0
    bindings: tuple[int, ...] = (BINDING_PARTIAL, BINDING_ML, BINDING_OUT)

    @staticmethod
    def workgroups(count: int) -> tuple[int, int, int]:
        groups = -(-count // GROUP)
        x = min(groups, MAX_GROUPS_X)
        return (x, -(-groups // x), 1)

    @staticmethod
    def push_constants(values: dict[str, int]) -> bytes:
        values = {**values, "groups_x": CombineKernel.workgroups(values["count"])[0]}
        return struct.pack(f"<{len(PUSH_FIELDS)}I", *(int(values.get(n, 0)) for n in PUSH_FIELDS))


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
    s.push_constants(PUSH_FIELDS, [s.u32] * len(PUSH_FIELDS))
    P = {name: s.param(name) for name in PUSH_FIELDS}
    wg = s.builtin(BuiltIn.WorkgroupId, mb.type_vector(s.u32, 3))
    tid = s.builtin(BuiltIn.LocalInvocationIndex, s.u32)
    wx, wy = (f.op(Op.CompositeExtract, s.u32, wg, i) for i in range(2))
    t = s.add(s.mul(s.add(s.mul(wy, P["groups_x"]), wx), s.c(GROUP)), tid)
    neg_inf, zero = mb.constant(f32, float("-inf")), mb.constant(f32, 0.0)

    def fop(op: Op, *args: int) -> int:
        return f.op(op, f32, *args)

    def ext(inst: GLSLstd450, *args: int) -> int:
        return f.op(Op.ExtInst, f32, glsl, inst, *args)

    def body() -> None:
        d = s.umod(t, P["value_dim"])
        rest = s.udiv(t, P["value_dim"])
        rows = s.mul(P["groups"], P["Lq"])
        R, slot0 = s.umod(rest, rows), s.mul(s.udiv(rest, rows), P["splits"])

        def row_of(sl: int) -> int:  # this row's index among the workspace's rows
            return s.add(s.mul(s.add(slot0, sl), P["rows_pad"]), R)

        def walk(each: object) -> None:
            i_var = f.local(s.u32, s.c(0))

            def step() -> None:
                f.emit(Op.Store, i_var, s.add(f.op(Op.Load, s.u32, i_var), s.c(1)))

            f.while_(lambda: s.lt(f.op(Op.Load, s.u32, i_var), P["splits"]),
                     lambda: each(f.op(Op.Load, s.u32, i_var)),  # type: ignore[operator]
                     step, LoopControl.DontUnroll)

        m_var = f.local(f32, neg_inf)
        walk(lambda sl: f.emit(Op.Store, m_var, ext(
            GLSLstd450.FMax, f.op(Op.Load, f32, m_var),
            s.buffer_load(ml, s.mul(row_of(sl), s.c(2))))))
        m = f.op(Op.Load, f32, m_var)
        m_use = s.select(f32, f.op(Op.FOrdEqual, s.bool, m, neg_inf), zero, m)
        l_var, o_var = f.local(f32, zero), f.local(f32, zero)

        def accumulate(sl: int) -> None:
            row = row_of(sl)
            at = s.mul(row, s.c(2))
            w = ext(GLSLstd450.Exp2, fop(Op.FSub, s.buffer_load(ml, at), m_use))
            l_s = s.buffer_load(ml, s.add(at, s.c(1)))
            f.emit(Op.Store, l_var, fop(Op.FAdd, f.op(Op.Load, f32, l_var), fop(Op.FMul, l_s, w)))
            o_s = s.buffer_load(partial, s.add(s.mul(row, P["ws_ld"]), d))
            f.emit(Op.Store, o_var, fop(Op.FAdd, f.op(Op.Load, f32, o_var), fop(Op.FMul, o_s, w)))

        walk(accumulate)
        l_val = f.op(Op.Load, f32, l_var)
        seen = f.op(Op.FOrdLessThan, s.bool, zero, l_val)
        value = s.select(f32, seen, fop(Op.FDiv, f.op(Op.Load, f32, o_var), l_val), zero)
        if out_el != f32:
            value = f.op(Op.FConvert, out_el, value)
        zz = s.udiv(rest, rows)
        outer, kv = s.udiv(zz, P["kv_heads"]), s.umod(zz, P["kv_heads"])
        head = s.add(s.mul(kv, P["groups"]), s.udiv(R, P["Lq"]))
        at = s.add(P["o_base"], s.add(s.add(s.mul(outer, P["o_outer"]), s.mul(head, P["o_head"])),
                                      s.add(s.mul(s.umod(R, P["Lq"]), P["o_ld"]), d)))
        s.buffer_store(out, at, value)

    f.if_(s.lt(t, P["count"]), body)
    return s.compute_module(GROUP)


@functools.cache
def combine_kernel(out: ComponentType) -> CombineKernel:
    traits = CombineTraits(out)
    caps = _capabilities(out)
    return CombineKernel(traits, _emit(traits),
                         tuple(sorted(set(vulkan_features(caps)) | set(element(out).features)
                                      if out != ComponentType.FLOAT32 else vulkan_features(caps))))
