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
from coopmat.common.quant_formats import BLOCK_ELEMS, SCALE_BYTES, QuantFormat

# Bytes a quantized B's buffer must hold past its blocks: the funnel shift's extra word.
QUANT_PAD_BYTES = 4


def overread_bytes(fmt: QuantFormat, tile_k: int, steps: int) -> int:
    """Bytes past the last block that an unchecked kernel's look-ahead (`steps` K steps
    past K) may read: the blocks of those steps past the last row's end, plus the pad."""
    return steps * (tile_k // BLOCK_ELEMS) * fmt.block_bytes + QUANT_PAD_BYTES


def block_words(fmt: QuantFormat) -> int:
    """32-bit words that cover a block from the word holding its first (even) byte: 9
    (36 bytes for q8_0's 34) or 5 (20 for q4_0's 18), whether it starts at bit 0 or 16;
    they end at most 2 bytes past the block."""
    return fmt.block_bytes // 4 + 1


def row_bytes(s: ShaderContext, fmt: QuantFormat, k: int) -> int:
    """Bytes of one row of the weight (B's column): K / 32 blocks (`k`: K, a runtime
    value; ldb is K for a weight, in weights)."""
    return s.mul(s.shr(k, s.c(5)), s.c(fmt.block_bytes))


def half_shift(s: ShaderContext, byte: int) -> int:
    """0 or 16: where the 16-bit value at even address `byte` sits in its 32-bit word."""
    f = s.f
    return f.op(Op.ShiftLeftLogical, s.u32, f.op(Op.BitwiseAnd, s.u32, byte, s.c(2)), s.c(3))


def read_words(s: ShaderContext, buf: Buffer, byte: int,
               count: int) -> tuple[list[int], int]:
    """(words, sh): `count` consecutive words of `buf` from the one holding even address
    `byte`, with sh = half_shift(byte) for `funnel`."""
    first = s.shr(byte, s.c(2))
    return ([s.buffer_load(buf, s.add(first, s.c(i))) for i in range(count)],
            half_shift(s, byte))


def funnel(s: ShaderContext, words: list[int], sh: int, skip_half: bool = False) -> list[int]:
    """The len(words) - 1 32-bit runs that start `sh` bits (0 or 16, a runtime value) into
    words[0], or 16 bits further with skip_half: run i holds bits o + 32 i .. o + 32 i + 31
    of the words laid end to end (o = sh, or sh + 16). o is 0, 16 or 32, so a run is
    words[i], the middle of words[i] and words[i + 1] (shifts by the constant 16, one
    funnel shift on NVIDIA), or words[i + 1]: one select picks, where shifts by the
    runtime amount took four operations a run."""
    f = s.f
    # The middle where o = 16: sh = 16 without skip_half, sh = 0 with it.
    at_middle = f.op(Op.IEqual if skip_half else Op.INotEqual, s.bool, sh, s.c(0))
    runs = []
    for lo, hi in zip(words[:-1], words[1:], strict=True):
        middle = f.op(Op.BitwiseOr, s.u32, s.shr(lo, s.c(16)),
                      f.op(Op.ShiftLeftLogical, s.u32, hi, s.c(16)))
        runs.append(s.select(s.u32, at_middle, middle, hi if skip_half else lo))
    return runs


def scale(s: ShaderContext, word: int, sh: int) -> int:
    """A block's scale d as float32: the float16 at bit `sh` (0 or 16) of `word`."""
    f, mb = s.f, s.mb
    f16 = mb.type_float(16)
    d16 = f.op(Op.CompositeExtract, f16,
               f.op(Op.Bitcast, mb.type_vector(f16, 2), s.shr(word, sh)), 0)
    return f.op(Op.FConvert, mb.type_float(32), d16)


# Integer fields ORed into the bits of a float with ulp 1 make that float plus the field,
# exactly: float16 1024 (fields < 1024) and float32 2^23. A subtract of it and the
# format's zero point leaves the weight; no integer-to-float conversion, which runs at a
# fraction of the FMA rate on NVIDIA GPUs.
F16_MAGIC, F16_MAGIC_VALUE = 0x6400, 1024.0
F32_MAGIC, F32_MAGIC_VALUE = 0x4B000000, 2.0 ** 23


def held_constant(s: ShaderContext, value: int, size: int, lane: int | None = None) -> int:
    """The u32 `value`, made at run time from `size` (a runtime value below 2^31, such as
    K) and, where given, `lane` (an invocation's index in its subgroup): value | size >>
    31, or value | (size / 2 + lane) >> 31, is value. A field masked and ORed under a
    magic takes two logic instructions when both constants are literals (NVIDIA's LOP3
    takes one immediate), one when the magic is in a register, and a driver keeps a value
    computed from a push constant in one: a uniform register when the value is the same
    for every invocation (which LOP3's third operand cannot read: a MOV a use), a vector
    register with `lane` in it. Measured faster for the khr kernel's few-row tiles
    (uniform) and q4_0's gemv kernel (with `lane`); q8_0's gemv and the khr prefill tile
    measured mixed or slower and keep the literal (docs/design.md, Quantized weights)."""
    x = size if lane is None else s.add(s.shr(size, s.c(1)), lane)
    return s.f.op(Op.BitwiseOr, s.u32, s.c(value), s.shr(x, s.c(31)))


class QuantReader:
    """Emits the loads and arithmetic of one dequantized unit."""

    def __init__(self, s: ShaderContext, fmt: QuantFormat, buf: Buffer, operand_el: int,
                 unit_type: int, unit: int, ldb: int, base: int, *,
                 held_magic: bool = False) -> None:
        """`ldb`: the weight's K; `base`: where along it B's first weight is (a split-K
        slice's; whole blocks); both runtime values. `held_magic`: the magic as
        `held_constant`, not a literal."""
        self.s, self.fmt, self.buf, self.unit = s, fmt, buf, unit
        self.operand_el, self.unit_type = operand_el, unit_type
        mb = s.mb
        self.f32 = mb.type_float(32)
        f16 = mb.type_float(16)
        self.h2 = mb.type_vector(f16, 2)  # also the scale's type (`scale`), declared up front
        # float16 operands: weights dequantized two at a time in packed float16, whose one
        # rounding of (w * d) is the float32 product's rounded once.
        self.packed = operand_el == f16
        self.v2op = mb.type_vector(operand_el, 2)
        self.row_bytes = row_bytes(s, fmt, ldb)
        self.base_bytes = row_bytes(s, fmt, base)
        magic = F16_MAGIC << 16 | F16_MAGIC if self.packed else F32_MAGIC
        self.magic = held_constant(s, magic, ldb) if held_magic else s.c(magic)
        if self.packed:
            offset = mb.constant(f16, F16_MAGIC_VALUE + fmt.zero_point)
            self.offset = mb.const_composite(self.h2, [offset, offset])
        else:
            self.offset = mb.constant(self.f32, F32_MAGIC_VALUE + fmt.zero_point)

    def _op(self, op: Op, a: int, b: int) -> int:
        return self.s.f.op(op, self.s.u32, a, b)

    def _block(self, n: int, k: int, inside: int | None) -> int:
        """The byte where the block holding weight k of row n starts; block 0 (always
        there) where `inside` (a bool id) is false."""
        s = self.s
        block = s.add(s.add(s.mul(n, self.row_bytes), self.base_bytes),
                      s.mul(s.shr(k, s.c(5)), s.c(self.fmt.block_bytes)))
        return block if inside is None else s.select(s.u32, inside, block, s.c(0))

    @property
    def whole_blocks(self) -> bool:
        return self.unit == BLOCK_ELEMS

    @property
    def fetched_words(self) -> int:
        """Words `fetch` returns a unit: a whole block's words (its scale in the first),
        or the unit's data words and its scale's word."""
        return block_words(self.fmt) if self.whole_blocks else self.unit // 4 + 2

    def fetch(self, n: int, k: int, inside: int | None) -> list[int]:
        """The raw words of the unit of weights k .. k + unit - 1 of row n (k a multiple
        of the unit): only loads, so that they can stay in flight in registers until
        `decode` (a K step later in the khr kernel's prefetch). Where `inside` (a bool
        id) is false, block 0 is read and the scale's word is zero: d = 0 makes every
        weight decode to zero."""
        s, fmt = self.s, self.fmt
        block = self._block(n, k, inside)
        if self.whole_blocks:  # the words from the one holding the block's first byte
            words = read_words(s, self.buf, block, block_words(fmt))[0]
        else:
            j = self._op(Op.BitwiseAnd, k, s.c(BLOCK_ELEMS - 1))  # first weight's index
            # The unit's bytes: q8_0 one a weight; q4_0 one for weights j and j + 16.
            data_off = self._op(Op.BitwiseAnd, j, s.c(15)) if fmt.nibbles else j
            p = s.add(block, s.add(s.c(SCALE_BYTES), data_off))
            words = [*read_words(s, self.buf, p, self.unit // 4 + 1)[0],
                     s.buffer_load(self.buf, s.shr(block, s.c(2)))]
        scale_at = 0 if self.whole_blocks else len(words) - 1
        if inside is not None:
            words[scale_at] = s.select(s.u32, inside, words[scale_at], s.c(0))
        return words

    def decode(self, words: list[int], n: int, k: int) -> list[int]:
        """`fetch`'s words for (n, k) -> the unit as vectors of 8 (or unit) packed operand
        values (unit_type), in K order: one, or BLOCK_ELEMS // 8 for a whole block."""
        s, f, fmt = self.s, self.s.f, self.fmt
        sh = half_shift(s, self._block(n, k, None))  # where d sits in its word
        if self.whole_blocks:  # the data start 16 bits after d
            scale_word = words[0]
            runs = funnel(s, words, sh, skip_half=True)
            if fmt.nibbles:  # low nibbles are weights 0..15, high nibbles 16..31
                runs = runs + [s.shr(r, s.c(4)) for r in runs]
        else:  # the data start at a multiple of 4 bytes past d's end: 16 bits from sh
            scale_word = words[-1]
            runs = funnel(s, words[:-1], self._op(Op.BitwiseXor, sh, s.c(16)))
            if fmt.nibbles:  # weights j.. are low nibbles below 16, high ones from 16
                j = self._op(Op.BitwiseAnd, k, s.c(BLOCK_ELEMS - 1))
                nibble_shift = self._op(Op.ShiftLeftLogical, s.shr(j, s.c(4)), s.c(2))
                runs = [s.shr(r, nibble_shift) for r in runs]
        # Weight e's field, read unsigned, at bit 8 (e % 4) of runs[e // 4]: q4_0's
        # nibbles, q8_0's bytes with their sign bits flipped.
        if not fmt.nibbles:
            runs = [self._op(Op.BitwiseXor, r, s.c(0x80808080)) for r in runs]
        if self.packed:
            packed = self._pairs(runs, scale_word, sh)
        else:
            packed = self._singles(runs, scale(s, scale_word, sh))
        per = 4 if self.whole_blocks else len(packed)
        return [f.op(Op.CompositeConstruct, self.unit_type, *packed[i:i + per])
                if per > 1 else packed[i] for i in range(0, len(packed), per)]

    def load(self, n: int, k: int, inside: int | None) -> list[int]:
        """`decode` of `fetch`: the unit's vectors at once."""
        return self.decode(self.fetch(n, k, inside), n, k)

    def _pairs(self, runs: list[int], scale_word: int, sh: int) -> list[int]:
        """Packed float16 words of weights (e, e + 1), four weights a run (their fields
        at bits 0, 8, 16, 24): fields 0 and 2 of a run masked in place and fields 1 and 3
        shifted down by 8 give two words of two fields each under float16 1024's bits,
        minus 1024 + zero point, times (d, d); a shuffle of the two puts them back in K
        order. Four weights cost eight operations and two shuffles."""
        s, f, mask = self.s, self.s.f, self.fmt.field_mask
        d = f.op(Op.Bitcast, self.h2, s.shr(scale_word, sh))  # d in its low half
        dd = f.op(Op.VectorShuffle, self.h2, d, d, 0, 0)
        magic, both = self.magic, s.c(mask << 16 | mask)

        def weights(fields: int) -> int:  # fields at bits 0 and 16 -> (w, w') in float16
            h = f.op(Op.Bitcast, self.h2,
                     self._op(Op.BitwiseOr, self._op(Op.BitwiseAnd, fields, both), magic))
            return f.op(Op.FMul, self.h2, f.op(Op.FSub, self.h2, h, self.offset), dd)

        out = []
        for run in runs:
            even, odd = weights(run), weights(s.shr(run, s.c(8)))  # (w0, w2), (w1, w3)
            out += [f.op(Op.Bitcast, s.u32, f.op(Op.VectorShuffle, self.h2, even, odd, *ix))
                    for ix in ((0, 2), (1, 3))]
        return out

    def _singles(self, runs: list[int], d: int) -> list[int]:
        """Packed words of weights made one at a time in float32 (2^23's bits), four a run,
        times d (exact in float32: 8 x 11 significant bits), rounded once to the operand
        type."""
        s, f, mask = self.s, self.s.f, self.fmt.field_mask
        values = []
        for e in range(4 * len(runs)):
            run, bit = runs[e // 4], 8 * (e % 4)
            u = self._op(Op.BitwiseAnd, s.shr(run, s.c(bit)) if bit else run, s.c(mask))
            w = f.op(Op.FSub, self.f32,
                     f.op(Op.Bitcast, self.f32, self._op(Op.BitwiseOr, u, self.magic)),
                     self.offset)
            values.append(f.op(Op.FConvert, self.operand_el, f.op(Op.FMul, self.f32, w, d)))
        return [f.op(Op.Bitcast, s.u32,
                     f.op(Op.CompositeConstruct, self.v2op, values[i], values[i + 1]))
                for i in range(0, len(values), 2)]
