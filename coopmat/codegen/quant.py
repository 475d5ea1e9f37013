"""Dequantizing GGUF blocks (q8_0, q4_0) while staging a khr kernel's B.

B is the N x K weight as stored: row n (B's column n, K contiguous) is K / 32 blocks of
block_bytes each (coopmat/quant_formats.py). One staged unit is `unit` consecutive weights
of one row inside one block; it becomes a vector of `unit` operand-type values packed in
32-bit words, exactly what the aligned variant stages for a float16 B, so the shared tiles
and the cooperative-matrix loads from them are unchanged.

The buffer is read as 32-bit words: blocks are only 2-byte aligned (34 and 18 bytes), and
u32 loads need neither storageBuffer8BitAccess nor 16-bit integers, and issue half the
loads 16-bit ones would. A run of bytes at an even address p is the word pair at p / 4
shifted right by 0 or 16 bits (a funnel shift); a unit of 8 weights is 3 word loads plus
one for the scale, all within 4 bytes past the run (callers keep that much room after the
blocks: QUANT_PAD_BYTES). The word reads, the funnel shift and the scale's decoding are
module functions, which the gemv kernel's quantized B (gemv_quant.py) shares.
"""

from __future__ import annotations

from coopmat.codegen.shader import Buffer, ShaderContext
from coopmat.codegen.spv import Op
from coopmat.quant_formats import BLOCK_ELEMS, SCALE_BYTES, QuantFormat

# Bytes a quantized B's buffer must hold past its blocks: the funnel shift's extra word.
QUANT_PAD_BYTES = 4


