"""A large numpy -> numpy GEMM as a pipeline: uploads, kernels and downloads overlap.

D = A @ B is cut into row blocks D_i = A_i @ B. B goes up first, then A_0, A_1, ...; the
GEMM of block i starts once B and A_i are on the device, while A_{i+1} is still crossing
PCIe; D_i comes back while later blocks compute. On a device with a transfer-only queue
family (NVIDIA's copy engines) uploads and downloads each run on a queue of their own,
beside the kernels on the compute queue, tied together by the streams' timeline
semaphores; elsewhere the same steps run in order on the compute queue (correct, just
not overlapped). The wall time then tends to the upload of A and B alone.

Status: measured on the H200 it is slower than the unpipelined path (docs/arrays.md), so
it runs only where copy queues were asked for (COOPMAT_COPY_QUEUES=1).

    upload lanes   | B ........ | A_0 | A_1 | A_2 | ... |
    compute queue               | GEMM_0 | GEMM_1 | ...    |
    download lanes                        | D_0 | D_1 | ...    | D_last |
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from coopmat.codegen import Layout
from coopmat.dispatch.gemm import (
    DeviceOperand,
    GemmResult,
    Staged,
    _plan,
    _staged_view,
    enqueue_gemm,
    plan_of,
)
from coopmat.dispatch.memory import Buffer, Kind
from coopmat.dispatch.runtime import Runtime
from coopmat.policy import Options, TypePair

# Problems moving at least this many bytes between host and device are pipelined.
PIPELINE_MIN_BYTES = 24 << 20
# About this many bytes of A and D a block; blocks are whole multiples of BLOCK_ROWS.
BLOCK_BYTES = 16 << 20
BLOCK_ROWS = 256
MAX_BLOCKS = 16
# The pipeline runs where the device has copy queues (COOPMAT_COPY_QUEUES=1); tests set
# FORCE to run its steps in order on the compute queue of a device without them.
FORCE = False
# A list to receive (perf_counter seconds, event) of each call's steps, for profiling
# (benchmarks/profile_numpy_path.py); None: not recorded.
TRACE: list[tuple[float, str]] | None = None


def _trace(event: str) -> None:
    if TRACE is not None:
        TRACE.append((time.perf_counter(), event))


def row_blocks(M: int, row_bytes: int) -> list[tuple[int, int]]:
    """[(first row, end row)] of the blocks D is cut into: at least two, about
    BLOCK_BYTES of A and D each, whole multiples of BLOCK_ROWS but the last."""
    count = min(MAX_BLOCKS, max(2, round(M * row_bytes / BLOCK_BYTES)))
    rows = -(-M // count)
    rows = -(-rows // BLOCK_ROWS) * BLOCK_ROWS
    return [(r, min(M, r + rows)) for r in range(0, M, rows)]


def applies(rt: Runtime, a: np.ndarray, b: np.ndarray, c: np.ndarray | None,
            out_shape: tuple[int, ...], io_bytes: int) -> bool:
    """Whether a call takes the pipeline: a discrete GPU, one product (no batch, no C),
    A row-major (row blocks are contiguous), a large enough problem."""
    device_kind, upload_kind, _ = rt.pool.kinds()
    return (device_kind is not upload_kind and (rt.copy_engines or FORCE) and c is None
            and a.shape[0] == 1 and b.shape[0] == 1 and out_shape[0] == 1
            and io_bytes >= PIPELINE_MIN_BYTES
            and _plan(a).layout is Layout.ROW_MAJOR
            and a.shape[1] >= 2 * BLOCK_ROWS)


def run_pipelined(rt: Runtime, pair: TypePair, a: np.ndarray, b: np.ndarray,
                  out: np.ndarray, alpha: float | int,
                  options: Options | None = None) -> GemmResult | None:
    """out[0] = alpha * a[0] @ b[0] through the pipeline; None (nothing done) where a
    block's kernel needs a repack first (8-bit operands): the caller runs it whole."""
    options = options or Options()
    _, M, K = a.shape
    N = b.shape[2]
    sa, sb = _plan(a), _plan(b)
    item = a.itemsize
    out_item = out.itemsize
    blocks = row_blocks(M, (K * item + N * out_item))
    plans = {}
    for r0, r1 in blocks:
        rows = r1 - r0
        if rows not in plans:
            plans[rows] = plan_of(rt, pair, _rows(sa, rows, item), sb, None,
                                  (1, rows, N, K), alpha, 0, None, options)
    if any(p.packs for p in plans.values()):
        return None
    result_dtype = next(iter(plans.values())).result_dtype
    assert out.dtype == result_dtype and out.flags.c_contiguous

    pool = rt.pool
    margin_a = max(p.margins[0] for p in plans.values())
    margin_b = max(p.margins[1] for p in plans.values())
    taken: list[Buffer] = []

    def take(nbytes: int) -> Buffer:
        taken.append(pool.acquire(Kind.DEVICE, nbytes))
        return taken[-1]

    try:
        a_buf, b_buf = take(sa.nbytes + margin_a), take(sb.nbytes + margin_b)
        d_buf = take(M * N * out_item)
        return _run(rt, pair, a, b, out, alpha, options, blocks, sa, sb, a_buf, b_buf, d_buf)
    finally:
        for buf in taken:  # every queue's work on them has completed (_run waited)
            pool.release(buf)


