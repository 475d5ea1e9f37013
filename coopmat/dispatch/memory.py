"""Buffers, and a pool that reuses them so steady-state calls allocate nothing.

Kinds of buffer:
- DEVICE: device-local storage the kernels read and write;
- UPLOAD / DOWNLOAD: host-visible staging for numpy data going in and out;
- MAPPED: device-local memory the host writes through a mapping (a resizable BAR: the
  H200 maps all of its memory this way): new arrays and the inputs of numpy products,
  which kernels then read like other device memory with no copy command. The host must
  never read it (uncached reads across PCIe: 4 ms for 128 KiB on the H200).
On a device whose device-local memory is also host-visible and coherent (lavapipe, most
integrated GPUs), SHARED buffers serve every role and no staging copy is made.
"""

from __future__ import annotations

import enum
import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from coopmat.common.errors import OutOfDeviceMemoryError
from coopmat.device.logical import Device
from coopmat.device.vkffi import vk
from coopmat.dispatch.vkcall import call

if TYPE_CHECKING:
    from coopmat.dispatch.stream import Stream

DEVICE_LOCAL = 0x1
HOST_VISIBLE = 0x2
HOST_COHERENT = 0x4
HOST_CACHED = 0x8

BUFFER_USAGE_TRANSFER_SRC = 0x1
BUFFER_USAGE_TRANSFER_DST = 0x2
BUFFER_USAGE_STORAGE = 0x20


def sharing(device: Any) -> dict[str, Any]:
    """VkBufferCreateInfo's sharing fields: buffers are used by the compute queue and,
    where the device has them, the copy queues (another family): concurrent sharing
    spares queue-family ownership transfers."""
    v = vk()
    families = device.queue_family_indices
    if len(families) == 1:
        return {"sharingMode": v.VK_SHARING_MODE_EXCLUSIVE}
    return {"sharingMode": v.VK_SHARING_MODE_CONCURRENT,
            "queueFamilyIndexCount": len(families), "pQueueFamilyIndices": list(families)}


class Kind(enum.Enum):
    DEVICE = "device"
    UPLOAD = "upload"
    DOWNLOAD = "download"
    SHARED = "shared"
    MAPPED = "mapped"

    # Members are singletons: identity hashing, in C, keeps the pool's dict lookups cheap
    # (Enum's own __hash__ is Python code on some versions, run twice per buffer a call).
    __hash__ = object.__hash__


# Per kind of buffer: (property flags its memory type must have, flags preferred).
MEMORY_FLAGS: dict[Kind, tuple[int, int]] = {
    Kind.DEVICE: (DEVICE_LOCAL, 0),
    Kind.UPLOAD: (HOST_VISIBLE | HOST_COHERENT, 0),
    Kind.DOWNLOAD: (HOST_VISIBLE | HOST_COHERENT, HOST_CACHED),
    Kind.SHARED: (DEVICE_LOCAL | HOST_VISIBLE | HOST_COHERENT, HOST_CACHED),
    Kind.MAPPED: (DEVICE_LOCAL | HOST_VISIBLE | HOST_COHERENT, 0),
}


@dataclass
class Buffer:
    kind: Kind
    size: int
    handle: Any
    memory: Any
    mapped: np.ndarray | None  # uint8 view of the mapping, for host-visible kinds
    addr: int = 0  # the VkBuffer handle as an int, a cheap cache key

    @property
    def host_access(self) -> bool:
        """Whether the host reads and writes this buffer through its mapping as its own
        memory: every mapped kind but MAPPED, which the host only writes (and only where
        no queued work uses it)."""
        return self.mapped is not None and self.kind is not Kind.MAPPED

    def view(self, dtype: np.dtype, count: int, offset: int = 0) -> np.ndarray:
        assert self.mapped is not None
        nbytes = count * np.dtype(dtype).itemsize
        return self.mapped[offset:offset + nbytes].view(dtype)


# The most bytes of idle buffers a pool keeps for reuse (at most a quarter of the heap).
MAX_CACHED_BYTES = 4 << 30


