"""coopmat: cooperative-matrix (tensor-core) GEMM for numpy through Vulkan.

    import coopmat
    d = coopmat.matmul(a, b)                   # numpy in, numpy out, on the GPU
    y = coopmat.linear(x, w, bias, "gelu_tanh")  # act(x @ w.T + bias), one fused kernel
    w = coopmat.asarray(b)                     # kept on the GPU
    y = (coopmat.asarray(a) @ w).numpy()       # queued there; .numpy() waits
    q = coopmat.quantize(weight, "q8_0")       # GGUF blocks on the GPU (or from_gguf)
    y = coopmat.matmul(x, q.T)                 # dequantized inside the GEMM
    o = coopmat.attention(q, k, v, causal=True)  # fused softmax(q k^T / sqrt(E)) v
    coopmat.devices(); coopmat.configs()       # what `python -m coopmat.info` shows
"""

from __future__ import annotations

from coopmat.common.errors import (
    CoopmatError,
    DeviceLostError,
    DeviceMismatchError,
    DeviceNotFoundError,
    MissingFeatureError,
    NoCooperativeMatrixDeviceError,
    NoDeviceError,
    OutOfDeviceMemoryError,
    VulkanError,
    VulkanUnavailableError,
)

__version__ = "0.1.0"

_MATMUL = ("configs", "devices", "last_kernel_time", "linear", "matmul", "supported_dtypes")
_ARRAY = ("Array", "asarray", "empty", "synchronize", "zeros")
_QUANT = ("QuantizedArray", "from_gguf", "quantize")
_OPTIONS = ("get_options", "options", "reload_environment", "set_options")
_ATTENTION = ("attention",)


def __getattr__(name: str) -> object:
    # The GEMM API pulls in codegen and dispatch; the device layer and `coopmat.info`
    # should not pay for that, so it is imported on first use, then kept as a module
    # attribute (later lookups skip this function: `coopmat.matmul` in a decode loop).
    if name in _MATMUL:
        from coopmat.api import matmul as module
    elif name in _ARRAY:
        from coopmat.api import array as module  # type: ignore[no-redef]
    elif name in _QUANT:
        from coopmat.api import quantized as module  # type: ignore[no-redef]
    elif name in _OPTIONS:
        from coopmat.policy import options as module  # type: ignore[no-redef]
    elif name in _ATTENTION:
        from coopmat.api import attention as module  # type: ignore[no-redef]
    else:
        raise AttributeError(f"module 'coopmat' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value

__all__ = [
    "Array", "CoopmatError", "DeviceLostError", "DeviceMismatchError", "DeviceNotFoundError",
    "MissingFeatureError", "QuantizedArray",
    "NoCooperativeMatrixDeviceError", "NoDeviceError", "OutOfDeviceMemoryError", "VulkanError",
    "VulkanUnavailableError", "asarray", "attention", "configs", "devices", "empty",
    "from_gguf", "get_options", "last_kernel_time", "linear", "matmul", "options", "quantize",
    "reload_environment", "set_options", "supported_dtypes", "synchronize", "zeros",
]
