"""Carry out a kernel choice: stage operands, run the repacks and the GEMM, read back.

Operands arrive as numpy arrays shaped (batch, rows, cols) where batch is 1 for an operand
shared by every batch entry (its batch stride is then 0). Each is written once into
host-visible memory (the staging copy; on unified-memory devices, and for small problems
on discrete ones, the kernel's own buffer) in the layout that reads it contiguously: a
transposed view goes to the kernel's column-major path instead of being transposed.
Which kernel runs is coopmat.policy's choice; this module only runs it.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from coopmat import codegen
from coopmat.codegen import GemmTraits, KhrTraits, Layout, abi
from coopmat.codegen.dequant import dequant_kernel
from coopmat.codegen.pack import pack_kernel
from coopmat.codegen.traits import EpilogueOps
from coopmat.common.dtypes import numpy_dtype
from coopmat.common.enums import ComponentType
from coopmat.common.errors import OutOfDeviceMemoryError
from coopmat.common.lru import Lru
from coopmat.dispatch import staging
from coopmat.dispatch.executor import Copy, Dispatch, copies_key
from coopmat.dispatch.memory import Buffer, Kind
from coopmat.dispatch.pipelines import Pipeline
from coopmat.dispatch.runtime import Runtime
from coopmat.dispatch.staging import (
    DeviceOperand,
    Staged,
    staged_of,
    staged_target,
    staged_view,
)
from coopmat.dispatch.stream import Stream
from coopmat.policy import (
    KernelChoice,
    OperandLayout,
    Options,
    PackChoice,
    Problem,
    TypePair,
    bounds_checked,
    choose,
    tuning,
)


@dataclass(frozen=True)
class GemmResult:
    kernel_seconds: float | None
    traits: GemmTraits  # a split-K's: the slice GEMM's
    split_k: int = 1  # S > 1: the GEMM ran as S slices of K (KhrTraits.split_k)


class PreparedGemm:
    """A GEMM whose kernel is built and whose operands sit in device buffers.

    `execute()` runs the kernel (again, for benchmarks) and returns its GPU time;
    `read(out)` copies D out; `release()` hands the buffers back to the pool.
    """

    def __init__(self, rt: Runtime, pair: TypePair, a: np.ndarray, b: np.ndarray,
                 c: np.ndarray | None, batch: int, alpha: float | int, beta: float | int,
                 traits: GemmTraits | None = None, options: Options | None = None,
                 bias: np.ndarray | None = None, residual: np.ndarray | None = None,
                 ops: EpilogueOps | None = None):
        """bias: N elements; residual: (batch, M, N), C-contiguous (addressed like D);
        both of the result dtype, given where `ops` asks for them."""
        self.rt = rt
        options = options or Options()
        plan = plan_of(rt, pair, staged_of(a), staged_of(b),
                       staged_of(c) if c is not None else None,
                       (batch, a.shape[1], b.shape[2], a.shape[2]), alpha, beta, traits,
                       options, ops=ops)
        self.plan = plan
        self.choice = plan.choice
        self.traits = plan.traits
        self.shape = plan.shape
        self.result_dtype = plan.result_dtype
        self.d_bytes = plan.d_bytes
        sa, sb, sc = plan.staged

        operand_kind, upload_kind, download_kind = rt.pool.kinds()
        device_kind = d_kind = operand_kind
        direct = rt.pool.direct_kind()
        # Large problems on a discrete GPU: operands go straight into device buffers (over
        # the parallel transfer lanes, or written through the mapping of device memory
        # the host maps), and D comes back over the lanes in read().
        self.bulk = operand_kind is not upload_kind and plan.io_bytes >= staging.BULK_MIN_BYTES
        if self.bulk:
            upload_kind, download_kind = operand_kind, operand_kind
            operand_kind = direct or operand_kind
        elif operand_kind is not upload_kind and plan.io_bytes <= staging.DIRECT_MAX_BYTES:
            # Small problem on a discrete GPU: the host writes A/B (and C) where the kernel
            # reads them (device memory it maps, else the upload buffers, read over PCIe)
            # and the kernel writes D into the download buffer over PCIe, sparing three
            # copy commands and their barriers, most of a tiny matmul's device time.
            operand_kind, d_kind = direct or upload_kind, download_kind
        elif operand_kind is not upload_kind and plan.io_bytes <= staging.MAPPED_MAX_BYTES:
            # Medium: inputs written into device memory the host maps, where there is any
            # (no copy commands in); D comes back by a copy.
            operand_kind = direct or operand_kind
        self._acquired: list[Buffer] = []
        # Where each input was staged (kept: a repeated small call writes there again).
        self._written: list[tuple[np.ndarray, Staged]] = []
        self._pending = 0  # a ticket of copies still reading the caller's arrays
        try:
            inputs = [(a, sa), (b, sb)] + ([(c, sc)] if c is not None and sc else [])
            # The fused epilogue's operands (bias as 1 x 1 x N), bound after C.
            extra = [(abi.BINDING_BIAS, bias.reshape(1, 1, -1)) if bias is not None else None,
                     (abi.BINDING_RESIDUAL, residual) if residual is not None else None]
            extra_bindings = [e[0] for e in extra if e is not None]
            inputs += [(x, staged_of(x)) for e in extra if e is not None for x in (e[1],)]
            packed_operands = {step.operand for step in plan.packs}
            device_bufs: list[Buffer] = []
            self.uploads: list[Copy] = []
            bulk_jobs: list[tuple[np.ndarray, Buffer]] = []
            for i, (x, s) in enumerate(inputs):
                # The kernel's margin goes where it reads: after a repack, the packed copy.
                margin = plan.margins[i] if i < 2 and i not in packed_operands else 0
                dev_buf = self._take(operand_kind, s.nbytes + margin)
                if self.bulk:
                    bulk_jobs.append((staged_view(x, s), dev_buf))
                    device_bufs.append(dev_buf)
                    continue
                host = dev_buf if dev_buf.mapped is not None else \
                    self._take(upload_kind, s.nbytes)
                target = staged_target(x, s, host.view(x.dtype, s.nbytes // x.itemsize))
                np.copyto(target, staged_view(x, s))
                self._written.append((target, s))
                if host is not dev_buf:
                    self.uploads.append(Copy(host, dev_buf, s.nbytes))
                device_bufs.append(dev_buf)
            if bulk_jobs:
                # Not waited for here: the kernel's submission runs after these copies,
                # and execute() (or release()) waits for it before the caller returns.
                self._pending = rt.transfers.upload_many(bulk_jobs, wait=False, fresh=True)
            d_buf = self._take(d_kind, self.d_bytes)
            self.d_host = d_buf if d_kind is download_kind else self._take(
                download_kind, self.d_bytes)
            self.downloads = [Copy(d_buf, self.d_host, self.d_bytes)] \
                if self.d_host is not d_buf else []
            # The plan's own device buffers (repacked copies, a split-K's workspace),
            # taken here so that release() gives them back with the rest.
            temps = [self._take(device_kind, step.nbytes + plan.margins[step.operand])
                     for step in plan.packs]
            if plan.workspace_bytes:
                temps.append(self._take(device_kind, plan.workspace_bytes))
        except BaseException:
            self.release()
            raise
        # Each input where the kernel reads it, in inputs' order: A, B, C, bias, residual.
        bound = [DeviceOperand(buf, 0, s) for buf, (_, s) in zip(device_bufs, inputs,
                                                                 strict=True)]
        extras = dict(zip(extra_bindings, bound[len(bound) - len(extra_bindings):],
                          strict=True))
        self.dispatches: list[Dispatch] = plan_dispatches(
            rt, plan, bound[0], bound[1], bound[2] if c is not None else None,
            DeviceOperand(d_buf, 0, Staged(Layout.ROW_MAJOR, self.shape[2], 0, self.d_bytes)),
            extras.get(abi.BINDING_BIAS), extras.get(abi.BINDING_RESIDUAL), temps)
        # Names its recordings (Executor.run), with each dispatch's kernel, constants and
        # grid: the plan and the buffers, in the order they were taken, fix the rest. A
        # later GEMM of the same plan that gets the same pooled buffers reuses the
        # recording: on the H200 recording cost about 300 us, most of a 256^3 call
        # (lab/notebook/arrays.md).
        self._name = ("prepared", plan.serial, *(buf.addr for buf in self._acquired))
        # D where the host reads it, for a small problem (read()); made on first use.
        self._d_view: np.ndarray | None = None

    def load(self, a: np.ndarray, b: np.ndarray) -> None:
        """Stage new A and B (the shapes, strides and dtypes this GEMM was prepared with)
        into its buffers, for execute() to run again: a repeated small call then skips
        the plan, the pool and the command recording (its recording is cached by buffer)."""
        if self.bulk:
            raise ValueError("load() is for problems staged through mapped memory")
        for x, (target, s) in zip((a, b), self._written, strict=False):
            np.copyto(target, staged_view(x, s))

    def _take(self, kind: Kind, nbytes: int) -> Buffer:
        buf = self.rt.pool.acquire(kind, nbytes)
        self._acquired.append(buf)
        return buf

    def execute(self, transfers: bool = True,
                then: Callable[[], int] | None = None) -> float | None:
        """Run the kernel; with transfers, also the staging copies in and out. Its
        recording is kept under its plan, buffers and dispatches. then: as Executor.run's."""
        # The dispatches are named as they are now: a caller may have replaced one (the
        # buffer-bounds test runs a kernel with a K its buffers do not hold).
        name = (*self._name, transfers,
                *((d.pipeline.addr, d.push_constants, d.groups) for d in self.dispatches))
        return self._run(self.uploads if transfers else [],
                         self.downloads if transfers else [], name, then)

    def _run(self, uploads: list[Copy], downloads: list[Copy],
             name: tuple[Any, ...] | None = None,
             then: Callable[[], int] | None = None) -> float | None:
        try:
            return self.rt.executor.run(uploads, self.dispatches, downloads, name=name,
                                        then=then)
        finally:
            self._pending = 0  # run waited for a later ticket of the same stream

    def execute_into(self, out: np.ndarray) -> float | None:
        """execute() and read(out) in one: where `out` is kept imported (mode 'auto',
        Transfers.kept_download), D's copy into it goes right behind the kernel and the
        call waits once for both."""
        kept = False

        def then() -> int:
            nonlocal kept
            ticket = self.rt.transfers.kept_download(self.d_host, 0, out.reshape(
                self.shape)) if self.bulk and out.flags.c_contiguous and \
                out.dtype == self.result_dtype else None
            kept = ticket is not None
            return ticket or 0

        seconds = self.execute(then=then)
        if not kept:
            self.read(out)
        return seconds

    def execute_new(self) -> tuple[float | None, np.ndarray]:
        """execute() and read_new() in one: where a kept pinned block is ready
        (Transfers.new_download), D's copy into it rides in the kernel's submission,
        so the call waits once instead of twice."""
        target = self.rt.transfers.new_download(self.d_bytes) if self.bulk else None
        if target is None:
            seconds = self.execute()
            return seconds, self.read_new()
        try:
            seconds = self._run(self.uploads, [Copy(self.d_host, target.dst, self.d_bytes,
                                                    dst_offset=target.offset)])
        except BaseException:
            target.abandon()
            raise
        raw = target.array()
        return seconds, raw.view(self.result_dtype).reshape(self.shape)

    def independent_copies(self, count: int) -> list[Dispatch]:
        """The GEMM dispatch `count` times, each writing its own D (the first the call's
        own), so they may run together: for timing dispatches back to back, as
        vk_cooperative_matrix_perf does. Repacks are left out: execute() has already
        written the operands they produce."""
        if self.plan.workspace_bytes:
            raise ValueError("the workgroups of a split-K GEMM share a workspace and counters "
                             "that copies would race for; time it with serial_seconds")
        gemm = self.dispatches[-1]
        kind = gemm.buffers[abi.BINDING_D].kind
        return [gemm] + [replace(gemm, buffers={**gemm.buffers,
                                                abi.BINDING_D: self._take(kind, self.d_bytes)})
                         for _ in range(count - 1)]

    def serial_seconds(self, count: int, submits: int = 3) -> float | None:
        """GPU seconds per run of the GEMM's dispatch (a split-K's too) run `count` times
        back to back in one submission, a barrier between each dispatch (the median of
        `submits` submissions; None without timestamps). Short kernels timed one per
        submission also carry the queue's start-up; peers time many launches in a row, and
        so does this. Repacks are left out, as in independent_copies."""
        return self.rt.executor.serial_seconds(self.dispatches[len(self.plan.packs):], count,
                                               submits)

    def read(self, out: np.ndarray) -> None:
        count = math.prod(self.shape)
        if self.bulk:
            if out.flags.c_contiguous and out.dtype == self.result_dtype:
                self.rt.transfers.download(self.d_host, 0, out.reshape(self.shape))
                return
            tmp = np.empty(self.shape, self.result_dtype)
            self.rt.transfers.download(self.d_host, 0, tmp)
            np.copyto(out, tmp, casting="unsafe")
            return
        if self._d_view is None:
            self._d_view = self.d_host.view(self.result_dtype, count).reshape(self.shape)
        np.copyto(out, self._d_view, casting="unsafe")

    def read_new(self) -> np.ndarray:
        """D in a new C-contiguous array; a large one in one device copy into a kept
        pinned block where the device allows (Transfers.download_new)."""
        if not self.bulk:
            out = np.empty(self.shape, self.result_dtype)
            self.read(out)
            return out
        raw = self.rt.transfers.download_new(self.d_host, 0, self.d_bytes)
        return raw.view(self.result_dtype).reshape(self.shape)

    def release(self) -> None:
        pending, self._pending = self._pending, 0
        try:
            if pending:  # never executed: the caller's arrays may change once we return
                self.rt.stream.wait(pending)
        finally:
            # Last taken, first given back: the pool hands out the buffer it got back
            # last, so the next GEMM of these shapes takes the same buffers in the same
            # roles and reuses this one's recording.
            for buf in reversed(self._acquired):
                self.rt.pool.release(buf)
            self._acquired = []


