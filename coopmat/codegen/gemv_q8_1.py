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
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from coopmat.codegen import abi
from coopmat.codegen.family import register_family
from coopmat.codegen.gemv import required_capabilities
from coopmat.codegen.gemv_quant import QuantGemvEmitter
from coopmat.codegen.kernel import Kernel
from coopmat.codegen.quant import funnel, read_words, scale
from coopmat.codegen.quant_q8_1 import A_BLOCK_UNITS, A_READ_UNITS
from coopmat.codegen.spv import (
    Capability,
    Op,
    PackedVectorFormat,
)
from coopmat.codegen.traits import GemmTraits, GemvTraits
from coopmat.codegen.types import vulkan_features
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
    q8_0 weight (b_quant); a_type/b_type float16 (the x the quantizing pass reads)."""

    family: ClassVar[str] = "gemv_q8_1"

    def check_tile(self) -> None:
        super().check_tile()
        if self.b_quant not in ("q4_0", "q8_0"):
            raise ValueError(f"the q8_1 integer kernel takes a q4_0 or q8_0 weight, not "
                             f"{self.b_quant!r}")
        if self.a_type != ComponentType.FLOAT16:
            raise ValueError("the q8_1 integer kernel quantizes float16 activations")

    def describe(self) -> str:
        return super().describe() + f"-a{ACTIVATION_QUANT}"


def q8_1_traits(gemv: GemvTraits) -> GemvQ8_1Traits:
    """`gemv` (a quantized B's gemv traits) as the integer kernel's."""
    return GemvQ8_1Traits(**{f.name: getattr(gemv, f.name) for f in fields(gemv)})


class Q8_1GemvEmitter(QuantGemvEmitter):
    a_units = A_READ_UNITS

    def _declare(self) -> None:
        super()._declare()
        self.s.mb.capability(*sorted(DOT_CAPABILITIES))
        self.i32 = self.s.mb.type_int(32, True)

    # -- loads --------------------------------------------------------------------------
    def _blocks(self, block: int, valid: int | None) -> _Loaded:
        """Block `block` of every column of B and row of A; where `valid` is false, block 0
        is read, A's units are zero (qx, dx and s: no contribution) and so is B's scale."""
        s = self.s
        if valid is not None:
            block = s.select(s.u32, valid, block, s.c(0))
        b_at = s.mul(block, s.c(self.fmt.block_bytes))
        b = [read_words(s, self.B, s.add(col, b_at), self.block_words) for col in self.b_col]
        a_at = s.mul(block, s.c(A_BLOCK_UNITS))
        a = [[s.buffer_load(self.A, s.add(row, s.add(a_at, s.c(i))))
              for i in range(A_READ_UNITS)] for row in self.a_row]
        if valid is not None:
            b = [([s.select(s.u32, valid, words[0], s.c(0)), *words[1:]], sh)
                 for words, sh in b]
            a = [[s.select(self.uvec4, valid, x, self.zero_unit) for x in units]
                 for units in a]
        return a, b

    # -- arithmetic ---------------------------------------------------------------------
    def _accumulate_blocks(self, accs: list[list[int]], loaded: _Loaded) -> None:
        """accs[r][j] += dw_j * (dx_r * sum(w_j * qx_r)) (q4_0: minus 8 s_r inside)."""
        s, f = self.s, self.s.f
        a_units, blocks = loaded
        nibbles = self.fmt.nibbles
        rows = []  # per row: x's 8 qs words, dx, and 8 s (q4_0)
        for units in a_units:
            words = [f.op(Op.CompositeExtract, s.u32, units[i // 4], i % 4) for i in range(8)]
            dx = f.op(Op.Bitcast, self.f32, f.op(Op.CompositeExtract, s.u32, units[2], 0))
            s8 = None
            if nibbles:
                sx = f.op(Op.Bitcast, self.f32, f.op(Op.CompositeExtract, s.u32, units[2], 1))
                s8 = f.op(Op.FMul, self.f32, sx, s.mb.constant(self.f32, 8.0))
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


class GemvQ8_1Family:
    """The integer gemv kernel (this module), beside gemv's own family."""

    name = GemvQ8_1Traits.family

    def describe(self, traits: GemmTraits) -> Kernel:
        if not isinstance(traits, GemvQ8_1Traits):
            raise ValueError(f"traits of family {traits.family!r}, not {self.name!r}")
        traits.check_tile()
        return Kernel(
            traits=traits, spirv=b"", local_size=(traits.invocations, 1, 1),
            required_subgroup_size=traits.subgroup_size, shared_memory_bytes=0,
            push_constant_size=abi.PUSH_CONSTANT_SIZE, bindings=abi.bindings(traits),
            tile_mn=(traits.tile.tile_m, traits.tile.tile_n),
            features=vulkan_features(required_capabilities(traits) | DOT_CAPABILITIES))

    def generate(self, traits: GemmTraits) -> bytes:
        assert isinstance(traits, GemvQ8_1Traits)
        return Q8_1GemvEmitter(traits).build()


register_family(GemvQ8_1Family())
