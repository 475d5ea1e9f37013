"""The GGUF block formats coopmat keeps on the device, in one table.

One row per format: its name (as `coopmat.quantize` takes it), the GGMLQuantizationType
value llama.cpp's `gguf` package names it by, the block geometry and how a block decodes.
The layouts are llama.cpp's (ggml-common.h), bit for bit, so tensors read from a GGUF file
go to the device as stored. Both formats here are 32 weights a block, led by a float16
scale `d`, little-endian:

- q8_0: 34 bytes, `d` then 32 int8 `qs`; weight i = qs[i] * d.
- q4_0: 18 bytes, `d` then 16 bytes `qs`; weight i (i < 16) = ((qs[i] & 0xF) - 8) * d,
  weight i + 16 = ((qs[i] >> 4) - 8) * d: low nibbles are weights 0..15, high 16..31.

Leaf module: it imports nothing of coopmat and not `gguf` (an optional dependency).
"""

from __future__ import annotations

from dataclasses import dataclass

BLOCK_ELEMS = 32  # weights per block, both formats
SCALE_BYTES = 2  # the float16 `d` that leads each block


@dataclass(frozen=True)
class QuantFormat:
    name: str  # "q8_0", as coopmat.quantize takes it
    ggml_type: int  # gguf.GGMLQuantizationType value (Q8_0 = 8, Q4_0 = 2)
    bits: int  # bits per weight in `qs`
    block_elems: int
    block_bytes: int
    decode: str  # the formula, for docs and error messages

    def row_bytes(self, k: int) -> int:
        """Bytes of one row of k weights (k a multiple of block_elems)."""
        return k // self.block_elems * self.block_bytes

    @property
    def nibbles(self) -> bool:
        """Two weights a byte (q4_0): low nibbles first half of the block, high second."""
        return self.bits == 4

    @property
    def field_mask(self) -> int:
        """The mask of one weight's bits."""
        return (1 << self.bits) - 1

    @property
    def zero_point(self) -> int:
        """The weight's field read unsigned, minus this, is the weight: q4_0 stores n = w + 8;
        q8_0's int8 with its sign bit flipped is w + 128."""
        return 1 << (self.bits - 1)


FORMATS: dict[str, QuantFormat] = {f.name: f for f in (
    QuantFormat("q8_0", 8, 8, BLOCK_ELEMS, SCALE_BYTES + BLOCK_ELEMS,
                "w[i] = int8(qs[i]) * d"),
    QuantFormat("q4_0", 2, 4, BLOCK_ELEMS, SCALE_BYTES + BLOCK_ELEMS // 2,
                "w[i] = (((qs[i % 16] >> 4 * (i // 16)) & 0xF) - 8) * d"),
)}


def quant_format(name: str) -> QuantFormat:
    """The row for `name` (case-insensitive, "Q8_0" or "q8_0"); ValueError naming the
    formats otherwise."""
    fmt = FORMATS.get(str(name).lower())
    if fmt is None:
        raise ValueError(f"unknown quantized format {name!r}; coopmat keeps "
                         f"{', '.join(FORMATS)} on the device")
    return fmt


def by_ggml_type(ggml_type: int) -> QuantFormat | None:
    return next((f for f in FORMATS.values() if f.ggml_type == int(ggml_type)), None)
