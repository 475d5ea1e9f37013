"""coopmat: cooperative-matrix (tensor-core) GEMM for numpy through Vulkan.

    import coopmat
    d = coopmat.matmul(a, b)                   # numpy in, numpy out, on the GPU
    coopmat.devices(); coopmat.configs()       # what `python -m coopmat.info` shows
"""

from __future__ import annotations

from coopmat.errors import (
    CoopmatError,
    DeviceNotFoundError,
    MissingFeatureError,
    NoCooperativeMatrixDeviceError,
    NoDeviceError,
    OutOfDeviceMemoryError,
    VulkanError,
    VulkanUnavailableError,
)

__version__ = "0.1.0"

_LINALG = ("configs", "devices", "last_kernel_time", "matmul", "supported_dtypes")


def __getattr__(name: str) -> object:
    # The GEMM API pulls in codegen and dispatch; the device layer and `coopmat.info`
    # should not pay for that, so it is imported on first use.
    if name in _LINALG:
        from coopmat import linalg
        return getattr(linalg, name)
    raise AttributeError(f"module 'coopmat' has no attribute {name!r}")

__all__ = [
    "CoopmatError", "DeviceNotFoundError", "MissingFeatureError",
    "NoCooperativeMatrixDeviceError", "NoDeviceError", "OutOfDeviceMemoryError", "VulkanError",
    "VulkanUnavailableError", "configs", "devices", "last_kernel_time", "matmul",
    "supported_dtypes",
]
