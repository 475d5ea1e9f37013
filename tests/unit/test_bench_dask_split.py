"""coopmat-bench --dask's per-task split, from a task stream as distributed reports one."""

from __future__ import annotations

import pytest

bench_dask = pytest.importorskip("coopmat.tools.bench_dask")


def task(key: str, worker: str, start: float, stop: float) -> dict:
    return {"key": key, "worker": worker,
            "startstops": [{"action": "transfer", "start": start - 1, "stop": start},
                           {"action": "compute", "start": start, "stop": stop}]}


def test_overhead_counts_idle_workers_and_uneven_tasks() -> None:
    # Two workers over 1.0 s: A computes three tasks of 0.3 s, B one; a task of another
    # kind is not counted.
    stream = [task("('coopmat-matmul-1', 0, 0)", "A", 0.0, 0.3),
              task("('coopmat-matmul-1', 1, 0)", "A", 0.3, 0.6),
              task("('coopmat-matmul-1', 2, 0)", "A", 0.6, 0.9),
              task("('coopmat-matmul-1', 3, 0)", "B", 0.0, 0.3),
              task("('random-1', 0, 0)", "B", 0.3, 0.9)]
    got = bench_dask.per_task(stream, "coopmat-matmul", 1.0, 2)
    assert got["task_compute_ms"] == pytest.approx(300)
    # 2 x 1.0 s of worker time, 1.2 s computing, over 4 tasks
    assert got["overhead_ms_per_task"] == pytest.approx(200)
    assert got["imbalance"] == pytest.approx(1.5)
    empty = bench_dask.per_task(stream, "coopmat-linear", 1.0, 2)
    assert all(v != v for v in empty.values())  # NaN: nothing to split
