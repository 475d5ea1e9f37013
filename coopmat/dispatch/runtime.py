"""Per-device state: logical device, memory pool, pipelines and executor, created once."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from coopmat import device as device_layer
from coopmat.codegen.abi import SPLIT_K_MAX_TILES
from coopmat.codegen.copy import copy_kernel
from coopmat.device.logical import Device
from coopmat.device.model import PhysicalDeviceInfo
from coopmat.device.select import ENV_VAR
from coopmat.dispatch.executor import Executor
from coopmat.dispatch.memory import Buffer, MemoryPool
from coopmat.dispatch.pipelines import PipelineCache
from coopmat.dispatch.stream import Stream
from coopmat.dispatch.transfer import Transfers


@dataclass
class Runtime:
    device: Device
    pool: MemoryPool
    pipelines: PipelineCache
    executor: Executor
    stream: Stream
    transfers: Transfers
    # Streams of the copy queues (uploads, downloads) where the device has a transfer-
    # only family; both the compute stream otherwise.
    up: Stream
    down: Stream
    # Called first by destroy(): layers above that hold buffers give them back.
    on_destroy: list[Callable[[], None]] = field(default_factory=list)
    _counters: Buffer | None = None
    _counters_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def copy_engines(self) -> bool:
        """Whether copies can run beside kernels (on queues of their own)."""
        return self.up is not self.stream

    def split_counters(self) -> Buffer:
        """The arrival counters every split-K on this device shares (abi.BINDING_COUNTERS,
        SPLIT_K_MAX_TILES of them): zeroed once here, and each dispatch leaves them zero
        (KhrTraits.split_k). Sharing is safe because the stream runs dispatches one after
        another, a barrier between each."""
        with self._counters_lock:
            if self._counters is None:
                nbytes = 4 * SPLIT_K_MAX_TILES
                buf = self.pool.acquire(self.pool.kinds()[0], nbytes)
                # On the compute stream: every later submission's leading barrier orders
                # its kernels after the fill.
                self.transfers.fill_zero(buf, 0, nbytes)
                self._counters = buf
            return self._counters

    @classmethod
    def create(cls, dev: Device) -> Runtime:
        """Everything one logical device needs to run kernels."""
        stream = Stream(dev)
        pool = MemoryPool(dev, stream=stream)
        queues = list(zip(dev.copy_queues, dev.copy_queue_locks, strict=True))
        copy = [Stream(dev, q, lock, compute=False) for q, lock in queues]
        up = copy[0] if copy else stream
        down = copy[-1] if copy else stream
        pipelines = PipelineCache(dev)
        executor = Executor(dev, pool, stream, lambda: pipelines.get(copy_kernel()))
        rt = cls(dev, pool, pipelines, executor, stream,
                 Transfers(dev, pool, stream), up, down)
        with _lock:
            _by_device[id(dev)] = rt
        return rt

    def destroy(self) -> None:
        """Tear down in reverse order of creation (work finished first); the device last."""
        self.stream.wait()
        for hook in self.on_destroy:
            hook()
        if self._counters is not None:
            self.pool.release(self._counters)
            self._counters = None
        self.transfers.destroy()
        for copy in {id(s): s for s in (self.up, self.down) if s is not self.stream}.values():
            copy.destroy()
        self.executor.destroy()
        self.pipelines.destroy()
        self.pool.clear()
        self.stream.destroy()
        with _lock:
            _by_device.pop(id(self.device), None)
            if _runtimes.get(self.device.info.index) is self:
                del _runtimes[self.device.info.index]
            for env in [e for e, rt in _defaults.items() if rt is self]:
                del _defaults[env]
        self.device.destroy()


_lock = threading.RLock()  # runtime() holds it while Runtime.create registers
_runtimes: dict[int, Runtime] = {}  # the default runtime per physical device index
_by_device: dict[int, Runtime] = {}  # every live runtime, by id() of its logical device
_defaults: dict[str | None, Runtime] = {}  # runtime(None) by the value of $COOPMAT_DEVICE

DeviceArg = int | str | PhysicalDeviceInfo | Device | None


def runtime(selector: DeviceArg = None) -> Runtime:
    """The runtime of the selected device (argument, $COOPMAT_DEVICE, or the default)."""
    if selector is None:  # every small call asks: remembered per value of the variable
        env = os.environ.get(ENV_VAR)
        known = _defaults.get(env)
        if known is not None:
            return known
        rt = _runtime(None)
        with _lock:
            _defaults[env] = rt
        return rt
    return _runtime(selector)


def _runtime(selector: DeviceArg) -> Runtime:
    if isinstance(selector, Device):
        # A Device names its own runtime: a second logical device on the same physical
        # one (a test, or a user's own) must not fall back to the default.
        with _lock:
            own = _by_device.get(id(selector))
        if own is not None:
            return own
        selector = selector.info.index
    elif isinstance(selector, PhysicalDeviceInfo):
        selector = selector.index
    dev = device_layer.open_device(selector)
    with _lock:
        rt = _runtimes.get(dev.info.index)
        if rt is None:
            rt = _by_device.get(id(dev))
            if rt is None:
                rt = Runtime.create(dev)
            _runtimes[dev.info.index] = rt
        return rt


def runtimes() -> list[Runtime]:
    """The runtimes created so far (devices this process has used)."""
    with _lock:
        return list(_runtimes.values())
