"""The opt-in integer product of a quantized weight (matmul's activation_quant="q8_1"):
whether it can run, and its kernel.

x is quantized to q8_1 blocks and multiplied by the q4_0 / q8_0 weight in 8-bit integer
dot products (codegen/gemv_q8_1.py): the gemv kernel's few-row structure on a tile of its
own (gemv_tiles.integer_gemv_tile), any number of rows (more than GEMV_MAX_ROWS in further
row blocks). Never chosen by default: the result differs from the float
product by the quantization of x.

A pass of its own writes x's q8_1 blocks first (codegen/quant_q8_1.py), then the integer
kernel reads them: two dispatches. A kernel that quantizes x itself, in registers
(fused_quant, one dispatch, the same bits) exists and the benchmark times it beside the
pass, but the policy takes it up to FUSED_MAX_ROWS rows only, now none: it quantizes each
block once per strip of columns, and on an H100 that made it twice the pass's time at one
row and worse beyond (docs/design.md, Quantized weights).
"""

from __future__ import annotations

from coopmat.codegen.gemv_q8_1 import ACTIVATION_QUANT, GemvQ8_1Traits, q8_1_traits
from coopmat.codegen.traits import EpilogueOps
from coopmat.codegen.variants import is_cpu, khr_subgroup_size
from coopmat.common.enums import ComponentType
from coopmat.common.quant_formats import BLOCK_ELEMS
from coopmat.device.model import PhysicalDeviceInfo
from coopmat.policy.gemv_tiles import gemv_traits, integer_gemv_tile
from coopmat.policy.types import TypePair

ACTIVATION_QUANTS = (ACTIVATION_QUANT,)
WEIGHTS = ("q4_0", "q8_0")  # the weight formats the integer kernel reads
FUSED_MAX_ROWS = 0  # rows up to which the kernel quantizes x itself (see above)


def check_name(name: str) -> None:
    """ValueError unless `name` is an activation quantization coopmat has."""
    if name not in ACTIVATION_QUANTS:
        raise ValueError(f"activation_quant={name!r}: coopmat has "
                         f"{', '.join(map(repr, ACTIVATION_QUANTS))} (or None: exact float "
                         f"activations)")


def q8_1_violation(info: PhysicalDeviceInfo, pair: TypePair, b_quant: str | None,
                   K: int) -> str | None:
    """Why x @ w.T cannot run with x quantized to q8_1, or None where it can: a q4_0 or
    q8_0 weight, float16 x with a float result, K whole blocks, and a device with 8-bit
    integer dot products and subgroup arithmetic."""
    if b_quant not in WEIGHTS:
        return (f"it multiplies a q4_0 or q8_0 weight (a coopmat.QuantizedArray), not "
                f"{'a float B' if b_quant is None else b_quant}")
    if pair.operand != ComponentType.FLOAT16:
        return f"it quantizes float16 activations, not {pair.operand.name.lower()}"
    if not pair.stored.is_float or pair.result != ComponentType.FLOAT32:
        return f"it computes float results in float32, not {pair.describe_result()}"
    if K % BLOCK_ELEMS:
        return f"K={K} is not whole {BLOCK_ELEMS}-element blocks"
    if not info.has("shaderIntegerDotProduct"):
        return (f"device {info.index} ({info.name}) lacks shaderIntegerDotProduct (8-bit "
                f"integer dot products)")
    if info.limits.subgroup_arithmetic is False:
        return f"device {info.index} ({info.name}) lacks subgroup arithmetic"
    return None


def fuses_quant(M: int) -> bool:
    """Whether the integer product of M rows quantizes x inside its kernel (one
    dispatch) rather than in a pass of its own first."""
    return M <= FUSED_MAX_ROWS


def q8_1_kernel(info: PhysicalDeviceInfo, pair: TypePair, M: int, N: int, K: int,
                b_quant: str, ops: EpilogueOps | None = None,
                fused: bool | None = None) -> GemvQ8_1Traits:
    """The integer kernel for an M x K x against an N x K weight of format b_quant: the
    integer kernel's tile for M rows and N columns, reading x itself where `fused` (None:
    fuses_quant(M)), else its q8_1 blocks."""
    tile = integer_gemv_tile(M, khr_subgroup_size(info.limits), b_quant, N, cpu=is_cpu(info))
    gemv = gemv_traits(pair.operand, pair.result, info.limits, False, M, tile=tile,
                       out_type=pair.out, ops=ops, b_quant=b_quant, K=K, N=N)
    return q8_1_traits(gemv, fuses_quant(M) if fused is None else fused)