def _rows(s: Staged, rows: int, item: int) -> Staged:
    """The staging description of `rows` rows of a row-major operand."""
    return Staged(Layout.ROW_MAJOR, s.ld, 0, rows * s.ld * item)


def _run(rt: Runtime, pair: TypePair, a: np.ndarray, b: np.ndarray, out: np.ndarray,
         alpha: float | int, options: Options, blocks: list[tuple[int, int]], sa: Staged,
         sb: Staged, a_buf: Buffer, b_buf: Buffer, d_buf: Buffer) -> GemmResult:
    K = a.shape[2]
    N = b.shape[2]
    item, out_item = a.itemsize, out.itemsize
    compute, up, down = rt.stream, rt.up, rt.down
    n = len(blocks)
    ready = [threading.Event() for _ in range(n + 1)]  # job 0: B; job i + 1: A_i
    uploaded = [0] * (n + 1)
    errors: list[BaseException] = []

    def on_job(job: int, ticket: int) -> None:
        uploaded[job] = ticket
        ready[job].set()
        _trace(f"up {'B' if job == 0 else f'A{job - 1}'} submitted")

    jobs = [(_staged_view(b, sb)[0], b_buf)] + [(a[0, r0:r1], a_buf) for r0, r1 in blocks]
    offsets = [0] + [r0 * sa.ld * item for r0, _ in blocks]
    # The copies may not overwrite buffers that earlier kernels still read.
    start = [(compute, compute.submitted)]
    _trace(f"start: {n} blocks")
    uploader = _thread(lambda: rt.transfers.upload_many(
        jobs, stream=up, waits=start, on_job=on_job, dst_offsets=offsets), errors)
    downloads: queue.Queue[tuple[int, int] | None] = queue.Queue()

    def download_all() -> None:
        # Blocks whose kernels were submitted meanwhile go down together (they are
        # contiguous rows): one download spreads over all the lanes, where one block
        # alone would keep only a few busy.
        done = False
        while not done:
            item_ = downloads.get()
            if item_ is None:
                return
            first, ticket = item_
            last = first
            while True:
                try:
                    more = downloads.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    done = True
                    break
                last, ticket = more
            r0, r1 = blocks[first][0], blocks[last][1]
            _trace(f"down D{first}..D{last} start")
            rt.transfers.download(d_buf, r0 * N * out_item, out[0, r0:r1], stream=down,
                                  waits=[(compute, ticket)])
            _trace(f"down D{first}..D{last} done")
    downloader = _thread(download_all, errors)
    traits = None
    try:
        for i, (r0, r1) in enumerate(blocks):
            for job in (0, i + 1):
                while not ready[job].wait(0.01):
                    if errors or not uploader.is_alive() and not ready[job].is_set():
                        raise errors[0] if errors else RuntimeError("upload stopped")
            rows = r1 - r0
            a_i = DeviceOperand(a_buf, r0 * sa.ld * item, _rows(sa, rows, item))
            d_i = DeviceOperand(d_buf, r0 * N * out_item,
                                Staged(Layout.ROW_MAJOR, N, 0, rows * N * out_item))
            ticket, plan = enqueue_gemm(
                rt, pair, a_i, DeviceOperand(b_buf, 0, sb), None, d_i, (1, rows, N, K),
                alpha, 0, options, waits=[(up, max(uploaded[0], uploaded[i + 1]))])
            traits = plan.traits
            _trace(f"gemm {i} submitted")
            downloads.put((i, ticket))
    finally:
        downloads.put(None)
        uploader.join()
        downloader.join()
        compute.wait()
        _trace("end")
    if errors:
        raise errors[0]
    assert traits is not None
    return GemmResult(None, traits)


def _thread(fn: Callable[[], object], errors: list[BaseException]) -> threading.Thread:
    def body() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the caller's thread
            errors.append(exc)
    t = threading.Thread(target=body, name="coopmat-pipeline", daemon=True)
    t.start()
    return t
