"""Mid-size products (#49): would the nv2 family's workgroup-scope tiles run a split-K's
slices faster than khr? A split of M x N x K in S slices runs the work of an unsplit
(S M) x N x (K / S) product (the same workgroups, each as deep), so this times those on
every nv2 tile the device allows beside the policy's (khr) kernel.

    python lab/nv2_slices.py [--shapes 1024x4096x1792,...] [--max-tiles 8]

Each line: shape, family and tile, kernel us (median of --repeat, one call a submission),
TFLOP/s, and whether rows 0-7 match float64 numpy.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

import numpy as np
from split_tiles import time_one  # the same timing and check as the split sweep

from coopmat import policy
from coopmat.codegen import Layout
from coopmat.codegen.nv2_tiles import nv2_traits
from coopmat.codegen.traits import ComponentType
from coopmat.dispatch.runtime import runtime
from coopmat.policy.tiles import nv2_tiles
from coopmat.tools.bench import make_operands
from coopmat.tools.bench_infer import hold_clock


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1024x4096x1792,1024x4096x3584,512x4096x3584")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--max-tiles", type=int, default=8)
    args = ap.parse_args()
    hold_clock()  # a CUDA context keeps the GPU's clock up (lab/notebook/benchmarks.md)
    rt = runtime()
    info = rt.device.info
    pair = policy.resolve(info, np.float16, np.float16)
    tiles = nv2_tiles(info, ComponentType.FLOAT16, ComponentType.FLOAT32)[:args.max_tiles]
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        M, N, K = (int(v) for v in shape.split("x"))
        a, b = make_operands(np.dtype(np.float16), M, N, K, "nt", rng)
        ref = a[:8].astype(np.float64) @ b.astype(np.float64)
        flops = 2.0 * M * N * K
        candidates: list[Any] = [None]
        for tile in tiles:
            try:
                candidates.append(replace(nv2_traits(
                    ComponentType.FLOAT16, ComponentType.FLOAT32,
                    info.flexible_dimensions_properties, info.limits.subgroup_size,
                    Layout.ROW_MAJOR, Layout.COLUMN_MAJOR, False, tile), out_type=pair.out))
            except ValueError as e:
                print(f"{shape} nv2 {tile.describe()}: {e}")
        for traits in candidates:
            try:
                t, ok, _, name = time_one(rt, pair, a, b, ref, traits, None, args.repeat)
            except Exception as e:  # a tile the driver or the plan refuses: say so, go on
                print(f"{shape} {traits.tile.describe() if traits else 'policy'}: "
                      f"{str(e)[:100]}", flush=True)
                continue
            print(f"{shape} {1e6 * t:8.1f} us {flops / t / 1e12:6.1f} T ok={ok} {name}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
