"""A helper kernel: dequantize a GGUF weight (q8_0 / q4_0 blocks) into a float16 or
bfloat16 B, K-contiguous, before a GEMM that reads it as a float B.

Where a product is bound by the tensor cores (many rows), dequantizing inside the GEMM's
staging costs each workgroup that reads a B tile the work again (M / tile_m times over);
one pass first costs one read of the blocks and one write of the float weight, after
which the float kernel (its tuned tiles, split-K rule and all) runs unchanged. The policy
picks it (policy.kernel.dequantizes_first).

The arithmetic is codegen/quant.py's QuantReader, the khr kernel's staging path: weight
values are made without integer-to-float conversions and multiplied by the block's scale
with one rounding to the operand type, so the float B holds exactly the values the fused
kernel would stage.

Each invocation writes one unit of 8 consecutive weights of one weight row (one 16-byte
vector): row n's K weights go to dst[n * ld + k]. The grid is flat over the N * K / 8
units, folded into x and y (at most MAX_GROUPS_X workgroups along x).

Push constants (u32): K, N, ld (of dst, in elements: a multiple of 8), groups_x.
Bindings: 0 = the blocks (32-bit words; QUANT_PAD_BYTES past the last block readable),
1 = dst (16-byte vectors).
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

from coopmat.codegen.kernel import HelperKernel
from coopmat.codegen.quant import QuantReader
from coopmat.codegen.shader import ShaderContext, folded_grid
from coopmat.codegen.spv import BuiltIn, Capability, Op
from coopmat.codegen.types import scalar_type, type_capabilities, type_extension, vulkan_features
from coopmat.common.enums import ComponentType
from coopmat.common.quant_formats import BLOCK_ELEMS, quant_format

PUSH_FIELDS = ("K", "N", "ld", "groups_x")
UNIT = 8  # weights an invocation writes: one 16-byte vector of 16-bit values
GROUP = 256
OPERAND_TYPES = (ComponentType.FLOAT16, ComponentType.BFLOAT16)


@dataclass(frozen=True)
class DequantTraits:
    """What the kernel is built for (its pipeline cache key)."""

    quant: str  # "q8_0" or "q4_0"
    operand_type: ComponentType  # float16 or bfloat16

    def describe(self) -> str:
        return f"dequant-{self.quant}-{self.operand_type.name.lower()}"


@dataclass(frozen=True)
class DequantKernel(HelperKernel):
    local_size: tuple[int, int, int] = (GROUP, 1, 1)
    push_constant_size: int = 4 * len(PUSH_FIELDS)

    @staticmethod
    def workgroups(K: int, N: int) -> tuple[int, int, int]:
        return folded_grid(-(-(N * K // UNIT) // GROUP))

    @staticmethod
    def push_constants(K: int, N: int, ld: int) -> bytes:
        if K % BLOCK_ELEMS or ld % UNIT or ld < K:
            raise ValueError(f"dequantizing needs K a multiple of {BLOCK_ELEMS} and the float "
                             f"B's leading dimension a multiple of {UNIT}, at least K")
        if N * ld >= 1 << 32:
            raise ValueError("the kernels index with 32 bits; the dequantized weight is too "
                             "large")
        return struct.pack("<4I", K, N, ld, DequantKernel.workgroups(K, N)[0])


def _capabilities(operand: ComponentType) -> set[Capability]:
    """Beyond ShaderContext's own: float16 for the blocks' scales and the packed
    arithmetic, and the operand type's."""
    return {Capability.Float16, *type_capabilities(operand, in_storage_buffer=False)}


def _emit(traits: DequantTraits) -> bytes:
    if traits.operand_type not in OPERAND_TYPES:
        raise ValueError(f"dequantizing to {traits.operand_type.name} is not supported; "
                         f"float16 or bfloat16")
    s = ShaderContext()
    mb, f = s.mb, s.f
    ext = type_extension(traits.operand_type)
    if ext:
        mb.extension(ext)
    mb.capability(*sorted(_capabilities(traits.operand_type)))
    uvec4 = mb.type_vector(s.u32, 4)
    src = s.storage_buffer(0, s.u32, 4, True, "blocks", restrict=True)
    dst = s.storage_buffer(1, uvec4, 16, False, "dst", restrict=True)
    s.push_constants(PUSH_FIELDS, [s.u32] * len(PUSH_FIELDS))
    P = {name: s.param(name) for name in PUSH_FIELDS}
    reader = QuantReader(s, quant_format(traits.quant), src, scalar_type(mb, traits.operand_type),
                         uvec4, UNIT, P["K"], s.c(0))
    v3 = mb.type_vector(s.u32, 3)
    wg = s.builtin(BuiltIn.WorkgroupId, v3)
    tid = s.builtin(BuiltIn.LocalInvocationIndex, s.u32)
    wx, wy = (f.op(Op.CompositeExtract, s.u32, wg, i) for i in range(2))
    unit = s.add(s.mul(s.add(s.mul(wy, P["groups_x"]), wx), s.c(GROUP)), tid)
    per_row = s.udiv(P["K"], s.c(UNIT))  # units a row
    n, k = s.udiv(unit, per_row), s.mul(s.umod(unit, per_row), s.c(UNIT))

    def body() -> None:
        vec, = reader.load(n, k, None)  # one 16-byte vector: UNIT 16-bit values
        s.buffer_store(dst, s.udiv(s.add(s.mul(n, P["ld"]), k), s.c(UNIT)), vec)

    f.if_(s.lt(n, P["N"]), body)
    return s.compute_module(GROUP)


@functools.cache
def dequant_kernel(quant: str, operand_type: ComponentType) -> DequantKernel:
    traits = DequantTraits(quant, operand_type)
    return DequantKernel(traits, _emit(traits), vulkan_features(
        _capabilities(operand_type) | {Capability.VulkanMemoryModel}))