def overread_bytes(fmt: QuantFormat, tile_k: int, steps: int) -> int:
    """Bytes past the last block that an unchecked kernel's look-ahead (`steps` K steps
    past K) may read: the blocks of those steps past the last row's end, plus the pad."""
    return steps * (tile_k // BLOCK_ELEMS) * fmt.block_bytes + QUANT_PAD_BYTES


def row_bytes(s: ShaderContext, fmt: QuantFormat, k: int) -> int:
    """Bytes of one row of the weight (B's column): K / 32 blocks (`k`: K, a runtime
    value; ldb is K for a weight, in weights)."""
    return s.mul(s.shr(k, s.c(5)), s.c(fmt.block_bytes))


def half_shift(s: ShaderContext, byte: int) -> int:
    """0 or 16: where the 16-bit value at even address `byte` sits in its 32-bit word."""
    f = s.f
    return f.op(Op.ShiftLeftLogical, s.u32, f.op(Op.BitwiseAnd, s.u32, byte, s.c(2)), s.c(3))


def read_words(s: ShaderContext, buf: Buffer, byte: int,
               count: int) -> tuple[list[int], int, int]:
    """(words, sh, inv): `count` consecutive words of `buf` from the one holding even
    address `byte`, with sh = half_shift(byte) and inv = 16 - sh for `funnel`."""
    sh = half_shift(s, byte)
    inv = s.f.op(Op.ISub, s.u32, s.c(16), sh)
    first = s.shr(byte, s.c(2))
    return [s.buffer_load(buf, s.add(first, s.c(i))) for i in range(count)], sh, inv


def funnel(s: ShaderContext, words: list[int], sh: int, inv: int,
           skip_half: bool = False) -> list[int]:
    """The len(words) - 1 32-bit runs that start `sh` bits (0 or 16, a runtime value; inv
    = 16 - sh) into words[0], or 16 bits further with skip_half: run i holds bits
    o + 32 i .. o + 32 i + 31 of the words laid end to end (o = sh, or sh + 16). Each
    half shifts in two steps so that no shift amount reaches 32 (undefined) when sh is 0
    or 16."""
    f = s.f

    def shl(a: int, b: int) -> int:
        return f.op(Op.ShiftLeftLogical, s.u32, a, b)

    runs = []
    for lo, hi in zip(words[:-1], words[1:], strict=True):
        if skip_half:
            low, high = s.shr(s.shr(lo, s.c(16)), sh), shl(hi, inv)
        else:
            low, high = s.shr(lo, sh), shl(shl(hi, s.c(16)), inv)
        runs.append(f.op(Op.BitwiseOr, s.u32, low, high))
    return runs


def scale(s: ShaderContext, word: int, sh: int) -> int:
    """A block's scale d as float32: the float16 at bit `sh` (0 or 16) of `word`."""
    f, mb = s.f, s.mb
    f16 = mb.type_float(16)
    d16 = f.op(Op.CompositeExtract, f16,
               f.op(Op.Bitcast, mb.type_vector(f16, 2), s.shr(word, sh)), 0)
    return f.op(Op.FConvert, mb.type_float(32), d16)


class QuantReader:
    """Emits the loads and arithmetic of one dequantized unit."""

    def __init__(self, s: ShaderContext, fmt: QuantFormat, buf: Buffer, operand_el: int,
                 unit_type: int, unit: int, ldb: int) -> None:
        self.s, self.fmt, self.buf, self.unit = s, fmt, buf, unit
        self.operand_el, self.unit_type = operand_el, unit_type
        mb = s.mb
        self.f32 = mb.type_float(32)
        mb.type_vector(mb.type_float(16), 2)  # the scale's (`scale`), declared up front
        self.v2op = mb.type_vector(operand_el, 2)
        self.zero = mb.const_null(unit_type)
        self.row_bytes = row_bytes(s, fmt, ldb)

    def _and(self, a: int, mask: int) -> int:
        return self.s.f.op(Op.BitwiseAnd, self.s.u32, a, self.s.c(mask))

    def _shl(self, a: int, b: int) -> int:
        return self.s.f.op(Op.ShiftLeftLogical, self.s.u32, a, b)

    def load(self, n: int, k: int, inside: int | None) -> int:
        """The unit of weights k .. k + unit - 1 of row n (k a multiple of the unit), as
        a vector of packed operand values; zero where `inside` (a bool id) is false."""
        s, f, fmt = self.s, self.s.f, self.fmt
        block = s.add(s.mul(n, self.row_bytes), s.mul(s.shr(k, s.c(5)), s.c(fmt.block_bytes)))
        if inside is not None:  # out of the matrix: read block 0 (always there), then zero
            block = s.select(s.u32, inside, block, s.c(0))
        j = self._and(k, BLOCK_ELEMS - 1)  # first weight's index in the block
        # The scale: the block's leading float16, converted to float32.
        d = scale(s, s.buffer_load(self.buf, s.shr(block, s.c(2))), half_shift(s, block))
        # The unit's bytes: q8_0 one a weight; q4_0 one for weights j and j + 16.
        nibble_shift = s.c(0)
        data_off = j
        if fmt.nibbles:
            data_off = self._and(j, 15)
            nibble_shift = self._shl(s.shr(j, s.c(4)), s.c(2))  # 0 or 4
        p = s.add(block, s.add(s.c(SCALE_BYTES), data_off))
        # Funnel: run i is bytes p + 4i .. p + 4i + 3.
        runs = funnel(s, *read_words(s, self.buf, p, self.unit // 4 + 1))
        values = []
        for e in range(self.unit):
            run, byte = runs[e // 4], e % 4
            if fmt.nibbles:
                off = s.add(s.c(8 * byte), nibble_shift)
                nib = f.op(Op.BitFieldUExtract, s.u32, run, off, s.c(4))
                q = f.op(Op.ISub, s.u32, nib, s.c(8))
            else:
                q = f.op(Op.BitFieldSExtract, s.u32, run, s.c(8 * byte), s.c(8))
            # q * d is exact in float32 (8 x 11 significant bits), so converting once to
            # the operand type rounds as a float16 multiply would.
            v = f.op(Op.FMul, self.f32, f.op(Op.ConvertSToF, self.f32, q), d)
            values.append(f.op(Op.FConvert, self.operand_el, v))
        packed = [f.op(Op.Bitcast, s.u32,
                       f.op(Op.CompositeConstruct, self.v2op, values[i], values[i + 1]))
                  for i in range(0, self.unit, 2)]
        vec = f.op(Op.CompositeConstruct, self.unit_type, *packed) if len(packed) > 1 \
            else packed[0]
        if inside is not None:
            vec = s.select(self.unit_type, inside, vec, self.zero)
        return vec
