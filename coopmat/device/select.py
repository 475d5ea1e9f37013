"""Choosing a physical device: by index or name substring, or the default."""

from __future__ import annotations

import os
from collections.abc import Sequence

from coopmat.device.model import PhysicalDeviceInfo
from coopmat.errors import DeviceNotFoundError, NoCooperativeMatrixDeviceError

ENV_VAR = "COOPMAT_DEVICE"


def _listing(devices: Sequence[PhysicalDeviceInfo]) -> str:
    return ", ".join(f"{d.index}: {d.name}" for d in devices)


def match(devices: Sequence[PhysicalDeviceInfo], selector: int | str) -> PhysicalDeviceInfo:
    """The device a selector names: an index, or a case-insensitive name substring."""
    text = str(selector).strip()
    if text.isdigit():
        i = int(text)
        for d in devices:
            if d.index == i:
                return d
        raise DeviceNotFoundError(f"no Vulkan device with index {i} (devices: {_listing(devices)})")
    hits = [d for d in devices if text.lower() in d.name.lower()]
    if not hits:
        raise DeviceNotFoundError(
            f"no Vulkan device whose name contains {text!r} (devices: {_listing(devices)})")
    return hits[0]


def select(devices: Sequence[PhysicalDeviceInfo],
           selector: int | str | None = None) -> PhysicalDeviceInfo:
    """The device to compute on.

    `selector`, else $COOPMAT_DEVICE, else the first discrete GPU with
    VK_KHR_cooperative_matrix, else the first device with it.
    """
    if selector is None:
        selector = os.environ.get(ENV_VAR) or None
    if selector is not None:
        d = match(devices, selector)
        if not d.has_cooperative_matrix:
            raise NoCooperativeMatrixDeviceError(
                f"device {d.index} ({d.name}) does not offer VK_KHR_cooperative_matrix")
        return d
    capable = [d for d in devices if d.has_cooperative_matrix]
    if not capable:
        raise NoCooperativeMatrixDeviceError(
            f"no Vulkan device offers VK_KHR_cooperative_matrix (devices: {_listing(devices)})")
    discrete = [d for d in capable if d.device_type == "DISCRETE_GPU"]
    return (discrete or capable)[0]
