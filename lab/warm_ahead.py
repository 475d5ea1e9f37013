"""Mid-size products (#49): the policy's kernel with B's sectors touched some K steps
ahead (KhrTraits.warm_ahead), against the same kernel without, for x @ w.T with w of
N x K (B column-major).

    python lab/warm_ahead.py [--shapes 128x4096x14336,...] [--ahead 0,2,4,8] [--rounds 2]

Each line: shape, split, warm_ahead, kernel us (median of --repeat), TFLOP/s, and whether
the result matches float64 numpy (rows 0-7).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from typing import Any

import numpy as np

from coopmat import policy
from coopmat.dispatch.gemm import PreparedGemm
from coopmat.dispatch.runtime import runtime
from coopmat.policy import Options
from coopmat.tools.bench import make_operands, spin_until_steady
from coopmat.tools.bench_infer import hold_clock


def time_one(rt: Any, pair: Any, a: np.ndarray, b: np.ndarray, traits: Any,
             split: int | None, repeat: int) -> tuple[float, np.ndarray, Any]:
    options = Options(split_k=split) if split else Options()
    g = PreparedGemm(rt, pair, a[None], b[None], None, 1, 1, 0, traits=traits,
                     options=options)
    try:
        g.execute()
        spin_until_steady(lambda: g.execute(transfers=False), 0.1)
        times = [g.execute(transfers=False) or 0.0 for _ in range(repeat)]
        out = np.empty((1,) + g.shape[1:3], g.result_dtype)
        g.read(out)
        return statistics.median(times), out[0], g.choice
    finally:
        g.release()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="128x4096x14336,256x4096x14336,512x4096x14336")
    ap.add_argument("--ahead", default="0,2,4,8")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    hold_clock()  # a CUDA context keeps the GPU's clock up (lab/notebook/benchmarks.md)
    rt = runtime()
    pair = policy.resolve(rt.device.info, np.float16, np.float16)
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        M, N, K = (int(v) for v in shape.split("x"))
        a, b = make_operands(np.dtype(np.float16), M, N, K, "nt", rng)
        rows = min(M, 8)
        ref = a[:rows].astype(np.float64) @ b.astype(np.float64)
        tol = 2e-2 * np.sqrt(K)
        _, _, choice = time_one(rt, pair, a, b, None, None, 1)
        flops = 2.0 * M * N * K
        for r in range(args.rounds):
            for ahead in (int(v) for v in args.ahead.split(",")):
                try:
                    traits = dataclasses.replace(choice.traits, warm_ahead=ahead)
                    t, out, got = time_one(rt, pair, a, b, traits, choice.split_k,
                                           args.repeat)
                except (TypeError, ValueError) as e:  # not a khr kernel, or refused
                    print(f"{shape} warm={ahead} {choice.traits.describe()}: {e}")
                    continue
                ok = bool(np.allclose(out[:rows], ref, rtol=2e-2, atol=tol))
                print(f"{shape} round {r} S={got.split_k} warm={ahead} {1e6 * t:8.1f} us "
                      f"{flops / t / 1e12:6.1f} T ok={ok} {got.traits.describe()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
