"""Device layer: Vulkan instance, physical devices, their cooperative-matrix properties,
the WebGPU config filter, and logical device creation.

Typical use::

    from coopmat import device
    for info in device.enumerate_devices(): ...
    dev = device.open_device()          # argument, $COOPMAT_DEVICE, or the default choice
"""

from __future__ import annotations

import threading

from coopmat.common.enums import ComponentType, Scope
from coopmat.device.logical import Device, create_device, missing_requirements
from coopmat.device.model import (
    CooperativeMatrixProperties,
    DeviceLimits,
    FlexibleDimensionsProperties,
    PhysicalDeviceInfo,
)
from coopmat.device.select import match, select
from coopmat.device.webgpu import (
    FilteredEntry,
    GPUSubgroupMatrixConfig,
    SubgroupMatrixSupport,
    filter_configs,
    subgroup_matrix_support,
)

__all__ = [
    "ComponentType", "CooperativeMatrixProperties", "Device", "DeviceLimits", "FilteredEntry",
    "FlexibleDimensionsProperties", "GPUSubgroupMatrixConfig", "PhysicalDeviceInfo", "Scope",
    "SubgroupMatrixSupport", "enumerate_devices", "filter_configs", "match",
    "missing_requirements", "open_device", "select", "select_info", "subgroup_matrix_support",
    "support",
]

_lock = threading.Lock()
_infos: list[PhysicalDeviceInfo] | None = None
_devices: dict[int, Device] = {}


def enumerate_devices() -> list[PhysicalDeviceInfo]:
    """Every physical device, read once per process."""
    global _infos
    with _lock:
        if _infos is None:
            from coopmat.device.instance import physical_devices
            from coopmat.device.query import read_device
            _infos = [read_device(i, pd) for i, pd in enumerate(physical_devices())]
        return list(_infos)


def select_info(selector: int | str | None = None) -> PhysicalDeviceInfo:
    return select(enumerate_devices(), selector)


def support(info: PhysicalDeviceInfo, *, shader_f16: bool = True) -> SubgroupMatrixSupport:
    """The WebGPU subgroup-matrix view of `info`."""
    return subgroup_matrix_support(info.cooperative_matrix_properties, info.features,
                                   info.limits.cooperative_matrix_supported_stages,
                                   shader_f16=shader_f16)


def open_device(selector: int | str | None = None) -> Device:
    """The logical device for `selector` (see `select`), created once and reused."""
    info = select_info(selector)
    with _lock:
        dev = _devices.get(info.index)
        if dev is None:
            from coopmat.device.instance import physical_devices
            dev = create_device(info, physical_devices()[info.index])
            _devices[info.index] = dev
        return dev
