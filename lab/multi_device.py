"""Two devices, two threads: a chain of products on each device, alone and at once.

Run on a host with two GPUs: python lab/multi_device.py
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

import coopmat

CHAIN = 20
N = 8192


def chain(dev: int, n: int, x: np.ndarray, w: np.ndarray, out: dict[int, Any]) -> None:
    X, W = coopmat.asarray(x, device=dev), coopmat.asarray(w, device=dev)
    coopmat.synchronize(dev)
    t = time.perf_counter()
    for _ in range(n):
        X = X @ W
    coopmat.synchronize(dev)
    out[dev] = (time.perf_counter() - t, X)


def main() -> None:
    print("devices", [(d.index, d.name) for d in coopmat.devices()])
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((N, N), dtype=np.float32) / 90).astype(np.float16)
    x = rng.standard_normal((N, N), dtype=np.float32).astype(np.float16)
    res: dict[int, Any] = {}
    chain(0, 2, x, w, res)  # warm-up: pipelines
    for d in (0, 1):
        chain(d, CHAIN, x, w, res)
    alone = [res[d][0] for d in (0, 1)]
    threads = [threading.Thread(target=chain, args=(d, CHAIN, x, w, res)) for d in (0, 1)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    both = time.perf_counter() - t
    print(f"{CHAIN} chained {N}^3 products: device 0 alone {alone[0] * 1e3:.1f} ms, "
          f"device 1 alone {alone[1] * 1e3:.1f} ms, both at once from two threads "
          f"{both * 1e3:.1f} ms")
    same = np.array_equal(res[0][1].numpy(), res[1][1].numpy())
    print("same result on both devices:", same)
    try:
        res[0][1] @ res[1][1]
    except coopmat.DeviceMismatchError as exc:
        print("mismatch error:", exc)


if __name__ == "__main__":
    main()