@functools.lru_cache(maxsize=4096)
def size_class(nbytes: int) -> int:
    """Round up to 1, 1.25, 1.5 or 1.75 times a power of two (>= 4 KiB): at most 25% slack,
    and few enough classes that mixed shapes reuse buffers."""
    n = max(int(nbytes), 4096)
    p = 1 << (n - 1).bit_length()
    for q in (p // 2 + p // 8, p // 2 + p // 4, p // 2 + 3 * p // 8, p):
        if q >= n:
            return q
    return p


class MemoryPool:
    """Allocates and recycles buffers of one device. Thread-safe."""

    def __init__(self, device: Device, max_cached_bytes: int | None = None,
                 stream: Stream | None = None):
        v = vk()
        self.device = device
        # Submitted work may still use a buffer the pool drops or hands out again: the
        # stream says when it is done (None: every caller has waited already).
        self.stream = stream
        self._lock = threading.RLock()
        self._free: OrderedDict[tuple[Kind, int], list[Buffer]] = OrderedDict()
        self.cached_bytes = 0
        self.allocated_bytes = 0
        # Bumped whenever a buffer is destroyed: recorded command buffers that name
        # buffers are valid only within one generation.
        self.generation = 0
        self.allocations = 0
        props = v.vkGetPhysicalDeviceMemoryProperties(device.physical)
        self._types = [(props.memoryTypes[i].propertyFlags, props.memoryTypes[i].heapIndex)
                       for i in range(props.memoryTypeCount)]
        self._heaps = [(props.memoryHeaps[i].size, props.memoryHeaps[i].flags)
                       for i in range(props.memoryHeapCount)]
        want = DEVICE_LOCAL | HOST_VISIBLE | HOST_COHERENT
        device_heap = max(self._heaps, key=lambda h: h[0] if h[1] & 1 else 0)
        self._device_heap_index = self._heaps.index(device_heap)
        self.device_heap_bytes = device_heap[0]
        # Host-visible coherent memory on that heap (a resizable BAR on a discrete GPU, not
        # a small window of it): MAPPED buffers come from there.
        self.device_mapped = any(
            f & want == want and h == self._device_heap_index for f, h in self._types)
        # Unified memory: the same, on a CPU or integrated GPU.
        self.unified = device.info.device_type in ("CPU", "INTEGRATED_GPU") and \
            self.device_mapped
        # Room for a large product's A, D and their neighbours (a 64k x 4096 float16
        # chunk's A and D take 1.1 GiB): below that, each call frees and allocates them.
        self.max_cached_bytes = max_cached_bytes if max_cached_bytes is not None else min(
            MAX_CACHED_BYTES, self.device_heap_bytes // 4)

    # -- choosing memory -------------------------------------------------------------
    def _memory_type(self, kind: Kind, type_bits: int) -> int:
        required, preferred = MEMORY_FLAGS[kind]
        candidates = [i for i, (f, _) in enumerate(self._types)
                      if type_bits & (1 << i) and f & required == required]
        if not candidates:
            raise OutOfDeviceMemoryError(f"the device has no memory type for {kind.value} buffers")
        if kind is Kind.MAPPED:  # the device's own heap, where a small BAR heap exists too
            candidates = [i for i in candidates
                          if self._types[i][1] == self._device_heap_index] or candidates
        best = [i for i in candidates if self._types[i][0] & preferred == preferred]
        return (best or candidates)[0]

    def kinds(self) -> tuple[Kind, Kind, Kind]:
        """(operand kind, upload kind, download kind) for this device."""
        if self.unified:
            return Kind.SHARED, Kind.SHARED, Kind.SHARED
        return Kind.DEVICE, Kind.UPLOAD, Kind.DOWNLOAD

    def direct_kind(self) -> Kind | None:
        """Where a small operand the host writes for one call goes so that the kernel
        reads it in device memory without a copy command: SHARED memory on unified
        devices, MAPPED where device-local memory is host-visible; None: stage it in
        UPLOAD memory and copy. On the H200 a 128 KiB x went 11 us sooner through the
        GPU in MAPPED memory than copied from UPLOAD memory (lab/notebook/arrays.md)."""
        if self.unified:
            return Kind.SHARED
        return Kind.MAPPED if self.device_mapped else None

    # -- allocation ------------------------------------------------------------------
    def _allocate(self, kind: Kind, size: int) -> Buffer:
        v = vk()
        dev = self.device.handle
        usage = BUFFER_USAGE_STORAGE | BUFFER_USAGE_TRANSFER_SRC | BUFFER_USAGE_TRANSFER_DST
        handle = call(v.vkCreateBuffer, dev, v.VkBufferCreateInfo(
            size=size, usage=usage, **sharing(self.device)), None)
        memory = None
        try:
            req = v.vkGetBufferMemoryRequirements(dev, handle)
            type_index = self._memory_type(kind, req.memoryTypeBits)
            memory = call(v.vkAllocateMemory, dev, v.VkMemoryAllocateInfo(
                allocationSize=req.size, memoryTypeIndex=type_index), None)
            call(v.vkBindBufferMemory, dev, handle, memory, 0)
            mapped = None
            if kind is not Kind.DEVICE:
                raw = call(v.vkMapMemory, dev, memory, 0, size, 0)
                mapped = np.frombuffer(raw, dtype=np.uint8, count=size)
        except BaseException:
            if memory is not None:
                v.vkFreeMemory(dev, memory, None)
            v.vkDestroyBuffer(dev, handle, None)
            raise
        self.allocated_bytes += size
        self.allocations += 1
        return Buffer(kind, size, handle, memory, mapped, int(v.ffi.cast("uintptr_t", handle)))

    def _destroy(self, buf: Buffer) -> None:
        v = vk()
        dev = self.device.handle
        with self._lock:
            if buf.mapped is not None:
                v.vkUnmapMemory(dev, buf.memory)
                buf.mapped = None
            v.vkDestroyBuffer(dev, buf.handle, None)
            v.vkFreeMemory(dev, buf.memory, None)
            self.allocated_bytes -= buf.size
            self.generation += 1

    def _drop(self, buf: Buffer) -> None:
        """Destroy `buf` once no submitted work can still use it."""
        if self.stream is None:
            self._destroy(buf)
        else:
            self.stream.defer(lambda: self._destroy(buf))

    def acquire(self, kind: Kind, nbytes: int) -> Buffer:
        size = size_class(nbytes)
        with self._lock:
            free = self._free.get((kind, size))
            if free:
                buf = free.pop()
                if free:
                    self._free.move_to_end((kind, size))
                else:  # no empty lists: _trim takes the first key's oldest buffer
                    del self._free[(kind, size)]
                self.cached_bytes -= size
                return buf
            try:
                return self._allocate(kind, size)
            except OutOfDeviceMemoryError:
                # Cached buffers may be what fills the heap: drop them and try once more.
                dropped = self._trim(0)
        self._drop_all(dropped)
        if self.stream is not None:
            self.stream.wait()  # buffers dropped above are freed when their work is done
        with self._lock:
            return self._allocate(kind, size)

    def release(self, buf: Buffer) -> None:
        """Give `buf` back for reuse now. Safe for a buffer only the device's queue uses
        (later work on it is ordered after earlier work); host-visible buffers that
        pending work may still read or write go through release_later."""
        key = (buf.kind, buf.size)
        with self._lock:
            self._free.setdefault(key, []).append(buf)
            self._free.move_to_end(key)
            self.cached_bytes += buf.size
            if self.cached_bytes <= self.max_cached_bytes:
                return
            dropped = self._trim(self.max_cached_bytes)
        self._drop_all(dropped)

    def recycle(self, buf: Buffer) -> None:
        """Give `buf` back as soon as that is safe: device-local memory now (later work on
        the queue is ordered after whatever still reads it), host-visible memory, which the
        host writes, once the work submitted so far is done."""
        if buf.mapped is None:
            self.release(buf)
        else:
            self.release_later(buf)

    def release_later(self, buf: Buffer) -> None:
        """Give `buf` back once everything submitted so far has completed."""
        if self.stream is None:
            self.release(buf)
        else:
            self.stream.defer(lambda: self.release(buf))

    def _trim(self, limit: int) -> list[Buffer]:
        """Take least recently used cached buffers out until at most `limit` bytes are
        cached; the caller drops them after releasing the lock (the stream's lock is
        taken after this one, never before)."""
        out = []
        while self.cached_bytes > limit and self._free:
            key, bufs = next(iter(self._free.items()))
            buf = bufs.pop(0)
            if not bufs:
                del self._free[key]
            self.cached_bytes -= buf.size
            out.append(buf)
        return out

    def _drop_all(self, bufs: list[Buffer]) -> None:
        for buf in bufs:
            self._drop(buf)

    def clear(self) -> None:
        with self._lock:
            dropped = self._trim(0)
        self._drop_all(dropped)
