"""`coopmat-bench --dask`: throughput of a chunked X @ W over 1, 2, ... Dask workers, one
per device (coopmat.dask.LocalCluster), beside dask + CuPy on the same chunks.

- X (rows x K) is made on the workers and persisted there before the clock starts (no
  random-number generation or client transfer timed); W (K x N) is one graph key, kept
  on each worker's device after a warm-up compute. Timed: from submitting the persisted
  product to `wait` (the result stays on the workers as numpy chunks, not gathered); each
  timed compute starts once the workers have let go of the previous one's result.
- Each worker count's split per task: the bare product on a worker, whole as a task runs
  it (a numpy chunk in, the weight resident, a numpy chunk out: uploads, kernels and
  downloads overlapped) and in parts (upload of the chunk, kernel, download of the
  result, timed with coopmat.synchronize between them, and coopmat.last_kernel_time
  where the device has timestamps); the task's own compute time (Dask's task stream);
  and the overhead: the workers' time not spent computing a task, per task (scheduling,
  transfers, and tasks spread unevenly over the workers).
- bare_speedup: workers x one worker's bare product over this count's (each worker's
  measured with all of them busy): the speedup the host allows the products themselves
  (their transfers share its memory), Dask aside.
- dask_floor: the same graph on the same chunks and workers with each task a sleep of the
  bare product's time (holding the worker's device lock, as a product does): Dask's own
  cost, and so the speedup its scheduling allows (floor_speedup) beside the product's.
- host_copy: numpy's copy of every chunk on the same workers at once, as GB/s over all:
  the host memory bandwidth that bounds the product's upload and download.
- --from-client: the same product with X sent from the client (made here as numpy): its
  chunks scattered to the workers in turn (straight from the client, not through the
  scheduler), then the product, timed from the scatter's start to `wait`, after one
  untimed run; X is made in this process once, a chunk at a time. (X as one array in
  the graph, `da.from_array`, would travel whole through the scheduler to one worker,
  then chunk by chunk to the others.)
- The peer, where cupy is importable (float16): `map_blocks(cupy.asarray)`, `@`,
  `map_blocks(cupy.asnumpy)` on a cluster of one worker per CUDA device
  (CUDA_VISIBLE_DEVICES), same X and chunks.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

import coopmat as _coopmat
from coopmat.tools.cli import prog, write

# coopmat's public names load on first use (coopmat.__getattr__), so mypy sees them as
# object: used through an Any.
coopmat: Any = _coopmat

LOOPBACK = "127.0.0.1"
CHECK_ROWS = 256


def _parse_ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"need integers >= 1, not {text!r}")
    return values


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"{prog('coopmat.bench')} --dask",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1 << 20, help="rows of X (default 2^20)")
    ap.add_argument("--k", type=int, default=4096, help="K: columns of X, rows of W")
    ap.add_argument("--n", type=int, default=4096, help="N: columns of W")
    ap.add_argument("--chunk", type=int, default=1 << 16, help="rows per chunk (default 64k)")
    ap.add_argument("--dtype", default="float16", choices=["float16", "int8"])
    ap.add_argument("--workers", type=_parse_ints, default=None, metavar="LIST",
                    help="worker counts to time, e.g. 1,2,4 (default 1, 2, ... up to the "
                         "devices listed)")
    ap.add_argument("--devices", default=None, metavar="LIST",
                    help="comma list of devices for the workers (index, name part, UUID or "
                         "PCI bus id; one listed twice gets two workers); default every "
                         "cooperative-matrix device")
    ap.add_argument("--repeat", type=int, default=3, help="timed computes per count (median)")
    ap.add_argument("--threads-per-worker", type=int, default=2, metavar="N",
                    help="threads of each coopmat worker (default 2, as coopmat.dask."
                         "LocalCluster: a worker's next task waits on the device while the "
                         "last one finishes)")
    ap.add_argument("--linear", choices=["q4_0", "q8_0", "float16"], default=None,
                    help="also time linear(X, W, bias, 'gelu_tanh') with W quantized to this "
                         "GGUF format on each worker (or float16 as it is); float16 X only")
    ap.add_argument("--from-client", action="store_true",
                    help="also time X sent from the client")
    ap.add_argument("--no-peers", action="store_true", help="skip dask + CuPy")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    return ap


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    if dtype == np.int8:
        return rng.integers(-8, 8, shape, dtype=np.int8)
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def _host_x(args: argparse.Namespace, dtype: np.dtype) -> np.ndarray:
    """X in this process's memory, for --from-client: made a chunk at a time with the
    workers' values (uniform, centred), so no float32 copy of all of it is ever held."""
    rng = np.random.default_rng(0)
    out = np.empty((args.rows, args.k), dtype)
    for i in range(0, args.rows, args.chunk):
        shape = (min(args.chunk, args.rows - i), args.k)
        out[i:i + shape[0]] = rng.integers(-8, 8, shape, dtype=np.int8) if dtype == np.int8 \
            else rng.random(shape, dtype=np.float32) - np.float32(0.5)
    return out


