"""numpy -> numpy float16 matmul on a discrete GPU: the whole call with the pipeline
(dispatch/pipeline.py) at several block sizes, and without it, beside the pieces of the
unpipelined call (upload, kernel, download) timed one by one.

    python benchmarks/profile_numpy_path.py [N ...] [--force]

--force: run the pipeline even without copy queues (its steps then share the compute
queue: host copies still overlap the device's work).
"""

from __future__ import annotations

import faulthandler
import sys
import time
from collections.abc import Callable

import numpy as np

import coopmat
from coopmat.dispatch import pipeline, stream
from coopmat.dispatch.gemm import PreparedGemm
from coopmat.dispatch.runtime import runtime
from coopmat.policy.types import resolve

WATCHDOG_S = 150


def median_ms(fn: Callable[[], object], n: int = 9) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[n // 2] * 1e3


def main() -> None:
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)  # a hang shows its stacks
    rt = runtime()
    print(f"copy queues: {rt.copy_engines} (family {rt.device.copy_queue_family_index}, "
          f"{len(rt.device.copy_queues)} queues)")
    pipeline.FORCE = "--force" in sys.argv
    saved_poll = stream.POLL_SECONDS
    sizes = [int(s) for s in sys.argv[1:] if not s.startswith("--")] or [4096, 8192]
    for n in sizes:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((n, n), dtype=np.float32).astype(np.float16)
        b = rng.standard_normal((n, n), dtype=np.float32).astype(np.float16)
        d = np.empty((n, n), np.float16)
        want = None
        row = []
        for label, block, poll in (("8M", 8 << 20, True), ("16M", 16 << 20, True),
                                   ("32M", 32 << 20, True), ("off", None, True),
                                   ("8M blocking-waits", 8 << 20, False),
                                   ("off blocking-waits", None, False)):
            stream.POLL_SECONDS = saved_poll if poll else 0.0
            saved = pipeline.BLOCK_BYTES, pipeline.PIPELINE_MIN_BYTES
            if block is None:
                pipeline.PIPELINE_MIN_BYTES = 1 << 62
            else:
                pipeline.BLOCK_BYTES = block
            try:
                coopmat.matmul(a, b, out=d)
                if want is None:
                    want = d.copy()
                else:
                    assert np.array_equal(d, want), label
                ms = median_ms(lambda a=a, b=b, d=d: coopmat.matmul(a, b, out=d))
                row.append(f"{label} {ms:.2f}")
            finally:
                pipeline.BLOCK_BYTES, pipeline.PIPELINE_MIN_BYTES = saved
                stream.POLL_SECONDS = saved_poll
        print(f"{n}^3 f16 numpy->numpy whole call (ms), pipeline block size: " + ", ".join(row))
        if pipeline.FORCE or rt.copy_engines:  # one traced call at the default block size
            pipeline.TRACE = []
            coopmat.matmul(a, b, out=d)
            t0 = pipeline.TRACE[0][0] if pipeline.TRACE else 0.0
            print("   trace (ms): " + "; ".join(f"{(t - t0) * 1e3:.2f} {e}"
                                             for t, e in pipeline.TRACE))
            pipeline.TRACE = None
        pair = resolve(rt.device.info, a.dtype, b.dtype)
        parts: dict[str, list[float]] = {"upload": [], "kernel": [], "download": []}
        for _ in range(5):
            t0 = time.perf_counter()
            g = PreparedGemm(rt, pair, a[None], b[None], None, 1, 1.0, 0.0)
            t1 = time.perf_counter()
            k = g.execute(transfers=False)
            t2 = time.perf_counter()
            g.read(d[None])
            t3 = time.perf_counter()
            g.release()
            parts["upload"].append(t1 - t0)
            parts["kernel"].append(k or 0.0)
            parts["download"].append(t3 - t2)
        print("   unpipelined pieces (ms): " + ", ".join(
            f"{k} {sorted(v)[2] * 1e3:.2f}" for k, v in parts.items()))


if __name__ == "__main__":
    main()
