"""Sweep definitions for `python -m coopmat.bench` (`coopmat-bench`).

Sizes are (M, N, K). Square powers of two show peak throughput; the LLM-shaped ones
(a few rows against a 4096x4096 weight) show the small-M regime of inference.
"""

from __future__ import annotations

from typing import Any

SQUARE = [(n, n, n) for n in (256, 512, 1024, 2048, 4096, 8192)]
LLM = [(m, 4096, 4096) for m in (1, 4, 16, 64)]
SMALL = [(n, n, n) for n in (16, 64, 128, 256)]  # what a CPU driver gets through quickly

# operand dtype -> result dtype, as coopmat.supported_dtypes() names them
DTYPES = ["float16->float16", "float16->float32", "bfloat16->float32", "int8->int32",
          "uint8->uint32"]

# nn: both row-major; tn: A is a transposed view; nt: B is a transposed view
LAYOUTS = ["nn", "tn", "nt"]

PRESETS: dict[str, dict[str, list[Any]]] = {
    "gpu": {"sizes": SQUARE + LLM, "layouts": ["nn"]},
    "full": {"sizes": SQUARE + LLM, "layouts": LAYOUTS},
    "cpu": {"sizes": SMALL, "layouts": ["nn", "tn"]},
}
