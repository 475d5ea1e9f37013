"""Per-device state: logical device, memory pool, pipelines and executor, created once."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from coopmat import device as device_layer
from coopmat.device.logical import Device
from coopmat.device.model import PhysicalDeviceInfo
from coopmat.dispatch.executor import Executor
from coopmat.dispatch.memory import MemoryPool
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


_lock = threading.Lock()
_runtimes: dict[int, Runtime] = {}

DeviceArg = int | str | PhysicalDeviceInfo | Device | None


def runtime(selector: DeviceArg = None) -> Runtime:
    """The runtime of the selected device (argument, $COOPMAT_DEVICE, or the default)."""
    if isinstance(selector, Device):
        selector = selector.info.index
    elif isinstance(selector, PhysicalDeviceInfo):
        selector = selector.index
    dev = device_layer.open_device(selector)
    with _lock:
        rt = _runtimes.get(dev.info.index)
        if rt is None:
            stream = Stream(dev)
            pool = MemoryPool(dev, stream=stream)
            rt = Runtime(dev, pool, PipelineCache(dev), Executor(dev, pool, stream), stream,
                         Transfers(dev, pool, stream))
            _runtimes[dev.info.index] = rt
        return rt


def runtimes() -> list[Runtime]:
    """The runtimes created so far (devices this process has used)."""
    with _lock:
        return list(_runtimes.values())
