"""Ordered, asynchronous submission to a device's queue, on one timeline semaphore.

Every submission of a device goes through its Stream and signals the next value of the
stream's timeline (a ticket). Work therefore runs in call order; a caller waits for a
ticket only when it needs a result on the host. Each recorded command buffer starts with a
full compute/transfer barrier, whose first scope covers everything submitted earlier on
the queue, so a submission may read what an earlier one wrote, and a device-local buffer
freed by one call can be reused by the next without waiting.

What must outlive the GPU's use of it (host-visible staging, command buffers, descriptor
sets, buffers about to be destroyed) is handed to `defer`, which runs it once everything
submitted so far has completed. A submission that fails on the device (device lost, out
of memory) is raised as the library's exception at the next wait, naming what failed.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from coopmat.common.errors import DeviceLostError, OutOfDeviceMemoryError, VulkanError
from coopmat.device.logical import Device
from coopmat.device.vkffi import vk
from coopmat.dispatch.vkcall import call, check

SEMAPHORE_TYPE_TIMELINE = 1
ALL_COMMANDS = 0x10000  # VK_PIPELINE_STAGE_ALL_COMMANDS_BIT
WAIT_SLICE_NS = 100_000_000
WAIT_TIMEOUT_S = 600.0
# A small dispatch completes within microseconds; a blocking wait's wake-up can cost more.
SPIN_SECONDS = 0.0005
# Then poll, sleeping POLL_SLEEP_S between polls (the GIL is free meanwhile), for up to
# POLL_SECONDS before a blocking vkWaitSemaphores: on the H200's driver a blocking wait
# woke about 10 ms after the work completed (benchmarks/profile_numpy_path.py traces).
POLL_SECONDS = 0.25
POLL_SLEEP_S = 0.0001

_RESULT_ERRORS = {
    -4: "VK_ERROR_DEVICE_LOST",
    -2: "VK_ERROR_OUT_OF_DEVICE_MEMORY",
    -1: "VK_ERROR_OUT_OF_HOST_MEMORY",
}


def _failure(what: str, result: int) -> Exception:
    name = _RESULT_ERRORS.get(result, str(result))
    if result == -4:
        return DeviceLostError(what, name)
    if result in (-1, -2):
        return OutOfDeviceMemoryError(f"{what} failed with {name}")
    return VulkanError(what, name)


class Stream:
    """The submission order of one queue (the device's compute queue unless `queue` and
    its `queue_lock` are given: a copy queue). Thread-safe: `lock` orders submissions.
    `compute`: whether the queue runs compute work (barrier stages depend on it)."""

    def __init__(self, device: Device, queue: Any = None, queue_lock: Any = None,
                 compute: bool = True):
        v = vk()
        self.device = device
        self.queue = device.queue if queue is None else queue
        self.queue_lock = device.queue_lock if queue_lock is None else queue_lock
        self.compute = compute
        # Command buffers submitted here come from pools of this family.
        family = device.queue_family_index if compute else device.copy_queue_family_index
        assert family is not None
        self.family_index: int = family
        self.lock = threading.RLock()
        type_info = v.VkSemaphoreTypeCreateInfo(semaphoreType=SEMAPHORE_TYPE_TIMELINE,
                                                initialValue=0)
        self.semaphore = call(v.vkCreateSemaphore, device.handle,
                              v.VkSemaphoreCreateInfo(pNext=type_info), None)
        ffi = v.ffi
        self._sems = ffi.new("VkSemaphore[1]", [self.semaphore])
        self._signal = ffi.new("uint64_t[1]")
        self._timeline = ffi.new("VkTimelineSemaphoreSubmitInfo *", {
            "sType": v.VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
            "signalSemaphoreValueCount": 1, "pSignalSemaphoreValues": self._signal})
        self._cmds = ffi.new("VkCommandBuffer[1]")
        self._submit = ffi.new("VkSubmitInfo *", {
            "sType": v.VK_STRUCTURE_TYPE_SUBMIT_INFO, "pNext": self._timeline,
            "commandBufferCount": 1, "pCommandBuffers": self._cmds,
            "signalSemaphoreCount": 1, "pSignalSemaphores": self._sems})
        self._value = ffi.new("uint64_t[1]")
        self.submitted = 0  # the last ticket handed out
        self.completed = 0  # the last ticket known complete
        self._deferred: deque[tuple[int, Callable[[], None]]] = deque()
        self._error: Exception | None = None
        self._what: dict[int, str | Callable[[], str]] = {}

    # -- submitting ------------------------------------------------------------------
    def submit(self, cmd: Any, what: str | Callable[[], str] = "a GEMM",
               waits: Sequence[tuple[Stream, int]] = ()) -> int:
        """Queue one recorded command buffer; returns its ticket. `what` names the work
        in the error raised if it fails (a callable: named only then). `waits`: (stream,
        ticket) pairs of other queues' work this submission must wait for (a semaphore
        wait: it also makes their writes visible here)."""
        lib = vk().lib
        waits = [(st, t) for st, t in waits if st is not self and t > st.completed]
        with self.lock:
            ticket = self.submitted + 1
            self._cmds[0] = cmd
            self._signal[0] = ticket
            submit, keep = (self._submit, None) if not waits else self._waiting(waits)
            with self.queue_lock:
                r = lib.vkQueueSubmit(self.queue, 1, submit, vk().ffi.NULL)
            del keep
            if r != 0:
                raise _failure(f"vkQueueSubmit of {_name(what)}", r)
            self.submitted = ticket
            self._what[ticket] = what
            if len(self._what) > 64:
                self._what.pop(next(iter(self._what)))
            ready = self._retire()
        _run(ready)
        return ticket

    def _waiting(self, waits: Sequence[tuple[Stream, int]]) -> tuple[Any, list[Any]]:
        """A VkSubmitInfo like the stream's own, waiting for `waits` first (and what must
        stay alive until vkQueueSubmit returns)."""
        v = vk()
        ffi = v.ffi
        n = len(waits)
        sems = ffi.new("VkSemaphore[]", [st.semaphore for st, _ in waits])
        values = ffi.new("uint64_t[]", [t for _, t in waits])
        stages = ffi.new("VkPipelineStageFlags[]", [ALL_COMMANDS] * n)
        timeline = ffi.new("VkTimelineSemaphoreSubmitInfo *", {
            "sType": v.VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
            "waitSemaphoreValueCount": n, "pWaitSemaphoreValues": values,
            "signalSemaphoreValueCount": 1, "pSignalSemaphoreValues": self._signal})
        submit = ffi.new("VkSubmitInfo *", {
            "sType": v.VK_STRUCTURE_TYPE_SUBMIT_INFO, "pNext": timeline,
            "waitSemaphoreCount": n, "pWaitSemaphores": sems, "pWaitDstStageMask": stages,
            "commandBufferCount": 1, "pCommandBuffers": self._cmds,
            "signalSemaphoreCount": 1, "pSignalSemaphores": self._sems})
        return submit, [sems, values, stages, timeline]

    def busy(self) -> bool:
        """Whether submitted work may still be running (polls the device)."""
        with self.lock:
            if self.completed < self.submitted:
                self.completed = max(self.completed, self.poll())
            return self.completed < self.submitted

    def defer(self, fn: Callable[[], None]) -> None:
        """Run `fn` once everything submitted so far has completed (now, if that is
        known). Work not yet seen complete is not polled for here: deferrals mostly
        follow a submission, and the next submit or wait runs what is due."""
        with self.lock:
            if self.completed < self.submitted:
                self._deferred.append((self.submitted, fn))
                return
        fn()

    # -- completion ------------------------------------------------------------------
    def poll(self, value: Any = None) -> int:
        """The last completed ticket, without blocking (`value`: a uint64_t[1] to use,
        for callers outside the lock)."""
        v = vk()
        out = self._value if value is None else value
        r = v.lib.vkGetSemaphoreCounterValue(self.device.handle, self.semaphore, out)
        if r != 0:
            self._error = self._error or _failure("the device", r)
            return self.completed
        return int(out[0])

    def _retire(self) -> list[Callable[[], None]]:
        """Note completed work; returns the deferred calls now due (the caller runs them
        after releasing the lock: they take other locks)."""
        done = self.poll()
        if done > self.completed:
            self.completed = done
        ready = []
        while self._deferred and self._deferred[0][0] <= self.completed:
            ready.append(self._deferred.popleft()[1])
        return ready

    def wait(self, ticket: int | None = None, spin: bool = True) -> None:
        """Block until `ticket` (default: everything submitted) has completed; raise what
        failed in between. Other threads keep submitting while this one blocks. spin:
        poll briefly first (worth it for one waiter on short work; many threads polling
        would only fight over the GIL)."""
        with self.lock:
            target = self.submitted if ticket is None else ticket
            pending = self._error is None and self.completed < target
        if pending:
            self._block(target, spin)
        with self.lock:
            ready = self._retire()
            err, self._error = self._error, None
        _run(ready)
        if err is not None:
            raise err

    def _block(self, target: int, spin: bool) -> None:
        v = vk()
        lib, ffi, dev = v.lib, v.ffi, self.device.handle
        value = ffi.new("uint64_t[1]")
        # Poll: back to back until t_spin, then with sleeps until t_poll; then block.
        t_spin = time.perf_counter() + (SPIN_SECONDS if spin else 0.0)
        t_poll = t_spin + POLL_SECONDS
        while True:
            if self.poll(value) >= target or self._error is not None:
                return
            now = time.perf_counter()
            if now >= t_poll:
                break
            if now >= t_spin:
                time.sleep(POLL_SLEEP_S)
        value[0] = target
        info = ffi.new("VkSemaphoreWaitInfo *", {
            "sType": v.VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO, "semaphoreCount": 1,
            "pSemaphores": self._sems, "pValues": value})
        waited = 0.0
        while True:
            r = lib.vkWaitSemaphores(dev, info, WAIT_SLICE_NS)
            if r == 0:
                return
            if r != 2:  # VK_TIMEOUT
                self._error = _failure(f"waiting for {_name(self._what.get(target, 'work'))}",
                                       r)
                return
            waited += WAIT_SLICE_NS * 1e-9
            if waited > WAIT_TIMEOUT_S:
                self._error = VulkanError("vkWaitSemaphores",
                                          f"VK_TIMEOUT after {WAIT_TIMEOUT_S:.0f} s")
                return

    def destroy(self) -> None:
        try:
            self.wait()
        finally:
            with self.queue_lock:
                check("vkQueueWaitIdle", vk().lib.vkQueueWaitIdle(self.queue))
            vk().vkDestroySemaphore(self.device.handle, self.semaphore, None)


def _name(what: str | Callable[[], str]) -> str:
    return what if isinstance(what, str) else what()


def _run(calls: list[Callable[[], None]]) -> None:
    for fn in calls:
        fn()
