"""The gemv kernel with a quantized B: GGUF q8_0 / q4_0 blocks read as they are stored
(GemvTraits.b_quant; issue #16, quantized decode).

B is the N x K weight's blocks (coopmat/quant_formats.py): B's column n is the weight's
row n, K / 32 consecutive blocks of 34 (q8_0) or 18 (q4_0) bytes, each a float16 scale d
and 32 weights. Everything but the reading of B is gemv.py's kernel (workgroups, columns
per subgroup, clamped rows and columns, the subgroup reduction and the epilogue); only
the unit a lane loads changes, from 16 bytes of a float B to one whole block:

    per step, lane l of a subgroup takes block (step + u * subgroup_size + l) of each of
    its C columns, u < U: the subgroup reads subgroup_size consecutive blocks of a
    column, contiguous bytes; and the 32 matching elements of each of the R rows of A
    (four 16-byte loads a row, as the float kernel reads A);
    for each column, row: partial = sum over the 32 weights of q * a (float32, exact
    products: 8 x 11 significant bits), then acc += partial * d, one multiply by the
    scale per block, row and column;
    remainder (K / 32 not a multiple of subgroup_size * U blocks): one block per lane at
    a time; blocks past K read block 0 of the column, with A's values and the scale's
    word zeroed (subgroup-uniform control flow, as gemv.py's remainder).

Blocks are only 2-byte aligned, so B is bound as 32-bit words (no 8/16-bit storage
features) and a block at byte p is the words from p / 4 on, as many as cover it: 9 for
q8_0, 5 for q4_0 (quant.read_words). d is the float16 at bit 0 or 16 of the first
(quant.scale); the weights start 16 bits after it, so the data's 32-bit runs are a funnel
shift of the same words (quant.funnel with skip_half). Those words end at most 2 bytes
past the block (when p is a multiple of 4), so the kernel never reads past the last block
+ QUANT_PAD_BYTES (abi.overread_bytes_b).

The weights become float32 two at a time through packed float16, as the khr staging
makes them (quant.py), but without the scale: the fields at bits b and b + 16 of a run,
masked under float16 1024's bits (q8_0's sign bits flipped by the same operation), are
(1024 + u, 1024 + u'); minus 1024 + the zero point they are the integer weights, exactly;
widened to float32 (two weights per run shift, no integer-to-float conversion and no
per-weight shift). A pair's two weights lie 2 apart in the block, so A's 32 elements,
widened once per row and step as for a float B, are regrouped into vectors in the
weights' order (register renaming, no instructions): faster than shifts and
conversions per weight (docs/design.md, Quantized weights).
"""

from __future__ import annotations

from coopmat.codegen import abi
from coopmat.codegen.gemv import GemvEmitter
from coopmat.codegen.quant import (
    F16_MAGIC,
    F16_MAGIC_VALUE,
    block_words,
    funnel,
    held_constant,
    read_words,
    row_bytes,
    scale,
)
from coopmat.codegen.shader import Buffer
from coopmat.codegen.spv import Op
from coopmat.codegen.traits import GEMV_VECTOR, GemvTraits
from coopmat.common.quant_formats import BLOCK_ELEMS, quant_format

# One block of a column as loaded: its words (from the one holding the block's first
# byte), the scale's bit in the first word (0 or 16).
_Block = tuple[list[int], int]
# One load step: the R rows of A (four 16-byte units each) and the C columns' blocks.
_Loaded = tuple[list[list[int]], list[_Block]]

_A_UNITS = BLOCK_ELEMS // GEMV_VECTOR  # 16-byte units of A per block: 4


