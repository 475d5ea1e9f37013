"""Steady-state behaviour: no growth in memory over many calls, and thread safety."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import coopmat
from coopmat.dispatch.runtime import runtime


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


SHAPES = [(1, 1, 1), (7, 9, 11), (16, 16, 16), (33, 20, 8), (64, 64, 64), (5, 100, 3),
          (2, 4, 6, 8)]


def call(rng: np.random.Generator, shape: tuple[int, ...]) -> None:
    if len(shape) == 4:
        batch, M, N, K = shape
        a = rng.integers(-5, 5, size=(batch, M, K), dtype=np.int8)
        b = rng.integers(-5, 5, size=(K, N), dtype=np.int8)
    else:
        M, N, K = shape
        a = rng.integers(-5, 5, size=(M, K), dtype=np.int8)
        b = rng.integers(-5, 5, size=(K, N), dtype=np.int8)
    d = coopmat.matmul(a, b)
    np.testing.assert_array_equal(d, np.matmul(a.astype(np.int32), b.astype(np.int32)))


def test_two_thousand_calls_keep_memory_flat(live_device_info):
    if "int8->int32" not in coopmat.supported_dtypes():
        pytest.skip("needs int8->int32")
    rng = np.random.default_rng(7)
    pool = runtime().pool
    for i in range(200):  # warm-up: every shape's kernel, pipeline and buffer classes
        call(rng, SHAPES[i % len(SHAPES)])
    rss0, dev0, n0 = rss_bytes(), pool.allocated_bytes, pool.allocations
    for i in range(1800):
        call(rng, SHAPES[(i * 5) % len(SHAPES)])
    rss1, dev1, n1 = rss_bytes(), pool.allocated_bytes, pool.allocations
    assert dev1 == dev0, (dev0, dev1)
    assert n1 == n0, f"{n1 - n0} new device allocations after warm-up"
    assert rss1 - rss0 < 8 * 2**20, f"process memory grew by {(rss1 - rss0) / 2**20:.1f} MiB"


def test_four_threads_fifty_calls_each(live_device_info):
    if "int8->int32" not in coopmat.supported_dtypes():
        pytest.skip("needs int8->int32")
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for i in range(50):
                call(rng, SHAPES[(seed + i) % len(SHAPES)])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
