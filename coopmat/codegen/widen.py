"""16-byte units of eight 16-bit floats (a uvec4 load) widened to float32 in registers.

float16: each pair of 32-bit words bitcast to four halves and converted (OpFConvert).
bfloat16: integer operations only (a bfloat16 is the top half of a float32: w << 16 and
w & 0xffff0000 are the even and odd elements of a word), so no bfloat16 feature is needed.
"""

from __future__ import annotations

from coopmat.codegen.shader import ShaderContext
from coopmat.codegen.spv import Op
from coopmat.codegen.traits import GEMV_VECTOR as UNIT_ELEMS
from coopmat.common.enums import ComponentType

UNIT_BYTES = 16  # one load: UNIT_ELEMS 16-bit elements as four 32-bit words


class UnitWidener:
    """Declares the vector types it needs once; `widen` emits one unit's conversion."""

    def __init__(self, s: ShaderContext, operand: ComponentType) -> None:
        mb = s.mb
        self.s = s
        self.f32 = mb.type_float(32)
        self.vec4 = mb.type_vector(self.f32, 4)
        self.uvec4 = mb.type_vector(s.u32, 4)
        self.uvec2 = mb.type_vector(s.u32, 2)
        self.bf16 = operand == ComponentType.BFLOAT16
        if self.bf16:
            self.shift16 = mb.const_composite(self.uvec4, [s.c(16)] * 4)
            self.high16 = mb.const_composite(self.uvec4, [s.c(0xFFFF0000)] * 4)
        else:
            self.h4 = mb.type_vector(mb.type_float(16), 4)

    def widen(self, unit: int) -> tuple[int, int]:
        """A unit as two float32 vec4s holding its 8 elements in `order`'s order (the
        same for every unit, so two widened units pair their elements in a dot product)."""
        f = self.s.f
        if self.bf16:
            even = f.op(Op.ShiftLeftLogical, self.uvec4, unit, self.shift16)
            odd = f.op(Op.BitwiseAnd, self.uvec4, unit, self.high16)
            return (f.op(Op.Bitcast, self.vec4, even), f.op(Op.Bitcast, self.vec4, odd))
        out = []
        for lo in (0, 2):
            words = f.op(Op.VectorShuffle, self.uvec2, unit, unit, lo, lo + 1)
            halves = f.op(Op.Bitcast, self.h4, words)
            out.append(f.op(Op.FConvert, self.vec4, halves))
        return out[0], out[1]

    def order(self, half: int) -> tuple[int, ...]:
        """Which of a unit's 8 elements `widen`'s vec4 number `half` holds, in order."""
        if self.bf16:
            return tuple(range(half, UNIT_ELEMS, 2))  # the even or odd halves of words
        return tuple(range(4 * half, 4 * half + 4))
