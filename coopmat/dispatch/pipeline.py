"""A large numpy -> numpy GEMM as a pipeline: the host's copies, kernels and downloads
overlap.

D = A @ B is cut into row blocks D_i = A_i @ B. B goes to the device first, then A_0,
A_1, ...; the GEMM of block i starts once B and A_i are there, while A_{i+1} is still
crossing PCIe, and D_i comes back while later blocks compute. Two ways, by what the
device offers:

- Device memory the host maps (memory.Kind.MAPPED: a resizable BAR, as on the H200): four
  threads write B and then each A_i through the mapping (a B kept imported goes up in
  one device copy first). A lane's thread that finishes A_i's last chunk submits GEMM_i
  on the compute queue, with D_i's copy into the result (a kept pinned block, or the
  caller's out= array where that is kept imported) in the same submission, or on a copy
  queue where the device was opened with them. The device runs GEMM_i while the host
  writes A_{i+1}. An A kept imported takes the unpipelined path instead (way()).

      host (4 threads) | B ........ | A_0 | A_1 | A_2 | ... | A_last |
      compute queue                       | GEMM_0, D_0 | GEMM_1, D_1 | ... | last |

- An A kept imported (transfer.py, kept imports) on a device opened with copy queues
  (COOPMAT_COPY_QUEUES=1): A_i's one device copy from the import runs on one copy queue,
  GEMM_i on the compute queue once it is in, D_i's copy into a kept pinned block (or the
  caller's kept out=) on the other: the host copies nothing, and PCIe carries A and D
  at once while the kernels run. This is a Dask task's product on a persisted chunk.

      up copy queue   | A_0 | A_1 | A_2 | ... | A_last |
      compute queue         | GEMM_0 | GEMM_1 | ...     | last |
      down copy queue                | D_0 | D_1 | ...         | D_last |

- Copy queues without such memory (COOPMAT_COPY_QUEUES=1): B and the A_i go up through
  staging on one copy queue, D_i come back over the lanes on another, the GEMMs run on
  the compute queue between them, tied by the streams' timeline semaphores. On the H200
  this measured slower than the unpipelined path (lab/notebook/arrays.md): the host's copies into
  staging bound it.

      upload lanes   | B ........ | A_0 | A_1 | A_2 | ... |
      compute queue               | GEMM_0 | GEMM_1 | ...    |
      download lanes                        | D_0 | D_1 | ...    | D_last |
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from coopmat.codegen import Layout
from coopmat.codegen.traits import EpilogueOps
from coopmat.common.dtypes import numpy_dtype
from coopmat.dispatch import staging
from coopmat.dispatch.executor import Copy
from coopmat.dispatch.gemm import GemmResult, Plan, enqueue_plan, plan_of
from coopmat.dispatch.memory import Buffer, Kind
from coopmat.dispatch.runtime import Runtime
from coopmat.dispatch.staging import DeviceOperand, Staged, staged_of, staged_view
from coopmat.dispatch.transfer import NewDownload
from coopmat.policy import Options, TypePair

# About this many bytes of A and D a block; blocks are whole multiples of BLOCK_ROWS.
BLOCK_BYTES = 32 << 20
BLOCK_ROWS = 256
MAX_BLOCKS = 16
# The mapped pipeline's writes: chunks of this size on this many threads. On the H200
# (128 MiB in 8 MiB jobs, idle GPU) 4 threads of 2 MiB chunks wrote 30 GB/s and finished
# the jobs in order, the first after 0.6 ms; 16 threads of 4 MiB chunks wrote 28-30 GB/s,
# but the first job took 1.2-1.6 ms and they came out of order; 16 of 512 KiB, 18-21 GB/s.
WRITE_CHUNK_BYTES = 2 << 20
WRITE_THREADS = 4
# Without device memory the host maps, the pipeline runs where the device has copy queues
# (COOPMAT_COPY_QUEUES=1), or where Options.pipeline forces it ('copy-queues': its steps
# in order on the compute queue of a device without them, for tests).


def _tracer(options: Options) -> Callable[[str], None]:
    """Options.trace, or a no-op."""
    return options.trace or (lambda event: None)


def row_blocks(M: int, row_bytes: int) -> list[tuple[int, int]]:
    """[(first row, end row)] of the blocks D is cut into: at least two, about
    BLOCK_BYTES of A and D each, whole multiples of BLOCK_ROWS but the last."""
    count = min(MAX_BLOCKS, max(2, round(M * row_bytes / BLOCK_BYTES)))
    rows = -(-M // count)
    rows = -(-rows // BLOCK_ROWS) * BLOCK_ROWS
    return [(r, min(M, r + rows)) for r in range(0, M, rows)]


def mapped(rt: Runtime) -> bool:
    """Whether the pipeline writes its inputs through the mapping of device memory."""
    return rt.pool.direct_kind() is Kind.MAPPED


def way(mapped: bool, copy_engines: bool, a_kept: bool, force: bool = False) -> str | None:
    """Which pipeline a large product takes: 'kept' (A's blocks copied from its import
    on a copy queue), 'mapped' (the host writes A's blocks through the mapping),
    'copy-queues' (through staging), or None (the unpipelined path). Without copy queues
    an A kept imported stays unpipelined: its one device copy (55 GB/s on the H200) is
    faster than the mapped way's writes (about 30 GB/s; lab/notebook/arrays.md)."""
    if a_kept and (copy_engines or force):
        return "kept"
    if mapped:
        return None if a_kept else "mapped"
    return "copy-queues" if copy_engines or force else None


def applies(rt: Runtime, a: np.ndarray, b: np.ndarray | DeviceOperand, c: np.ndarray | None,
            out_shape: tuple[int, ...], io_bytes: int, options: Options | None = None) -> bool:
    """Whether a call takes the pipeline: a discrete GPU, one product (no batch, no C),
    A row-major (row blocks are contiguous), a large enough problem, and a way (way());
    never with Options.pipeline 'off'. b: a numpy array, or B resident on the device."""
    mode = options.pipeline if options is not None else "auto"
    device_kind, upload_kind, _ = rt.pool.kinds()
    one_b = isinstance(b, DeviceOperand) and b.staged.batch_stride == 0 or \
        isinstance(b, np.ndarray) and b.shape[0] == 1
    a_kept = rt.transfers.kept(a[0])
    return (mode != "off" and device_kind is not upload_kind and c is None and a.shape[0] == 1
            and one_b and out_shape[0] == 1 and io_bytes >= staging.PIPELINE_MIN_BYTES
            and staged_of(a).layout is Layout.ROW_MAJOR and a.shape[1] >= 2 * BLOCK_ROWS
            and way(mapped(rt), rt.copy_engines, a_kept, mode == "copy-queues") is not None)


@dataclass(frozen=True)
class Epilogue:
    """A pipelined product's fused operations: bias (N,) already on the device (the
    residual, an M x N operand, is not pipelined)."""

    ops: EpilogueOps
    bias: DeviceOperand | None = None


def run_pipelined(rt: Runtime, pair: TypePair, a: np.ndarray, b: np.ndarray | DeviceOperand,
                  out: np.ndarray | None, alpha: float | int,
                  options: Options | None = None, *, n: int = 0,
                  epilogue: Epilogue | None = None) -> tuple[GemmResult, np.ndarray] | None:
    """alpha * a[0] @ b[0] through the pipeline, into `out` (C-contiguous, of the result
    dtype) or a new array; returns the result and that array. b: a numpy array, or B
    resident on the device (its n columns), which then never crosses PCIe. None (nothing
    done) where a block's kernel needs a repack first (8-bit operands, a quantized B): the
    caller runs it whole."""
    options = options or Options()
    _, M, K = a.shape
    N = n if isinstance(b, DeviceOperand) else b.shape[2]
    sa = staged_of(a)
    sb = b.staged if isinstance(b, DeviceOperand) else staged_of(b)
    ops = epilogue.ops if epilogue is not None else None
    item = a.itemsize
    result_dtype = numpy_dtype(pair.stored)
    blocks = row_blocks(M, (K * item + N * result_dtype.itemsize))
    plans: dict[int, Plan] = {}
    for r0, r1 in blocks:
        rows = r1 - r0
        if rows not in plans:
            sa_i = staging.rows_of(sa, rows, item)
            plan = plan_of(rt, pair, sa_i, sb, None, (1, rows, N, K), alpha, 0, None,
                           options, ops=ops)
            if isinstance(b, DeviceOperand) and \
                    b.buffer.size - b.offset < sb.nbytes + plan.operand_margins[1]:
                # A resident B has no room past its data: no variant that reads past it.
                plan = plan_of(rt, pair, sa_i, sb, None, (1, rows, N, K), alpha, 0, None,
                               options, margins_ok=False, ops=ops)
            plans[rows] = plan
    if any(p.packs for p in plans.values()):
        return None
    first = plans[blocks[0][1] - blocks[0][0]]
    result = GemmResult(None, first.traits, first.choice.split_k)
    assert out is None or (out.dtype == result_dtype and out.flags.c_contiguous)
    margins = (max(p.margins[0] for p in plans.values()),
               max(p.margins[1] for p in plans.values()))
    chosen = way(mapped(rt), rt.copy_engines, rt.transfers.kept(a[0]),
                 options.pipeline == "copy-queues")
    if chosen == "kept":
        array = _run_kept(rt, a, b, N, out, blocks, plans, sa, sb, margins, result_dtype,
                          epilogue, _tracer(options))
        return None if array is None else (result, array)
    if mapped(rt):
        return result, _run_mapped(rt, a, b, N, out, blocks, plans, sa, sb, margins,
                                   result_dtype, epilogue, _tracer(options))
    if out is None:  # the copy queues' lanes download into the caller's array
        out = np.empty((1, M, N), result_dtype)
    pool = rt.pool
    taken: list[Buffer] = []

    def take(nbytes: int) -> Buffer:
        taken.append(pool.acquire(Kind.DEVICE, nbytes))
        return taken[-1]

    try:
        a_buf = take(sa.nbytes + margins[0])
        b_op = b if isinstance(b, DeviceOperand) else \
            DeviceOperand(take(sb.nbytes + margins[1]), 0, sb)
        d_buf = take(M * N * out.itemsize)
        _run(rt, plans, a, None if isinstance(b, DeviceOperand) else b, N, out, options,
             blocks, sa, a_buf, b_op, d_buf, epilogue)
        return result, out
    finally:
        for buf in taken:  # every queue's work on them has completed (_run waited)
            pool.release(buf)


def _run_mapped(rt: Runtime, a: np.ndarray, b: np.ndarray | DeviceOperand, N: int,
                out: np.ndarray | None, blocks: list[tuple[int, int]], plans: dict[int, Plan],
                sa: Staged, sb: Staged, margins: tuple[int, int], result_dtype: np.dtype,
                epilogue: Epilogue | None, _trace: Callable[[str], None]) -> np.ndarray:
    """The pipeline on device memory the host maps (the module's first way)."""
    _, M, K = a.shape
    bias = epilogue.bias if epilogue is not None else None
    pool, transfers, compute = rt.pool, rt.transfers, rt.stream
    item, row_d = a.itemsize, N * result_dtype.itemsize
    d_bytes = M * row_d
    taken: list[Buffer] = []
    target: NewDownload | None = None
    array: np.ndarray | None = None
    # D's copies on a copy queue, beside the kernels, where the device was opened with
    # them (COOPMAT_COPY_QUEUES=1): about 5% faster at 8192^3 with a new A and a kept B
    # on the H200, within the noise with both new (lab/notebook/arrays.md).
    down = rt.down if rt.copy_engines else None
    try:
        a_buf = pool.acquire(Kind.MAPPED, sa.nbytes + margins[0])
        taken.append(a_buf)
        d_buf = pool.acquire(Kind.DEVICE, d_bytes)
        taken.append(d_buf)
        if isinstance(b, DeviceOperand):
            b_op = b
        else:
            taken.append(pool.acquire(Kind.MAPPED, sb.nbytes + margins[1]))
            b_op = DeviceOperand(taken[-1], 0, sb)
        with contextlib.ExitStack() as hold:
            # Where D_i goes as its kernel completes: the caller's kept array or a kept
            # pinned block for a new result; else D comes back whole at the end.
            dest: tuple[Buffer, int] | None = None
            if out is not None:
                dest = hold.enter_context(transfers.kept_destination(out))
            else:
                target = transfers.new_download(d_bytes)
                dest = (target.dst, target.offset) if target is not None else None
            _trace(f"start: {len(blocks)} blocks")
            # B: resident already; or a kept import's one device copy (the kernels run
            # after it: the stream orders them), else written through the mapping before
            # the blocks of A.
            b_src = None if isinstance(b, DeviceOperand) else staged_view(b, sb)[0]
            b_ticket = None if b_src is None else transfers.kept_upload(b_src, b_op.buffer)
            b_copied = b_src is None or b_ticket is not None
            if b_ticket is not None:
                # Waited for before A's writes, which would share PCIe with it: the
                # kernels then start with A's first block (8192^3 with a new A on the
                # H200: 11.4-11.6 ms against 12.9 with the copy beside the writes).
                compute.wait(b_ticket)
                _trace("B copied")
            jobs = [(a[0, r0:r1], a_buf, r0 * sa.ld * item) for r0, r1 in blocks]
            if not b_copied:
                assert b_src is not None
                jobs.insert(0, (b_src, b_op.buffer, 0))
            lock = threading.Lock()
            written: list[int] = []  # blocks of A written before B was

            def submit(i: int) -> None:
                r0, r1 = blocks[i]
                rows = r1 - r0
                a_i = DeviceOperand(a_buf, r0 * sa.ld * item, staging.rows_of(sa, rows, item))
                d_i = DeviceOperand(d_buf, r0 * row_d,
                                    Staged(Layout.ROW_MAJOR, N, 0, rows * row_d))
                # D_i goes back as soon as it is done, while the host writes later
                # blocks. That slows the writes (device -> host copies share the link),
                # but D left to the end cost more: new A and B at 8192^3 on the H200,
                # 13.1-13.5 ms against 11.8-11.9 (lab/notebook/arrays.md).
                copy = [Copy(d_buf, dest[0], rows * row_d, r0 * row_d, dest[1] + r0 * row_d)
                        ] if dest is not None else []
                ticket = enqueue_plan(rt, plans[rows], a_i, b_op, None, d_i, bias=bias,
                                      downloads=copy if down is None else ())
                _trace(f"gemm {i} submitted")
                if down is not None:
                    for cp in copy:
                        transfers.copy_after(cp.src, cp.src_offset, cp.dst, cp.dst_offset,
                                             cp.nbytes, down, [(compute, ticket)], lane=i % 4)

            def on_job(j: int) -> None:
                # On a lane's thread: run each block's kernel once B and its rows are in.
                nonlocal b_copied
                with lock:
                    if not b_copied and j == 0:
                        b_copied, ready = True, written[:]
                    elif b_copied:
                        ready = [j - (len(jobs) - len(blocks))]
                    else:
                        written.append(j - 1)
                        ready = []
                for i in ready:
                    submit(i)

            transfers.write_mapped_jobs(jobs, on_job, WRITE_CHUNK_BYTES, WRITE_THREADS)
            _trace("written")
            # Note A and B (or import them, at their second time) like any upload: A
            # kept, the next product of the same arrays skips the pipeline (way()).
            transfers.kept_later(a[0])
            if b_src is not None and len(jobs) > len(blocks):
                transfers.kept_later(b_src)
            compute.wait()
            if down is not None:
                down.wait()
        _trace("end")
        array = _result(rt, target, out, dest, d_buf, result_dtype, (M, N))
        return array
    finally:
        if array is None and down is not None:
            with contextlib.suppress(Exception):  # the call's own failure is raised
                down.wait()  # no copy may still read d_buf once it is given back
        if target is not None and array is None:
            target.abandon()
        for buf in taken:  # once the work submitted so far (all of this call's) is done
            pool.release_later(buf)


def _result(rt: Runtime, target: NewDownload | None, out: np.ndarray | None,
            dest: tuple[Buffer, int] | None, d_buf: Buffer, result_dtype: np.dtype,
            shape: tuple[int, int]) -> np.ndarray:
    """The result once D's blocks are done: the kept pinned block they were copied into,
    else D downloaded whole into a new array or into `out` (unless copied there already)."""
    M, N = shape
    if target is not None:
        return target.array().view(result_dtype).reshape(1, M, N)
    if out is None:
        return rt.transfers.download_new(d_buf, 0, M * N * result_dtype.itemsize).view(
            result_dtype).reshape(1, M, N)
    if dest is None:
        rt.transfers.download(d_buf, 0, out)
    return out


# Copies a queue keeps in flight in the kept way: lanes of two command buffers each.
KEPT_LANES = 4


def _run_kept(rt: Runtime, a: np.ndarray, b: np.ndarray | DeviceOperand, N: int,
              out: np.ndarray | None, blocks: list[tuple[int, int]], plans: dict[int, Plan],
              sa: Staged, sb: Staged, margins: tuple[int, int], result_dtype: np.dtype,
              epilogue: Epilogue | None, _trace: Callable[[str], None]) -> np.ndarray | None:
    """The pipeline for an A kept imported (the module's second way); None where A's
    import went meanwhile (the caller runs the product whole)."""
    _, M, _ = a.shape
    bias = epilogue.bias if epilogue is not None else None
    pool, transfers, compute, up, down = rt.pool, rt.transfers, rt.stream, rt.up, rt.down
    item, row_d = a.itemsize, N * result_dtype.itemsize
    d_bytes = M * row_d
    taken: list[Buffer] = []
    target: NewDownload | None = None
    array: np.ndarray | None = None
    submitted = False
    try:
        with contextlib.ExitStack() as hold:
            src = hold.enter_context(transfers.kept_destination(a[0]))
            if src is None:
                return None
            taken.append(pool.acquire(Kind.DEVICE, sa.nbytes + margins[0]))
            a_buf = taken[-1]
            taken.append(pool.acquire(Kind.DEVICE, d_bytes))
            d_buf = taken[-1]
            if isinstance(b, DeviceOperand):
                b_op = b
            else:  # B goes first, on the compute queue: the kernels are ordered after it
                taken.append(pool.acquire(Kind.DEVICE, sb.nbytes + margins[1]))
                b_op = DeviceOperand(taken[-1], 0, sb)
                transfers.upload(staged_view(b, sb)[0], b_op.buffer)
            dest: tuple[Buffer, int] | None
            if out is not None:
                dest = hold.enter_context(transfers.kept_destination(out))
            else:
                target = transfers.new_download(d_bytes)
                dest = (target.dst, target.offset) if target is not None else None
            where = "downloaded at the end" if dest is None else \
                "into out" if out is not None else "into a kept block"
            _trace(f"start: {len(blocks)} blocks, D {where}")
            # A's copies may not overwrite a buffer that earlier kernels still read.
            start = [(compute, compute.submitted)]
            submitted = True
            for i, (r0, r1) in enumerate(blocks):
                rows = r1 - r0
                sa_i = staging.rows_of(sa, rows, item)
                at = r0 * sa.ld * item
                copied = transfers.copy_after(src[0], src[1] + at, a_buf, at, sa_i.nbytes,
                                              up, start, lane=i % KEPT_LANES)
                d_i = DeviceOperand(d_buf, r0 * row_d,
                                    Staged(Layout.ROW_MAJOR, N, 0, rows * row_d))
                ticket = enqueue_plan(rt, plans[rows], DeviceOperand(a_buf, at, sa_i), b_op,
                                      None, d_i, waits=[(up, copied)], bias=bias)
                _trace(f"gemm {i} submitted")
                if dest is not None:
                    transfers.copy_after(d_buf, r0 * row_d, dest[0], dest[1] + r0 * row_d,
                                         rows * row_d, down, [(compute, ticket)],
                                         lane=i % KEPT_LANES)
            compute.wait()  # every copy of A too: each kernel waited for its block's
            down.wait()
        _trace("end")
        array = _result(rt, target, out, dest, d_buf, result_dtype, (M, N))
        return array
    finally:
        if array is None and submitted:
            with contextlib.suppress(Exception):  # the call's own failure is raised
                compute.wait()  # no copy may still use a buffer once it is given back
                up.wait()
                down.wait()
        if target is not None and array is None:
            target.abandon()
        for buf in taken:
            pool.release_later(buf)


def _run(rt: Runtime, plans: dict[int, Plan], a: np.ndarray, b: np.ndarray | None, N: int,
         out: np.ndarray, options: Options, blocks: list[tuple[int, int]], sa: Staged,
         a_buf: Buffer, b_op: DeviceOperand, d_buf: Buffer,
         epilogue: Epilogue | None) -> None:
    """The pipeline on copy queues (the module's third way); b None: B is resident in
    b_op already."""
    _trace = _tracer(options)
    item, out_item = a.itemsize, out.itemsize
    compute, up, down = rt.stream, rt.up, rt.down
    n = len(blocks)
    ready = [threading.Event() for _ in range(n + 1)]  # job 0: B; job i + 1: A_i
    uploaded = [0] * (n + 1)
    errors: list[BaseException] = []

    def on_job(job: int, ticket: int) -> None:
        job += 1 - first_job  # in ready's numbering
        uploaded[job] = ticket
        ready[job].set()
        _trace(f"up {'B' if job == 0 else f'A{job - 1}'} submitted")

    jobs = [(a[0, r0:r1], a_buf) for r0, r1 in blocks]
    offsets = [r0 * sa.ld * item for r0, _ in blocks]
    if b is None:
        ready[0].set()  # B is there: the kernels wait for their A only
    else:
        jobs.insert(0, (staged_view(b, b_op.staged)[0], b_op.buffer))
        offsets.insert(0, 0)
    first_job = 0 if b is None else 1  # job j is A_{j - first_job}
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
    try:
        for i, (r0, r1) in enumerate(blocks):
            for job in (0, i + 1):
                while not ready[job].wait(0.01):
                    if errors or not uploader.is_alive() and not ready[job].is_set():
                        raise errors[0] if errors else RuntimeError("upload stopped")
            rows = r1 - r0
            a_i = DeviceOperand(a_buf, r0 * sa.ld * item, staging.rows_of(sa, rows, item))
            d_i = DeviceOperand(d_buf, r0 * N * out_item,
                                Staged(Layout.ROW_MAJOR, N, 0, rows * N * out_item))
            ticket = enqueue_plan(rt, plans[rows], a_i, b_op, None, d_i,
                                  waits=[(up, max(uploaded[0], uploaded[i + 1]))],
                                  bias=epilogue.bias if epilogue is not None else None)
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
    # Note A (or import it, at its second time) like any upload: kept, the next product
    # of the same A takes the kept way.
    rt.transfers.kept_later(a[0])


def _thread(fn: Callable[[], object], errors: list[BaseException]) -> threading.Thread:
    def body() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the caller's thread
            errors.append(exc)
    t = threading.Thread(target=body, name="coopmat-pipeline", daemon=True)
    t.start()
    return t
