"""Exceptions coopmat raises. Each names what went wrong in the user's terms."""

from __future__ import annotations

# Said after any "no usable driver" error: which drivers offer what coopmat needs.
DRIVER_ADVICE = (
    "coopmat needs a Vulkan driver with VK_KHR_cooperative_matrix: NVIDIA's driver, Mesa >= 23.3 "
    "RADV (AMD RDNA3 and newer), Mesa ANV (Intel) or Mesa >= 26 lavapipe (CPU); Debian 12's "
    "Mesa 22.3 offers it on no device. In a coopmat checkout, scripts/run runs a command in a "
    "CPU sandbox with lavapipe")


class CoopmatError(Exception):
    """Base class of every coopmat error."""


class VulkanUnavailableError(CoopmatError):
    """No Vulkan loader (libvulkan.so.1) or no Vulkan instance could be created."""


class NoDeviceError(CoopmatError):
    """Vulkan works but reports no physical device at all."""


class DeviceNotFoundError(CoopmatError):
    """A device selector (argument or COOPMAT_DEVICE) matched no device."""


class NoCooperativeMatrixDeviceError(CoopmatError):
    """No device (or not the selected one) offers VK_KHR_cooperative_matrix."""


class MissingFeatureError(CoopmatError):
    """The device lacks a feature, extension or limit that the kernels need."""


class OutOfDeviceMemoryError(MemoryError, CoopmatError):
    """The problem does not fit the device's memory (or an allocation failed).

    MemoryError comes first so the class pickles through tblib (as distributed sends a
    task's error): tblib rebuilds an exception with its first base's __new__."""


class VulkanError(CoopmatError):
    """A Vulkan call failed; the message names the call and the VkResult."""

    def __init__(self, call: str, result: int | str):
        self.call = call
        self.result = result
        super().__init__(f"{call} failed with {result}")


class DeviceLostError(VulkanError):
    """The device was lost (VK_ERROR_DEVICE_LOST) while running submitted work."""


class DeviceMismatchError(CoopmatError, ValueError):
    """Operands of one operation live on different devices."""
