"""Which devices the workers of this host get, and how each is pinned (COOPMAT_DEVICE):
by its UUID where the driver reports one that names it alone, else by its index."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from coopmat import NoCooperativeMatrixDeviceError
from coopmat import device as device_layer
from coopmat.device.logical import COPY_QUEUES_ENV

ENV_VAR = "COOPMAT_DEVICE"


@dataclass(frozen=True)
class Placement:
    """One worker's device: the value of its COOPMAT_DEVICE, and the device."""

    pin: str
    info: Any  # coopmat.device.PhysicalDeviceInfo


def worker_env(pin: str) -> dict[str, str]:
    """The variables a worker process gets beside this one's: its device, and the GPU's
    copy queues opened unless COOPMAT_COPY_QUEUES says otherwise (a task's product on a
    chunk kept imported then overlaps its copies and kernels: dispatch/pipeline.py)."""
    return {ENV_VAR: pin, COPY_QUEUES_ENV: os.environ.get(COPY_QUEUES_ENV) or "1"}


def describe(info: Any) -> str:
    """A device in one line, with the identity that outlives processes: index, name,
    driver, type, UUID and PCI bus id where known."""
    ids = [f"UUID {info.device_uuid}" if info.device_uuid else "",
           f"PCI {info.pci_bus_id}" if info.pci_bus_id else ""]
    return ", ".join([info.describe()] + [x for x in ids if x])


def _pin(info: Any, infos: Sequence[Any]) -> str:
    uuid = info.device_uuid
    if uuid and sum(d.device_uuid == uuid for d in infos) == 1:
        return str(uuid)
    return str(info.index)


def placements(devices: Any = None) -> list[Placement]:
    """A worker per listed device (an index, a name substring, a UUID or a PCI bus id, as
    COOPMAT_DEVICE takes them; a device listed twice gets two workers), or, by default,
    one per cooperative-matrix device of this host."""
    infos = device_layer.enumerate_devices()
    if devices is None:
        chosen = [d for d in infos if d.has_cooperative_matrix]
        if not chosen:
            listing = ", ".join(f"{d.index}: {d.name}" for d in infos) or "none"
            raise NoCooperativeMatrixDeviceError(
                f"no Vulkan device of this host offers VK_KHR_cooperative_matrix (devices: "
                f"{listing})")
    else:
        if isinstance(devices, (str, int)):
            devices = [devices]
        selectors = list(devices)
        if not selectors:
            raise ValueError("devices is empty: list at least one device, or pass None for "
                             "every cooperative-matrix device of this host")
        chosen = []
        for sel in selectors:
            d = device_layer.match(infos, sel)
            if not d.has_cooperative_matrix:
                raise NoCooperativeMatrixDeviceError(
                    f"device {d.index} ({d.name}) does not offer VK_KHR_cooperative_matrix")
            chosen.append(d)
    return [Placement(_pin(d, infos), d) for d in chosen]


def held_device() -> str:
    """The device this process computes on ($COOPMAT_DEVICE or the default), described;
    on a cluster `client.run(held_device)` asks every worker."""
    return describe(device_layer.select_info())
