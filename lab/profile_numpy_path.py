"""numpy -> numpy float16 matmul on a discrete GPU, the whole call: the pipeline
(dispatch/pipeline.py) at several block sizes against the unpipelined path, for four
kinds of call, each the median of --repeat calls after a warm-up:

- new_ab: new A and B each call (neither can be kept imported);
- new_a: a new A each call, the same B (kept imported after its second call);
- same_out: the same A and B, into the same out= array;
- same: the same A and B, a new result each call.

    python benchmarks/profile_numpy_path.py [N ...] [--blocks 16,32] [--repeat 7]
        [--rounds 2] [--trace] [--set NAME=VALUE,...] [--json FILE]

--set changes the pipeline module's constants (WAIT_FOR_B=0, WRITE_THREADS=8, ...);
--trace prints the steps of one pipelined call with new A and B.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import coopmat
from coopmat.dispatch import pipeline, staging
from coopmat.dispatch.host import run_gemm
from coopmat.dispatch.runtime import runtime
from coopmat.policy import Options, resolve
from coopmat.tools.bench_infer import warm_up

WATCHDOG_S = 500


def median_ms(fn: Callable[[Any], object], repeat: int,
              make: Callable[[], Any] = lambda: None) -> float:
    """Median ms of fn(make()) over `repeat` calls after one warm-up, timing fn only."""
    times = []
    for _ in range(repeat + 1):
        args = make()
        t0 = time.perf_counter()
        fn(args)
        times.append(time.perf_counter() - t0)
        del args
    return statistics.median(times[1:]) * 1e3


def measure(a: np.ndarray, b: np.ndarray, d: np.ndarray, want: np.ndarray,
            whole: np.ndarray, repeat: int) -> dict[str, float]:
    """The four kinds of call (module docstring), ms; the largest error of the first rows
    of a product against float64, and whether all of it equals `whole` (the unpipelined
    path's result) bit for bit."""
    got = coopmat.matmul(a.copy(), b.copy())
    return {
        "equal_to_unpipelined": float(np.array_equal(got.view(np.uint16),
                                                     whole.view(np.uint16))),
        "new_ab": median_ms(lambda ab: coopmat.matmul(*ab), repeat,
                            lambda: (a.copy(), b.copy())),
        "new_a": median_ms(lambda x: coopmat.matmul(x, b), repeat, a.copy),
        "same_out": median_ms(lambda _: coopmat.matmul(a, b, out=d), repeat),
        "same": median_ms(lambda _: coopmat.matmul(a, b), repeat),
        "max_err_first_rows": float(np.abs(got[:want.shape[0]] - want).max()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sizes", nargs="*", type=int, default=[4096, 8192])
    ap.add_argument("--blocks", default="32", help="pipeline block sizes, MiB")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--set", default="", help="NAME=VALUE,... of pipeline's constants")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)  # a hang shows its stacks
    for item in filter(None, args.set.split(",")):
        name, value = item.split("=")
        setattr(pipeline, name, int(value))
    rt = runtime()
    # The clock the bench's figures run at: a process with torch's CUDA context keeps the
    # H200 at full clock; without one, the host's long copies between calls let it fall
    # (8192^3 calls went from 11.9 to 16-17 ms within one process on 2026-11-24).
    warm_up(0.3)
    print(f"{rt.device.info.name}: device memory the host maps {pipeline.mapped(rt)}, "
          f"copy queues {rt.copy_engines}")
    rows: dict[str, dict[str, float]] = {}
    rng = np.random.default_rng(1)
    for n in args.sizes:
        a = rng.standard_normal((n, n), dtype=np.float32).astype(np.float16)
        b = rng.standard_normal((n, n), dtype=np.float32).astype(np.float16)
        d = np.empty((n, n), np.float16)
        want = a[:32].astype(np.float64) @ b.astype(np.float64)
        saved = staging.PIPELINE_MIN_BYTES, pipeline.BLOCK_BYTES
        staging.PIPELINE_MIN_BYTES = 1 << 62
        try:
            whole = coopmat.matmul(a, b)
        finally:
            staging.PIPELINE_MIN_BYTES = saved[0]
        for rnd in range(args.rounds):
            for mib in [0] + [int(s) for s in args.blocks.split(",")]:
                if mib:
                    pipeline.BLOCK_BYTES = mib << 20
                else:
                    staging.PIPELINE_MIN_BYTES = 1 << 62
                try:
                    row = measure(a, b, d, want, whole, args.repeat)
                finally:
                    staging.PIPELINE_MIN_BYTES, pipeline.BLOCK_BYTES = saved
                key = f"{n}^3 {f'{mib} MiB blocks' if mib else 'unpipelined'} round {rnd}"
                rows[key] = row
                print(key + ": " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()),
                      flush=True)
        if args.trace:
            events: list[tuple[float, str]] = []
            traced = Options(
                trace=lambda e, add=events.append: add((time.perf_counter(), e)))
            run_gemm(rt, resolve(rt.device.info, a.dtype, b.dtype), a.copy()[None],
                     b.copy()[None], None, None, 1, 0, traced)
            t0 = events[0][0] if events else 0.0
            print("   trace (ms): " + "; ".join(f"{(t - t0) * 1e3:.2f} {e}"
                                             for t, e in events))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(
            {"device": rt.device.info.name, "set": args.set, "ms": rows}, indent=1))


if __name__ == "__main__":
    main()
