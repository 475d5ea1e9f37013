"""The process-wide Vulkan instance and the list of physical devices."""

from __future__ import annotations

import threading
from typing import Any

from coopmat.device.vkffi import vk
from coopmat.errors import NoDeviceError, VulkanUnavailableError

API_VERSION_1_3 = (1 << 22) | (3 << 12)

_lock = threading.Lock()
_instance: Any = None


def instance() -> Any:
    """The VkInstance, created on first use. Layers come from the environment
    (VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation), not from code."""
    global _instance
    with _lock:
        if _instance is None:
            v = vk()
            app = v.VkApplicationInfo(
                pApplicationName="coopmat", applicationVersion=1,
                pEngineName="coopmat", engineVersion=1, apiVersion=API_VERSION_1_3,
            )
            info = v.VkInstanceCreateInfo(pApplicationInfo=app)
            try:
                _instance = v.vkCreateInstance(info, None)
            except v.VkError as exc:
                raise VulkanUnavailableError(
                    f"vkCreateInstance failed ({type(exc).__name__}): no usable Vulkan driver"
                ) from exc
        return _instance


def physical_devices() -> list[Any]:
    v = vk()
    try:
        devices = list(v.vkEnumeratePhysicalDevices(instance()))
    except v.VkError as exc:
        raise NoDeviceError(f"vkEnumeratePhysicalDevices failed ({type(exc).__name__})") from exc
    if not devices:
        raise NoDeviceError("Vulkan reports no physical device")
    return devices
