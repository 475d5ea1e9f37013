"""Logical device creation: enable exactly what the kernels need."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from coopmat.common.errors import MissingFeatureError, VulkanError
from coopmat.device import vkffi
from coopmat.device.model import PhysicalDeviceInfo
from coopmat.device.query import (
    COOPMAT2_FEATURES,
    EXTENSION_FEATURE_STRUCTS,
    PIPELINE_ROBUSTNESS_FEATURES,
    PIPELINE_STATS_FEATURES,
)
from coopmat.device.vkffi import new_struct, vk

# Without these no cooperative-matrix kernel can run (WebGPU's subgroup-matrix set).
REQUIRED_FEATURES = ("cooperativeMatrix", "vulkanMemoryModel", "subgroupSizeControl",
                     "computeFullSubgroups")
# Enabled when present: they widen the set of configs the kernels can use.
OPTIONAL_FEATURES = (
    "vulkanMemoryModelDeviceScope", "shaderFloat16", "shaderInt8", "shaderInt16",
    "storageBuffer16BitAccess", "storageBuffer8BitAccess",
    "shaderBFloat16Type", "shaderBFloat16CooperativeMatrix",
    "shaderFloat8", "shaderFloat8CooperativeMatrix", "shaderIntegerDotProduct",
    *COOPMAT2_FEATURES,
    *PIPELINE_STATS_FEATURES, *PIPELINE_ROBUSTNESS_FEATURES,
)
OPTIONAL_EXTENSIONS = ("VK_NV_cooperative_matrix2", "VK_KHR_shader_bfloat16",
                       "VK_EXT_shader_float8", "VK_KHR_pipeline_executable_properties",
                       "VK_EXT_external_memory_host", "VK_EXT_pipeline_robustness")


def missing_requirements(info: PhysicalDeviceInfo) -> list[str]:
    missing = []
    if not info.extensions.get("VK_KHR_cooperative_matrix"):
        missing.append("extension VK_KHR_cooperative_matrix")
    major, minor = (int(x) for x in info.api_version.split(".")[:2])
    if (major, minor) < (1, 3):
        missing.append(f"Vulkan 1.3 (device has {info.api_version})")
    missing += [f"feature {f}" for f in REQUIRED_FEATURES if not info.features.get(f)]
    return missing


@dataclass(repr=False)
class Device:
    """A VkDevice with one compute queue (and, where the device has a transfer-only
    queue family, up to two copy queues of it), and what was enabled on it."""

    info: PhysicalDeviceInfo
    physical: Any
    handle: Any
    queue: Any
    queue_family_index: int
    enabled_features: frozenset[str]
    enabled_extensions: tuple[str, ...]
    timestamp_valid_bits: int
    queue_lock: threading.Lock = field(default_factory=threading.Lock)
    # Queues of a transfer-only family (the GPU's copy engines: they copy while the
    # compute queue runs kernels), one for each direction where the family has two.
    copy_queues: tuple[Any, ...] = ()
    copy_queue_family_index: int | None = None
    copy_queue_locks: tuple[threading.Lock, ...] = ()

    @property
    def queue_family_indices(self) -> tuple[int, ...]:
        """The families buffers are shared between (concurrent sharing mode)."""
        if self.copy_queue_family_index is None:
            return (self.queue_family_index,)
        return (self.queue_family_index, self.copy_queue_family_index)

    def has(self, feature: str) -> bool:
        return feature in self.enabled_features

    def __repr__(self) -> str:  # the Vulkan handles are cffi pointers: no use to a reader
        state = "" if self.handle is not None else ", destroyed"
        return f"<Device {self.info.describe()}{state}>"

    def destroy(self) -> None:
        if self.handle is not None:
            vk().vkDestroyDevice(self.handle, None)
            self.handle = None


def _compute_queue_family(physical: Any) -> tuple[int, int]:
    v = vk()
    families = v.vkGetPhysicalDeviceQueueFamilyProperties(physical)
    # Prefer a compute family without graphics: on discrete GPUs it is the async queue.
    ranked = sorted(
        (i for i, f in enumerate(families) if f.queueFlags & v.VK_QUEUE_COMPUTE_BIT),
        key=lambda i: bool(families[i].queueFlags & v.VK_QUEUE_GRAPHICS_BIT),
    )
    if not ranked:
        raise MissingFeatureError("the device has no compute queue")
    # Graphics+compute families are the ones guaranteed to support timestamps well; keep
    # the first that reports timestamp bits.
    for i in ranked:
        if families[i].timestampValidBits:
            return i, families[i].timestampValidBits
    return ranked[0], 0


def create_device(info: PhysicalDeviceInfo, physical: Any) -> Device:
    missing = missing_requirements(info)
    if missing:
        raise MissingFeatureError(
            f"device {info.index} ({info.name}) lacks what cooperative-matrix kernels need: "
            + ", ".join(missing))
    v = vk()
    features = info.features
    enable = {f for f in (*REQUIRED_FEATURES, *OPTIONAL_FEATURES) if features.get(f)}
    extensions = ["VK_KHR_cooperative_matrix"] + [
        e for e in OPTIONAL_EXTENSIONS if info.extensions.get(e)]
    for ext, _, _, names in EXTENSION_FEATURE_STRUCTS:  # no extension, no feature of it
        if ext not in extensions:
            enable -= set(names)

    f2 = new_struct("VkPhysicalDeviceFeatures2", v.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2)
    f2.features.shaderInt16 = "shaderInt16" in enable
    f11 = new_struct("VkPhysicalDeviceVulkan11Features", 49)
    f11.storageBuffer16BitAccess = "storageBuffer16BitAccess" in enable
    f12 = new_struct("VkPhysicalDeviceVulkan12Features", 51)
    for name in ("shaderFloat16", "shaderInt8", "storageBuffer8BitAccess", "vulkanMemoryModel",
                 "vulkanMemoryModelDeviceScope"):
        setattr(f12, name, name in enable)
    f12.timelineSemaphore = True  # core since 1.2; every submission signals a timeline
    f13 = new_struct("VkPhysicalDeviceVulkan13Features", 53)
    f13.subgroupSizeControl = True
    f13.computeFullSubgroups = True
    f13.shaderIntegerDotProduct = "shaderIntegerDotProduct" in enable
    coopmat = new_struct("VkPhysicalDeviceCooperativeMatrixFeaturesKHR",
                         v.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR)
    coopmat.cooperativeMatrix = True
    structs: list[Any] = [f2, f11, f12, f13, coopmat]
    for ext, ctype, stype, names in EXTENSION_FEATURE_STRUCTS:
        if ext in extensions:
            s = new_struct(ctype, stype)
            for name in names:
                setattr(s, name, name in enable)
            structs.append(s)
    vkffi.chain(*structs)

    family, ts_bits = _compute_queue_family(physical)
    queue_infos = [v.VkDeviceQueueCreateInfo(queueFamilyIndex=family, queueCount=1,
                                             pQueuePriorities=[1.0])]
    copy_family, copy_count = _copy_queue_family(physical)
    if copy_family is not None:
        queue_infos.append(v.VkDeviceQueueCreateInfo(
            queueFamilyIndex=copy_family, queueCount=copy_count,
            pQueuePriorities=[1.0] * copy_count))
    create = v.VkDeviceCreateInfo(
        pNext=vkffi.as_vk_pointer(f2), queueCreateInfoCount=len(queue_infos),
        pQueueCreateInfos=queue_infos,
        enabledExtensionCount=len(extensions), ppEnabledExtensionNames=extensions,
        pEnabledFeatures=None,
    )
    try:
        handle = v.vkCreateDevice(physical, create, None)
    except v.VkError as exc:
        raise VulkanError("vkCreateDevice", type(exc).__name__) from exc
    queue = v.vkGetDeviceQueue(handle, family, 0)
    copies = tuple(v.vkGetDeviceQueue(handle, copy_family, i) for i in range(copy_count)) \
        if copy_family is not None else ()
    return Device(info=info, physical=physical, handle=handle, queue=queue,
                  queue_family_index=family, enabled_features=frozenset(enable),
                  enabled_extensions=tuple(extensions), timestamp_valid_bits=ts_bits,
                  copy_queues=copies, copy_queue_family_index=copy_family,
                  copy_queue_locks=tuple(threading.Lock() for _ in copies))


COPY_QUEUES_ENV = "COOPMAT_COPY_QUEUES"


def _copy_queue_family(physical: Any) -> tuple[int | None, int]:
    """(family, queues to take) of a transfer-only queue family, or (None, 0). Only with
    COOPMAT_COPY_QUEUES=1 (coopmat.dask's workers set it): products of an A kept
    imported then overlap A's copies, the kernels and D's copies, which a process whose
    arrays seldom repeat would not gain from enough to share every buffer between queue
    families by default (docs/design.md, data path)."""
    value = os.environ.get(COPY_QUEUES_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{COPY_QUEUES_ENV}={value!r}: use 1 (open copy queues) or 0")
    if value != "1":
        return None, 0
    v = vk()
    for i, f in enumerate(v.vkGetPhysicalDeviceQueueFamilyProperties(physical)):
        flags = f.queueFlags
        if flags & v.VK_QUEUE_TRANSFER_BIT and not flags & (
                v.VK_QUEUE_GRAPHICS_BIT | v.VK_QUEUE_COMPUTE_BIT):
            return i, min(2, f.queueCount)
    return None, 0
