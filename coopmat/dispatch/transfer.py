"""numpy <-> device memory at PCIe speed.

One thread copying into pinned memory reaches about a sixth of what PCIe carries, so a
large transfer is cut into chunks spread over `lanes`, one per worker thread. Each lane
owns two pinned staging buffers and two command buffers and works double-buffered: while
the device copies one chunk (upload) or the host drains one (download), the lane fills or
waits for the other. numpy releases the GIL while it copies, so lanes run in parallel.

Second way in and out, for C-contiguous arrays on devices with
VK_EXT_external_memory_host: the array's own pages are imported as device-visible memory
(the driver pins them) and the device copies straight from or into them, with no host
copy at all. Pinning runs at about a fifth of PCIe's rate on the H200, so a transfer pays
for it only once: in mode 'auto' (the default) a large contiguous array that owns its
memory goes through the lanes its first two times, its pages are imported in the
background after the second, and while the array lives every later transfer from or
into it is one device copy (_HostPin). Mode 'staging' uses the lanes only; 'import'
imports every array for every transfer (lab/notebook/arrays.md has the measurements). Both fall
back to the lanes where the device lacks the extension or the array is not contiguous.

On unified-memory devices (lavapipe, integrated GPUs) device buffers are host-visible and
the lanes copy straight into them.

Ordering: every chunk's command buffer starts with a full barrier, so uploads run after
all earlier work on the stream (a buffer handed back by an earlier call may be the
destination) and downloads read what earlier work wrote.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Any

import numpy as np

from coopmat.common.errors import OutOfDeviceMemoryError, VulkanError
from coopmat.device.vkffi import vk
from coopmat.dispatch.executor import (
    ACCESS_ALL,
    ACCESS_SHADER_WRITE,
    ACCESS_TRANSFER_READ,
    ACCESS_TRANSFER_WRITE,
    STAGE_COMPUTE,
    STAGE_TRANSFER,
)
from coopmat.dispatch.memory import (
    BUFFER_USAGE_STORAGE,
    BUFFER_USAGE_TRANSFER_DST,
    BUFFER_USAGE_TRANSFER_SRC,
    Buffer,
    Kind,
    MemoryPool,
    sharing,
    size_class,
)
from coopmat.dispatch.stream import Stream
from coopmat.dispatch.vkcall import call, check

CHUNK_BYTES = 4 << 20
# Each lane's two staging buffers: fixed when the lane is made, and lanes live as long as
# the device, so chunks through staging are cut at most this big (_staged_chunk) even
# where CHUNK_BYTES has changed since (tests lower it): a copy never passes its buffer.
STAGING_BYTES = 4 << 20
# Below this a transfer is one chunk on the calling thread: a thread hand-off costs more.
PARALLEL_MIN_BYTES = 2 * CHUNK_BYTES
MAX_LANES = 16
COPY_REGIONS = 1 << 16  # regions of one copy command (Transfers.copy_regions)
COPY_LANES = 4  # lanes whose command buffers Transfers.copy_regions takes in turn
IMPORT_CHUNK_BYTES = 32 << 20
HOST_ALLOCATION = 0x80  # VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT
COMMAND_POOL_RESET = 0x2
ONE_TIME_SUBMIT = 0x1
MODES = ("auto", "staging", "import")
MODE_ENV = "COOPMAT_TRANSFER"
# Downloads of at least this many bytes into a new array (Array.numpy()) land in host
# memory coopmat owns and keeps imported (_PinnedBlock): one DMA, no host copy.
PINNED_MIN_BYTES = 8 << 20


def _pinned_keep_bytes() -> int:
    """Free pinned blocks kept for reuse per device, in bytes: a sixteenth of the host's
    memory, at least 1 GiB and at most 16 GiB. Results held by their owner (a Dask
    worker's persisted chunks) come back together once let go, and a later product then
    lands in pages already faulted and imported rather than in fresh ones."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        physical = 0
    return min(16 << 30, max(1 << 30, physical // 16))


PINNED_KEEP_BYTES = _pinned_keep_bytes()
# Small results that come back with their product (Transfers.small_download): kept
# pinned blocks per size class, at most this many (more lent at once: the pool's
# host-visible buffers and a host copy serve the rest).
SMALL_BLOCKS = 4
# The user's arrays kept imported (mode 'auto') per device, in bytes: as much as the free
# pinned blocks, so that a Dask worker's persisted chunks, used again by each compute,
# stay imported where the host has the memory.
HOST_PIN_KEEP_BYTES = PINNED_KEEP_BYTES
# Arrays transferred once, noted (a weakref each) so that a second transfer imports them.
HOST_PIN_NOTED = 64

_workers: dict[str, ThreadPoolExecutor] = {}
_workers_lock = threading.Lock()


def lane_count() -> int:
    return max(1, min(MAX_LANES, os.cpu_count() or 1))


def _pool(direction: str = "up") -> ThreadPoolExecutor:
    """The worker threads of one direction: uploads and downloads of a pipelined GEMM run
    at the same time, so neither waits for the other's threads."""
    with _workers_lock:
        pool = _workers.get(direction)
        if pool is None:
            pool = _workers[direction] = ThreadPoolExecutor(
                lane_count(), thread_name_prefix=f"coopmat-{direction}")
        return pool


class _Lane:
    """Two staging buffers and two command buffers, used by one thread at a time, on one
    stream (the compute queue's or a copy queue's)."""

    def __init__(self, transfers: Transfers, kind: Kind, stream: Stream):
        v = vk()
        self.t = transfers
        self.stream = stream
        self.waits: list[tuple[Stream, int]] = []  # other streams' work the next copies wait for
        self.lock = threading.Lock()
        dev = transfers.device.handle
        self.cmd_pool = call(v.vkCreateCommandPool, dev, v.VkCommandPoolCreateInfo(
            flags=COMMAND_POOL_RESET, queueFamilyIndex=stream.family_index), None)
        self.cmds = call(v.vkAllocateCommandBuffers, dev, v.VkCommandBufferAllocateInfo(
            commandPool=self.cmd_pool, level=v.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
            commandBufferCount=2))
        self.staging = [transfers.pool.acquire(kind, STAGING_BYTES) for _ in range(2)]
        self.tickets = [0, 0]
        # Poll before blocking only when alone: lanes polling together fight for the GIL.
        self.spin = True
        ffi = v.ffi
        self._begin = ffi.new("VkCommandBufferBeginInfo *", {
            "sType": v.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, "flags": ONE_TIME_SUBMIT})
        self._region = ffi.new("VkBufferCopy *")
        # A copy queue knows no compute stage: its barrier orders copies only.
        self._stages = STAGE_COMPUTE | STAGE_TRANSFER if stream.compute else STAGE_TRANSFER
        self._barrier = ffi.new("VkMemoryBarrier *", {
            "sType": v.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
            "srcAccessMask": ACCESS_SHADER_WRITE | ACCESS_TRANSFER_WRITE if stream.compute
            else ACCESS_TRANSFER_WRITE,
            "dstAccessMask": ACCESS_ALL if stream.compute
            else ACCESS_TRANSFER_READ | ACCESS_TRANSFER_WRITE})

    def slot(self, i: int) -> np.ndarray:
        """Staging buffer i's bytes, once the device is done with its last use."""
        if self.tickets[i]:
            self.stream.wait(self.tickets[i], spin=self.spin)
            self.tickets[i] = 0
        mapped = self.staging[i].mapped
        assert mapped is not None
        return mapped

    def copy(self, i: int, src: Any, src_offset: int, dst: Any, dst_offset: int,
             nbytes: int, what: str) -> int:
        """Record and submit one copy in command buffer i; returns its ticket."""
        r = self._region
        r.srcOffset, r.dstOffset, r.size = src_offset, dst_offset, nbytes
        return self.record(i, lambda cmd: vk().lib.vkCmdCopyBuffer(cmd, src, dst, 1, r), what)

    def record(self, i: int, command: Any, what: str) -> int:
        """Record barrier + command(cmd) in command buffer i (free: slot(i) was called)
        and submit it; returns its ticket."""
        lib = vk().lib
        cmd = self.cmds[i]
        check("vkBeginCommandBuffer", lib.vkBeginCommandBuffer(cmd, self._begin))
        lib.vkCmdPipelineBarrier(cmd, self._stages, self._stages, 0, 1, self._barrier,
                                 0, vk().ffi.NULL, 0, vk().ffi.NULL)
        command(cmd)
        check("vkEndCommandBuffer", lib.vkEndCommandBuffer(cmd))
        ticket = self.stream.submit(cmd, what, self.waits)
        self.tickets[i] = ticket
        return ticket

    def destroy(self) -> None:
        v = vk()
        for buf in self.staging:
            self.t.pool.release(buf)
        v.vkDestroyCommandPool(self.t.device.handle, self.cmd_pool, None)


class NewDownload:
    """A kept pinned block lent for one result (Transfers.new_download): `dst` at
    `offset` is where the device copies it; `array()` once that copy has completed,
    `abandon()` where it never will be used."""

    def __init__(self, dst: Buffer, offset: int, nbytes: int, block: _PinnedBlock,
                 returned: deque[_PinnedBlock]) -> None:
        self.dst, self.offset, self.nbytes = dst, offset, nbytes
        self._block, self._returned = block, returned

    def array(self) -> np.ndarray:
        return self._block.lend(self.nbytes, self._returned)

    def abandon(self) -> None:
        self._returned.append(self._block)

    def peek(self) -> np.ndarray:
        """The bytes in place, once the copy has completed, for a caller that reads them
        without taking the block (which stays this object's)."""
        return np.frombuffer(self._block.mm, np.uint8, self.nbytes)


class _Imported:
    """A host range imported as device memory (VK_EXT_external_memory_host), bound to a
    buffer; `offset` is where the array's first byte lies in it."""

    def __init__(self, t: Transfers, address: int, nbytes: int):
        v = vk()
        ffi = v.ffi
        dev = t.device.handle
        align = t.import_alignment
        base = address & ~(align - 1)
        end = -(-(address + nbytes) // align) * align
        self.offset = address - base
        self.size = end - base
        self.t = t
        ptr = ffi.cast("void *", base)
        props = ffi.new("VkMemoryHostPointerPropertiesEXT *", {
            "sType": v.VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT})
        check("vkGetMemoryHostPointerPropertiesEXT",
              t.host_pointer_properties(dev, HOST_ALLOCATION, ptr, props))
        external = v.VkExternalMemoryBufferCreateInfo(handleTypes=HOST_ALLOCATION)
        # Storage too: a small result comes back by the copy kernel (Executor).
        self.buffer = call(v.vkCreateBuffer, dev, v.VkBufferCreateInfo(
            pNext=external, size=self.size,
            usage=BUFFER_USAGE_STORAGE | BUFFER_USAGE_TRANSFER_SRC | BUFFER_USAGE_TRANSFER_DST,
            **sharing(t.device)), None)
        self.memory = None
        try:
            req = v.vkGetBufferMemoryRequirements(dev, self.buffer)
            bits = req.memoryTypeBits & props.memoryTypeBits
            if not bits:
                raise OutOfDeviceMemoryError("no memory type can import these host pages")
            index = (bits & -bits).bit_length() - 1
            imp = v.VkImportMemoryHostPointerInfoEXT(handleType=HOST_ALLOCATION,
                                                     pHostPointer=ptr)
            self.memory = call(v.vkAllocateMemory, dev, v.VkMemoryAllocateInfo(
                pNext=imp, allocationSize=self.size, memoryTypeIndex=index), None)
            call(v.vkBindBufferMemory, dev, self.buffer, self.memory, 0)
        except BaseException:
            self.free()
            raise
        # The import as a device copy's destination or source (recordings name it by
        # its handle's address).
        self.target = Buffer(Kind.DOWNLOAD, self.size, self.buffer, None, None,
                             int(ffi.cast("uintptr_t", self.buffer)))

    def free(self) -> None:
        v = vk()
        dev = self.t.device.handle
        v.vkDestroyBuffer(dev, self.buffer, None)
        if self.memory is not None:
            v.vkFreeMemory(dev, self.memory, None)
        # A kept recording may copy into this buffer (new_download): recordings are
        # valid within one of the pool's generations.
        self.t.pool.generation += 1


class _PinnedBlock:
    """Host memory coopmat owns (an anonymous mapping: page aligned, pages faulted by
    whoever first writes them), imported as device memory once (`imported`, set by a
    background import) and kept for the next download of a similar size: the device
    then copies straight into it, and the host copies nothing. A block is lent as a
    numpy array (`lend`) and comes back when that array (and every view of it) is gone;
    the mapping lives as long as the array does, so the array stays valid after the
    device is destroyed."""

    def __init__(self, size: int):
        self.size = size
        # Private, not mmap's default shared mapping: shared anonymous pages are shmem,
        # whose first touch measured 5 GB/s against numpy's 34 on the H200 host; huge
        # pages where the kernel gives them on request (as numpy asks for its arrays).
        self.mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            self.mm.madvise(mmap.MADV_HUGEPAGE)
        self.imported: _Imported | None = None
        self.importing = False  # an import is under way (never two of the same pages)
        self.refused = False  # the driver would not import it: the lanes serve it
        self._returned: deque[_PinnedBlock] | None = None
        self._lent: Any = None  # a weakref to the array lent last

    def lend(self, nbytes: int, returned: deque[_PinnedBlock]) -> np.ndarray:
        """A fresh uint8 array over the first nbytes. Its base is a memoryview, so views of
        it keep it (not a shared parent) alive: the block returns to `returned` when it
        is collected (a weakref's callback; deque.append is safe from any thread)."""
        raw = np.frombuffer(memoryview(self.mm)[:nbytes], np.uint8)
        self._returned = returned
        self._lent = weakref.ref(raw, self._give_back)
        return raw

    def _give_back(self, _ref: Any) -> None:
        assert self._returned is not None
        self._returned.append(self)


class _HostPin:
    """The pages of a user's array (the ndarray owning them), imported as device memory
    in the background after a second transfer from or into it went through the lanes
    (pinning an array used once would only compete with the lanes), and kept
    until that array is collected (a weakref.finalize on it) or evicted: the next transfer
    from or into the array is then one device copy, with no host copy. (The weakref also
    keeps the memory where it is: numpy refuses ndarray.resize on a referenced array.)"""

    def __init__(self, owner: np.ndarray):
        self.address = owner.ctypes.data
        self.nbytes = owner.nbytes
        self.imported: _Imported | None = None
        self.scheduled = False  # its import was started (at its second transfer)
        self.seen = 0  # Transfers._tick at its last transfer
        self.finalizer: Any = None  # weakref.finalize


def _owner(arr: np.ndarray) -> np.ndarray | None:
    """The ndarray whose memory `arr` views, where numpy allocated it (not a buffer of
    another object such as an mmap or a coopmat block)."""
    x = arr
    while isinstance(x.base, np.ndarray):
        x = x.base
    return x if x.base is None and x.flags.owndata else None


class Transfers:
    """numpy <-> device buffers for one device."""

    def __init__(self, device: Any, pool: MemoryPool, stream: Stream):
        self.device = device
        self.pool = pool
        self.stream = stream
        self._lock = threading.Lock()
        self._lanes: dict[tuple[Kind, int], list[_Lane]] = {}
        self.unified = pool.unified
        self.import_alignment = 0
        self.host_pointer_properties: Any = None
        if "VK_EXT_external_memory_host" in device.enabled_extensions:
            v = vk()
            name = b"vkGetMemoryHostPointerPropertiesEXT"
            fn = v.lib.vkGetDeviceProcAddr(device.handle, name)
            if fn != v.ffi.NULL:
                self.host_pointer_properties = v.ffi.cast(
                    "PFN_vkGetMemoryHostPointerPropertiesEXT", fn)
                stype = v.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT
                ext = v.ffi.new("VkPhysicalDeviceExternalMemoryHostPropertiesEXT *",
                                {"sType": stype})
                p2 = v.ffi.new("VkPhysicalDeviceProperties2 *", {
                    "sType": v.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, "pNext": ext})
                v.lib.vkGetPhysicalDeviceProperties2(device.physical, p2)
                self.import_alignment = int(ext.minImportedHostPointerAlignment)
        self._blocks: list[_PinnedBlock] = []  # every block, lent or free
        self._free: list[_PinnedBlock] = []
        self._returned: deque[_PinnedBlock] = deque()
        # Small blocks by size, free (last returned last) and all of them.
        self._small_free: dict[int, list[_PinnedBlock]] = {}
        self._small_all: dict[int, int] = {}
        self._small_returned: deque[_PinnedBlock] = deque()
        self._importing: list[Future[None]] = []
        # Kept imports of user arrays by id of the owning array, least recently used
        # first. _pin_lock is held from looking one up until its copy is submitted; an
        # import dropped after that is freed once the copy completes (Stream.defer).
        self._pins: OrderedDict[int, _HostPin] = OrderedDict()
        self._tick = 0  # transfers of pinnable arrays so far (_HostPin.seen)
        self._dead: deque[tuple[int, _HostPin]] = deque()  # collected arrays' pins
        self._pin_lock = threading.RLock()
        env = os.environ.get(MODE_ENV, "")
        if env and env not in MODES:
            raise ValueError(f"{MODE_ENV}={env!r}: expected one of {', '.join(MODES)}")
        self.mode = env or "auto"

    @property
    def can_import(self) -> bool:
        return self.import_alignment > 0 and not self.unified

    def _lanes_of(self, kind: Kind, count: int, stream: Stream | None = None,
                  waits: Sequence[tuple[Stream, int]] = ()) -> list[_Lane]:
        stream = stream or self.stream
        with self._lock:
            lanes = self._lanes.setdefault((kind, id(stream)), [])
            while len(lanes) < count:
                lanes.append(_Lane(self, kind, stream))
            for lane in lanes[:count]:
                lane.waits = list(waits)
            return lanes[:count]

    # -- numpy -> device -------------------------------------------------------------
    def upload(self, src: np.ndarray, dst: Buffer, dst_offset: int = 0,
               mode: str | None = None, fresh: bool = False) -> None:
        """Write `src` (any strides) into dst at dst_offset, C order. Returns once `src`
        may change again; the device copies finish in stream order. fresh: dst was just
        taken from the pool, so no submitted work uses it (a MAPPED dst is then written
        through its mapping at once; otherwise after that work)."""
        nbytes = src.nbytes
        if nbytes == 0:
            return
        if dst.host_access:
            self._write_mapped(src, dst, dst_offset)  # unified memory
            return
        mode = mode or self.mode
        if mode == "import" and self.can_import and src.flags.c_contiguous \
                and nbytes >= PARALLEL_MIN_BYTES:
            try:
                self._imported(src, dst, dst_offset, upload=True)
                return
            except (VulkanError, OutOfDeviceMemoryError):
                pass  # pages the driver will not import: the staging path does it all
        if mode == "auto":
            self._auto_upload([(src, dst, dst_offset)], fresh=fresh)
            return
        self._staged_upload([(src, dst, dst_offset)])

    def write_mapped_jobs(self, jobs: Sequence[tuple[np.ndarray, Buffer, int]],
                          on_job: Callable[[int], None],
                          chunk_bytes: int = CHUNK_BYTES, threads: int = 0) -> None:
        """Write each job's array into its buffer (host-visible, used by no submitted work)
        at its offset through the mapping: the jobs' chunks go in order to whichever lane's
        thread is free, and on_job(j) runs, on that thread, once job j is all written
        (jobs may finish out of order: each thread has a chunk in flight, so a job is done
        about threads x chunk_bytes after its first chunk started; threads 0: one a
        lane). Returns when every job is written. A pipeline cut into blocks this way
        keeps every thread busy to the end, where writing block after block, each waited
        for, measured 14 GB/s for 8 MiB blocks on the H200 against 31 for one array."""
        queue = _ChunkQueue(jobs, chunk_bytes)
        for j, n in enumerate(queue.left):
            if n == 0:
                on_job(j)
        failed = threading.Event()  # after a failure the other threads stop too

        def run(_li: int) -> None:
            while not failed.is_set():
                chunk = queue.take()
                if chunk is None:
                    return
                j, src, dst, off, lo, _, part = chunk
                assert dst.mapped is not None
                try:
                    np.copyto(dst.mapped[off + lo:off + lo + part.nbytes].view(
                        src.dtype).reshape(part.shape), part)
                    if queue.finish(j) is not None:
                        on_job(j)
                except BaseException:
                    failed.set()
                    raise
        _on_lanes(run, min(len(queue.chunks), threads or lane_count()))

    def copy_after(self, src: Buffer, src_offset: int, dst: Buffer, dst_offset: int,
                   nbytes: int, stream: Stream, waits: Sequence[tuple[Stream, int]],
                   lane: int = 0) -> int:
        """Submit one device copy on `stream` (a copy queue's) once `waits` are done; its
        ticket on that stream. Lanes 0..lane take such copies in turn, two command
        buffers each: a caller rotating `lane` seldom waits for an earlier copy."""
        with self._lock:  # not _lanes_of: it would reset the waits of lanes in use
            lanes = self._lanes.setdefault((Kind.DOWNLOAD, id(stream)), [])
            while len(lanes) <= lane:
                lanes.append(_Lane(self, Kind.DOWNLOAD, stream))
            chosen = lanes[lane]
        with chosen.lock:
            chosen.waits = list(waits)
            i = 0 if chosen.tickets[0] <= chosen.tickets[1] else 1
            chosen.slot(i)
            return chosen.copy(i, src.handle, src_offset, dst.handle, dst_offset, nbytes,
                               "a copy from the device")

    def _write_mapped(self, src: np.ndarray, dst: Buffer, dst_offset: int) -> None:
        """src into dst through dst's mapping, by the lanes' threads: the whole upload for
        unified memory and MAPPED buffers (on the H200, 31-32 GB/s from 4 or more threads
        writing its BAR, against 16-29 GB/s through staging and a device copy)."""
        assert dst.mapped is not None
        mapped = dst.mapped
        self._parallel(src.nbytes, src, lambda lo, hi, part: np.copyto(
            mapped[dst_offset + lo:dst_offset + hi].view(src.dtype).reshape(part.shape),
            part))

    def upload_many(self, jobs: list[tuple[np.ndarray, Buffer]], stream: Stream | None = None,
                    waits: Sequence[tuple[Stream, int]] = (),
                    on_job: Callable[[int, int], None] | None = None,
                    dst_offsets: Sequence[int] | None = None, wait: bool = True,
                    fresh: bool = False) -> int:
        """upload() of several arrays, their chunks spread over the lanes together, in
        job order (a GEMM's A and B: one array's tail does not leave lanes idle).
        stream: the queue whose lanes copy (default: the compute stream); waits: other
        streams' work the copies wait for; on_job(j, ticket): job j's copies are all
        submitted, and complete once `stream` reaches ticket.

        Returns once the arrays may change. With wait=False, copies still reading an
        array (mode 'auto''s kept imports) may be in flight: the returned ticket of the
        compute stream (0: none) must be waited for before the caller returns to its
        own caller; work submitted on that stream meanwhile runs after them. fresh: as
        upload's, for every dst."""
        offsets = list(dst_offsets) if dst_offsets is not None else [0] * len(jobs)
        if self.unified or (self.mode == "import" and stream is None):
            for j, ((src, dst), off) in enumerate(zip(jobs, offsets, strict=True)):
                self.upload(src, dst, off, fresh=fresh)
                if on_job is not None:
                    on_job(j, self.stream.submitted)
            return 0
        if self.mode == "auto" and stream is None and on_job is None:
            return self._auto_upload([(src, dst, off) for (src, dst), off
                                      in zip(jobs, offsets, strict=True)], wait, fresh)
        self._staged_upload([(src, dst, off) for (src, dst), off in zip(jobs, offsets,
                                                                        strict=True)],
                            stream, waits, on_job)
        return 0

    def _auto_upload(self, jobs: list[tuple[np.ndarray, Buffer, int]],
                     wait: bool = True, fresh: bool = False) -> int:
        """Mode 'auto': arrays kept imported go in one device copy each (waited for
        together unless `wait` is False: then their ticket is returned, as upload_many
        says); the lanes take the rest together, and their arrays are noted or imported
        for next time. The kept copies are taken only on an idle device (decided once,
        before any of them: each would queue behind earlier work, where the lanes start
        at once), and then for every kept array of the call: A's copy must not send B to
        the lanes. A MAPPED dst is written through its mapping instead of the lanes (after
        the work submitted so far, unless `fresh`)."""
        idle = not self.stream.busy()
        rest, tickets = [], []
        for src, dst, off in jobs:
            ticket = self._pinned_copy(src, dst, off, upload=True) if idle else None
            if ticket is None:
                rest.append((src, dst, off))
            else:
                tickets.append(ticket)
        mapped = [job for job in rest if job[1].kind is Kind.MAPPED]
        if mapped and not fresh:
            self.stream.wait()  # the host writes it: nothing queued may still use it
        for src, dst, off in mapped:
            self._write_mapped(src, dst, off)
        if len(mapped) < len(rest):
            self._staged_upload([job for job in rest if job[1].kind is not Kind.MAPPED])
        for src, _, _ in rest:
            self._pin_later(src)
        if tickets and wait:
            self.stream.wait(max(tickets))
            return 0
        return max(tickets, default=0)

    def _staged_upload(self, jobs: list[tuple[np.ndarray, Buffer, int]],
                       stream: Stream | None = None, waits: Sequence[tuple[Stream, int]] = (),
                       on_job: Callable[[int, int], None] | None = None) -> None:
        queue = _ChunkQueue(jobs, _staged_chunk())
        total = sum(src.nbytes for src, _, _ in jobs)
        lanes = self._lanes_of(Kind.UPLOAD, min(len(queue.chunks), lane_count())
                               if total >= PARALLEL_MIN_BYTES else 1, stream, waits)
        # Chunks go out in order to whichever lane is free; a job is done when its last
        # chunk is submitted (one queue, a barrier a chunk: they complete in order).

        def run(li: int) -> None:
            lane = lanes[li]
            with lane.lock:
                lane.spin = len(lanes) == 1
                j = 0
                while True:
                    chunk = queue.take()
                    if chunk is None:
                        return
                    job, src, dst, off, lo, hi, part = chunk
                    i = j % 2
                    j += 1
                    stage = lane.slot(i)
                    np.copyto(stage[:hi - lo].view(src.dtype).reshape(part.shape), part)
                    ticket = lane.copy(i, lane.staging[i].handle, 0, dst.handle, off + lo,
                                       hi - lo, "a copy to the device")
                    last = queue.finish(job, ticket)
                    if last is not None and on_job is not None:
                        on_job(job, last)
        _on_lanes(run, len(lanes), "up")

    def fill_zero(self, dst: Buffer, offset: int, nbytes: int) -> None:
        """Zero nbytes of dst from offset (both multiples of 4 or reaching the end)."""
        if dst.host_access:  # unified memory
            dst.view(np.dtype(np.uint8), nbytes, offset)[:] = 0
            return
        size = -(-nbytes // 4) * 4  # the buffer's size class leaves room to round up
        lane = self._lanes_of(Kind.UPLOAD, 1)[0]
        with lane.lock:
            lane.slot(0)
            lane.record(0, lambda cmd: vk().lib.vkCmdFillBuffer(cmd, dst.handle, offset,
                                                                  size, 0), "a fill")

    def copy_regions(self, src: Buffer, dst: Buffer, regions: np.ndarray) -> None:
        """Queue device copies from src to dst on the stream, after the work submitted
        so far: `regions` rows of (source byte offset, destination byte offset, bytes),
        uint64 (strided_copy.regions), at most COPY_REGIONS a command."""
        ffi, lib = vk().ffi, vk().lib
        lanes = self._lanes_of(Kind.UPLOAD, COPY_LANES)
        for lo in range(0, len(regions), COPY_REGIONS):
            part = np.ascontiguousarray(regions[lo:lo + COPY_REGIONS], dtype=np.uint64)

            def command(cmd: Any, part: np.ndarray = part) -> None:
                lib.vkCmdCopyBuffer(cmd, src.handle, dst.handle, len(part),
                                    ffi.cast("VkBufferCopy *", ffi.from_buffer(part)))

            # The command buffer submitted longest ago: a loop writing a few rows a step
            # waits only when all of them are still in flight.
            lane, i = min(((lane, i) for lane in lanes for i in (0, 1)),
                          key=lambda li: li[0].tickets[li[1]])
            with lane.lock:
                lane.slot(i)
                lane.record(i, command, "a copy on the device")

    # -- device -> numpy -------------------------------------------------------------
    def download(self, src: Buffer, src_offset: int, dst: np.ndarray,
                 mode: str | None = None, stream: Stream | None = None,
                 waits: Sequence[tuple[Stream, int]] = ()) -> None:
        """Fill the C-contiguous `dst` from src at src_offset, after all work submitted so
        far (on another `stream`: after `waits`); returns when dst holds the data."""
        assert dst.flags.c_contiguous
        nbytes = dst.nbytes
        if nbytes == 0:
            return
        if src.host_access:
            if stream is None:
                self.stream.wait()
            for st, ticket in waits:
                st.wait(ticket)
            self._parallel(nbytes, dst, lambda lo, hi, part: np.copyto(
                part, src.view(dst.dtype, (hi - lo) // dst.itemsize, src_offset + lo).reshape(
                    part.shape)))
            return
        mode = mode or self.mode
        if mode == "import" and self.can_import and nbytes >= PARALLEL_MIN_BYTES \
                and stream is None:
            try:
                self._imported(dst, src, src_offset, upload=False)
                return
            except (VulkanError, OutOfDeviceMemoryError):
                pass
        keep = mode == "auto" and stream is None and not waits
        copied = self._pinned_copy(dst, src, src_offset, upload=False) if keep else None
        if copied is not None:
            self.stream.wait(copied)
            return
        self._lane_download(src, src_offset, dst, stream, waits)
        if keep:
            self._pin_later(dst)

    def kept_download(self, src: Buffer, src_offset: int, dst: np.ndarray) -> int | None:
        """Submit the copy of dst.nbytes from src into `dst` where dst's array is kept
        imported (mode 'auto'), after all work submitted so far; its ticket, for the
        caller to wait for before reading dst. None where it is not (download() then)."""
        if self.mode != "auto" or self.unified or src.host_access:
            return None
        return self._pinned_copy(dst, src, src_offset, upload=False)

    def _lane_download(self, src: Buffer, src_offset: int, dst: np.ndarray,
                       stream: Stream | None, waits: Sequence[tuple[Stream, int]]) -> None:
        nbytes = dst.nbytes
        flat = dst.reshape(-1).view(np.uint8)
        chunk = _staged_chunk()
        bounds = [(lo, min(nbytes, lo + chunk)) for lo in range(0, nbytes, chunk)]
        lanes = self._lanes_of(Kind.DOWNLOAD, min(len(bounds), lane_count())
                               if nbytes >= PARALLEL_MIN_BYTES else 1, stream, waits)

        def run(li: int) -> None:
            lane = lanes[li]
            mine = bounds[li::len(lanes)]
            with lane.lock:
                lane.spin = len(lanes) == 1
                def start(j: int) -> None:
                    lo, hi = mine[j]
                    # The device writes the staging buffer: never past its end.
                    assert hi - lo <= lane.staging[j % 2].size
                    lane.slot(j % 2)
                    lane.copy(j % 2, src.handle, src_offset + lo, lane.staging[j % 2].handle,
                              0, hi - lo, "a copy from the device")
                start(0)
                for j, (lo, hi) in enumerate(mine):
                    if j + 1 < len(mine):
                        start(j + 1)  # the other buffer's DMA overlaps this drain
                    np.copyto(flat[lo:hi], lane.slot(j % 2)[:hi - lo])
        _on_lanes(run, len(lanes), "down")

    def download_new(self, src: Buffer, src_offset: int, nbytes: int) -> np.ndarray:
        """A new uint8 array of nbytes from src at src_offset, after all work submitted so
        far. Large ones (PINNED_MIN_BYTES, devices that import host memory) come in one
        device copy into a kept pinned block when one is ready, else through the lanes
        into a new block that is imported in the background for next time."""
        if nbytes < PINNED_MIN_BYTES or not self.can_import:
            out = np.empty(nbytes, np.uint8)
            self.download(src, src_offset, out)
            return out
        block = self._take_block(nbytes)
        target = self._lent(block, nbytes, self._returned)
        if target is None:
            raw = block.lend(nbytes, self._returned)
            self.download(src, src_offset, raw)
            self._import_later(block)
            return raw
        ticket = self._one_copy(src.handle, src_offset, target.dst.handle, target.offset,
                                nbytes, upload=False)
        try:
            self.stream.wait(ticket)
        except BaseException:
            target.abandon()
            raise
        return target.array()

    def new_download(self, nbytes: int) -> NewDownload | None:
        """A kept pinned block, already imported, for the caller to record the copy of a
        new nbytes result into (in its own submission: no separate copy and wait, as
        download_new makes); None where there is none ready (download_new then)."""
        if nbytes < PINNED_MIN_BYTES or not self.can_import:
            return None
        block = self._take_block(nbytes)
        target = self._lent(block, nbytes, self._returned)
        if target is None:
            self._returned.append(block)  # download_new takes it again, through the lanes
        return target

    def small_download(self, nbytes: int) -> NewDownload | None:
        """A kept pinned block for a small result that comes back with its product:
        numpy gets the block as it is (NewDownload.array), with no host copy (7 us for
        128 KiB on the H200 host). The block last returned goes first, so a loop of
        products reuses one recording. None where no imported block of the size is free:
        the first call of a size starts one's import, up to SMALL_BLOCKS per size."""
        if not self.can_import:
            return None
        size = size_class(nbytes)
        new = None
        with self._lock:
            while self._small_returned:
                back = self._small_returned.popleft()
                if back in self._blocks:  # else dropped (destroy) while it was lent
                    self._small_free.setdefault(back.size, []).append(back)
            free = self._small_free.setdefault(size, [])
            block = next((b for b in reversed(free) if b.imported is not None), None)
            if block is not None:
                free.remove(block)
            elif self._small_all.get(size, 0) < SMALL_BLOCKS and \
                    not any(b.importing for b in free):
                new = _PinnedBlock(size)
                self._small_all[size] = self._small_all.get(size, 0) + 1
                self._blocks.append(new)
                free.append(new)
        if new is not None:
            self._import_later(new)
        return None if block is None else self._lent(block, nbytes, self._small_returned)

    def _lent(self, block: _PinnedBlock, nbytes: int,
              returned: deque[_PinnedBlock]) -> NewDownload | None:
        """The block as a device copy's destination, where it is imported already."""
        imp = block.imported
        if imp is None:
            return None
        return NewDownload(imp.target, imp.offset, nbytes, block, returned)

    def _take_block(self, nbytes: int) -> _PinnedBlock:
        """The smallest free block of nbytes to 2 nbytes (imported ones first), else a new
        one of nbytes rounded up to 2 MiB."""
        with self._lock:
            while self._returned:
                back = self._returned.popleft()
                if back in self._blocks:  # else dropped (destroy) while it was lent
                    self._free.append(back)
            fits = [b for b in self._free if nbytes <= b.size <= 2 * nbytes]
            if fits:
                best = min(fits, key=lambda b: (b.imported is None, b.size))
                self._free.remove(best)
                return best
            block = _PinnedBlock(-(-nbytes // (2 << 20)) * (2 << 20))
            self._blocks.append(block)
            keep = sum(b.size for b in self._free)
            while self._free and keep > PINNED_KEEP_BYTES:  # drop the oldest free blocks
                old = self._free.pop(0)
                keep -= old.size
                self._drop(old)
            return block

    def _import_later(self, block: _PinnedBlock) -> None:
        """Import the block on a background thread (pinning costs about as much as the
        download it saves), unless the device lacks the extension."""
        address = np.frombuffer(block.mm, np.uint8).ctypes.data
        if address % self.import_alignment:
            return  # the mapping is only page aligned; the lanes keep serving this block
        with self._lock:
            if block.importing or block.refused:
                return
            block.importing = True

        def run() -> None:
            try:
                imp: _Imported | None = _Imported(self, address, block.size)
            except (VulkanError, OutOfDeviceMemoryError):
                imp = None
            with self._lock:
                block.importing, block.refused = False, imp is None
                if block in self._blocks:
                    block.imported = imp
                    return
            if imp is not None:  # dropped meanwhile
                imp.free()
        self._in_background(run)

    def wait_imports(self) -> None:
        """Wait for the imports of host memory started so far (kept pinned blocks and
        arrays imported in the background); raise what failed. For measurements that
        want the next transfer to find its memory imported."""
        with self._lock:
            pending = list(self._importing)
        for f in pending:
            f.result()

    def _in_background(self, run: Callable[[], None]) -> None:
        """Run an import on the import thread; destroy() waits for it."""
        with self._lock:
            self._importing = [f for f in self._importing if not f.done()]
            self._importing.append(_pool("import").submit(run))

    def _one_copy(self, src: Any, src_offset: int, dst: Any, dst_offset: int, nbytes: int,
                  upload: bool) -> int:
        """One device copy between buffer handles on a single lane of the compute stream;
        its ticket. It takes the lane's older command buffer: a GEMM's kept A and B go out
        back to back, B's submission not waiting for A's copy to complete."""
        lane = self._lanes_of(Kind.UPLOAD if upload else Kind.DOWNLOAD, 1)[0]
        with lane.lock:
            i = 0 if lane.tickets[0] <= lane.tickets[1] else 1
            lane.slot(i)
            return lane.copy(i, src, src_offset, dst, dst_offset, nbytes,
                             "a copy to the device" if upload else "a copy from the device")

    def _drop(self, block: _PinnedBlock) -> None:
        """Forget a block (its pages stay mapped while an array uses them)."""
        self._blocks.remove(block)
        if block.imported is not None:
            block.imported.free()
            block.imported = None

    # -- the user's arrays, kept imported (mode 'auto') ----------------------------------
    def _pinnable(self, arr: np.ndarray) -> np.ndarray | None:
        """arr's owning array where keeping it imported is worth it: a large contiguous
        transfer covering at least half of an owner within the budget."""
        if not self.can_import or arr.nbytes < PINNED_MIN_BYTES or not arr.flags.c_contiguous:
            return None
        owner = _owner(arr)
        if owner is None or owner.nbytes > 2 * arr.nbytes or owner.nbytes > HOST_PIN_KEEP_BYTES:
            return None
        return owner

    def _pinned_copy(self, host: np.ndarray, buf: Buffer, offset: int,
                     upload: bool) -> int | None:
        """Submit one device copy between `host` and buf at offset through the kept
        import of host's array; its ticket, for the caller to wait for before the array
        may change (upload) or be read (download). None where there is no ready import."""
        with self._pin_lock:
            kept = self._kept_import(host)
            if kept is None:
                return None
            imp, at = kept
            if upload:
                return self._one_copy(imp.buffer, at, buf.handle, offset, host.nbytes,
                                      upload=True)
            return self._one_copy(buf.handle, offset, imp.buffer, at, host.nbytes,
                                  upload=False)

    def kept_upload(self, src: np.ndarray, dst: Buffer, dst_offset: int = 0) -> int | None:
        """Where src's array is kept imported (mode 'auto') and the device idle (else the
        copy would queue behind earlier work), submit its one device copy into dst and
        return its ticket, for the caller to wait for before src may change. Else None:
        the caller writes src some other way, then notes it (kept_later)."""
        if self.mode != "auto" or self.stream.busy():
            return None
        return self._pinned_copy(src, dst, dst_offset, upload=True)

    def _kept_import(self, host: np.ndarray) -> tuple[_Imported, int] | None:
        """The kept import of host's array, marked as used last, and where host's first
        byte lies in it; None where there is none ready. Caller holds _pin_lock."""
        owner = self._pinnable(host)
        if owner is None:
            return None
        self._forget_dead()
        pin = self._pins.get(id(owner))
        if pin is None or pin.imported is None:
            return None
        self._pins.move_to_end(id(owner))
        self._tick += 1
        pin.seen = self._tick
        return pin.imported, pin.imported.offset + host.ctypes.data - pin.address

    def kept(self, arr: np.ndarray) -> bool:
        """Whether arr's array is kept imported (mode 'auto'): its transfers are one
        device copy each."""
        if self.mode != "auto":
            return False
        with self._pin_lock:
            return self._kept_import(arr) is not None

    def kept_later(self, src: np.ndarray) -> None:
        """src went to the device some other way: note its array, or import it for the
        next time (as a transfer through the lanes does, mode 'auto')."""
        if self.mode == "auto":
            self._pin_later(src)

    @contextmanager
    def kept_destination(self, host: np.ndarray) -> Iterator[tuple[Buffer, int] | None]:
        """host's kept import (mode 'auto') as device copies' destination: (buffer, offset
        of host's first byte), or None where host's array is not kept imported. Held for
        the with block: the import is not freed before copies submitted within it have
        completed (other threads' lookups wait meanwhile)."""
        if self.mode != "auto":
            yield None
            return
        with self._pin_lock:
            kept = self._kept_import(host)
            yield None if kept is None else (kept[0].target, kept[1])

    def _pin_later(self, host: np.ndarray) -> None:
        """After a transfer through the lanes: note host's array the first time; the
        second time, import it in the background (pinning costs about what the next
        transfer saves), within HOST_PIN_KEEP_BYTES. Room is made only from kept imports
        idle for longer than this array's reuse distance (the transfers since its last
        one): arrays cycled through in turn, more of them than the budget holds (a Dask
        worker's chunks), would otherwise each evict the next one to be used, every
        import wasted."""
        owner = self._pinnable(host)
        if owner is None:
            return
        key = id(owner)
        with self._pin_lock:
            self._forget_dead()
            self._tick += 1
            pin = self._pins.get(key)
            if pin is None:
                pin = self._pins[key] = _HostPin(owner)
                pin.seen = self._tick
                # deque.append: safe from any thread, taking no lock (a collection can
                # run the finalizer in a thread that holds one of ours).
                pin.finalizer = weakref.finalize(owner, self._dead.append, (key, pin))
                noted = [(k, p) for k, p in self._pins.items() if not p.scheduled]
                for old_key, old in noted[:max(0, len(noted) - HOST_PIN_NOTED)]:
                    self._unpin(old_key, old)
                return
            last, pin.seen = pin.seen, self._tick
            if pin.scheduled:
                return
            victims = [(k, p) for k, p in self._pins.items() if p.scheduled]
            kept = sum(p.nbytes for _, p in victims) + pin.nbytes
            evict = []
            for old_key, old in sorted(victims, key=lambda kp: kp[1].seen):
                if kept <= HOST_PIN_KEEP_BYTES or old.seen >= last:
                    break
                kept -= old.nbytes
                evict.append((old_key, old))
            if kept > HOST_PIN_KEEP_BYTES:
                return  # noted still: its next transfer measures its reuse again
            for old_key, old in evict:
                self._unpin(old_key, old)
            pin.scheduled = True
            self._pins.move_to_end(key)

        def run(owner: np.ndarray = owner) -> None:  # (alive, so are its pages, meanwhile)
            try:
                imp: _Imported | None = _Imported(self, pin.address, pin.nbytes)
            except (VulkanError, OutOfDeviceMemoryError):
                imp = None  # pages the driver will not import: the lanes keep serving it
            with self._pin_lock:
                if self._pins.get(key) is pin:
                    pin.imported = imp
                    return
            if imp is not None:  # the array went away meanwhile
                imp.free()
        self._in_background(run)

    def _forget_dead(self) -> None:
        """Unpin the arrays collected since the last call: before any lookup, as a new
        array may have a dead one's id and address (but other pages)."""
        while self._dead:
            self._unpin(*self._dead.popleft())

    def _unpin(self, key: int, pin: _HostPin) -> None:
        """Forget a kept import (its array was collected or evicted); the import is freed
        once the copies submitted so far, which may read or write it, have completed."""
        with self._pin_lock:
            if self._pins.get(key) is pin:
                del self._pins[key]
            if pin.finalizer is not None:
                pin.finalizer.detach()
            imp, pin.imported = pin.imported, None
        if imp is not None:
            self.stream.defer(imp.free)

    # -- both ways through imported pages --------------------------------------------
    def _imported(self, host: np.ndarray, dev_buf: Buffer, dev_offset: int,
                  upload: bool) -> None:
        """Copy between the array's own pages and dev_buf, a chunk a lane: importing
        (pinning) one chunk overlaps the device copying another. Waits for the copies:
        the pages must not change or go away while the device reads or writes them."""
        base = host.ctypes.data
        nbytes = host.nbytes
        # Chunk edges at absolute multiples of the chunk size: neighbouring imports then
        # never share a page (a driver may refuse to pin a page twice).
        edges = [0] + [e - base for e in range(
            (base // IMPORT_CHUNK_BYTES + 1) * IMPORT_CHUNK_BYTES, base + nbytes,
            IMPORT_CHUNK_BYTES)] + [nbytes]
        bounds = list(zip(edges, edges[1:], strict=False))
        lanes = self._lanes_of(Kind.DOWNLOAD if not upload else Kind.UPLOAD,
                               min(len(bounds), lane_count()))
        imported: list[_Imported] = []
        lock = threading.Lock()

        def run(li: int) -> None:
            lane = lanes[li]
            with lane.lock:
                lane.spin = len(lanes) == 1
                for j, (lo, hi) in enumerate(bounds[li::len(lanes)]):
                    i = j % 2
                    lane.slot(i)
                    imp = _Imported(self, base + lo, hi - lo)
                    with lock:
                        imported.append(imp)
                    if upload:
                        lane.copy(i, imp.buffer, imp.offset, dev_buf.handle, dev_offset + lo,
                                  hi - lo, "a copy to the device")
                    else:
                        lane.copy(i, dev_buf.handle, dev_offset + lo, imp.buffer, imp.offset,
                                  hi - lo, "a copy from the device")
        try:
            _on_lanes(run, len(lanes))
        finally:
            try:
                self.stream.wait()
            finally:
                for imp in imported:
                    imp.free()

    # -- helpers ---------------------------------------------------------------------
    def _parallel(self, nbytes: int, arr: np.ndarray, fn: Any) -> None:
        chunks = _chunks(arr, CHUNK_BYTES)
        count = min(len(chunks), lane_count()) if nbytes >= PARALLEL_MIN_BYTES else 1

        def run(li: int) -> None:
            for lo, hi, part in chunks[li::count]:
                fn(lo, hi, part)
        _on_lanes(run, count)

    def destroy(self) -> None:
        self.stream.wait()
        self.wait_imports()  # no import may start on a destroyed device
        with self._lock:
            for block in list(self._blocks):
                self._drop(block)
            self._free.clear()
            self._returned.clear()
            self._small_free.clear()
            self._small_all.clear()
            self._small_returned.clear()
        with self._pin_lock:
            self._forget_dead()
            for key, pin in list(self._pins.items()):
                self._unpin(key, pin)
        for lanes in self._lanes.values():
            for lane in lanes:
                lane.stream.wait()
                lane.destroy()
        self._lanes.clear()


def _staged_chunk() -> int:
    """The size chunks through the lanes' staging buffers are cut to."""
    return min(CHUNK_BYTES, STAGING_BYTES)


def _on_lanes(run: Any, count: int, direction: str = "up") -> None:
    """run(0..count-1), on the direction's worker threads when more than one; returns
    (or raises the first failure) once every one has returned, so that no lane still
    works on the caller's buffers after it has given them back."""
    if count == 1:
        run(0)
        return
    futures = [_pool(direction).submit(run, i) for i in range(count)]
    wait(futures)
    for f in futures:
        f.result()


_Chunk = tuple[int, np.ndarray, Buffer, int, int, int, np.ndarray]


class _ChunkQueue:
    """The chunks of several (array, buffer, offset) jobs, handed in job order to
    whichever thread asks next: (job, array, buffer, offset, first byte, end byte,
    piece), with a count of each job's chunks not yet finished."""

    def __init__(self, jobs: Sequence[tuple[np.ndarray, Buffer, int]], chunk_bytes: int
                 ) -> None:
        self.chunks: list[_Chunk] = [
            (j, src, dst, off, lo, hi, part) for j, (src, dst, off) in enumerate(jobs)
            for lo, hi, part in _chunks(src, chunk_bytes)]
        self.left = [0] * len(jobs)
        for c in self.chunks:
            self.left[c[0]] += 1
        self._last = [0] * len(jobs)
        self._next = iter(self.chunks)
        self._lock = threading.Lock()

    def take(self) -> _Chunk | None:
        with self._lock:
            return next(self._next, None)

    def finish(self, job: int, ticket: int = 0) -> int | None:
        """One of job's chunks is done (its copy's ticket, if any): the largest ticket of
        the job's chunks where this was its last, else None."""
        with self._lock:
            self._last[job] = max(self._last[job], ticket)
            self.left[job] -= 1
            return self._last[job] if self.left[job] == 0 else None


def _chunks(x: np.ndarray, chunk_bytes: int) -> list[tuple[int, int, np.ndarray]]:
    """x cut into pieces of about chunk_bytes: (first byte, end byte, piece) in C order
    of x's bytes. Contiguous arrays are cut anywhere; others along their leading axes,
    so every piece is a view numpy copies without a temporary."""
    nbytes = x.nbytes
    if x.flags.c_contiguous:
        flat = x.reshape(-1)
        step = max(1, chunk_bytes // x.itemsize)
        return [(lo * x.itemsize, min(flat.size, lo + step) * x.itemsize,
                 flat[lo:lo + step]) for lo in range(0, flat.size, step)]
    if x.ndim == 0 or nbytes <= chunk_bytes:
        return [(0, nbytes, x)]
    row = nbytes // x.shape[0]
    if row > chunk_bytes and x.ndim > 1:  # one leading index is too big: split below it
        out = []
        for i in range(x.shape[0]):
            out += [(i * row + lo, i * row + hi, p) for lo, hi, p in _chunks(x[i], chunk_bytes)]
        return out
    rows = max(1, chunk_bytes // row)
    return [(r * row, min(x.shape[0], r + rows) * row, x[r:r + rows])
            for r in range(0, x.shape[0], rows)]
