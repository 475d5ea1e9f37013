"""The gemv kernel in integers: x quantized to q8_1 blocks (quant_q8_1.py) against a q4_0
or q8_0 weight, products as 8-bit integer dot products (opt-in: coopmat.matmul's
activation_quant="q8_1"; GemvQ8_1Traits, family "gemv_q8_1").

Everything but A and the arithmetic is gemv_quant.py's kernel (workgroups, columns per
subgroup, a whole block of each column per lane and load, clamped rows and columns, the
remainder, the subgroup reduction and the epilogue). A is the blocks the quantizing pass
wrote: block b of row m is the 16-byte units from 4 (m nb + b), where a float16 x's block
would be (the kernel's lda is K), of which a lane loads 3 (the 32 int8 qs, then d and s
as float32) where it loaded 4 of a float16 x.

Per block, column and row, with the weight's scale dw, its quants w and x's (dx, s, qx):
- q8_0: acc += dw * (dx * sum(w * qx)), the sum eight OpSDot of 4 int8 pairs each;
- q4_0: w = n - 8 for the stored nibble n, so sum(w * qx) = sum(n * qx) - 8 sum(qx), and
  dx * sum(qx) is s: acc += dw * (dx * sum(n * qx) - 8 s), the sum eight OpSUDot of 4
  (int8, nibble) pairs: a data word's low nibbles are weights 4i .. 4i + 3 (x's word i),
  its high nibbles weights 16 + 4i .. (x's word 4 + i).
The integer sums are exact (|sum| <= 32 * 127 * 127); each block then costs one
conversion and three or four float32 operations a row, and the sums are float32 scalars.
Needs the device feature shaderIntegerDotProduct (core in Vulkan 1.3, required there).

The fused variant (GemvQ8_1Traits.fused_quant) needs no quantizing pass: A is the float16
x itself, read as gemv_quant.py's kernel reads it (4 units of 16 bytes a block and row),
and the lane that loaded a block quantizes it in registers with the pass's own code
(quant_q8_1.quantize_block: the same bits as the pass's blocks), once per row and block,
before the block's products with all C columns the lane multiplies.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from coopmat.codegen.family import GemvFamily, register_family
from coopmat.codegen.gemv_quant import QuantGemvEmitter
from coopmat.codegen.quant import funnel, scale
from coopmat.codegen.quant_q8_1 import A_READ_UNITS, quantize_block
from coopmat.codegen.spv import (
    Capability,
    Op,
    PackedVectorFormat,
)
from coopmat.codegen.traits import GemmTraits, GemvTraits
from coopmat.common.enums import ComponentType

ACTIVATION_QUANT = "q8_1"
DOT_CAPABILITIES = {Capability.DotProduct, Capability.DotProductInput4x8BitPacked}
_NIBBLES = 0x0F0F0F0F

# One block as loaded: per row the 3 units of A; per column the block's words and the
# scale's bit (gemv_quant._Block).
_Loaded = tuple[list[list[int]], list[tuple[list[int], int]]]


@dataclass(frozen=True)
class GemvQ8_1Traits(GemvTraits):
    """GemvTraits of the integer kernel: A the q8_1 blocks of a float16 x, B a q4_0 or
    q8_0 weight (b_quant); a_type/b_type float16 (the x the quantizing pass reads).
    fused_quant: A is x itself (float16), quantized in registers by the kernel."""

    family: ClassVar[str] = "gemv_q8_1"
    fused_quant: bool = False

    def check_tile(self) -> None:
        super().check_tile()
        if self.b_quant not in ("q4_0", "q8_0"):
            raise ValueError(f"the q8_1 integer kernel takes a q4_0 or q8_0 weight, not "
                             f"{self.b_quant!r}")
        if self.a_type != ComponentType.FLOAT16:
            raise ValueError("the q8_1 integer kernel quantizes float16 activations")

    def describe(self) -> str:
        return super().describe() + f"-a{ACTIVATION_QUANT}" + ("f" if self.fused_quant else "")


def q8_1_traits(gemv: GemvTraits, fused_quant: bool = False) -> GemvQ8_1Traits:
    """`gemv` (a quantized B's gemv traits) as the integer kernel's (fused_quant: the
    variant quantizing x itself)."""
    return GemvQ8_1Traits(**{f.name: getattr(gemv, f.name) for f in fields(gemv)},
                          fused_quant=fused_quant)


class Q8_1GemvEmitter(QuantGemvEmitter):
    """Loads are gemv_quant.py's: of the q8_1 blocks' 4 units a row the first
    A_READ_UNITS, of a float16 x (fused_quant) all 4."""

    def __init__(self, t: GemvQ8_1Traits) -> None:
        super().__init__(t)
        self.fused = t.fused_quant
        if not self.fused:
            self.a_units = A_READ_UNITS

    def _declare(self) -> None:
        super()._declare()
        self.s.mb.capability(*sorted(DOT_CAPABILITIES))
        self.i32 = self.s.mb.type_int(32, True)

    # -- arithmetic ---------------------------------------------------------------------
    def _accumulate_blocks(self, accs: list[list[int]], loaded: _Loaded) -> None:
        """accs[r][j] += dw_j * (dx_r * sum(w_j * qx_r)) (q4_0: minus 8 s_r inside)."""
        s, f = self.s, self.s.f
        a_units, blocks = loaded
        nibbles = self.fmt.nibbles
        rows = []  # per row: x's 8 qs words, dx, and 8 s (q4_0)
        for units in a_units:
            words, dx, sx = self._x_block(units, nibbles)
            s8 = None if sx is None else f.op(Op.FMul, self.f32, sx,
                                                s.mb.constant(self.f32, 8.0))
            rows.append((words, dx, s8))
        for j, (words, sh) in enumerate(blocks):
            dw = scale(s, words[0], sh)
            runs = funnel(s, words, sh, skip_half=True)  # the block's data bytes
            if nibbles:  # (x word, 4 weights): low nibbles, then high ones
                pairs = [(i, f.op(Op.BitwiseAnd, s.u32, run, s.c(_NIBBLES)))
                         for i, run in enumerate(runs)]
                pairs += [(4 + i, f.op(Op.BitwiseAnd, s.u32, s.shr(run, s.c(4)),
                                       s.c(_NIBBLES))) for i, run in enumerate(runs)]
                dot = Op.SUDot
            else:
                pairs, dot = list(enumerate(runs)), Op.SDot
            for r, (xw, dx, s8) in enumerate(rows):
                total = None
                for xi, w in pairs:
                    part = f.op(dot, self.i32, xw[xi], w,
                                PackedVectorFormat.PackedVectorFormat4x8Bit)
                    total = part if total is None else f.op(Op.IAdd, self.i32, total, part)
                assert total is not None
                v = f.op(Op.FMul, self.f32, dx, f.op(Op.ConvertSToF, self.f32, total))
                if s8 is not None:
                    v = f.op(Op.FSub, self.f32, v, s8)
                accs[r][j] = f.op(Op.FAdd, self.f32, accs[r][j], f.op(Op.FMul, self.f32, dw, v))

    def _x_block(self, units: list[int], with_sum: bool) -> tuple[list[int], int, int | None]:
        """One row's block of x as (its 8 qs words, d, s where with_sum): the pass's
        values as loaded, or (fused_quant) x's 32 float16 elements quantized here, once
        for all the columns of the lane."""
        s, f = self.s, self.s.f
        if self.fused:
            q = quantize_block(s, [vec for unit in units for vec in self._widen(unit)])
            return q.words, q.d, q.s if with_sum else None
        words = [f.op(Op.CompositeExtract, s.u32, units[i // 4], i % 4) for i in range(8)]
        d = f.op(Op.Bitcast, self.f32, f.op(Op.CompositeExtract, s.u32, units[2], 0))
        sx = f.op(Op.Bitcast, self.f32, f.op(Op.CompositeExtract, s.u32, units[2], 1)) \
            if with_sum else None
        return words, d, sx

    # -- float32 scalar sums (the float kernels keep vec4s) --------------------------------
    def _load_accs(self) -> list[list[int]]:
        return [[self.s.f.op(Op.Load, self.f32, var) for var in row] for row in self.acc_vars]

    def _lane_sum(self, acc: int) -> int:
        return acc  # a float32 already

    def build(self) -> bytes:
        self._declare()
        self._setup()
        s, t = self.s, self.t
        zero = s.mb.constant(self.f32, 0.0)
        self.acc_vars = [[s.f.local(self.f32, zero) for _ in range(t.cols)]
                         for _ in range(t.rows)]
        self._k_loop()
        self._reduce_and_store()
        return s.compute_module(t.invocations)


class GemvQ8_1Family(GemvFamily):
    """The integer gemv kernel (this module): gemv's kernel description with its own
    traits and the dot-product capabilities."""

    name = GemvQ8_1Traits.family
    traits_class = GemvQ8_1Traits
    extra_capabilities = frozenset(DOT_CAPABILITIES)

    def generate(self, traits: GemmTraits) -> bytes:
        assert isinstance(traits, GemvQ8_1Traits)
        return Q8_1GemvEmitter(traits).build()


register_family(GemvQ8_1Family())
