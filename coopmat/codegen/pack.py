"""A helper kernel: repack an 8-bit row-major B (K x N) as K-contiguous (column-major).

Tensor cores take 8-bit B fragments with K contiguous, and a row-major 8-bit B cannot be
transposed on the way into them as cheaply as 16-bit data can, so a GEMM on 8-bit types
with a row-major B runs much slower than with a column-major one (about half the speed;
docs/design.md, Kernels). Repacking B first costs one read and one write of B.

Each invocation gathers a 32 (K) x 4 (N) block and writes, per column, its 32 K values as
two 16-byte vectors (one whole 32-byte memory sector). The wide variant reads the block as
32 words (one per K row, coalesced along N across the subgroup) and transposes their bytes
in registers; the narrow one, for sources whose rows are not 4-byte aligned, reads bytes.
The output has leading dimension `ld_dst` (a multiple of 16 elements, so the GEMM's
aligned path applies); K positions past K are written as zeros.

Push constants (u32): K, N, ld_src, batch_stride_src, ld_dst, batch_stride_dst.
Bindings: 0 = source bytes, 1 = destination (16-byte vectors).
Workgroup (x, y, z) covers (256 columns, 64 rows, batch).
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

from coopmat.codegen.kernel import HelperKernel
from coopmat.codegen.shader import ShaderContext
from coopmat.codegen.spv import (
    BuiltIn,
    Capability,
    Op,
)

PUSH_FIELDS = ("K", "N", "ld_src", "batch_stride_src", "ld_dst", "batch_stride_dst")
COLS_PER_INVOCATION = 4
ROWS_PER_INVOCATION = 32  # two 16-byte vectors per column
GROUP_X, GROUP_Y = 64, 2  # invocations along N and along K
TILE_N = GROUP_X * COLS_PER_INVOCATION
TILE_K = GROUP_Y * ROWS_PER_INVOCATION
LD_ALIGN = 16


@dataclass(frozen=True)
class PackTraits:
    """What the pack kernel is built for (its pipeline cache key). `wide`: the source's
    rows, leading dimension and batch stride are multiples of 4 bytes (word loads)."""

    wide: bool
    element_bits: int = 8


@dataclass(frozen=True)
class PackKernel(HelperKernel):
    features: tuple[str, ...] = ("shaderInt8", "storageBuffer8BitAccess")
    local_size: tuple[int, int, int] = (GROUP_X * GROUP_Y, 1, 1)
    push_constant_size: int = 4 * len(PUSH_FIELDS)

    @staticmethod
    def leading_dimension(K: int) -> int:
        return -(-K // LD_ALIGN) * LD_ALIGN

    @staticmethod
    def workgroups(K: int, N: int, batch: int) -> tuple[int, int, int]:
        return (-(-N // TILE_N), -(-K // TILE_K), batch)

    @staticmethod
    def push_constants(K: int, N: int, ld_src: int, batch_stride_src: int, ld_dst: int,
                       batch_stride_dst: int) -> bytes:
        if ld_dst % LD_ALIGN or batch_stride_dst % LD_ALIGN:
            raise ValueError("the packed B's leading dimension and batch stride must be "
                             f"multiples of {LD_ALIGN}")
        return struct.pack("<6I", K, N, ld_src, batch_stride_src, ld_dst, batch_stride_dst)


def wide_ok(N: int, ld_src: int, batch_stride_src: int) -> bool:
    return N % 4 == 0 and ld_src % 4 == 0 and batch_stride_src % 4 == 0


def _emit(traits: PackTraits) -> bytes:
    s = ShaderContext()
    mb, f = s.mb, s.f
    mb.capability(Capability.Int8, Capability.StorageBuffer8BitAccess)
    u8 = mb.type_int(8, False)
    uvec4 = mb.type_vector(s.u32, 4)
    if traits.wide:
        src = s.storage_buffer(0, s.u32, 4, True, "src", restrict=True)
    else:
        src = s.storage_buffer(0, u8, 1, True, "src", restrict=True)
    dst = s.storage_buffer(1, uvec4, 16, False, "dst", restrict=True)
    s.push_constants(PUSH_FIELDS, [s.u32] * len(PUSH_FIELDS))
    v3 = mb.type_vector(s.u32, 3)
    wg = s.builtin(BuiltIn.WorkgroupId, v3)
    tid = s.builtin(BuiltIn.LocalInvocationIndex, s.u32)
    wx, wy, z = (f.op(Op.CompositeExtract, s.u32, wg, i) for i in range(3))
    P = {name: s.param(name) for name in PUSH_FIELDS}
    tx, ty = s.umod(tid, s.c(GROUP_X)), s.udiv(tid, s.c(GROUP_X))
    n0 = s.mul(s.add(s.mul(wx, s.c(GROUP_X)), tx), s.c(COLS_PER_INVOCATION))
    k0 = s.mul(s.add(s.mul(wy, s.c(GROUP_Y)), ty), s.c(ROWS_PER_INVOCATION))
    src_base = s.mul(z, P["batch_stride_src"])
    dst_base = s.mul(z, P["batch_stride_dst"])
    mask = s.c(0xFF)

    def shl(x: int, bits: int) -> int:
        return f.op(Op.ShiftLeftLogical, s.u32, x, s.c(bits)) if bits else x

    def or_(a: int, b: int) -> int:
        return f.op(Op.BitwiseOr, s.u32, a, b)

    def byte_of(word: int, i: int) -> int:
        shifted = s.shr(word, s.c(8 * i)) if i else word
        return f.op(Op.BitwiseAnd, s.u32, shifted, mask)

    def rows_wide() -> list[list[int]]:
        """bytes[r][c]: K row k0 + r, column n0 + c (as u32 values 0..255)."""
        out = []
        n_in = s.lt(n0, P["N"])  # N % 4 == 0: a word is all inside or all outside
        for r in range(ROWS_PER_INVOCATION):
            k = s.add(k0, s.c(r))
            inside = s.and_(s.lt(k, P["K"]), n_in)
            idx = s.shr(s.add(src_base, s.add(s.mul(k, P["ld_src"]), n0)), s.c(2))
            safe = s.select(s.u32, inside, idx, s.c(0))
            word = s.select(s.u32, inside, s.buffer_load(src, safe), s.c(0))
            out.append([byte_of(word, c) for c in range(COLS_PER_INVOCATION)])
        return out

    def rows_narrow() -> list[list[int]]:
        zero8 = mb.const_null(u8)
        out = []
        for r in range(ROWS_PER_INVOCATION):
            k = s.add(k0, s.c(r))
            row = s.add(src_base, s.mul(k, P["ld_src"]))
            k_in = s.lt(k, P["K"])
            vals = []
            for c in range(COLS_PER_INVOCATION):
                n = s.add(n0, s.c(c))
                inside = s.and_(k_in, s.lt(n, P["N"]))
                idx = s.select(s.u32, inside, s.add(row, n), s.c(0))
                byte = s.select(u8, inside, s.buffer_load(src, idx), zero8)
                vals.append(f.op(Op.UConvert, s.u32, byte))
            out.append(vals)
        return out

    def body() -> None:
        b = rows_wide() if traits.wide else rows_narrow()
        for c in range(COLS_PER_INVOCATION):
            n = s.add(n0, s.c(c))
            # Column c's K values, four to a word (K ascending from the low byte).
            words = []
            for w in range(ROWS_PER_INVOCATION // 4):
                word = b[4 * w][c]
                for i in range(1, 4):
                    word = or_(word, shl(b[4 * w + i][c], 8 * i))
                words.append(word)
            row = s.add(dst_base, s.mul(n, P["ld_dst"]))
            for half in range(ROWS_PER_INVOCATION // 16):
                vec = f.op(Op.CompositeConstruct, uvec4, *words[4 * half:4 * half + 4])
                k = s.add(k0, s.c(16 * half))
                at = s.shr(s.add(row, k), s.c(4))
                # The vector must lie inside the row (the padded K) and the column in N.
                ok = s.and_(s.lt(n, P["N"]), s.lt(k, P["K"]))
                def store(at: int = at, vec: int = vec) -> None:
                    s.buffer_store(dst, at, vec)

                f.if_(ok, store)

    # Blocks wholly past K have nothing to write.
    f.if_(s.lt(k0, P["K"]), body)
    return s.compute_module(GROUP_X * GROUP_Y)


@functools.cache
def pack_kernel(wide: bool) -> PackKernel:
    traits = PackTraits(wide)
    return PackKernel(traits, _emit(traits))
