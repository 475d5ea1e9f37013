"""Mid-size products (#49): the split-K slices' tile and slice count swept by kernel time,
against the policy's choice, for x @ w.T with w of N x K (B column-major).

    python lab/split_tiles.py [--rows 128,256,512] [--n 4096] [--k 14336] [--splits 1,2,4,8]
        [--serial 20]

Each line: rows, S, tile, workgroups, kernel us (median of --repeat), TFLOP/s, and whether
rows 0-7 match float64 numpy. The policy's own choice comes first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import numpy as np

from coopmat import codegen, policy
from coopmat.codegen import GemmParams, Layout
from coopmat.dispatch.gemm import PreparedGemm
from coopmat.dispatch.runtime import runtime
from coopmat.policy import Options, tuning
from coopmat.policy.tiles import khr_tune_tiles
from coopmat.tools.bench import make_operands, spin_until_steady
from coopmat.tools.bench_infer import hold_clock


def time_one(rt: Any, pair: Any, a: np.ndarray, b: np.ndarray, ref: np.ndarray,
             traits: Any, S: int | None, repeat: int,
             serial: int = 0) -> tuple[float, bool, int, str]:
    """(kernel seconds, rows 0-7 within tolerance of `ref`, the split run, the kernel's
    name): the median of `repeat` runs, each one call a submission, or with `serial` the
    median of `repeat` submissions of `serial` runs back to back (as peers time theirs)."""
    options = Options(split_k=S) if S else Options()
    g = PreparedGemm(rt, pair, a[None], b[None], None, 1, 1, 0, traits=traits, options=options)
    try:
        g.execute()
        spin_until_steady(lambda: g.execute(transfers=False), 0.1)
        if serial:
            g.serial_seconds(serial, submits=1)  # untimed: the first runs of a case lag
            times = [g.serial_seconds(serial, submits=1) or 0.0 for _ in range(repeat)]
        else:
            times = [g.execute(transfers=False) or 0.0 for _ in range(repeat)]
        out = np.empty((1,) + g.shape[1:3], g.result_dtype)
        g.read(out)
        name = g.choice.traits.describe()
    finally:
        g.release()
    ok = bool(np.allclose(out[0, :8], ref, rtol=2e-2, atol=2e-2 * np.sqrt(a.shape[1])))
    return statistics.median(times), ok, g.choice.split_k, name


def timing_args(ap: argparse.ArgumentParser, max_tiles: int) -> None:
    """The options time_one's callers share: how many runs, how many tiles, back to back."""
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--max-tiles", type=int, default=max_tiles)
    ap.add_argument("--serial", type=int, default=0, metavar="N",
                    help="time N runs back to back a submission (0: one run a submission)")


def float16_setup() -> tuple[Any, Any, Any]:
    """(runtime, device info, the float16 pair), the GPU's clock held up first."""
    hold_clock()  # a CUDA context keeps the GPU's clock up (lab/notebook/benchmarks.md)
    rt = runtime()
    return rt, rt.device.info, policy.resolve(rt.device.info, np.float16, np.float16)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="128,256,512")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=14336)
    ap.add_argument("--splits", default="1,2,4,8")
    timing_args(ap, 16)
    args = ap.parse_args()
    rt, info, pair = float16_setup()
    config = policy.config_for(info, pair)
    assert config is not None, "no float16 configuration with float32 accumulation"
    rng = np.random.default_rng(0)
    N, K = args.n, args.k
    # the float16 pairs' tuned tiles first (the policy's own for large products; another
    # pair's, int8's, may need more shared memory at float16), then the tuner's list
    tiles = list(dict.fromkeys(tile for key, (family, tile) in tuning.choices(info).items()
                               if family == "khr" and key.startswith("float16->")))
    tiles += [t for t in khr_tune_tiles(config, info.limits) if t not in tiles]
    tiles = [t for t in tiles if t.tile_m in (64, 128) and t.tile_n in (64, 128, 256)]
    tiles = tiles[:args.max_tiles]
    for M in (int(v) for v in args.rows.split(",")):
        a, b = make_operands(np.dtype(np.float16), M, N, K, "nt", rng)
        ref = a[:8].astype(np.float64) @ b.astype(np.float64)
        flops = 2.0 * M * N * K
        t, ok, S, name = time_one(rt, pair, a, b, ref, None, None, args.repeat,
                                   args.serial)
        print(f"{M:5d} policy S={S} {1e6 * t:8.1f} us {flops / t / 1e12:6.1f} T ok={ok} "
              f"{name}", flush=True)
        for S in (int(v) for v in args.splits.split(",")):
            Ks = K // S
            if K % S:
                continue
            params = GemmParams(M, N, Ks, K, K, N, N, Ks, Ks, 0, M * N)
            for tile in tiles:
                try:
                    base = codegen.khr_traits(config, info, Layout.ROW_MAJOR,
                                              Layout.COLUMN_MAJOR, False, tile)
                    traits = policy.fastest_variant(base, params, S, Options(split_k=S))
                    t, ok, got, name = time_one(rt, pair, a, b, ref, traits, S,
                                                args.repeat, args.serial)
                except Exception as e:  # a tile the split refuses: say so, go on
                    print(f"{M:5d} S={S} {tile.describe():<24} error: {str(e)[:80]}",
                          flush=True)
                    continue
                groups = -(-M // tile.tile_m) * -(-N // tile.tile_n) * got
                print(f"{M:5d} S={got} {tile.describe():<24} wg={groups:4d} "
                      f"{1e6 * t:8.1f} us {flops / t / 1e12:6.1f} T ok={ok} {name}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
