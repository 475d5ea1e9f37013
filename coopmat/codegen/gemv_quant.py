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

The weights are widened to float32 four at a time, in the order gemv.py's `_widen` puts
A's elements (float16: consecutive; bfloat16: even then odd), so A is widened exactly as
for a float B: q = the signed field of 8 bits (q8_0) or 4 bits (q4_0) at the weight's bit
of its run, by two shifts of a uvec4. For q4_0 each run is first XORed with 0x88888888:
flipping a nibble's top bit turns n into the 4-bit two's complement of n - 8, so the
signed field is the weight's (n - 8) at once.
"""

from __future__ import annotations

from coopmat.codegen import abi
from coopmat.codegen.gemv import GemvEmitter
from coopmat.codegen.quant import block_words, funnel, read_words, row_bytes, scale
from coopmat.codegen.shader import Buffer
from coopmat.codegen.spv import Op
from coopmat.codegen.traits import GEMV_VECTOR, GemvTraits
from coopmat.quant_formats import BLOCK_ELEMS, quant_format

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

    # -- B: blocks as 32-bit words ---------------------------------------------------------
    def _b_buffer(self) -> Buffer:
        return self.s.storage_buffer(abi.BINDING_B, self.s.u32, 4, True, "B", restrict=True)

    def _b_setup(self, batch: int) -> None:
        # One weight for every batch entry (abi.quant_violation): no batch stride.
        self.row_bytes = row_bytes(self.s, self.fmt, self.P["K"])

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
        a = [[s.buffer_load(self.A, s.add(row, s.add(a_at, s.c(i)))) for i in range(_A_UNITS)]
             for row in self.a_row]
        if valid is not None:
            b = [([s.select(s.u32, valid, words[0], s.c(0)), *words[1:]], sh)
                 for words, sh in b]
            a = [[s.select(self.uvec4, valid, x, self.zero_unit) for x in units]
                 for units in a]
        return a, b

    # -- arithmetic -------------------------------------------------------------------------
    def _weights(self, block: _Block) -> tuple[int, list[int]]:
        """(d, the block's 32 weights as 8 float32 vec4s in `_widen`'s order of A's
        elements: unit i's vec4 h holds weights 8 i + _widened(h))."""
        s, f = self.s, self.s.f
        words, sh = block
        d = scale(s, words[0], sh)
        runs = funnel(s, words, sh, skip_half=True)  # the bytes after d
        width = self.fmt.bits
        if self.fmt.nibbles:  # nibble n -> the 4-bit two's complement of n - 8
            runs = [f.op(Op.BitwiseXor, s.u32, r, s.c(0x88888888)) for r in runs]
        top = s.mb.const_composite(self.uvec4, [s.c(32 - width)] * 4)
        out = []
        for i in range(_A_UNITS):
            for half in (0, 1):
                fields = [self._field(8 * i + e) for e in self._widened(half)]
                vec = f.op(Op.CompositeConstruct, self.uvec4, *(runs[r] for r, _ in fields))
                # The signed field of `width` bits at bit b: shifted to the top, then back
                # down arithmetically (sign-extending).
                up = s.mb.const_composite(self.uvec4, [s.c(32 - width - b) for _, b in fields])
                q = f.op(Op.ShiftRightArithmetic, self.uvec4,
                         f.op(Op.ShiftLeftLogical, self.uvec4, vec, up), top)
                out.append(f.op(Op.ConvertSToF, self.vec4, q))
        return d, out

    def _field(self, k: int) -> tuple[int, int]:
        """(run, bit): where weight k of a block sits among its data runs. q8_0: byte k;
        q4_0: the low nibble of byte k for k < 16, the high nibble of byte k - 16 after."""
        if self.fmt.nibbles:
            byte, bit = k % (BLOCK_ELEMS // 2), 4 * (k // (BLOCK_ELEMS // 2))
        else:
            byte, bit = k, 0
        return byte // 4, 8 * (byte % 4) + bit

    def _accumulate_blocks(self, accs: list[list[int]], loaded: _Loaded) -> None:
        """accs[r][j] += d_j * (the block's weights of column j . A's row r there)."""
        f, v = self.s.f, self.vec4
        a_units, blocks = loaded
        a = [[x for unit in units for x in self._widen(unit)] for units in a_units]
        for j, block in enumerate(blocks):
            d, w = self._weights(block)
            for r in range(self.t.rows):
                partial = f.op(Op.FMul, v, a[r][0], w[0])
                for x, y in zip(a[r][1:], w[1:], strict=True):
                    partial = f.op(Op.FAdd, v, partial, f.op(Op.FMul, v, x, y))
                accs[r][j] = f.op(Op.FAdd, v, accs[r][j],
                                  f.op(Op.VectorTimesScalar, v, partial, d))
