"""The oracle of quantized weights: gguf.quants (llama.cpp's own quantizer and
dequantizer), and integer weights whose blocks quantize with scale d = 1, so that every
product and sum with small-integer x is exact in float32."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants

QTYPE = {"q8_0": QT.Q8_0, "q4_0": QT.Q4_0}
RNG = np.random.default_rng(16)


def exact_weight(fmt: str, n: int, k: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """Integer weights that gguf quantizes with d = 1 (so dequantize gives them back)."""
    rng = rng or RNG
    if fmt == "q8_0":
        w = rng.integers(-100, 101, (n, k // 32, 32))
        w[:, :, 0] = 127 * rng.choice([-1, 1], (n, k // 32))
    else:
        w = rng.integers(-7, 8, (n, k // 32, 32))
        w[:, :, 0] = -8
    w = np.take_along_axis(w, rng.permuted(np.tile(np.arange(32), (n, k // 32, 1)), axis=2),
                           axis=2)  # the extreme value anywhere in its block
    return w.reshape(n, k).astype(np.float32)


def oracle(fmt: str, w: np.ndarray) -> np.ndarray:
    """gguf's dequantization of gguf's quantization of w, in float64."""
    return quants.dequantize(quants.quantize(w, QTYPE[fmt]), QTYPE[fmt]).astype(np.float64)
