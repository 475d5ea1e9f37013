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


def test_overhead_parts_from_the_submission() -> None:
    # Submitted at t=10.0, wall 1.0 s: A starts at 10.1 and waits 0.05 s between tasks,
    # B starts at 10.2; the last compute ends at 10.8.
    stream = [task("('coopmat-matmul-1', 0, 0)", "A", 10.1, 10.3),
              task("('coopmat-matmul-1', 1, 0)", "A", 10.35, 10.55),
              task("('coopmat-matmul-1', 2, 0)", "A", 10.6, 10.8),
              task("('coopmat-matmul-1', 3, 0)", "B", 10.2, 10.4)]
    got = bench_dask.per_task(stream, "coopmat-matmul", 1.0, 2, submitted=10.0)
    # Per worker: A starts after 100 ms, B after 200; A waits 2 x 50 ms between its three
    # tasks; A's last compute ends 200 ms before `wait` returns, B's 600 ms.
    assert got["start_ms"] == pytest.approx(150)
    assert got["gap_ms"] == pytest.approx(50)
    assert got["tail_ms"] == pytest.approx(400)
    assert got["imbalance"] == pytest.approx(1.5)
    # the parts add up to the idle time: per worker, start + gaps + tail
    idle = got["overhead_ms_per_task"] * 4 / 2
    assert got["start_ms"] + got["gap_ms"] * (4 - 2) / 2 + got["tail_ms"] == pytest.approx(idle)
    assert got["per_worker"] == [pytest.approx([100, 800, 3, 50]),
                                 pytest.approx([200, 400, 1, 0])]
    # B's clock estimate put its times 20 ms late: taken back off, B starts at 180 ms
    shifted = bench_dask.per_task(stream, "coopmat-matmul", 1.0, 2, submitted=10.0,
                                  shifts={"B": 0.02})
    assert shifted["per_worker"][1] == pytest.approx([180, 380, 1, 0])
    assert shifted["start_ms"] == pytest.approx(140)
    empty = bench_dask.per_task(stream, "coopmat-linear", 1.0, 2, submitted=10.0)
    assert set(empty) >= {"start_ms", "gap_ms", "tail_ms"} and all(v != v for v in empty.values())


def test_threads_of_one_worker_overlapping_count_once() -> None:
    # A runs two threads: its second task computes (waits on the device) from 10.2 while
    # the first runs to 10.3; A was busy 10.1-10.5, idle 0.1 + 0.5 s of the 1.0 s wall.
    stream = [task("('coopmat-matmul-1', 0, 0)", "A", 10.1, 10.3),
              task("('coopmat-matmul-1', 1, 0)", "A", 10.2, 10.5)]
    got = bench_dask.per_task(stream, "coopmat-matmul", 1.0, 1, submitted=10.0)
    assert got["overhead_ms_per_task"] == pytest.approx(600 / 2)
    assert (got["start_ms"], got["gap_ms"], got["tail_ms"]) == pytest.approx((100, 0, 500))
    assert got["per_worker"] == [pytest.approx([100, 500, 2, 0])]


def test_threads_per_worker_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_dask.main(["--threads-per-worker", "0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--threads-per-worker" in err
    assert bench_dask._parser().parse_args([]).threads_per_worker == 2
