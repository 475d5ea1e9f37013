"""The process-wide Vulkan instance and the list of physical devices."""

from __future__ import annotations

import os
import threading
from typing import Any

from coopmat.common.errors import DRIVER_ADVICE, NoDeviceError, VulkanUnavailableError
from coopmat.device.vkffi import vk

API_VERSION_1_3 = (1 << 22) | (3 << 12)

_lock = threading.Lock()
_instance: Any = None
_messenger: Any = None
_callback: Any = None

VALIDATION_ENV = "COOPMAT_VALIDATION"
VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"
# Validation errors reported since the instance was made (COOPMAT_VALIDATION=1 only);
# the test suite fails any test that adds to it.
validation_errors: list[str] = []

_SEVERITY_ERROR = 0x1000
_SEVERITY_WARNING = 0x100
_TYPE_GENERAL_VALIDATION = 0x1 | 0x2


def validation_requested() -> bool:
    return os.environ.get(VALIDATION_ENV) == "1"


def _messenger_info(v: Any) -> Any:
    global _callback

    @v.ffi.callback("PFN_vkDebugUtilsMessengerCallbackEXT")
    def on_message(severity: int, types: int, data: Any, user: Any) -> int:
        text = v.ffi.string(data.pMessage).decode(errors="replace") if data.pMessage else ""
        if severity & _SEVERITY_ERROR:
            validation_errors.append(text)
        return 0

    _callback = on_message  # cffi callbacks die with their last reference
    return v.VkDebugUtilsMessengerCreateInfoEXT(
        messageSeverity=_SEVERITY_ERROR | _SEVERITY_WARNING,
        messageType=_TYPE_GENERAL_VALIDATION, pfnUserCallback=on_message)


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
            layers: list[str] = []
            extensions: list[str] = []
            messenger_info = None
            if validation_requested():
                available = {p.layerName for p in v.vkEnumerateInstanceLayerProperties()}
                if VALIDATION_LAYER not in available:
                    raise VulkanUnavailableError(
                        f"{VALIDATION_ENV}=1 but {VALIDATION_LAYER} is not installed")
                layers, extensions = [VALIDATION_LAYER], ["VK_EXT_debug_utils"]
                messenger_info = _messenger_info(v)
            info = v.VkInstanceCreateInfo(
                pNext=messenger_info, pApplicationInfo=app,
                enabledLayerCount=len(layers), ppEnabledLayerNames=layers or None,
                enabledExtensionCount=len(extensions),
                ppEnabledExtensionNames=extensions or None)
            try:
                _instance = v.vkCreateInstance(info, None)
            except v.VkError as exc:
                raise VulkanUnavailableError(
                    f"no usable Vulkan driver: vkCreateInstance failed ({type(exc).__name__}). "
                    + DRIVER_ADVICE) from None
            if messenger_info is not None:
                global _messenger
                create = v.vkGetInstanceProcAddr(_instance, "vkCreateDebugUtilsMessengerEXT")
                _messenger = create(_instance, messenger_info, None)
        return _instance


def physical_devices() -> list[Any]:
    v = vk()
    try:
        devices = list(v.vkEnumeratePhysicalDevices(instance()))
    except v.VkError as exc:
        raise NoDeviceError(f"vkEnumeratePhysicalDevices failed ({type(exc).__name__}). "
                            + DRIVER_ADVICE) from None
    if not devices:
        raise NoDeviceError("Vulkan reports no physical device. " + DRIVER_ADVICE)
    return devices
