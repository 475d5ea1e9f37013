"""One to a few rows against a q4_0 / q8_0 weight (#49): does a gemv lane reading half a
block (two lanes a block, `GemvTraits.half_blocks`) beat the policy's block a lane?

    python lab/gemv_half_blocks.py [--rows 1,2] [--n 4096] [--k 14336] [--formats q4_0,q8_0]

Each line: format, rows, the kernel's name, GPU time by timestamps (median of --repeat
back-to-back runs, the bench's seam; the gemv family forced), the blocks' bytes read per second, and the largest
difference from the policy kernel's result relative to its largest value (the two differ
only in the order of float32 additions). The policy's kernel comes first, then the
half-block kernel on the policy's tile and on the swept (C columns, U units) tiles.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

import numpy as np

from coopmat.api.array import asarray, empty
from coopmat.api.matmul import device_operand
from coopmat.api.quantized import quantize
from coopmat.codegen.traits import gemv_tile
from coopmat.dispatch.gemm import device_plan, plan_serial_seconds
from coopmat.dispatch.runtime import runtime
from coopmat.policy import current_options, resolve
from coopmat.tools.bench_infer import warm_up

BYTES_PER_BLOCK = {"q4_0": 18, "q8_0": 34}


def time_plan(rt: Any, pair: Any, a: Any, b: Any, out: Any, shape: tuple[int, ...],
              traits: Any, repeat: int) -> tuple[float, str, np.ndarray]:
    # the gemv family (a CPU driver's policy takes khr for these shapes)
    plan = device_plan(rt, pair, a, b, None, shape, 1, 0, current_options().with_family("gemv"),
                       traits=traits)
    plan_serial_seconds(rt, plan, a, b, out, repeat, 1)  # untimed: first runs can lag
    t = plan_serial_seconds(rt, plan, a, b, out, repeat)
    return (t or float("nan")), plan.traits.describe(), plan.traits


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=14336)
    ap.add_argument("--formats", default="q4_0,q8_0")
    ap.add_argument("--cols", default="1,2,4")
    ap.add_argument("--unroll", default="1,2,4")
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    rt = runtime()
    warm_up()
    rng = np.random.default_rng(0)
    N, K = args.n, args.k
    w = rng.standard_normal((N, K), dtype=np.float32)
    for fmt in args.formats.split(","):
        wq = quantize(w, fmt)
        for M in (int(v) for v in args.rows.split(",")):
            x = asarray(rng.standard_normal((M, K), dtype=np.float32).astype(np.float16))
            d = empty((M, N), np.float16)
            a, out, b = device_operand(x, 0), device_operand(d, 2), device_operand(wq.T, 1)
            pair = resolve(rt.device.info, x.dtype, x.dtype)
            shape = (1, M, N, K)
            gb = N * K // 32 * BYTES_PER_BLOCK[fmt] / 1e9
            t, name, base = time_plan(rt, pair, a, b, out, shape, None, args.repeat)
            ref = d.numpy().astype(np.float64)
            scale = float(np.abs(ref).max())
            print(f"{fmt} M={M} policy {name} {1e6 * t:7.2f} us {gb / t / 1e3:5.2f} TB/s",
                  flush=True)
            sg, splits = base.subgroup_size, base.splits
            tiles = [(base.cols, base.unroll)] + [
                (c, u) for c in (int(v) for v in args.cols.split(","))
                for u in (int(v) for v in args.unroll.split(","))
                if (c, u) != (base.cols, base.unroll)]
            for cols, unroll in tiles:
                tile = gemv_tile(rows=base.rows, cols=cols, splits=splits, unroll=unroll,
                                 subgroup_size=sg, b_quant=fmt, half_blocks=True)
                traits = replace(base, tile=tile, half_blocks=True)
                t, name, _ = time_plan(rt, pair, a, b, out, shape, traits, args.repeat)
                diff = float(np.abs(d.numpy().astype(np.float64) - ref).max()) / scale
                print(f"{fmt} M={M} half C={cols} U={unroll} {name} {1e6 * t:7.2f} us "
                      f"{gb / t / 1e3:5.2f} TB/s diff {diff:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
