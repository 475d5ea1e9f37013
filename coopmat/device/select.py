"""Choosing a physical device: by index or name substring, or the default."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from coopmat.common.errors import DRIVER_ADVICE, DeviceNotFoundError, NoCooperativeMatrixDeviceError
from coopmat.device.model import PhysicalDeviceInfo

ENV_VAR = "COOPMAT_DEVICE"


def _listing(devices: Sequence[PhysicalDeviceInfo]) -> str:
    return ", ".join(f"{d.index}: {d.name}" for d in devices)


def _numbers(devices: Sequence[PhysicalDeviceInfo]) -> str:
    indices = sorted(d.index for d in devices)
    if not indices:
        return "there is no Vulkan device"
    if len(indices) == 1:
        return f"the only index is {indices[0]}"
    return f"indices run from {indices[0]} to {indices[-1]}"


def match(devices: Sequence[PhysicalDeviceInfo], selector: int | str,
          source: str | None = None) -> PhysicalDeviceInfo:
    """The device a selector names: an index, or a case-insensitive name substring.

    A negative index is refused (as torch refuses device -1): no numbering counts from
    the end of the device list. `source` names where the selector came from (an
    environment variable, say): the error then names it, since the user may not know it
    is set."""
    text = str(selector).strip()
    if re.fullmatch(r"[+-]?\d+", text):
        i = int(text)
        if i < 0:
            where = f"{source}={str(selector)!r}: " if source is not None else ""
            raise DeviceNotFoundError(
                f"{where}device index {i} is negative; {_numbers(devices)} "
                f"(devices: {_listing(devices)})")
        for d in devices:
            if d.index == i:
                return d
        what = f"no Vulkan device with index {i}; {_numbers(devices)}"
    else:
        hits = [d for d in devices if text.lower() in d.name.lower()]
        if hits:
            return hits[0]
        what = f"no Vulkan device whose name contains {text!r}"
    if source is not None:
        raise DeviceNotFoundError(
            f"{source}={str(selector)!r} matches no Vulkan device (devices: {_listing(devices)}); "
            "unset it, or set it to one of these indices or a part of its name")
    raise DeviceNotFoundError(f"{what} (devices: {_listing(devices)})")


def select(devices: Sequence[PhysicalDeviceInfo],
           selector: int | str | None = None) -> PhysicalDeviceInfo:
    """The device to compute on.

    `selector`, else $COOPMAT_DEVICE, else the first discrete GPU with
    VK_KHR_cooperative_matrix, else the first device with it.
    """
    source = None
    if selector is None:
        selector = os.environ.get(ENV_VAR) or None
        source = ENV_VAR
    if selector is not None:
        d = match(devices, selector, source)
        if not d.has_cooperative_matrix:
            what = f"device {d.index} ({d.name}) does not offer VK_KHR_cooperative_matrix"
            if source is not None:
                what = f"{source}={str(selector)!r} selects {what}; unset it or pick another"
            raise NoCooperativeMatrixDeviceError(f"{what} (devices: {_listing(devices)})")
        return d
    capable = [d for d in devices if d.has_cooperative_matrix]
    if not capable:
        raise NoCooperativeMatrixDeviceError(
            f"no Vulkan device offers VK_KHR_cooperative_matrix (devices: {_listing(devices)}). "
            + DRIVER_ADVICE)
    discrete = [d for d in capable if d.device_type == "DISCRETE_GPU"]
    return (discrete or capable)[0]
