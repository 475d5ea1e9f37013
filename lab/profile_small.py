"""Where a small call's time goes: a 64^3 float16 numpy -> numpy matmul, a decode step
(16 x 4096 numpy @ a resident 4096^2 Array, back to numpy) and ten queued device-array
products (the host's cost per product), median wall time per call and the Python profile
of many calls (functions by own time).

    python lab/profile_small.py [--calls 500] [--top 25] [--breakdown] [--host]
        [--phases] [--k 4096]

--k K: the decode step's weight is K x K (default 4096; small on a CPU driver).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import coopmat


def median_us(fn: Callable[[], object], n: int) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[n // 2] * 1e6


def profile(label: str, fn: Callable[[], object], calls: int, top: int) -> None:
    for _ in range(20):
        fn()
    print(f"== {label}: median {median_us(fn, calls):.1f} us per call")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(top)


def breakdown(calls: int) -> None:
    """Median wall time of the pieces of a 64^3 call, each run alone: preparing it (plan
    lookup, buffers, staging writes), running it (one submission and its wait), reading D,
    and an empty submission's round trip (a recorded barrier, submit, wait)."""
    from coopmat.dispatch.gemm import PreparedGemm
    from coopmat.dispatch.runtime import runtime
    from coopmat.policy import resolve
    rt = runtime()
    s = np.ones((1, 64, 64), np.float16)
    pair = resolve(rt.device.info, s.dtype, s.dtype)
    out = np.empty((1, 64, 64), np.float16)
    g = PreparedGemm(rt, pair, s, s, None, 1, 1, 0)
    print("== 64^3 pieces, median us:")
    prepare = median_us(lambda: PreparedGemm(rt, pair, s, s, None, 1, 1, 0).release(), calls)
    print(f"   prepare + release  {prepare:7.1f}")
    print(f"   execute            {median_us(g.execute, calls):7.1f}")
    print(f"   read               {median_us(lambda: g.read(out), calls):7.1f}")
    print(f"   empty submission   {median_us(lambda: rt.executor.run([], [], []), calls):7.1f}")
    kernel = [g.execute() or 0.0 for _ in range(calls)]
    print(f"   kernel (timestamps) {sorted(kernel)[calls // 2] * 1e6:6.1f}")
    g.release()


def host_cost(repeat: int = 9) -> None:
    """Host time per call, GPU left to run: 100 chained 16x4096 @ 4096^2 Array products
    (the time to queue them, per product) and coopmat.matmul(x, W) with a numpy x (each
    call timed alone, then synchronized)."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((4096, 4096), dtype=np.float32) / 64).astype(np.float16)
    x = rng.standard_normal((16, 4096), dtype=np.float32).astype(np.float16)
    W, X = coopmat.asarray(w), coopmat.asarray(x)

    def chain() -> float:
        y = X
        t0 = time.perf_counter()
        for _ in range(100):
            y = y @ W
        t = (time.perf_counter() - t0) / 100
        coopmat.synchronize()
        return t
    for _ in range(5):
        chain()
    per = sorted(chain() for _ in range(repeat))[repeat // 2]
    print(f"== host: {per * 1e6:.1f} us to queue one of 100 chained Array products")

    def one() -> float:
        t0 = time.perf_counter()
        coopmat.matmul(x, W)
        t = time.perf_counter() - t0
        coopmat.synchronize()
        return t
    for _ in range(50):
        one()
    times = sorted(one() for _ in range(1000))
    print(f"== host: {times[500] * 1e6:.1f} us for coopmat.matmul(x, W), x numpy")


def phase_medians(steps: tuple[Callable[[], object], ...], calls: int,
                  warm: int = 50) -> list[float]:
    """Median microseconds of each step of a sequence run `calls` times (after `warm`
    unrecorded runs), and of the whole sequence, last."""
    rows: list[list[float]] = []
    for i in range(calls + warm):
        marks = [time.perf_counter()]
        for step in steps:
            step()
            marks.append(time.perf_counter())
        if i >= warm:
            rows.append([b - a for a, b in zip(marks, marks[1:], strict=False)]
                        + [marks[-1] - marks[0]])
    return [sorted(c)[len(c) // 2] * 1e6 for c in zip(*rows, strict=True)]


def phases(calls: int) -> None:
    """Median wall time of each phase of a decode step (16 x 4096 numpy @ a resident
    4096^2 Array, back to numpy): the call (until its submission returns), the wait for
    the GPU, and .numpy() after it; torch's step in the same phases (upload, product
    launch, download) when torch is importable."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((4096, 4096), dtype=np.float32) / 64).astype(np.float16)
    x = rng.standard_normal((16, 4096), dtype=np.float32).astype(np.float16)
    W = coopmat.asarray(w)
    held: list[Any] = [None]

    def product() -> None:
        held[0] = coopmat.matmul(x, W)

    call, wait, host, total = phase_medians(
        (product, coopmat.synchronize, lambda: held[0].numpy()), calls)
    print(f"== decode step phases, median us: call {call:.1f}  wait {wait:.1f}  "
          f"numpy {host:.1f}  total {total:.1f}")
    try:
        import torch
    except ImportError:
        return
    wt = torch.from_numpy(w).cuda()

    def upload() -> None:
        held[0] = torch.from_numpy(x).cuda()

    def launch() -> None:
        held[0] = held[0] @ wt

    up, launch_us, down, total = phase_medians(
        (upload, launch, lambda: held[0].cpu().numpy()), calls)
    print(f"== torch step phases, median us: upload {up:.1f}  launch {launch_us:.1f}  "
          f"download {down:.1f}  total {total:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--k", type=int, default=4096, help="the decode step's weight is K x K")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--breakdown", action="store_true", help="time the pieces of a call")
    ap.add_argument("--host", action="store_true",
                    help="only the host's time per call (queued products, x @ W)")
    ap.add_argument("--phases", action="store_true",
                    help="only a decode step's phases, beside torch's")
    args = ap.parse_args()
    if args.phases:
        phases(args.calls)
        return
    if args.host:
        host_cost()
        return
    if args.breakdown:
        breakdown(args.calls)
    rng = np.random.default_rng(0)
    s = rng.standard_normal((64, 64), dtype=np.float32).astype(np.float16)
    profile("64^3 f16 numpy -> numpy", lambda: coopmat.matmul(s, s), args.calls, args.top)
    w = (rng.standard_normal((args.k, args.k), dtype=np.float32) / 64).astype(np.float16)
    x = rng.standard_normal((16, args.k), dtype=np.float32).astype(np.float16)
    W = coopmat.asarray(w)
    profile(f"decode step 16x{args.k} @ resident W", lambda: coopmat.matmul(x, W).numpy(),
            args.calls, args.top)
    # Host cost of one queued device-array product: small enough that the GPU keeps up.
    ws = coopmat.asarray((rng.standard_normal((256, 256), dtype=np.float32) / 16)
                         .astype(np.float16))
    xs = coopmat.asarray(rng.standard_normal((16, 256), dtype=np.float32).astype(np.float16))

    def chain() -> None:
        y = xs
        for _ in range(10):
            y = y @ ws
        coopmat.synchronize()

    profile("10 queued 16x256 @ 256^2 Array products, then synchronize", chain,
            max(1, args.calls // 10), args.top)


if __name__ == "__main__":
    main()
