"""Recording, submitting and timing GEMM dispatches on a device.

One Executor per logical device. A submission is: barrier (after all earlier work, while
some may still run) -> staging uploads and their barrier (where there are any) ->
timestamp -> dispatches -> timestamp -> barrier ->
downloads (small ones into host memory by a copy kernel: shader_copy_fits). `run`
submits and waits (the numpy path, timed); `submit` only queues and returns the
stream's ticket (device arrays). Both go through the device's Stream, so work
runs in call order whichever thread calls.

Recorded command buffers are kept in a small LRU keyed by everything they name (buffers,
pipeline, push constants, grid), so a repeated call of the same shape only submits: the
Python cost of recording through the binding is most of a small matmul's time.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from coopmat.codegen.copy import UNIT as COPY_UNIT
from coopmat.codegen.copy import CopyKernel
from coopmat.device.logical import Device
from coopmat.device.vkffi import vk
from coopmat.dispatch.memory import Buffer, Kind, MemoryPool
from coopmat.dispatch.pipelines import SHADER_STAGE_COMPUTE, Pipeline
from coopmat.dispatch.stream import Stream
from coopmat.dispatch.vkcall import call, check

STAGE_TRANSFER = 0x1000
STAGE_COMPUTE = 0x800
STAGE_HOST = 0x4000
STAGE_TOP = 0x1
STAGE_BOTTOM = 0x2000
ACCESS_SHADER_READ = 0x20
ACCESS_SHADER_WRITE = 0x40
ACCESS_TRANSFER_READ = 0x800
ACCESS_TRANSFER_WRITE = 0x1000
ACCESS_HOST_READ = 0x2000
ACCESS_ALL = (ACCESS_SHADER_READ | ACCESS_SHADER_WRITE | ACCESS_TRANSFER_READ
              | ACCESS_TRANSFER_WRITE)
QUERY_RESULT_64 = 0x1
QUERY_RESULT_WAIT = 0x2
# A cached recording may be submitted again while an earlier submission of it is pending.
COMMAND_BUFFER_SIMULTANEOUS_USE = 0x4
RECORDED_CACHE = 64
# Downloads up to this size are recorded as the copy kernel (shader_copy_fits).
SHADER_COPY_MAX_BYTES = 1 << 20
# A recording holds up to this many dispatches (repacks of A and B, the GEMM), each with
# one descriptor set of at most MAX_BINDINGS storage buffers; the pool is sized for a
# full cache of such recordings.
MAX_DISPATCHES = 4
# A, B, D, C, bias, residual, and a split-K's partials and counters (codegen.abi)
MAX_BINDINGS = 8
DESCRIPTOR_POOL_FLAGS_FREE = 0x1


@dataclass(frozen=True)
class Copy:
    src: Buffer
    dst: Buffer
    nbytes: int
    src_offset: int = 0
    dst_offset: int = 0


@dataclass(frozen=True)
class Dispatch:
    pipeline: Pipeline
    buffers: dict[int, Buffer]  # binding -> buffer
    push_constants: bytes
    groups: tuple[int, int, int]
    offsets: tuple[tuple[int, int], ...] = ()  # (binding, byte offset) where not 0


# (uploads, dispatches, downloads): one submission's work.
_Work = tuple[Sequence[Copy], Sequence[Dispatch], Sequence[Copy]]


@dataclass
class _Recorded:
    cmd: Any
    sets: list[Any]
    submit: Any  # a VkSubmitInfo naming cmd, ready for vkQueueSubmit
    what: str = "a GEMM"  # names the work in errors


def shader_copy_fits(c: Copy) -> bool:
    """Whether a download is recorded as the copy kernel (codegen.copy) instead of a copy
    command: device memory into host memory, at most SHADER_COPY_MAX_BYTES, on 16-byte
    boundaries, the whole units it writes within both buffers. On the H200 the kernel
    took about half the copy command's GPU time for a small result (lab/notebook/arrays.md)."""
    units = -(-c.nbytes // COPY_UNIT) * COPY_UNIT
    return (c.dst.kind is Kind.DOWNLOAD and c.src.kind is not Kind.DOWNLOAD
            and 0 < c.nbytes <= SHADER_COPY_MAX_BYTES
            and not (c.src_offset | c.dst_offset) % COPY_UNIT
            and c.src_offset + units <= c.src.size and c.dst_offset + units <= c.dst.size)


class Executor:
    def __init__(self, device: Device, pool: MemoryPool, stream: Stream,
                 copy_pipeline: Callable[[], Pipeline] | None = None):
        """copy_pipeline: the copy kernel's pipeline, made on first use; without one
        every download is a copy command."""
        v = vk()
        self.device = device
        self.pool = pool
        self.stream = stream
        self._copy_pipeline = copy_pipeline
        # Re-entrant: a deferred free (run by a wait under this lock) takes it again.
        self.lock = threading.RLock()
        dev = device.handle
        self._cmd_pool = call(v.vkCreateCommandPool, dev, v.VkCommandPoolCreateInfo(
            queueFamilyIndex=device.queue_family_index), None)
        self._desc_pool = call(v.vkCreateDescriptorPool, dev, v.VkDescriptorPoolCreateInfo(
            flags=DESCRIPTOR_POOL_FLAGS_FREE, maxSets=MAX_DISPATCHES * RECORDED_CACHE,
            poolSizeCount=1, pPoolSizes=[v.VkDescriptorPoolSize(
                type=v.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                descriptorCount=MAX_BINDINGS * MAX_DISPATCHES * RECORDED_CACHE)]),
            None)
        self.timestamps = device.timestamp_valid_bits > 0
        self._queries = call(v.vkCreateQueryPool, dev, v.VkQueryPoolCreateInfo(
            queryType=v.VK_QUERY_TYPE_TIMESTAMP, queryCount=2), None) if self.timestamps else None
        self._ts = v.ffi.new("uint64_t[2]")
        self._period_ns = device.info.limits.timestamp_period
        self._ts_mask = (1 << device.timestamp_valid_bits) - 1 if self.timestamps else 0
        self._max_groups = device.info.limits.max_compute_work_group_count
        self._max_range = device.info.limits.max_storage_buffer_range
        self._recorded: OrderedDict[tuple[Any, ...], _Recorded] = OrderedDict()
        self._generation = pool.generation
        # A CPU driver (lavapipe) compiles a kernel at its first dispatch, between the
        # timestamps: run() runs work with a new pipeline once untimed first, so that the
        # time it reports is the kernel's. The pipelines run so far (their addr):
        self._compiles_late = device.info.device_type == "CPU"
        self._warm: set[int] = set()

    @staticmethod
    def _key(uploads: Sequence[Copy], dispatches: Sequence[Dispatch],
             downloads: Sequence[Copy], timed: bool, ordered: bool) -> tuple[Any, ...]:
        return (
            copies_key(uploads),
            tuple((d.pipeline.addr, tuple((b, buf.addr) for b, buf in d.buffers.items()),
                   d.offsets, d.push_constants, d.groups) for d in dispatches),
            copies_key(downloads),
            timed,
            ordered,
        )

    def _recording(self, build: Callable[[], _Work], timed: bool,
                   name: tuple[Any, ...] | None = None) -> _Recorded:
        """The cached recording of the work `build` gives as (uploads, dispatches,
        downloads), recorded now if new. Caller holds lock. It waits for earlier
        submissions only while some may still run: on an idle queue the leading barrier
        would only cost time. name: a key the caller keeps for exactly this work (every
        buffer, offset and kernel it uses), spared assembling one from the work; the work
        is then built only when nothing is kept under it."""
        ordered = self.stream.busy()
        if self._generation != self.pool.generation:
            self._forget(len(self._recorded))  # a named buffer may be gone
            self._generation = self.pool.generation
        key = (name, timed, ordered) if name is not None else \
            self._key(*build(), timed, ordered)
        rec = self._recorded.get(key)
        if rec is None:
            rec = self._new_recording(key, *build(), timed, ordered)
        else:
            self._recorded.move_to_end(key)
        return rec

    def _new_recording(self, key: tuple[Any, ...], uploads: Sequence[Copy],
                       dispatches: Sequence[Dispatch], downloads: Sequence[Copy],
                       timed: bool, ordered: bool) -> _Recorded:
        """Record the work and keep it under `key`, forgetting the least recently used
        recording past the cache's size. Caller holds lock."""
        if len(dispatches) + len(downloads) > MAX_DISPATCHES or any(
                len(d.buffers) > MAX_BINDINGS for d in dispatches):
            raise ValueError(f"at most {MAX_DISPATCHES} dispatches of at most "
                             f"{MAX_BINDINGS} buffers per run")
        self._forget(len(self._recorded) - RECORDED_CACHE + 1)
        rec = self._record(uploads, dispatches, downloads, timed=timed, ordered=ordered)
        rec.what = _what(dispatches, uploads, downloads)
        self._recorded[key] = rec
        return rec

    def run(self, uploads: Sequence[Copy], dispatches: Sequence[Dispatch],
            downloads: Sequence[Copy], name: tuple[Any, ...] | None = None,
            then: Callable[[], int] | None = None) -> float | None:
        """Run one submission and wait for it; returns the dispatches' GPU time in seconds
        (None where the queue has no timestamps). name: as _recording's. then: submits
        more work on this stream right behind it (a copy of the result into the caller's
        memory, say) and returns its ticket (0: none), waited for with it."""
        with self.lock:
            cold = self._compiles_late and any(d.pipeline.addr not in self._warm
                                               for d in dispatches)
            with self.stream.lock:  # no other submission between busy() and this one
                rec = self._recording(lambda: (uploads, dispatches, downloads), True, name)
                ticket = self.stream.submit(rec.cmd, rec.what)
            if cold:  # that run compiled the kernel: the same work again, timed
                self.stream.wait(ticket)
                self._warm.update(d.pipeline.addr for d in dispatches)
                with self.stream.lock:
                    ticket = self.stream.submit(rec.cmd, rec.what)
            if then is not None:
                ticket = max(ticket, then())
            # Timed runs share one query pair, so they hold the lock until read.
            self.stream.wait(ticket)
            return self._gpu_seconds()

    def submit(self, uploads: Sequence[Copy], dispatches: Sequence[Dispatch],
               downloads: Sequence[Copy] = (), waits: Sequence[tuple[Stream, int]] = ()
               ) -> int:
        """Queue the work without waiting; returns the stream's ticket for it. `waits`:
        other queues' work (stream, ticket) it must wait for."""
        with self.lock, self.stream.lock:
            rec = self._recording(lambda: (uploads, dispatches, downloads), False)
            return self.stream.submit(rec.cmd, rec.what, waits)

    def submit_keyed(self, key: tuple[Any, ...], build: Callable[[], _Work],
                     waits: Sequence[tuple[Stream, int]] = ()) -> int:
        """As submit, for a caller that names its work by a cheap `key` (every buffer,
        offset and kernel the work uses, nothing else) and builds the (uploads,
        dispatches, downloads) only when no recording of that key is kept: a repeated
        product pays a dict lookup instead of assembling its dispatches."""
        with self.lock, self.stream.lock:
            rec = self._recording(build, False, key)
            return self.stream.submit(rec.cmd, rec.what, waits)

    def run_independent(self, dispatches: Sequence[Dispatch],
                        submits: int) -> list[tuple[float | None, float]]:
        """Submit `dispatches` `submits` times, recorded once with no barrier between them,
        so the device may overlap them as vk_cooperative_matrix_perf's timing loop lets it.
        The caller guarantees they are independent: none writes a buffer another one
        reads or writes. Returns per submission (GPU seconds from the timestamps or None,
        wall seconds of submit and wait)."""
        return self._run_recorded(dispatches, submits, barriers=False)

    def run_serial(self, dispatches: Sequence[Dispatch],
                   submits: int) -> list[tuple[float | None, float]]:
        """As run_independent, but with a compute barrier between the dispatches: they run
        one after another, as kernels on one CUDA stream do (how peers time a short kernel:
        many launches back to back, no host round trip between them)."""
        return self._run_recorded(dispatches, submits, barriers=True)

    def serial_seconds(self, dispatches: Sequence[Dispatch], count: int,
                       submits: int) -> float | None:
        """GPU seconds per run of `dispatches` run `count` times back to back in one
        submission (run_serial), the median of `submits` submissions; None without
        timestamps."""
        runs = self.run_serial(list(dispatches) * count, submits)
        times = sorted(t for t, _ in runs if t is not None)
        return times[len(times) // 2] / count if times else None

    def _run_recorded(self, dispatches: Sequence[Dispatch], submits: int,
                      barriers: bool) -> list[tuple[float | None, float]]:
        v = vk()
        dev = self.device.handle
        if any(len(d.buffers) > MAX_BINDINGS for d in dispatches):
            raise ValueError(f"at most {MAX_BINDINGS} buffers per dispatch")
        pool = call(v.vkCreateDescriptorPool, dev, v.VkDescriptorPoolCreateInfo(
            maxSets=len(dispatches), poolSizeCount=1, pPoolSizes=[v.VkDescriptorPoolSize(
                type=v.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                descriptorCount=MAX_BINDINGS * len(dispatches))]), None)
        out: list[tuple[float | None, float]] = []
        with self.lock:
            rec = None
            try:
                rec = self._record([], dispatches, [], pool, barriers=barriers)
                for _ in range(submits):
                    t0 = time.perf_counter()
                    self.stream.wait(self.stream.submit(rec.cmd, "timed GEMMs"))
                    wall = time.perf_counter() - t0
                    out.append((self._gpu_seconds(), wall))
            finally:
                self.stream.wait()
                if rec is not None:
                    v.vkFreeCommandBuffers(dev, self._cmd_pool, 1, [rec.cmd])
                v.vkDestroyDescriptorPool(dev, pool, None)  # frees the sets with it
        return out

    def _gpu_seconds(self) -> float | None:
        """The last submission's time between its two timestamps."""
        if self._queries is None:
            return None
        check("vkGetQueryPoolResults", vk().lib.vkGetQueryPoolResults(
            self.device.handle, self._queries, 0, 2, 16, self._ts, 8,
            QUERY_RESULT_64 | QUERY_RESULT_WAIT))
        ticks = (self._ts[1] - self._ts[0]) & self._ts_mask
        return ticks * self._period_ns * 1e-9

    def _record(self, uploads: Sequence[Copy], dispatches: Sequence[Dispatch],
                downloads: Sequence[Copy], desc_pool: Any = None,
                barriers: bool = True, timed: bool = True, ordered: bool = True) -> _Recorded:
        # Structs are filled through cffi directly: the binding's keyword constructors
        # made recording most of a repeated call's host time where its key changes.
        v = vk()
        ffi, lib = v.ffi, v.lib
        dev = self.device.handle
        copies, downloads = self._split_downloads(downloads)
        cmd_out = ffi.new("VkCommandBuffer[1]")
        check("vkAllocateCommandBuffers", lib.vkAllocateCommandBuffers(dev, ffi.new(
            "VkCommandBufferAllocateInfo*", {
                "sType": v.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                "commandPool": self._cmd_pool, "level": v.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                "commandBufferCount": 1}), cmd_out))
        cmd = cmd_out[0]
        sets = [self._descriptor_set(d, desc_pool or self._desc_pool)
                for d in [*dispatches, *copies]]
        check("vkBeginCommandBuffer", lib.vkBeginCommandBuffer(cmd, ffi.new(
            "VkCommandBufferBeginInfo*", {
                "sType": v.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                "flags": COMMAND_BUFFER_SIMULTANEOUS_USE})))
        # After everything submitted earlier (the stream's ordering): a buffer an earlier
        # submission reads or writes may be this one's destination.
        if ordered:
            barrier_all(cmd)
        # Host writes to coherent mapped memory are visible to the device at submit (the
        # spec's host write ordering guarantee), so only staging copies need this barrier
        # before the shaders read.
        for c in uploads:
            record_copy(cmd, c)
        if uploads:
            memory_barrier(cmd, STAGE_TRANSFER, STAGE_COMPUTE, ACCESS_TRANSFER_WRITE,
                           ACCESS_SHADER_READ)
        timed = timed and self._queries is not None
        if timed:
            lib.vkCmdResetQueryPool(cmd, self._queries, 0, 2)
            lib.vkCmdWriteTimestamp(cmd, STAGE_TOP, self._queries, 0)
        for i, (d, s) in enumerate(zip(dispatches, sets, strict=False)):
            if i and barriers:
                memory_barrier(cmd, STAGE_COMPUTE, STAGE_COMPUTE, ACCESS_SHADER_WRITE,
                               ACCESS_SHADER_READ | ACCESS_SHADER_WRITE)
            self._dispatch(cmd, d, s)
        if timed:
            lib.vkCmdWriteTimestamp(cmd, STAGE_BOTTOM, self._queries, 1)
        if copies:
            memory_barrier(cmd, STAGE_COMPUTE, STAGE_COMPUTE, ACCESS_SHADER_WRITE,
                           ACCESS_SHADER_READ)
            for d, s in zip(copies, sets[len(dispatches):], strict=True):
                self._dispatch(cmd, d, s)
        memory_barrier(cmd, STAGE_COMPUTE, STAGE_TRANSFER | STAGE_HOST, ACCESS_SHADER_WRITE,
                       ACCESS_TRANSFER_READ | ACCESS_HOST_READ)
        for c in downloads:
            record_copy(cmd, c)
        if downloads:
            memory_barrier(cmd, STAGE_TRANSFER, STAGE_HOST, ACCESS_TRANSFER_WRITE,
                           ACCESS_HOST_READ)
        check("vkEndCommandBuffer", lib.vkEndCommandBuffer(cmd))
        cmds = ffi.new("VkCommandBuffer[1]", [cmd])
        submit = ffi.new("VkSubmitInfo *", {
            "sType": v.VK_STRUCTURE_TYPE_SUBMIT_INFO, "commandBufferCount": 1,
            "pCommandBuffers": cmds})
        rec = _Recorded(cmd, sets, submit)
        rec.keep = cmds  # type: ignore[attr-defined]  # the submit info points into it
        return rec

    def _descriptor_set(self, d: Dispatch, pool: Any) -> Any:
        """A descriptor set from `pool` binding d's buffers (each from its offset)."""
        v = vk()
        ffi, lib = v.ffi, v.lib
        dev = self.device.handle
        out = ffi.new("VkDescriptorSet[1]")
        check("vkAllocateDescriptorSets", lib.vkAllocateDescriptorSets(dev, ffi.new(
            "VkDescriptorSetAllocateInfo*", {
                "sType": v.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                "descriptorPool": pool, "descriptorSetCount": 1,
                "pSetLayouts": ffi.new("VkDescriptorSetLayout[1]", [d.pipeline.set_layout])}),
            out))
        offsets = dict(d.offsets)
        n = len(d.buffers)
        infos = ffi.new("VkDescriptorBufferInfo[]", n)
        writes = ffi.new("VkWriteDescriptorSet[]", n)
        for i, (b, buf) in enumerate(d.buffers.items()):
            offset = offsets.get(b, 0)
            info = infos[i]
            info.buffer, info.offset, info.range = buf.handle, offset, \
                self.bound_range(buf, offset)
            w = writes[i]
            w.sType = v.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET
            w.dstSet, w.dstBinding, w.descriptorCount = out[0], b, 1
            w.descriptorType = v.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
            w.pBufferInfo = infos + i
        lib.vkUpdateDescriptorSets(dev, n, writes, 0, ffi.NULL)
        return out[0]

    def _split_downloads(self, downloads: Sequence[Copy]
                         ) -> tuple[list[Dispatch], Sequence[Copy]]:
        """(the copy kernel's dispatches for the downloads it takes, the other downloads,
        recorded as copy commands)."""
        if self._copy_pipeline is None:
            return [], downloads
        fits = [shader_copy_fits(c) for c in downloads]
        if not any(fits):
            return [], downloads
        pipeline = self._copy_pipeline()
        return ([Dispatch(pipeline, {0: c.src, 1: c.dst},
                          CopyKernel.push_constants(c.nbytes, c.src_offset, c.dst_offset),
                          CopyKernel.workgroups(c.nbytes))
                 for c, fit in zip(downloads, fits, strict=True) if fit],
                [c for c, fit in zip(downloads, fits, strict=True) if not fit])

    def bound_range(self, buf: Buffer, offset: int = 0) -> int:
        """Bytes of `buf` a descriptor binds from `offset`. A pooled buffer is rounded up
        to its size class, which can pass maxStorageBufferRange (4 GiB - 1 on NVIDIA)
        although the data in it does not: dispatch checks that every operand, with the
        exact variant's look-ahead margin, fits the limit, so binding at most the limit
        covers all of it."""
        return min(buf.size - offset, self._max_range)

    def _forget(self, count: int) -> None:
        """Free the `count` least recently used recordings, once no pending submission
        can still be running them."""
        recs = [self._recorded.popitem(last=False)[1] for _ in range(max(0, count))]
        if recs:
            self.stream.defer(lambda: self._free(recs))

    def _free(self, recs: list[_Recorded]) -> None:
        v = vk()
        dev = self.device.handle
        with self.lock:
            for rec in recs:
                v.lib.vkFreeCommandBuffers(dev, self._cmd_pool, 1,
                                           v.ffi.new("VkCommandBuffer[1]", [rec.cmd]))
                if rec.sets:  # a recording of copies alone has none (and a count of 0 is invalid)
                    v.lib.vkFreeDescriptorSets(dev, self._desc_pool, len(rec.sets), v.ffi.new(
                        "VkDescriptorSet[]", rec.sets))

    def _dispatch(self, cmd: Any, d: Dispatch, s: Any) -> None:
        v = vk()
        p = d.pipeline
        v.lib.vkCmdBindPipeline(cmd, v.VK_PIPELINE_BIND_POINT_COMPUTE, p.handle)
        v.lib.vkCmdBindDescriptorSets(cmd, v.VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0, 1,
                                      v.ffi.new("VkDescriptorSet[1]", [s]), 0, v.ffi.NULL)
        pc = v.ffi.from_buffer(d.push_constants)
        v.lib.vkCmdPushConstants(cmd, p.layout, SHADER_STAGE_COMPUTE, 0, len(d.push_constants), pc)
        gx, gy, gz = d.groups
        mx, my, mz = self._max_groups
        if gx > mx or gy > my:
            raise ValueError(f"problem needs {gx}x{gy} workgroups, the device allows {mx}x{my}")
        # Large batches: split z, relying on the DISPATCH_BASE pipeline flag so the
        # shader's WorkgroupId still counts from the true batch index.
        for z0 in range(0, gz, mz):
            v.lib.vkCmdDispatchBase(cmd, 0, 0, z0, gx, gy, min(mz, gz - z0))

    def destroy(self) -> None:
        v = vk()
        dev = self.device.handle
        with self.lock:
            self._forget(len(self._recorded))
        self.stream.wait()
        if self._queries is not None:
            v.vkDestroyQueryPool(dev, self._queries, None)
        v.vkDestroyDescriptorPool(dev, self._desc_pool, None)
        v.vkDestroyCommandPool(dev, self._cmd_pool, None)


def copies_key(copies: Sequence[Copy]) -> tuple[int, ...]:
    """The copies as a recording key names them (Executor.submit_keyed's callers too)."""
    return tuple(x for c in copies for x in (c.src.addr, c.dst.addr, c.nbytes, c.src_offset,
                                              c.dst_offset))


_barriers: dict[tuple[int, int], Any] = {}  # VkMemoryBarrier structs by access masks


def memory_barrier(cmd: Any, src_stage: int, dst_stage: int, src: int, dst: int) -> None:
    """Record a global memory barrier: `src` accesses of `src_stage` before `dst`
    accesses of `dst_stage`."""
    v = vk()
    barrier = _barriers.get((src, dst))
    if barrier is None:
        barrier = _barriers[src, dst] = v.ffi.new("VkMemoryBarrier*", {
            "sType": v.VK_STRUCTURE_TYPE_MEMORY_BARRIER, "srcAccessMask": src,
            "dstAccessMask": dst})
    v.lib.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 1, barrier, 0, v.ffi.NULL, 0,
                               v.ffi.NULL)


def barrier_all(cmd: Any) -> None:
    """Order everything submitted before on the queue (shaders and copies) before what
    this command buffer does next."""
    memory_barrier(cmd, STAGE_COMPUTE | STAGE_TRANSFER, STAGE_COMPUTE | STAGE_TRANSFER,
                   ACCESS_SHADER_WRITE | ACCESS_TRANSFER_WRITE, ACCESS_ALL)


def record_copy(cmd: Any, c: Copy) -> None:
    v = vk()
    v.lib.vkCmdCopyBuffer(cmd, c.src.handle, c.dst.handle, 1, v.ffi.new("VkBufferCopy*", {
        "srcOffset": c.src_offset, "dstOffset": c.dst_offset, "size": c.nbytes}))


def _what(dispatches: Sequence[Dispatch], uploads: Sequence[Copy],
          downloads: Sequence[Copy]) -> str:
    """Names submitted work in errors."""
    if dispatches:
        kernel = getattr(dispatches[-1].pipeline.kernel, "traits", None)
        return f"the kernel {kernel.describe()}" if kernel is not None else "a kernel"
    return "a copy to the device" if uploads else "a copy from the device"
