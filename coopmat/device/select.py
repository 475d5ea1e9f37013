"""Choosing a physical device: by index, name substring, UUID or PCI bus id, or the
default."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from coopmat.common.errors import DRIVER_ADVICE, DeviceNotFoundError, NoCooperativeMatrixDeviceError
from coopmat.device.model import PhysicalDeviceInfo

ENV_VAR = "COOPMAT_DEVICE"


def _listing(devices: Sequence[PhysicalDeviceInfo], uuids: bool = False) -> str:
    def ids(d: PhysicalDeviceInfo) -> str:
        known = [x for x in (getattr(d, "device_uuid", ""), getattr(d, "pci_bus_id", "")) if x]
        return f" [{', '.join(known)}]" if uuids and known else ""
    return ", ".join(f"{d.index}: {d.name}{ids(d)}" for d in devices)


def _numbers(devices: Sequence[PhysicalDeviceInfo]) -> str:
    indices = sorted(d.index for d in devices)
    if not indices:
        return "there is no Vulkan device"
    if len(indices) == 1:
        return f"the only index is {indices[0]}"
    return f"indices run from {indices[0]} to {indices[-1]}"


# lspci's 0000:41:00.0, nvidia-smi's 00000000:41:00.0, or 41:00.0 (domain 0).
_PCI = re.compile(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])")
# A UUID or a prefix of it: hex digits and dashes, nvidia-smi's GPU- before it allowed.
_UUID = re.compile(r"(?:gpu-)?([0-9a-f-]+)")
UUID_PREFIX_MIN = 4  # hex digits: fewer would read as a name as often as a UUID


def _pci_key(text: str) -> tuple[int, ...] | None:
    m = _PCI.fullmatch(text.lower())
    return tuple(int(g or "0", 16) for g in m.groups()) if m else None


def _by_identity(devices: Sequence[PhysicalDeviceInfo],
                 text: str) -> tuple[list[PhysicalDeviceInfo], str] | None:
    """The devices a PCI bus id or a UUID (prefix) names, and how the selector was read;
    None where the text is neither."""
    pci = _pci_key(text)
    if pci is not None:
        return ([d for d in devices if _pci_key(getattr(d, "pci_bus_id", "")) == pci],
                f"PCI bus id {text!r}")
    m = _UUID.fullmatch(text.lower())
    digits = m.group(1).replace("-", "") if m else ""
    if len(digits) < UUID_PREFIX_MIN or text.isdigit():  # digits alone: an index
        return None
    hits = [d for d in devices
            if getattr(d, "device_uuid", "").replace("-", "").startswith(digits)]
    return hits, f"UUID {text!r}"


def match(devices: Sequence[PhysicalDeviceInfo], selector: int | str,
          source: str | None = None) -> PhysicalDeviceInfo:
    """The device a selector names: an index; a PCI bus id (0000:41:00.0); a UUID as
    `coopmat.info` shows it, or a unique prefix of it (at least 4 hex digits; nvidia-smi's
    GPU- before it allowed); else a case-insensitive name substring.

    A negative index is refused (as torch refuses device -1): no numbering counts from
    the end of the device list. `source` names where the selector came from (an
    environment variable, say): the error then names it, since the user may not know it
    is set."""
    text = str(selector).strip()
    identity = _by_identity(devices, text)
    if identity is not None and len(identity[0]) > 1:
        raise DeviceNotFoundError(
            (f"{source}={str(selector)!r}: " if source is not None else "")
            + f"{identity[1]} matches devices "
            + ", ".join(str(d.index) for d in identity[0])
            + "; give more of it (devices: " + _listing(devices, uuids=True) + ")")
    if identity is not None and identity[0]:
        found = identity[0][0]
        named = [d for d in devices if text.lower() in d.name.lower() and d is not found]
        if named and _pci_key(text) is None:  # 'a100': a UUID's start, or a name's part?
            raise DeviceNotFoundError(
                (f"{source}={str(selector)!r}: " if source is not None else "")
                + f"{text!r} starts the UUID of device {found.index} and is part of the name "
                f"of device {named[0].index}; give the index or more of the UUID "
                f"(devices: {_listing(devices, uuids=True)})")
        return found
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
        if identity is not None:
            what = f"no Vulkan device with {identity[1]} or a name containing it"
            raise DeviceNotFoundError(
                (f"{source}={str(selector)!r}: " if source is not None else "")
                + f"{what} (devices: {_listing(devices, uuids=True)})")
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