class QuantGemvEmitter(GemvEmitter):
    def __init__(self, t: GemvTraits) -> None:
        super().__init__(t)
        assert t.b_quant is not None
        self.fmt = quant_format(t.b_quant)
        self.block_words = block_words(self.fmt)

    def _declare(self) -> None:
        super()._declare()
        mb = self.s.mb
        self.f16 = mb.type_float(16)
        self.h2 = mb.type_vector(self.f16, 2)
        self.vec2 = mb.type_vector(self.f32, 2)

    # -- B: blocks as 32-bit words ---------------------------------------------------------
    def _b_buffer(self) -> Buffer:
        return self.s.storage_buffer(abi.BINDING_B, self.s.u32, 4, True, "B", restrict=True)

    def _b_setup(self, batch: int) -> None:
        # One weight for every batch entry (abi.quant_violation): no batch stride.
        self.row_bytes = row_bytes(self.s, self.fmt, self.P["K"])
        # q8_0's sign bits flip inside the same XOR as the magic.
        flip = 0 if self.fmt.nibbles else (1 << (self.fmt.bits - 1)) * 0x10001
        magic = (F16_MAGIC << 16 | F16_MAGIC) ^ flip
        # q4_0 holds the magic in a vector register (quant.held_constant), so a weight
        # pair's mask and XOR are one LOP3 on NVIDIA GPUs (measured faster); q8_0 measured
        # mixed and keeps the literal.
        self.magic = (held_constant(self.s, magic, self.P["K"], self.lane)
                      if self.fmt.nibbles else self.s.c(magic))

    def _b_column(self, col: int) -> int:
        """The byte where column `col`'s first block starts."""
        return self.s.mul(col, self.row_bytes)

    def _k_loop(self) -> None:
        self._walk_k(self._blocks, self._accumulate_blocks)

    def _blocks(self, block: int, valid: int | None) -> _Loaded:
        """Block `block` of every column of B and the matching 4 units of every row of A;
        where `valid` is false, block 0 is read, A's units are zero and so is the word
        holding the scale (d = 0)."""
        s = self.s
        if valid is not None:
            block = s.select(s.u32, valid, block, s.c(0))
        b_at = s.mul(block, s.c(self.fmt.block_bytes))
        b = [read_words(s, self.B, s.add(col, b_at), self.block_words) for col in self.b_col]
        a_at = s.mul(block, s.c(_A_UNITS))
        a = [[s.buffer_load(self.A, s.add(row, s.add(a_at, s.c(i)))) for i in range(self.a_units)]
             for row in self.a_row]
        if valid is not None:
            b = [([s.select(s.u32, valid, words[0], s.c(0)), *words[1:]], sh)
                 for words, sh in b]
            a = [[s.select(self.uvec4, valid, x, self.zero_unit) for x in units]
                 for units in a]
        return a, b

    def _flat(self, loaded: _Loaded) -> list[tuple[int, int]]:
        s = self.s
        a, b = loaded
        return ([(self.uvec4, x) for units in a for x in units]
                + [(s.u32, x) for words, sh in b for x in (*words, sh)])

    # 16-byte units of A each row loads per block (a variant with its own A sets its own).
    a_units = _A_UNITS

    def _unflat(self, values: list[int]) -> _Loaded:
        n_a = self.t.rows * self.a_units
        a = [values[i:i + self.a_units] for i in range(0, n_a, self.a_units)]
        per = self.block_words + 1
        b = [(values[i:i + per - 1], values[i + per - 1])
             for i in range(n_a, len(values), per)]
        return a, b

    # -- arithmetic -------------------------------------------------------------------------
    def _weights(self, block: _Block) -> tuple[int, list[tuple[int, tuple[int, ...]]]]:
        """(d, the block's 32 weights as 8 float32 vec4s, each with the indices in the
        block of the 4 weights it holds).

        Two weights at a time in packed float16, with no integer-to-float conversion and
        no per-weight shift: a run's fields at bits b and b + 16 masked under float16
        1024's bits are (1024 + u, 1024 + u') exactly, u a field read unsigned (q8_0's
        bytes with their sign bits flipped, folded into the same mask); minus 1024 + the
        zero point, the weights q, q' exactly (small integers); widened to float32. A run
        of 8 nibbles takes 3 shifts and 4 masks, of 4 bytes 1 and 2."""
        s, f, fmt = self.s, self.s.f, self.fmt
        words, sh = block
        d = scale(s, words[0], sh)
        runs = funnel(s, words, sh, skip_half=True)  # the bytes after d
        mask, magic = fmt.field_mask | fmt.field_mask << 16, self.magic
        zero = s.mb.constant(self.f16, F16_MAGIC_VALUE + fmt.zero_point)
        offset = s.mb.const_composite(self.h2, [zero, zero])
        pairs: list[tuple[int, tuple[int, int]]] = []
        for r, run in enumerate(runs):
            for shift in range(0, 16, fmt.bits):  # fields at bits shift and shift + 16
                x = f.op(Op.ShiftRightLogical, s.u32, run, s.c(shift)) if shift else run
                u = f.op(Op.BitwiseXor, s.u32, f.op(Op.BitwiseAnd, s.u32, x, s.c(mask)), magic)
                q = f.op(Op.FSub, self.h2, f.op(Op.Bitcast, self.h2, u), offset)
                pairs.append((f.op(Op.FConvert, self.vec2, q),
                              (self._field_index(r, shift), self._field_index(r, shift + 16))))
        out: list[tuple[int, tuple[int, ...]]] = []
        for (x, ix), (y, iy) in zip(pairs[::2], pairs[1::2], strict=True):
            out.append((f.op(Op.VectorShuffle, self.vec4, x, y, 0, 1, 2, 3), ix + iy))
        return d, out

    def _field_index(self, run: int, bit: int) -> int:
        """Which weight of a block sits at bit `bit` of data run `run`. q8_0: byte
        4 run + bit / 8; q4_0: the low nibble of byte k is weight k, the high one k + 16."""
        if self.fmt.nibbles:
            byte = 4 * run + bit // 8
            return byte + (BLOCK_ELEMS // 2 if bit % 8 else 0)
        return 4 * run + bit // 8

    def _accumulate_blocks(self, accs: list[list[int]], loaded: _Loaded) -> None:
        """accs[r][j] += d_j * (the block's weights of column j . A's row r there)."""
        f, v = self.s.f, self.vec4
        a_units, blocks = loaded
        # A's 32 elements of each row as float32, by index in the block.
        a = []
        for units in a_units:
            elems: dict[int, int] = {}
            for i, unit in enumerate(units):
                for half, vec in enumerate(self._widen(unit)):
                    for c, e in enumerate(self._widened(half)):
                        elems[8 * i + e] = f.op(Op.CompositeExtract, self.f32, vec, c)
            a.append(elems)
        gathered: dict[tuple[int, tuple[int, ...]], int] = {}  # (row, indices) -> vec4
        for j, block in enumerate(blocks):
            d, w = self._weights(block)
            for r in range(self.t.rows):
                partial = None
                for vec, ix in w:
                    key = (r, ix)
                    if key not in gathered:
                        gathered[key] = f.op(Op.CompositeConstruct, v, *(a[r][e] for e in ix))
                    prod = f.op(Op.FMul, v, gathered[key], vec)
                    partial = prod if partial is None else f.op(Op.FAdd, v, partial, prod)
                assert partial is not None
                accs[r][j] = f.op(Op.FAdd, v, accs[r][j],
                                  f.op(Op.VectorTimesScalar, v, partial, d))
