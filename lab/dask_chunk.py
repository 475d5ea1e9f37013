"""What does one coopmat.dask task's product cost on this host, and what bounds it? A new
numpy chunk (rows x 4096 float16) against a 4096 x 4096 float16 weight kept on the device,
a numpy chunk out: `coopmat.matmul(x, W).numpy()` against `matmul_to_host` with its rows
pipelined (COOPMAT_PIPELINE=always); results let go (their pinned blocks come back) or
held (new memory each time, as persisted Dask chunks); one traced pipelined call; and the
host's own rates (first touch, copies on 1, 4 and 8 threads). Prints one JSON line.

    python lab/dask_chunk.py [--rows 65536]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import numpy as np

import coopmat
from coopmat.api.matmul import matmul_to_host


def _ms(seconds: list[float]) -> list[float]:
    return [round(1e3 * s, 1) for s in seconds]


def _host_rates(xs: list[np.ndarray]) -> dict[str, float]:
    size = xs[0].size
    t = time.perf_counter()
    fresh = np.empty(size, np.float16)
    fresh[...] = 1
    out = {"first_touch_gbps": fresh.nbytes / (time.perf_counter() - t) / 1e9}
    t = time.perf_counter()
    np.copyto(fresh, xs[0].ravel())
    out["copy_warm_gbps"] = fresh.nbytes / (time.perf_counter() - t) / 1e9
    for n in (4, 8):
        dst = np.empty(size, np.float16)
        src = xs[1].ravel()
        bounds = np.linspace(0, size, n + 1).astype(int)
        threads = [threading.Thread(target=np.copyto, args=(dst[lo:hi], src[lo:hi]))
                   for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        out[f"copy_fresh_{n}_threads_gbps"] = fresh.nbytes / (time.perf_counter() - t) / 1e9
    return {k: round(v, 2) for k, v in out.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=65536)
    ap.add_argument("--k", type=int, default=4096)
    args = ap.parse_args(argv)
    K = N = args.k
    rng = np.random.default_rng(0)
    xs = [(rng.random((args.rows, K), dtype=np.float32) - 0.5).astype(np.float16)
          for _ in range(2)]
    w = (rng.random((K, N), dtype=np.float32) - 0.5).astype(np.float16)
    W = coopmat.asarray(w)
    want = xs[0][:64].astype(np.float64) @ w.astype(np.float64)
    out: dict[str, Any] = {"device": coopmat.devices()[0].name, "rows": args.rows}

    def plain(x: np.ndarray) -> np.ndarray:
        return coopmat.matmul(x, W).numpy()

    def piped(x: np.ndarray) -> np.ndarray:
        with coopmat.options(pipeline="always"):
            return matmul_to_host(x, W)

    for f in (plain, piped):
        out[f"{f.__name__}_error"] = float(np.abs(f(xs[0].copy())[:64] - want).max())
        times = []
        for i in range(6):  # a new x each time (not kept imported), results let go
            x = xs[i % 2].copy()
            t = time.perf_counter()
            f(x)
            times.append(time.perf_counter() - t)
        out[f"{f.__name__}_released_ms"] = _ms(times)
        held, times = [], []
        for i in range(8):  # results held, as persisted chunks: new memory each time
            x = xs[i % 2].copy()
            t = time.perf_counter()
            held.append(f(x))
            times.append(time.perf_counter() - t)
        out[f"{f.__name__}_held_ms"] = _ms(times)
        held.clear()
    events: list[tuple[float, str]] = []
    start = time.perf_counter()
    x = xs[1].copy()
    with coopmat.options(pipeline="always", trace=lambda e: events.append(
            (round(1e3 * (time.perf_counter() - start), 2), e))):
        start = time.perf_counter()
        matmul_to_host(x, W)
    out["trace_ms"] = events + [(round(1e3 * (time.perf_counter() - start), 2), "returned")]
    out.update(_host_rates(xs))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
