"""The split-K reduction: the second dispatch of a split-K GEMM (issue #16).

A split-K GEMM (policy.kernel.split_k_for, KernelChoice.split_k = S) runs the product as
a batched khr GEMM of S problems, slice s reading K range [s Ks, (s + 1) Ks) with
Ks = K / S, and writes S float32 partial products to a workspace P of S x M x N (row
stride ldp, slice stride stride_p): few-row products get S times as many workgroups to
read the weight with. This kernel then finishes what the GEMM's own epilogue would have
done, per element of D:

    sum = P[0][m, n] + P[1][m, n] + ... + P[S-1][m, n]          (float32, in slice order)
    D[m, n] = act(alpha * sum + beta * C[m, n] + bias[n]) + residual[m, n]

with the shared emitters (epilogue.Epilogue, epilogue.buffer_element_ops): C, bias and
residual read in D's type and widened, everything in float32, rounded to D's type once.
So a float16 result is rounded once from a float32 sum, as the unsplit kernel rounds
its float32 accumulator once; only the order of the float32 additions differs.

One invocation per element: workgroup (x, y) covers GROUP_X columns of row y. No shared
memory, no barriers, no subgroup operations; the grid is (ceil(N / GROUP_X), M, 1).
C, D and the residual are row-major with leading dimensions ldc, ldd and ldd (abi.py's
convention for the GEMM kernels), one matrix (batch 1).

Push constants (4 bytes each): PUSH_FIELDS; alpha and beta float32, the rest u32.
Bindings: 0 = partials (float32), 2 = D, 3 = C (with C), 4 = bias, 5 = residual (with the
fused operations asking for them): the GEMM ABI's numbers (abi.py) where they mean the
same thing, so the fused epilogue's declarations are shared.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

from coopmat.codegen import abi
from coopmat.codegen.epilogue import Epilogue, Types, buffer_element_ops, epilogue_buffers
from coopmat.codegen.plan import element_bytes
from coopmat.codegen.shader import ShaderContext
from coopmat.codegen.spv import BuiltIn, Capability, Op
from coopmat.codegen.traits import EpilogueOps
from coopmat.codegen.types import (
    scalar_type,
    type_capabilities,
    type_extension,
    vulkan_features,
)
from coopmat.device.enums import ComponentType
from coopmat.dtypes import element

PUSH_FIELDS = ("M", "N", "S", "ldp", "stride_p", "ldc", "ldd", "alpha", "beta")
BINDING_PARTIALS = abi.BINDING_A
# Columns per workgroup: a multiple of every maxSubgroupSize (the pipeline asks no subgroup
# size, so Vulkan wants the x size to be one), and small enough that a 4096-wide row of D
# still spreads over 64 workgroups per row.
GROUP_X = 64


@dataclass(frozen=True)
class ReduceTraits:
    """What the reduction kernel is built for (its pipeline cache key): D's stored type,
    whether C is read, and the fused operations (None: none)."""

    stored_type: ComponentType
    has_c: bool
    ops: EpilogueOps | None = None

    def describe(self) -> str:
        name = f"splitk-reduce-f32-{element(self.stored_type).name}"
        if self.has_c:
            name += "-c"
        if self.ops is not None:
            name += self.ops.describe()
        return name


@dataclass(frozen=True)
class ReduceKernel:
    """What PipelineCache and the dispatcher need of the reduction kernel."""

    traits: ReduceTraits
    spirv: bytes
    local_size: tuple[int, int, int] = (GROUP_X, 1, 1)
    required_subgroup_size: int | None = None
    shared_memory_bytes: int = 0
    push_constant_size: int = 4 * len(PUSH_FIELDS)
    bindings: tuple[int, ...] = ()
    features: tuple[str, ...] = ()

    @staticmethod
    def workgroups(M: int, N: int) -> tuple[int, int, int]:
        return (-(-N // GROUP_X), M, 1)

    @staticmethod
    def push_constants(M: int, N: int, S: int, ldp: int, stride_p: int, ldc: int, ldd: int,
                       alpha: float, beta: float) -> bytes:
        if min(M, N, S) < 1 or ldp < N or ldd < N or (S > 1 and stride_p < (M - 1) * ldp + N):
            raise ValueError("the split-K reduction needs M, N, S >= 1, ldp and ldd >= N, "
                             "and non-overlapping partials")
        for v in (S * stride_p, M * ldc, M * ldd):
            if v > abi.U32_MAX:
                raise ValueError("the kernels index with 32 bits; the workspace is too large")
        return struct.pack("<7I2f", M, N, S, ldp, stride_p, ldc, ldd, alpha, beta)


def bindings(traits: ReduceTraits) -> tuple[int, ...]:
    out = [BINDING_PARTIALS, abi.BINDING_D] + ([abi.BINDING_C] if traits.has_c else [])
    if traits.ops is not None:
        out += [abi.BINDING_BIAS] if traits.ops.bias else []
        out += [abi.BINDING_RESIDUAL] if traits.ops.residual else []
    return tuple(out)


def required_capabilities(traits: ReduceTraits) -> set[Capability]:
    caps = {Capability.Shader, Capability.VulkanMemoryModel}
    caps.update(type_capabilities(traits.stored_type, in_storage_buffer=True))
    return caps


def _emit(traits: ReduceTraits) -> bytes:
    if not element(traits.stored_type).is_float:
        raise ValueError("the split-K reduction stores float results only")
    s = ShaderContext()
    mb, f = s.mb, s.f
    ext = type_extension(traits.stored_type)
    if ext:
        mb.extension(ext)
    mb.capability(*sorted(required_capabilities(traits)))
    f32 = mb.type_float(32)
    o_el = scalar_type(mb, traits.stored_type)
    ob = element_bytes(traits.stored_type)
    partials = s.storage_buffer(BINDING_PARTIALS, f32, 4, True, "partials", restrict=True)
    D = s.storage_buffer(abi.BINDING_D, o_el, ob, False, "D")
    C = s.storage_buffer(abi.BINDING_C, o_el, ob, True, "C") if traits.has_c else None
    bias, residual = epilogue_buffers(s, traits.ops, o_el, ob)
    s.push_constants(PUSH_FIELDS, [s.u32] * 7 + [f32, f32])
    v3 = mb.type_vector(s.u32, 3)
    wg = s.builtin(BuiltIn.WorkgroupId, v3)
    lid = s.builtin(BuiltIn.LocalInvocationIndex, s.u32)
    P = {name: s.param(name) for name in PUSH_FIELDS}
    col = s.add(s.mul(f.op(Op.CompositeExtract, s.u32, wg, 0), s.c(GROUP_X)), lid)
    row = f.op(Op.CompositeExtract, s.u32, wg, 1)
    epilogue = Epilogue(s, float_result=True, acc_el=f32, acc_is_f32=True,
                        alpha=P["alpha"], beta=P["beta"])
    element_ops = buffer_element_ops(s, traits.ops, float_result=True, stored_el=o_el,
                                     bias=bias, residual=residual, base_d=s.c(0),
                                     ldd=P["ldd"])

    def body() -> None:
        # The S partials of this element, summed in slice order.
        at = s.add(s.mul(row, P["ldp"]), col)
        sum_var = f.local(f32, mb.constant(f32, 0.0))
        i_var = f.local(s.u32, s.c(0))

        def add_slice() -> None:
            i = f.op(Op.Load, s.u32, i_var)
            x = s.buffer_load(partials, s.add(at, s.mul(i, P["stride_p"])))
            f.emit(Op.Store, sum_var, f.op(Op.FAdd, f32, f.op(Op.Load, f32, sum_var), x))

        f.while_(lambda: s.lt(f.op(Op.Load, s.u32, i_var), P["S"]), add_slice,
                 lambda: f.emit(Op.Store, i_var, s.add(f.op(Op.Load, s.u32, i_var), s.c(1))))
        total = f.op(Op.Load, f32, sum_var)

        def load_c(out_type: int) -> int:
            assert C is not None
            return s.buffer_load(C, s.add(s.mul(row, P["ldc"]), col))

        types = Types(f32, o_el)
        c_loader = load_c if C is not None else None
        if element_ops is None:
            value = epilogue.apply(types, total, c_loader, matrix=False)
        else:
            value = element_ops.apply(epilogue.combine(types, total, c_loader, matrix=False),
                                      f32, row, col, o_el)
        s.buffer_store(D, s.add(s.mul(row, P["ldd"]), col), value)

    # Columns past N (the last workgroup of a row) have nothing to do.
    f.if_(s.lt(col, P["N"]), body)
    return s.compute_module(GROUP_X)


@functools.cache
def reduce_kernel(traits: ReduceTraits) -> ReduceKernel:
    """The reduction kernel for `traits` (built once per process)."""
    return ReduceKernel(traits, _emit(traits), bindings=bindings(traits),
                        features=vulkan_features(required_capabilities(traits)))
