"""A helper kernel: activations x (M x K float16, row-major) quantized to q8_1 blocks, the
first pass of the opt-in integer product (coopmat.matmul's activation_quant="q8_1"; the
second is gemv_q8_1.py).

Each block of 32 consecutive elements of a row becomes llama.cpp's q8_1 values (ggml's
quantize_row_q8_1_ref): d = amax / 127 (amax: the block's largest |x|), qs = x * (1 / d)
rounded half away from zero (C's roundf) as int8 (0 where d = 0), s = d * sum(qs). d and
s stay float32 (ggml stores them as float16): the integer kernel scales by them once per
block and row.

Layout: a block takes A_BLOCK_UNITS = 4 16-byte units, row m's block b from unit 4 (m nb +
b) (nb = K / 32): units 0 and 1 the 32 qs bytes in order, unit 2 (d, s, 0, 0) as float32
bits, unit 3 unused. A row is thus as long as a float16 row of x (K elements, the gemv
kernel's lda), and a block where a float16 x's block would be.

One invocation quantizes one block, its 32 elements as 8 float32 vec4s: amax by FMax over
them, roundf as trunc(t) + sign(t) where |t - trunc(t)| >= 1/2 (exact: t - trunc(t) is),
the 32 int8 packed 4 to a word. The grid is flat over the M * nb blocks, folded into x
and y (at most MAX_GROUPS_X workgroups along x).

Push constants (u32): K, M, lda (x's row stride in elements, a multiple of 8), groups_x.
Bindings: 0 = x (16-byte vectors), 1 = the blocks (16-byte vectors).
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

from coopmat.codegen.kernel import HelperKernel
from coopmat.codegen.shader import ShaderContext, folded_grid
from coopmat.codegen.spv import BuiltIn, Capability, GLSLstd450, Op
from coopmat.codegen.types import vulkan_features
from coopmat.common.quant_formats import BLOCK_ELEMS

PUSH_FIELDS = ("K", "M", "lda", "groups_x")
A_BLOCK_UNITS = 4  # 16-byte units a quantized block takes: 32 qs bytes, d and s, unused
A_READ_UNITS = 3  # of which the integer kernel reads these
A_BLOCK_BYTES = 16 * A_BLOCK_UNITS
GROUP = 128
QMAX = 127  # the largest |q| of an 8-bit block (d = amax / QMAX)


def quantized_bytes(M: int, K: int) -> int:
    """Bytes of the q8_1 blocks of an M x K x."""
    return M * (K // BLOCK_ELEMS) * A_BLOCK_BYTES


def quantized_lda(K: int) -> int:
    """The row stride of the blocks as the gemv kernel's lda counts it (float16 elements:
    its 16-byte units times 8): K."""
    return K // BLOCK_ELEMS * A_BLOCK_UNITS * 8


@dataclass(frozen=True)
class QuantizeQ8_1Traits:
    """What the kernel is built for (its pipeline cache key): one kernel, float16 x."""

    def describe(self) -> str:
        return "quantize-q8_1-float16"


@dataclass(frozen=True)
class QuantizeQ8_1Kernel(HelperKernel):
    local_size: tuple[int, int, int] = (GROUP, 1, 1)
    push_constant_size: int = 4 * len(PUSH_FIELDS)

    @staticmethod
    def workgroups(M: int, K: int) -> tuple[int, int, int]:
        return folded_grid(-(-(M * (K // BLOCK_ELEMS)) // GROUP))

    @staticmethod
    def push_constants(M: int, K: int, lda: int) -> bytes:
        if K % BLOCK_ELEMS or K == 0 or lda % 8 or lda < K:
            raise ValueError(f"quantizing x to q8_1 needs K a positive multiple of "
                             f"{BLOCK_ELEMS} and its row stride a multiple of 8, at least K "
                             f"(K={K}, lda={lda})")
        if max(M * lda, M * (K // BLOCK_ELEMS) * A_BLOCK_UNITS) >= 1 << 32:
            raise ValueError("the kernels index with 32 bits; x is too large")
        return struct.pack("<4I", K, M, lda, QuantizeQ8_1Kernel.workgroups(M, K)[0])


@dataclass(frozen=True)
class QuantizedBlock:
    """One block of x as q8_1 values (ids): its qs as 8 words (elements 4i .. 4i + 3 in
    the bytes of word i), d and s (float32)."""

    words: list[int]
    d: int
    s: int


def quantize_block(s: ShaderContext, xs: list[int]) -> QuantizedBlock:
    """Emit the q8_1 quantization of one block, its 32 elements as 8 float32 vec4s (vec4 i:
    elements 4i .. 4i + 3): amax by FMax, d = amax / 127, qs = roundf(x * (1 / d)) (0
    where d = 0) as int8 packed 4 to a word, s = d * sum(qs). The pass below and the
    integer gemv kernel quantizing in registers (gemv_q8_1.py) both emit it, so their
    blocks are the same bits."""
    mb, f = s.mb, s.f
    glsl = mb.ext_inst_import("GLSL.std.450")
    f32 = mb.type_float(32)
    i32 = mb.type_int(32, True)
    vec4, uvec4, ivec4 = (mb.type_vector(t, 4) for t in (f32, s.u32, i32))
    bvec4 = mb.type_vector(s.bool, 4)

    def ext(inst: GLSLstd450, ty: int, *args: int) -> int:
        return f.op(Op.ExtInst, ty, glsl, inst, *args)

    def splat(ty: int, value: int) -> int:
        return mb.const_composite(ty, [value] * 4)

    amax4 = ext(GLSLstd450.FAbs, vec4, xs[0])
    for x in xs[1:]:
        amax4 = ext(GLSLstd450.FMax, vec4, amax4, ext(GLSLstd450.FAbs, vec4, x))
    parts = [f.op(Op.CompositeExtract, f32, amax4, i) for i in range(4)]
    amax = ext(GLSLstd450.FMax, f32, ext(GLSLstd450.FMax, f32, parts[0], parts[1]),
               ext(GLSLstd450.FMax, f32, parts[2], parts[3]))
    zero, one = mb.constant(f32, 0.0), mb.constant(f32, 1.0)
    d = f.op(Op.FDiv, f32, amax, mb.constant(f32, float(QMAX)))
    inv = s.select(f32, f.op(Op.FOrdLessThan, s.bool, zero, d),
                   f.op(Op.FDiv, f32, one, d), zero)
    half, zero4 = splat(vec4, mb.constant(f32, 0.5)), mb.const_null(vec4)
    low8 = splat(uvec4, s.c(0xFF))
    shifts = mb.const_composite(uvec4, [s.c(8 * i) for i in range(4)])
    words: list[int] = []
    total: int | None = None
    for x in xs:
        t = f.op(Op.VectorTimesScalar, vec4, x, inv)
        whole = ext(GLSLstd450.Trunc, vec4, t)
        up = f.op(Op.FOrdGreaterThanEqual, bvec4,
                  ext(GLSLstd450.FAbs, vec4, f.op(Op.FSub, vec4, t, whole)), half)
        r = f.op(Op.FAdd, vec4, whole,
                 s.select(vec4, up, ext(GLSLstd450.FSign, vec4, t), zero4))
        q = f.op(Op.ConvertFToS, ivec4, r)
        total = q if total is None else f.op(Op.IAdd, ivec4, total, q)
        byte = f.op(Op.ShiftLeftLogical, uvec4,
                    f.op(Op.BitwiseAnd, uvec4, f.op(Op.Bitcast, uvec4, q), low8), shifts)
        c = [f.op(Op.CompositeExtract, s.u32, byte, i) for i in range(4)]
        words.append(f.op(Op.BitwiseOr, s.u32, f.op(Op.BitwiseOr, s.u32, c[0], c[1]),
                          f.op(Op.BitwiseOr, s.u32, c[2], c[3])))
    assert total is not None
    sums = [f.op(Op.CompositeExtract, i32, total, i) for i in range(4)]
    qsum = f.op(Op.IAdd, i32, f.op(Op.IAdd, i32, sums[0], sums[1]),
                f.op(Op.IAdd, i32, sums[2], sums[3]))
    return QuantizedBlock(words, d, f.op(Op.FMul, f32, d, f.op(Op.ConvertSToF, f32, qsum)))


def _emit() -> bytes:
    s = ShaderContext()
    mb, f = s.mb, s.f
    mb.capability(Capability.Float16)
    # The types quantize_block uses, declared up front: the module's ids then do not
    # depend on where the block is emitted.
    mb.ext_inst_import("GLSL.std.450")
    f32, f16 = mb.type_float(32), mb.type_float(16)
    i32 = mb.type_int(32, True)
    vec4, uvec4, _ = (mb.type_vector(t, 4) for t in (f32, s.u32, i32))
    uvec2, h4 = mb.type_vector(s.u32, 2), mb.type_vector(f16, 4)
    mb.type_vector(s.bool, 4)
    src = s.storage_buffer(0, uvec4, 16, True, "x", restrict=True)
    dst = s.storage_buffer(1, uvec4, 16, False, "blocks", restrict=True)
    s.push_constants(PUSH_FIELDS, [s.u32] * len(PUSH_FIELDS))
    P = {name: s.param(name) for name in PUSH_FIELDS}

    wg = s.builtin(BuiltIn.WorkgroupId, mb.type_vector(s.u32, 3))
    tid = s.builtin(BuiltIn.LocalInvocationIndex, s.u32)
    wx, wy = (f.op(Op.CompositeExtract, s.u32, wg, i) for i in range(2))
    block = s.add(s.mul(s.add(s.mul(wy, P["groups_x"]), wx), s.c(GROUP)), tid)
    nb = s.shr(P["K"], s.c(5))  # blocks a row
    m, b = s.udiv(block, nb), s.umod(block, nb)

    def body() -> None:
        first = s.shr(s.add(s.mul(m, P["lda"]), s.mul(b, s.c(BLOCK_ELEMS))), s.c(3))
        xs = []  # 8 vec4s: elements 4i .. 4i + 3 of the block
        for u in range(BLOCK_ELEMS // 8):
            unit = s.buffer_load(src, s.add(first, s.c(u)))
            for lo in (0, 2):
                pair = f.op(Op.VectorShuffle, uvec2, unit, unit, lo, lo + 1)
                xs.append(f.op(Op.FConvert, vec4, f.op(Op.Bitcast, h4, pair)))
        q = quantize_block(s, xs)
        out = s.mul(block, s.c(A_BLOCK_UNITS))
        for u in range(2):
            s.buffer_store(dst, s.add(out, s.c(u)),
                           f.op(Op.CompositeConstruct, uvec4, *q.words[4 * u:4 * u + 4]))
        ds = f.op(Op.CompositeConstruct, uvec4, f.op(Op.Bitcast, s.u32, q.d),
                  f.op(Op.Bitcast, s.u32, q.s), s.c(0), s.c(0))
        s.buffer_store(dst, s.add(out, s.c(2)), ds)

    f.if_(s.lt(m, P["M"]), body)
    return s.compute_module(GROUP)


@functools.cache
def quantize_q8_1_kernel() -> QuantizeQ8_1Kernel:
    return QuantizeQ8_1Kernel(QuantizeQ8_1Traits(), _emit(), vulkan_features(
        {Capability.Float16, Capability.VulkanMemoryModel}))
