"""numpy <-> device copies of one large array through the staging lanes
(dispatch/transfer.py) at several chunk sizes and lane counts: GB/s each way, median of
`--repeat`. Downloads into a preallocated array (pages already touched) and into a fresh
one (as .numpy() does), to show what first touch costs.

    python benchmarks/transfer_sweep.py [--mib 256] [--repeat 7]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from coopmat.dispatch import transfer
from coopmat.dispatch.memory import Kind
from coopmat.dispatch.runtime import runtime


def median_s(fn: Callable[[], object], n: int) -> float:
    fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[n // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    rt = runtime()
    nbytes = args.mib << 20
    host = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    back = np.empty_like(host)
    buf = rt.pool.acquire(Kind.DEVICE, nbytes)
    gb = nbytes / 1e9
    try:
        for chunk_mib in (2, 4, 8, 16):
            for lanes in (8, 12, 16):
                rt.transfers.destroy()  # new lanes with staging of this chunk size
                transfer.CHUNK_BYTES = chunk_mib << 20
                transfer.PARALLEL_MIN_BYTES = 2 * transfer.CHUNK_BYTES
                transfer.MAX_LANES = lanes
                up = median_s(lambda: (rt.transfers.upload(host, buf), rt.stream.wait()),
                              args.repeat)
                down = median_s(lambda: rt.transfers.download(buf, 0, back), args.repeat)
                fresh = median_s(lambda: rt.transfers.download(buf, 0, np.empty_like(host)),
                                 args.repeat)
                assert np.array_equal(back, host)
                print(f"chunk {chunk_mib:2d} MiB lanes {lanes:2d} (of {transfer.lane_count()}):"
                      f" up {gb / up:5.1f} GB/s, down {gb / down:5.1f}, "
                      f"down into a new array {gb / fresh:5.1f}", flush=True)
    finally:
        rt.pool.release(buf)


if __name__ == "__main__":
    main()