def _x_on_workers(client: Any, args: argparse.Namespace, dtype: np.dtype,
                  workers: list[str]) -> Any:
    """X generated by tasks on `workers` and persisted there, its chunks spread evenly: a
    run of whole chunks made and kept on each worker in turn. (Root tasks land where the
    scheduler puts them, often unevenly, and `rebalance` moves data only past memory
    thresholds that a few GiB on a large host never reach.)"""
    import dask.array as da
    import distributed

    nchunks = -(-args.rows // args.chunk)
    pieces = []
    for i, worker in enumerate(workers):
        first = args.chunk * (nchunks * i // len(workers))
        last = min(args.rows, args.chunk * (nchunks * (i + 1) // len(workers)))
        if last <= first:
            continue
        rng = da.random.default_rng(i)
        shape, chunks = (last - first, args.k), (args.chunk, args.k)
        if dtype == np.int8:
            piece = rng.integers(-8, 8, shape, chunks=chunks, dtype=np.int8)
        else:  # uniform, centred: several times faster to make than normal values
            piece = (rng.random(shape, chunks=chunks, dtype=np.float32)
                     - np.float32(0.5)).astype(dtype)
        pieces.append(client.persist(piece, workers=[worker], allow_other_workers=False))
    x = da.concatenate(pieces, axis=0)
    distributed.wait(x)
    return x


def _x_from_client(client: Any, host: np.ndarray, chunk: int, workers: list[str]) -> Any:
    """`host`'s row chunks scattered over `workers` in turn, as one dask array."""
    import dask
    import dask.array as da

    pieces = [host[i:i + chunk] for i in range(0, host.shape[0], chunk)]
    # direct: the client sends each chunk to its worker itself (not through the scheduler)
    futures = client.scatter(pieces, workers=workers, hash=False, direct=True)
    return da.concatenate([da.from_delayed(dask.delayed(f), p.shape, dtype=p.dtype)
                           for f, p in zip(futures, pieces, strict=True)], axis=0)


# Untimed computes before the timed ones: a persisted chunk is imported in the background
# after its second crossing (dispatch/transfer.py, kept imports), and 8 GiB of chunks take
# longer to import than one compute, so the fourth compute is the steady state.
WARMUP = 3


def _timed(client: Any, make: Any, workers: list[str], repeat: int,
           prefix: str = "", make_timed: bool = False,
           warmup: int = WARMUP) -> tuple[float, dict[str, Any]]:
    """Median seconds from submitting `make()` persisted on `workers` to `wait`, after
    `warmup` untimed runs (`make_timed`: from calling `make`, for one that sends data); and,
    for tasks whose key holds `prefix`, per_task(): the median task's compute time and
    the workers' time not spent computing, per task."""
    import distributed

    runs: list[tuple[float, dict[str, Any]]] = []

    def once() -> float:
        t0, submitted = time.perf_counter(), time.time()
        y = make()
        with distributed.get_task_stream(client) as ts:
            if not make_timed:
                t0, submitted = time.perf_counter(), time.time()
            y = client.persist(y, workers=workers, allow_other_workers=False)
            distributed.wait(y)
            seconds = time.perf_counter() - t0
        if prefix:
            runs.append((seconds, per_task(ts.data, prefix, seconds, len(workers),
                                           submitted, client.run(_clock_shift))))
        keys = {f.key for f in distributed.futures_of(y)}
        del y
        _released(client, keys)
        return seconds

    for _ in range(warmup):
        once()
    runs.clear()
    times = [once() for _ in range(repeat)]
    split: dict[str, Any] = {}
    if runs:
        split = {k: statistics.median(r[1][k] for r in runs) for k in runs[0][1]
                 if k != "per_worker"}
        split["runs"] = [{"seconds": s, **r} for s, r in runs]
    return statistics.median(times), split


def _released(client: Any, keys: set[Any], timeout: float = 30.0) -> None:
    """Wait until no worker holds `keys` (a result let go) and the workers have collected
    it: the next compute starts where a later one would, not while the workers still
    free the last one's chunks."""
    import gc
    deadline = time.monotonic() + timeout
    while keys & set(client.who_has()) and time.monotonic() < deadline:
        time.sleep(0.05)
    client.run(gc.collect)


def _clock_shift(dask_worker: Any) -> float:
    """The seconds a worker adds to its task times: its estimate of its clock's offset to
    the scheduler's. On one host the clocks are one and the estimate is noise (tens of
    ms on a loaded machine), so per_task takes it back off."""
    return float(dask_worker.scheduler_delay)


def per_task(stream: list[Any], prefix: str, wall: float, workers: int,
             submitted: float | None = None,
             shifts: dict[str, float] | None = None) -> dict[str, Any]:
    """From one run's task stream: the median compute time of the tasks whose key holds
    `prefix` (ms; with several threads a worker, it includes a task's wait for the
    device), the workers' time not spent computing them per task (ms: workers x wall less
    the time each worker had one computing, over the tasks), and how unevenly the tasks fell
    (the busiest worker's count over the mean). Where the submission's time.time() is
    given, that idle time's parts too, averaged over the workers (ms; they add up to it):
    from submission to a worker's first compute (`start_ms`), between one worker's
    computes (`gap_ms`, a task), and from a worker's last compute to `wait` returning
    (`tail_ms`); and per worker, [first start, last stop, tasks, longest gap] in ms.
    `shifts`: {worker: seconds} taken off that worker's times (_clock_shift)."""
    spans: dict[str, list[tuple[float, float]]] = {}
    shifts = shifts or {}
    for task in stream:
        if prefix not in str(task.get("key", "")):
            continue
        worker = task.get("worker", "")
        shift = shifts.get(worker, 0.0)
        spans.setdefault(worker, []).extend(
            (s["start"] - shift, s["stop"] - shift) for s in task.get("startstops", ())
            if s.get("action") == "compute")
    computes = [stop - start for runs in spans.values() for start, stop in runs]
    busy = {w: _merged(r) for w, r in spans.items()}
    parts = ("start_ms", "gap_ms", "tail_ms") if submitted is not None else ()
    if not computes:
        return dict.fromkeys(("task_compute_ms", "overhead_ms_per_task", "imbalance", *parts),
                             float("nan"))
    tasks = len(computes)
    got: dict[str, Any] = {
        "task_compute_ms": 1e3 * statistics.median(computes),
        "overhead_ms_per_task": 1e3 * (workers * wall - sum(
            stop - start for runs in busy.values() for start, stop in runs)) / tasks,
        "imbalance": max(len(r) for r in spans.values()) * workers / tasks}
    if submitted is not None:
        gaps = {w: [b[0] - a[1] for a, b in itertools.pairwise(r)] for w, r in busy.items()}
        end = submitted + wall
        got["start_ms"] = 1e3 * sum(r[0][0] - submitted for r in busy.values()) / workers
        got["gap_ms"] = 1e3 * sum(sum(g) for g in gaps.values()) / max(1, tasks - len(spans))
        got["tail_ms"] = 1e3 * sum(end - r[-1][1] for r in busy.values()) / workers
        got["per_worker"] = [[1e3 * (r[0][0] - submitted), 1e3 * (r[-1][1] - submitted),
                              len(spans[w]), 1e3 * max(gaps[w], default=0.0)]
                             for w, r in sorted(busy.items())]
    return got


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """A worker's compute spans as the times it was busy: overlapping ones (tasks of a
    worker's threads computing, or waiting on its device, together) joined."""
    out: list[tuple[float, float]] = []
    for start, stop in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


def split_block(x: np.ndarray, w: np.ndarray, token: str) -> np.ndarray:
    """On a worker, against the weight its cache keeps: this chunk's upload, kernel and
    download seconds, the kernel's device time (NaN without timestamps), and the whole
    product as a task runs it (matmul_to_host: numpy in, numpy out, overlapped), the best
    of three; alone on the device, as a task's product is."""
    from coopmat.api.matmul import matmul_to_host
    from coopmat.dask.cache import weight_cache
    from coopmat.dask.linalg import DEVICE_LOCK
    with DEVICE_LOCK:
        dev_w = weight_cache().get(token, lambda: coopmat.asarray(w))
        coopmat.synchronize()
        whole = []
        for _ in range(3):  # as a task runs it; results let go, as Dask lets go of them
            t = time.perf_counter()
            del_me = matmul_to_host(x, dev_w)
            whole.append(time.perf_counter() - t)
            del del_me
        t0 = time.perf_counter()
        xa = coopmat.asarray(x)
        coopmat.synchronize()
        t1 = time.perf_counter()
        y = coopmat.matmul(xa, dev_w)
        coopmat.synchronize()
        t2 = time.perf_counter()
        kernel = coopmat.last_kernel_time()
        y.numpy()
        t3 = time.perf_counter()
        return np.array([[t1 - t0, t2 - t1, t3 - t2, np.nan if kernel is None else kernel,
                          min(whole)]])


def _split(client: Any, x: Any, w: Any, workers: list[str]) -> dict[str, Any]:
    import dask.array as da

    from coopmat.dask.weights import weight_key
    wk = weight_key(w)  # the key and token coopmat.dask.matmul gives it: its cached copy
    parts = da.map_blocks(split_block, x, wk.value, wk.token, dtype=np.float64, chunks=(1, 5))
    rows = client.compute(parts, workers=workers, allow_other_workers=False).result()
    rows = rows[1:] if len(rows) > 1 else rows  # the first chunk may still compile
    ms = 1e3 * np.median(rows[:, :3], axis=0)
    device = rows[:, 3][~np.isnan(rows[:, 3])]
    return {"whole_ms": float(1e3 * np.median(rows[:, 4])), "upload_ms": float(ms[0]),
            "kernel_ms": float(ms[1]), "download_ms": float(ms[2]),
            "kernel_device_ms": float(1e3 * np.median(device)) if device.size else None}


def sleep_block(x: np.ndarray, seconds: float) -> np.ndarray:
    """A task that holds its worker's device lock for `seconds`, as a product does, and
    returns one value: the graph of the product with Dask's costs and none of the GPU's."""
    from coopmat.dask.linalg import DEVICE_LOCK
    with DEVICE_LOCK:
        time.sleep(seconds)
    return np.zeros((1, 1), x.dtype)


def _dask_floor(client: Any, x: Any, seconds: float, workers: list[str],
                repeat: int) -> float:
    """Median seconds of the product's graph (same chunks, same workers) with each task a
    sleep of the bare product's time: what Dask alone allows this worker count."""
    def make() -> Any:
        return x.map_blocks(sleep_block, seconds, dtype=x.dtype, chunks=(1, 1))
    return _timed(client, make, workers, repeat)[0]


def _host_copy(client: Any, x: Any, workers: list[str]) -> float:
    """GB/s of numpy copies of every chunk (read + write) on `workers` at once."""
    seconds, _ = _timed(client, lambda: x.map_blocks(np.copy, dtype=x.dtype), workers, 1)
    return 2 * x.nbytes / seconds / 1e9


def host_memory_gbps(nbytes: int = 1 << 31, threads: int | None = None) -> float:
    """The host's memory rate (GB/s, read + write) with numpy copying `nbytes` in one
    slice per core at once, best of three: the ceiling that the workers' transfers and
    numpy share. (numpy lets go of the GIL inside a large copy.)"""
    from concurrent.futures import ThreadPoolExecutor
    threads = threads or os.cpu_count() or 1
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros_like(src)  # both touched: no page faults inside the clock
    edges = [nbytes * i // threads for i in range(threads + 1)]
    slices = [slice(a, b) for a, b in itertools.pairwise(edges)]
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(3):
            t0 = time.perf_counter()
            list(pool.map(lambda s: np.copyto(dst[s], src[s]), slices))
            best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best / 1e9


def _row(engine: str, workers: int, seconds: float, args: argparse.Namespace,
         x_bytes: int, y_bytes: int, nchunks: int) -> dict[str, Any]:
    flops = 2.0 * args.rows * args.k * args.n
    return {"engine": engine, "workers": workers, "seconds": seconds,
            "tflops": flops / seconds / 1e12, "gbps_moved": (x_bytes + y_bytes) / seconds / 1e9,
            "ms_per_chunk_per_worker": 1e3 * seconds * workers / nchunks}


def run_coopmat(args: argparse.Namespace, counts: list[int],
                rows: list[dict[str, Any]], saved: Any) -> None:
    import distributed

    import coopmat.dask as cd
    from coopmat.dask.linalg import result_dtype
    dtype = np.dtype(args.dtype)
    devices = args.devices.split(",") if args.devices else None
    w = _random(np.random.default_rng(1), (args.k, args.n), dtype)
    # memory_limit=0: no spilling to disk; one worker of several may hold all of X and Y.
    with cd.LocalCluster(devices=devices, threads_per_worker=args.threads_per_worker,
                         host=LOOPBACK, dashboard_address=f"{LOOPBACK}:0",
                         silence_logs=logging.ERROR, memory_limit=0) as cluster, \
            distributed.Client(cluster) as client:
        names = {addr: info["name"] for addr, info in client.scheduler_info()["workers"].items()}
        ordered = sorted(names, key=lambda a: names[a])
        if max(counts) > len(ordered):
            raise SystemExit(f"--workers {max(counts)}: only {len(ordered)} devices "
                             f"({', '.join(cd.worker_devices(client).values())}); list one "
                             f"twice in --devices to share it")
        held = cd.worker_devices(client)
        w = _resident(client, w)
        host = _host_x(args, dtype) if args.from_client else None
        for count in counts:
            subset = ordered[:count]
            x = _x_on_workers(client, args, dtype, subset)
            nchunks = len(x.chunks[0])
            y_bytes = args.rows * args.n * result_dtype(dtype, None).itemsize
            seconds, split = _timed(client, lambda x=x: cd.matmul(x, w), subset, args.repeat,
                                    "coopmat-matmul")
            row = _row("coopmat", count, seconds, args, x.nbytes, y_bytes, nchunks)
            row.update(split)
            row["bare_product"] = _split(client, x, w, subset)
            # the host memory the bare products' transfers use, every worker at once
            chunk_bytes = args.chunk * (args.k * dtype.itemsize + y_bytes // args.rows)
            row["host_transfer_gbps"] = (count * chunk_bytes
                                         / row["bare_product"]["whole_ms"] / 1e6)
            row["host_copy_gbps"] = _host_copy(client, x, subset)
            row["dask_floor_seconds"] = _dask_floor(
                client, x, row["bare_product"]["whole_ms"] / 1e3, subset, args.repeat)
            row["devices"] = [held[a] for a in subset]
            row["max_error"] = _check(cd.matmul(x, w), x, lambda a, w=w: a @ np.asarray(
                w.compute(), np.float64))
            rows.append(row)
            saved()
            if args.linear:
                rows.append(_linear_row(client, args, x, w, subset, y_bytes, nchunks))
                saved()
            del x
            if host is not None:
                seconds, _ = _timed(
                    client, lambda host=host, subset=subset: cd.matmul(
                        _x_from_client(client, host, args.chunk, subset), w),
                    subset, args.repeat, make_timed=True, warmup=1)
                row = _row("coopmat, X from the client", count, seconds, args, host.nbytes,
                           y_bytes, nchunks)
                first = _x_from_client(client, host[:args.chunk], args.chunk, subset)
                row["max_error"] = _check(cd.matmul(first, w), first,
                                          lambda a, w=w: a @ np.asarray(w.compute(),
                                                                        np.float64))
                rows.append(row)
                saved()
                del first


def _check(y: Any, x: Any, reference: Any) -> float:
    """The first rows of the result against `reference` (numpy, float64) of the same rows
    of x: the largest error relative to the result's scale (the bench times nothing that
    gives a wrong answer)."""
    rows = slice(0, CHECK_ROWS)  # numpy's float64 product of a whole chunk takes minutes
    got = y.blocks[0][rows].compute().astype(np.float64)
    want = reference(x.blocks[0][rows].compute().astype(np.float64))
    error = float(np.abs(got - want).max() / max(1.0, float(np.abs(want).max())))
    if error > 2e-2:
        raise SystemExit(f"coopmat.dask's product is off by {error:.3g} of its scale")
    return error


def _gelu_tanh(v: np.ndarray) -> np.ndarray:
    return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))


def _linear_row(client: Any, args: argparse.Namespace, x: Any, w: Any, workers: list[str],
                y_bytes: int, nchunks: int) -> dict[str, Any]:
    """linear(X, W.T as (N, K), bias, "gelu_tanh") with W quantized to --linear's format
    on each worker (or float16 as it is): timed and checked as the plain product."""
    import coopmat.dask as cd
    weight_nk = np.ascontiguousarray(np.asarray(w.compute()).T)
    bias = _random(np.random.default_rng(2), (args.n,), np.dtype(np.float16))
    if args.linear == "float16":
        weight: Any = weight_nk
        dense = weight_nk.astype(np.float64)
    else:
        from gguf import GGMLQuantizationType, quants
        qtype = GGMLQuantizationType[args.linear.upper()]
        weight = cd.quantized(weight_nk, args.linear)
        dense = quants.dequantize(quants.quantize(weight_nk.astype(np.float32), qtype),
                                  qtype).astype(np.float64)
    seconds, split = _timed(client, lambda: cd.linear(x, weight, bias, "gelu_tanh"),
                            workers, args.repeat, "coopmat-linear")
    row = _row(f"coopmat linear {args.linear} + bias + gelu_tanh", len(workers), seconds, args,
               x.nbytes, y_bytes, nchunks)
    row.update(split)
    row["max_error"] = _check(cd.linear(x, weight, bias, "gelu_tanh"), x,
                              lambda a: _gelu_tanh(a @ dense.T + bias))
    return row


def _resident(client: Any, w: np.ndarray) -> Any:
    """W as a one-chunk dask array held in every worker's memory, so that a compute does
    not ship it again (its device copy is cached by coopmat.dask either way)."""
    import dask.array as da
    from distributed import futures_of, wait
    wd = client.persist(da.from_array(w, chunks=w.shape))
    wait(wd)
    client.replicate(futures_of(wd))
    return wd


class _CudaCluster:
    """A distributed.LocalCluster with one worker per CUDA device, each seeing only its
    own (CUDA_VISIBLE_DEVICES), as dask-cuda's LocalCUDACluster gives."""

    @staticmethod
    def start(count: int) -> Any:
        import distributed

        class Cluster(distributed.LocalCluster):
            def new_worker_spec(self) -> dict[Any, Any]:
                i = min(set(range(count)) - set(self.worker_spec))
                spec = copy.deepcopy(self.new_spec)
                spec["options"]["env"] = {"CUDA_VISIBLE_DEVICES": str(i)}
                return {i: spec}

        cluster = Cluster(n_workers=0, threads_per_worker=1, host=LOOPBACK,
                          dashboard_address=f"{LOOPBACK}:0", silence_logs=logging.ERROR,
                          memory_limit=0)
        cluster.scale(count)
        cluster.sync(cluster._correct_state)
        return cluster


def cupy_module() -> Any:
    try:
        import cupy
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # no cupy, or no CUDA driver
        return None


def run_cupy(args: argparse.Namespace, counts: list[int], rows: list[dict[str, Any]],
             saved: Any) -> None:
    dtype = np.dtype(args.dtype)
    cp = cupy_module()
    if cp is None or dtype != np.float16:  # cupy's int8 @ int8 is int8 (wraps): no peer
        return
    import distributed
    available = cp.cuda.runtime.getDeviceCount()
    counts = [c for c in counts if c <= available]
    if not counts:
        return
    w = _random(np.random.default_rng(1), (args.k, args.n), dtype)
    cluster = _CudaCluster.start(max(counts))
    try:
        with distributed.Client(cluster) as client:
            names = {a: i["name"] for a, i in client.scheduler_info()["workers"].items()}
            ordered = sorted(names, key=lambda a: names[a])
            wd = _resident(client, w).map_blocks(cp.asarray)
            for count in counts:
                subset = ordered[:count]
                x = _x_on_workers(client, args, dtype, subset)
                y_bytes = args.rows * args.n * dtype.itemsize

                def make(x: Any = x) -> Any:
                    return (x.map_blocks(cp.asarray) @ wd).map_blocks(cp.asnumpy)

                seconds, _ = _timed(client, make, subset, args.repeat)
                rows.append(_row("dask + cupy", count, seconds, args, x.nbytes, y_bytes,
                                 len(x.chunks[0])))
                saved()
                del x
    finally:
        cluster.close()


def _report(rows: list[dict[str, Any]]) -> None:
    base = {r["engine"]: r["seconds"] for r in rows if r["workers"] == 1}
    floor = {r["engine"]: r["dask_floor_seconds"] for r in rows
             if r["workers"] == 1 and "dask_floor_seconds" in r}
    bare = {r["engine"]: r["bare_product"]["whole_ms"] for r in rows
            if r["workers"] == 1 and "bare_product" in r}
    write(f"{'engine':<40} {'workers':>7} {'seconds':>9} {'TFLOP/s':>8} {'GB/s moved':>10} "
          f"{'ms/chunk':>9} {'speedup':>7}  split per task (ms)")
    for r in rows:
        speed = base.get(r["engine"], float("nan")) / r["seconds"]
        r["speedup"] = speed
        split = ""
        if "bare_product" in r:
            b = r["bare_product"]
            split = (f"bare {b['whole_ms']:.1f} (upload {b['upload_ms']:.1f}, kernel "
                     f"{b['kernel_ms']:.1f}, download {b['download_ms']:.1f}); task "
                     f"{r['task_compute_ms']:.1f}, overhead {r['overhead_ms_per_task']:.1f} "
                     f"(start {r['start_ms']:.1f}, gap {r['gap_ms']:.1f}, tail "
                     f"{r['tail_ms']:.1f}), "
                     f"imbalance {r['imbalance']:.2f}; host copy {r['host_copy_gbps']:.1f} GB/s, "
                     f"transfers {r['host_transfer_gbps']:.0f} GB/s")
            # what the workers' bare products allow, Dask aside: the host's share of them
            r["bare_speedup"] = (r["workers"] * bare.get(r["engine"], float("nan"))
                                 / b["whole_ms"])
            split += f"; bare products allow {r['bare_speedup']:.2f}x"
        if "dask_floor_seconds" in r:
            r["floor_speedup"] = floor.get(r["engine"], float("nan")) / r["dask_floor_seconds"]
            split += (f"; dask floor {r['dask_floor_seconds']:.3f} s (speedup "
                      f"{r['floor_speedup']:.2f})")
        write(f"{r['engine']:<40} {r['workers']:>7} {r['seconds']:>9.3f} {r['tflops']:>8.2f} "
              f"{r['gbps_moved']:>10.2f} {r['ms_per_chunk_per_worker']:>9.1f} {speed:>7.2f}  "
              f"{split}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if min(args.rows, args.k, args.n, args.chunk, args.repeat, args.threads_per_worker) < 1:
        _parser().error("--rows, --k, --n, --chunk, --repeat and --threads-per-worker must "
                        "be >= 1")
    if args.linear and args.dtype != "float16":
        _parser().error("--linear takes float16 X (--dtype float16)")
    if args.linear in ("q4_0", "q8_0") and args.k % 32:
        _parser().error(f"--linear {args.linear}: --k must be a multiple of 32")
    if args.json is not None and not args.json.parent.is_dir():
        _parser().error(f"--json {args.json}: directory {str(args.json.parent)!r} does not exist")
    from coopmat.dask.devices import placements
    available = len(placements(args.devices.split(",") if args.devices else None))
    counts = args.workers or list(range(1, available + 1))
    rows: list[dict[str, Any]] = []

    def saved() -> None:
        """The rows so far into --json: a run cut short keeps what it measured."""
        if args.json is not None:
            doc = {"config": {"rows": args.rows, "k": args.k, "n": args.n, "chunk": args.chunk,
                              "dtype": args.dtype, "repeat": args.repeat,
                              "linear": args.linear,
                              "threads_per_worker": args.threads_per_worker,
                              "cupy": cupy_module() is not None and not args.no_peers,
                              "host": host},
                   "results": rows}
            args.json.write_text(json.dumps(doc, indent=1, default=float) + "\n")

    x_bytes = args.rows * args.k * np.dtype(args.dtype).itemsize
    host = {"cores": os.cpu_count(),
            "memory_gbps": host_memory_gbps(min(1 << 31, max(1 << 26, x_bytes)))}
    write(f"host: {host['cores']} cores; numpy copying on all of them: "
          f"{host['memory_gbps']:.0f} GB/s (read + write)")
    run_coopmat(args, counts, rows, saved)
    if not args.no_peers:
        run_cupy(args, counts, rows, saved)
    _report(rows)
    saved()  # with the speedups _report adds
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
