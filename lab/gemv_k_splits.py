"""One to a few rows against a q4_0 / q8_0 weight (#49): the gemv kernel with K split
between the subgroups of a workgroup (`GemvTraits.k_splits`, Q subgroups on the same
columns, their sums added through shared memory) against the policy's kernel, for the
float path and the opt-in integer path (activation_quant="q8_1", x quantized by a pass).

    python lab/gemv_k_splits.py [--rows 1,2] [--shapes 4096x14336] [--formats q4_0,q8_0]
        [--paths float,q8_1] [--cols 1,2,4] [--unroll 1,2,4] [--groups 4x1,1x4,2x2,1x8,2x4]

--shapes lists weights as N x K (outputs x depth). Each line: path, format, rows, N x K,
the kernel's name, GPU time by timestamps (median of
submissions of --repeat runs back to back, the bench's seam; a pass that quantizes x
included), the blocks' bytes read per second, and the largest difference from the
policy kernel's result relative to its largest value (the two differ only in the order
of float32 additions). The policy's kernel comes first, then each tile: C columns, U
blocks a lane and step, S column groups x Q subgroups a group (--groups SxQ).
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
from coopmat.dispatch.act_quant import q8_1_plan
from coopmat.dispatch.gemm import device_plan, plan_serial_seconds
from coopmat.dispatch.runtime import runtime
from coopmat.policy import current_options, resolve
from coopmat.tools.bench_infer import warm_up

BYTES_PER_BLOCK = {"q4_0": 18, "q8_0": 34}


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def time_plan(rt: Any, pair: Any, a: Any, b: Any, out: Any, shape: tuple[int, ...],
              path: str, traits: Any, repeat: int) -> tuple[float, Any]:
    """(seconds per run, the GEMM kernel's traits) of the plan for `path` with `traits`
    (None: the policy's)."""
    if path == "q8_1":
        plan = q8_1_plan(rt, pair, a, b, shape, 1, current_options(), fused=False,
                         traits=traits)
    else:
        plan = device_plan(rt, pair, a, b, None, shape, 1, 0,
                           current_options().with_family("gemv"), traits=traits)
    plan_serial_seconds(rt, plan, a, b, out, repeat, 1)  # untimed: first runs can lag
    t = plan_serial_seconds(rt, plan, a, b, out, repeat)
    return (t or float("nan")), plan.traits


def sweep(rt: Any, args: Any, wq: Any, fmt: str, N: int, K: int, rows: list[int],
          groups: list[tuple[int, ...]], rng: Any) -> None:
    gb = N * K // 32 * BYTES_PER_BLOCK[fmt] / 1e9
    for M in rows:
        x = asarray(rng.standard_normal((M, K), dtype=np.float32).astype(np.float16))
        d = empty((M, N), np.float16)
        a, out, b = device_operand(x, 0), device_operand(d, 2), device_operand(wq.T, 1)
        pair = resolve(rt.device.info, x.dtype, x.dtype)
        shape = (1, M, N, K)
        case = f"{fmt} M={M} {N}x{K}"
        for path in args.paths.split(","):
            t, base = time_plan(rt, pair, a, b, out, shape, path, None, args.repeat)
            ref = d.numpy().astype(np.float64)
            scale = float(np.abs(ref).max())
            print(f"{path} {case} policy {base.describe()} {1e6 * t:7.2f} us "
                  f"{gb / t / 1e3:5.2f} TB/s", flush=True)
            best = (t, "policy")
            for cols in ints(args.cols):
                for unroll in ints(args.unroll):
                    for splits, k_splits in groups:
                        tile = gemv_tile(rows=base.rows, cols=cols, splits=splits,
                                         unroll=unroll, subgroup_size=base.subgroup_size,
                                         b_quant=fmt, k_splits=k_splits)
                        t, _ = time_plan(rt, pair, a, b, out, shape, path,
                                         replace(base, tile=tile), args.repeat)
                        diff = float(np.abs(d.numpy().astype(np.float64) - ref).max()) / scale
                        label = f"C={cols} U={unroll} S={splits} Q={k_splits}"
                        best = min(best, (t, label))
                        print(f"{path} {case} {label} {1e6 * t:7.2f} us "
                              f"{gb / t / 1e3:5.2f} TB/s diff {diff:.1e}", flush=True)
            print(f"{path} {case} best {best[1]} {1e6 * best[0]:7.2f} us", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2")
    ap.add_argument("--shapes", default="4096x14336")
    ap.add_argument("--formats", default="q4_0,q8_0")
    ap.add_argument("--paths", default="float,q8_1")
    ap.add_argument("--cols", default="1,2,4")
    ap.add_argument("--unroll", default="1,2,4")
    ap.add_argument("--groups", default="4x1,1x4,2x2,1x8,2x4")
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    groups = [tuple(int(v) for v in g.split("x")) for g in args.groups.split(",")]
    rt = runtime()
    warm_up()
    rng = np.random.default_rng(0)
    for shape_text in args.shapes.split(","):
        N, K = (int(v) for v in shape_text.split("x"))
        w = rng.standard_normal((N, K), dtype=np.float32)
        for fmt in args.formats.split(","):
            sweep(rt, args, quantize(w, fmt), fmt, N, K, ints(args.rows), groups, rng)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