@dataclass(frozen=True)
class PackStep:
    """A dispatch that repacks an 8-bit operand K-contiguous before the GEMM (pack.py)."""

    operand: int  # 0: A, 1: B
    pipeline: Pipeline
    push_constants: bytes
    groups: tuple[int, int, int]
    nbytes: int


def _pack_step(rt: Runtime, pack: PackChoice, operand: ComponentType) -> PackStep:
    itemsize = operand.bits // 8
    src, dst = pack.source, pack.packed
    if pack.quant is not None:  # a quantized B dequantized into the float B
        dk = dequant_kernel(pack.quant, operand)
        return PackStep(pack.operand, rt.pipelines.get(dk),
                        dk.push_constants(pack.lines, pack.other, dst.ld),
                        dk.workgroups(pack.lines, pack.other), pack.packed_elems * itemsize)
    pk = pack_kernel(pack.wide)
    return PackStep(pack.operand, rt.pipelines.get(pk),
                    pk.push_constants(pack.lines, pack.other, src.ld, src.batch_stride,
                                      dst.ld, dst.batch_stride),
                    pk.workgroups(pack.lines, pack.other,
                                  pack.packed_elems // (pack.other * dst.ld)),
                    pack.packed_elems * itemsize)


def split_bindings(rt: Runtime, workspace: Buffer) -> dict[int, Buffer]:
    """A split-K's own bindings: its workspace for the partials, the device's counters."""
    return {abi.BINDING_PARTIALS: workspace, abi.BINDING_COUNTERS: rt.split_counters()}


@dataclass(frozen=True)
class Plan:
    """Everything about a call that depends only on shapes, strides, types and scalars:
    computed once and reused (a small matmul's Python cost is mostly this)."""

    choice: KernelChoice
    pipeline: Pipeline
    staged: tuple[Staged, Staged, Staged | None]
    shape: tuple[int, int, int]
    result_dtype: np.dtype
    d_bytes: int
    push_constants: bytes
    groups: tuple[int, int, int]
    packs: tuple[PackStep, ...] = ()
    workspace_bytes: int = 0  # a split-K's float32 partials (choice.split_k > 1)
    # Names the plan in recording keys (Executor.submit_keyed): unique in the process,
    # where id() could be reused by a later plan.
    serial: int = field(default_factory=lambda: next(_plan_serials), compare=False,
                        repr=False)

    @property
    def traits(self) -> GemmTraits:
        return self.choice.traits

    @property
    def margins(self) -> tuple[int, int]:
        return self.choice.margins

    @functools.cached_property
    def operand_margins(self) -> tuple[int, int]:
        """The margins a and b's own buffers must hold past their data: none for an
        operand the plan repacks (its device copy, which the plan allocates, has it)."""
        packed = {step.operand for step in self.packs}
        ma, mb = self.margins
        return (0 if 0 in packed else ma, 0 if 1 in packed else mb)

    @property
    def io_bytes(self) -> int:
        """Bytes that cross between host and device: A, B and C in, D out."""
        return sum(s.nbytes for s in self.staged if s is not None) + self.d_bytes


PLAN_CACHE = 256
_plans: Lru[Plan] = Lru(PLAN_CACHE)
_plan_serials: Iterator[int] = itertools.count(1)

# Each shape-specialized kernel is a pipeline kept for the life of the process, so a sweep
# over many large shapes would grow that set without bound: only this many kernel and
# shape combinations are specialized per process (unless Options.specialize is
# 'always'); later ones run the shared kernel.
MAX_SPECIALIZED = 64
_specialized: set[GemmTraits] = set()
_specialized_lock = threading.Lock()


def _admit(traits: GemmTraits, options: Options) -> GemmTraits:
    """The specialization budget: the policy asked for a specialized kernel; past
    MAX_SPECIALIZED of them in this process, the shared one runs instead."""
    if not isinstance(traits, KhrTraits) or not traits.specialized or \
            options.specialize == "always":
        return traits
    with _specialized_lock:
        if traits in _specialized or len(_specialized) < MAX_SPECIALIZED:
            _specialized.add(traits)
            return traits
    return replace(traits, specialized=())


def problem_of(pair: TypePair, a: Staged, b: Staged, c: Staged | None, M: int, N: int,
               K: int, batch: int, alpha: float | int, beta: float | int,
               ops: EpilogueOps | None = None) -> Problem:
    """The policy's view of a staged call."""
    return Problem(pair, M, N, K, OperandLayout(a.layout, a.ld, a.batch_stride),
                   OperandLayout(b.layout, b.ld, b.batch_stride), batch,
                   has_c=c is not None, c_batch_stride=c.batch_stride if c else 0,
                   alpha=alpha, beta=beta, ops=ops, b_quant=b.quant)


def plan_of(rt: Runtime, pair: TypePair, sa: Staged, sb: Staged, sc: Staged | None,
            shape: tuple[int, int, int, int], alpha: float | int, beta: float | int,
            traits: GemmTraits | None, options: Options, margins_ok: bool = True,
            ops: EpilogueOps | None = None) -> Plan:
    """The cached plan of a call: shape is (batch, M, N, K); margins_ok False when the
    operands' buffers have no room past their data (device arrays): no exact variant;
    ops: the fused epilogue."""
    key = (id(rt), pair, sa, sb, sc, shape, alpha, beta, traits, options, margins_ok, ops)
    plan = _plans.get(key)
    if plan is None:
        plan = _make_plan(rt, pair, sa, sb, sc, shape, alpha, beta, traits, options,
                          margins_ok, ops)
        _plans.put(key, plan)
    return plan


def _make_plan(rt: Runtime, pair: TypePair, sa: Staged, sb: Staged, sc: Staged | None,
               shape: tuple[int, int, int, int], alpha: float | int, beta: float | int,
               traits: GemmTraits | None, options: Options, margins_ok: bool,
               ops: EpilogueOps | None) -> Plan:
    batch, M, N, K = shape
    info = rt.device.info
    problem = problem_of(pair, sa, sb, sc, M, N, K, batch, alpha, beta, ops)
    choice = choose(info, problem, options, tuning.choices(info) if options.tuning else {},
                    traits)
    if not margins_ok and isinstance(choice.traits, KhrTraits) and choice.traits.exact:
        choice = choose(info, problem, options, {}, bounds_checked(choice.traits),
                        split_k=choice.split_k)
    choice = replace(choice, traits=_admit(choice.traits, options))
    result_dtype = numpy_dtype(pair.stored)
    d_bytes = batch * M * N * result_dtype.itemsize
    steps = tuple(_pack_step(rt, p, pair.operand) for p in choice.packs)
    workspace = abi.split_workspace_bytes(choice.traits, M, N) \
        if isinstance(choice.traits, KhrTraits) and choice.split_k > 1 else 0
    check_fits(rt, [sa.nbytes, sb.nbytes, sc.nbytes if sc else 0, d_bytes,
                    d_bytes if ops is not None and ops.residual else 0,
                    *(st.nbytes for st in steps), workspace])
    kernel = codegen.build_gemm(choice.traits)
    # A split-K's grid has a z of its S slices (batch is 1 then).
    gemm_batch = choice.split_k if workspace else batch
    return Plan(choice, rt.pipelines.get(kernel), (sa, sb, sc), (batch, M, N), result_dtype,
                d_bytes, kernel.push_constants(choice.params),
                kernel.workgroups(M, N, gemm_batch), steps, workspace)


def check_fits(rt: Runtime, sizes: list[int]) -> None:
    limits = rt.device.info.limits
    largest = max(sizes)
    if largest > limits.max_storage_buffer_range:
        raise OutOfDeviceMemoryError(
            f"an operand needs {largest} bytes; the device's maxStorageBufferRange is "
            f"{limits.max_storage_buffer_range}")
    total = sum(sizes)
    if total > rt.pool.device_heap_bytes:
        raise OutOfDeviceMemoryError(
            f"the problem needs {total} bytes of device memory; the device's memory heap "
            f"holds {rt.pool.device_heap_bytes}")


def device_plan(rt: Runtime, pair: TypePair, a: DeviceOperand, b: DeviceOperand,
                c: DeviceOperand | None, shape: tuple[int, int, int, int],
                alpha: float | int, beta: float | int, options: Options,
                ops: EpilogueOps | None = None, traits: GemmTraits | None = None) -> Plan:
    """The plan of a product of operands already on the device: the policy's kernel (or
    `traits`), without the margins a and b have no room for."""
    plan = plan_of(rt, pair, a.staged, b.staged, c.staged if c else None, shape, alpha, beta,
                   traits, options, ops=ops)
    if not plan_fits(plan, a, b):
        plan = plan_of(rt, pair, a.staged, b.staged, c.staged if c else None, shape, alpha,
                       beta, traits, options, margins_ok=False, ops=ops)
    return plan


def gemm_dispatch(plan: Plan, a: tuple[Buffer, int], b: tuple[Buffer, int],
                  c: DeviceOperand | None, d: DeviceOperand,
                  bias: DeviceOperand | None = None,
                  residual: DeviceOperand | None = None) -> Dispatch:
    """The plan's GEMM dispatch on device buffers: a and b as (buffer, byte offset), as
    the kernel reads them (after any repack)."""
    bindings = {0: a[0], 1: b[0], 2: d.buffer}
    offsets = [(0, a[1]), (1, b[1]), (2, d.offset)]
    if c is not None:
        bindings[3] = c.buffer
        offsets.append((3, c.offset))
    for binding, op in ((abi.BINDING_BIAS, bias), (abi.BINDING_RESIDUAL, residual)):
        if op is not None:
            bindings[binding] = op.buffer
            offsets.append((binding, op.offset))
    return Dispatch(plan.pipeline, bindings, plan.push_constants, plan.groups,
                    tuple(o for o in offsets if o[1]))


def enqueue_gemm(rt: Runtime, pair: TypePair, a: DeviceOperand, b: DeviceOperand,
                 c: DeviceOperand | None, d: DeviceOperand, shape: tuple[int, int, int, int],
                 alpha: float | int, beta: float | int, options: Options,
                 uploads: Sequence[Copy] = (),
                 waits: Sequence[tuple[Stream, int]] = (), *,
                 bias: DeviceOperand | None = None, residual: DeviceOperand | None = None,
                 ops: EpilogueOps | None = None,
                 traits: GemmTraits | None = None) -> tuple[int, Plan]:
    """Queue d = alpha * a @ b (+ beta * c) on buffers already on the device (after the
    staging copies `uploads`, in the same submission, and other queues' work `waits`),
    without waiting; returns the stream's ticket and the plan that ran. With `ops`, the
    fused epilogue reads `bias` (N elements) and `residual` (laid out exactly like d).
    `traits`: this kernel rather than the policy's (as a sweep times them)."""
    plan = device_plan(rt, pair, a, b, c, shape, alpha, beta, options, ops, traits)
    return enqueue_plan(rt, plan, a, b, c, d, uploads, waits, bias=bias,
                        residual=residual), plan


def plan_fits(plan: Plan, a: DeviceOperand, b: DeviceOperand) -> bool:
    """Whether a and b's buffers hold the plan's read-past margins (a repacked or
    dequantized operand's margin is its device copy's, which the plan allocates)."""
    ma, mb = plan.operand_margins
    return a.buffer.size - a.offset >= a.staged.nbytes + ma and \
        b.buffer.size - b.offset >= b.staged.nbytes + mb


def enqueue_plan(rt: Runtime, plan: Plan, a: DeviceOperand, b: DeviceOperand,
                 c: DeviceOperand | None, d: DeviceOperand, uploads: Sequence[Copy] = (),
                 waits: Sequence[tuple[Stream, int]] = (), *,
                 bias: DeviceOperand | None = None,
                 residual: DeviceOperand | None = None,
                 downloads: Sequence[Copy] = ()) -> int:
    """Queue a plan made for these operands (device_plan; a caller that kept one skips
    its lookup), after the staging copies `uploads` and before the copies `downloads`, in
    one submission; returns the stream's ticket. A repeat on the same buffers submits the
    kept recording (Executor.submit_keyed): this is a chain's per-product cost."""
    temps = plan_temps(rt, plan)
    try:
        key = (plan.serial, a.buffer.addr, a.offset, b.buffer.addr, b.offset,
               d.buffer.addr, d.offset, *_operand_key(c), *_operand_key(bias),
               *_operand_key(residual), *(t.addr for t in temps), *copies_key(uploads),
               None, *copies_key(downloads))
        ticket = rt.executor.submit_keyed(
            key, lambda: (uploads, plan_dispatches(rt, plan, a, b, c, d, bias, residual, temps),
                          downloads), waits)
    finally:
        for buf in temps:
            rt.pool.recycle(buf)
    return ticket


def plan_serial_seconds(rt: Runtime, plan: Plan, a: DeviceOperand, b: DeviceOperand,
                        d: DeviceOperand, count: int, submits: int = 3) -> float | None:
    """GPU seconds per run of all the plan's dispatches on these operands (a quantized
    B's dequantizing pass and a split-K's too), `count` runs back to back in one
    submission (Executor.run_serial: as peers time short kernels), the median of
    `submits` submissions (Executor.serial_seconds); None without timestamps."""
    temps = plan_temps(rt, plan)
    try:
        return rt.executor.serial_seconds(
            plan_dispatches(rt, plan, a, b, None, d, None, None, temps), count, submits)
    finally:
        for buf in temps:
            rt.pool.recycle(buf)


def plan_temps(rt: Runtime, plan: Plan) -> list[Buffer]:
    """Device buffers one run of the plan writes, in plan_dispatches' order: each repack's
    or dequantization's copy (with the GEMM's margin), then a split-K's workspace. The
    caller gives them back (pool.recycle) once the run is queued."""
    kind = rt.pool.kinds()[0]
    temps = [rt.pool.acquire(kind, step.nbytes + plan.margins[step.operand])
             for step in plan.packs]
    if plan.workspace_bytes:
        temps.append(rt.pool.acquire(kind, plan.workspace_bytes))
    return temps


def _operand_key(op: DeviceOperand | None) -> tuple[int, int]:
    return (0, 0) if op is None else (op.buffer.addr, op.offset)


def plan_dispatches(rt: Runtime, plan: Plan, a: DeviceOperand, b: DeviceOperand,
                     c: DeviceOperand | None, d: DeviceOperand, bias: DeviceOperand | None,
                     residual: DeviceOperand | None, temps: list[Buffer]) -> list[Dispatch]:
    """The plan's dispatches, the one builder of them for every product (prepared,
    queued, pipelined, timed): repacks of 8-bit operands or a quantized B's dequantization
    (into temps, in order), then the GEMM (a split-K's workspace: the last of temps)."""
    dispatches: list[Dispatch] = []
    operands = [(a.buffer, a.offset), (b.buffer, b.offset)]
    for step, packed in zip(plan.packs, temps, strict=False):  # K-contiguous first
        src, off = operands[step.operand]
        dispatches.append(Dispatch(step.pipeline, {0: src, 1: packed}, step.push_constants,
                                   step.groups, ((0, off),) if off else ()))
        operands[step.operand] = (packed, 0)
    gemm = gemm_dispatch(plan, operands[0], operands[1], c, d, bias, residual)
    if plan.workspace_bytes:
        gemm = replace(gemm, buffers={**gemm.buffers, **split_bindings(rt, temps[-1])})
    dispatches.append(gemm)
    return dispatches
