"""Calling Vulkan so that failures become VulkanError naming the call and the VkResult."""

from __future__ import annotations

import re
from typing import Any

from coopmat.common.errors import OutOfDeviceMemoryError, VulkanError
from coopmat.device.vkffi import check, result_name, vk

__all__ = ["call", "check", "result_of"]


def result_of(exc: BaseException) -> str:
    """VkErrorOutOfDeviceMemory -> VK_ERROR_OUT_OF_DEVICE_MEMORY."""
    name = type(exc).__name__
    words = re.findall(r"[A-Z][a-z0-9]*", name[2:] if name.startswith("Vk") else name)
    return "VK_" + "_".join(w.upper() for w in words)


def call(fn: Any, *args: Any) -> Any:
    """fn(*args) through the binding; a VkError becomes VulkanError(fn name, VkResult)."""
    v = vk()
    try:
        return fn(*args)
    except v.VkError as exc:
        result = result_of(exc)
        name = getattr(fn, "__name__", str(fn))
        if result in ("VK_ERROR_OUT_OF_DEVICE_MEMORY", "VK_ERROR_OUT_OF_HOST_MEMORY"):
            raise OutOfDeviceMemoryError(f"{name} failed with {result}") from exc
        raise VulkanError(name, result) from exc
    except KeyError as exc:  # the binding has no exception class for newer VkResults
        code = exc.args[0] if exc.args else None
        if not isinstance(code, int) or code >= 0:
            raise
        raise VulkanError(getattr(fn, "__name__", str(fn)), result_name(code)) from None


