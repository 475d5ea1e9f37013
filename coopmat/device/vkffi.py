"""Access to the `vulkan` cffi binding, plus what its 1.3.275 headers lack.

The binding is imported lazily so that `import coopmat` works on a machine without a
Vulkan loader; the first real use raises VulkanUnavailableError instead.

Structures newer than 1.3.275 (VK_NV_cooperative_matrix2, VK_KHR_shader_bfloat16,
VK_EXT_shader_float8) are declared in a small FFI of our own. Both FFIs describe plain C
memory, so a structure of ours is chained into the binding's pNext by address.
"""

from __future__ import annotations

import functools
from typing import Any

import cffi

from coopmat.common.errors import DRIVER_ADVICE, VulkanUnavailableError

EXTRA_CDEF = """
typedef struct {
    int sType; void* pNext;
    uint32_t cooperativeMatrixWorkgroupScope;
    uint32_t cooperativeMatrixFlexibleDimensions;
    uint32_t cooperativeMatrixReductions;
    uint32_t cooperativeMatrixConversions;
    uint32_t cooperativeMatrixPerElementOperations;
    uint32_t cooperativeMatrixTensorAddressing;
    uint32_t cooperativeMatrixBlockLoads;
} VkPhysicalDeviceCooperativeMatrix2FeaturesNV;

typedef struct {
    int sType; void* pNext;
    uint32_t cooperativeMatrixWorkgroupScopeMaxWorkgroupSize;
    uint32_t cooperativeMatrixFlexibleDimensionsMaxDimension;
    uint32_t cooperativeMatrixWorkgroupScopeReservedSharedMemory;
} VkPhysicalDeviceCooperativeMatrix2PropertiesNV;

typedef struct {
    int sType; void* pNext;
    uint32_t MGranularity; uint32_t NGranularity; uint32_t KGranularity;
    int AType; int BType; int CType; int ResultType;
    uint32_t saturatingAccumulation;
    int scope;
    uint32_t workgroupInvocations;
} VkCooperativeMatrixFlexibleDimensionsPropertiesNV;

typedef struct {
    int sType; void* pNext;
    uint32_t shaderBFloat16Type;
    uint32_t shaderBFloat16DotProduct;
    uint32_t shaderBFloat16CooperativeMatrix;
} VkPhysicalDeviceShaderBfloat16FeaturesKHR;

typedef struct {
    int sType; void* pNext;
    uint32_t shaderFloat8;
    uint32_t shaderFloat8CooperativeMatrix;
} VkPhysicalDeviceShaderFloat8FeaturesEXT;

typedef int (*PFN_vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV)(
    void* physicalDevice, uint32_t* pPropertyCount,
    VkCooperativeMatrixFlexibleDimensionsPropertiesNV* pProperties);
"""

# VkStructureType values of the feature structures query.EXTENSION_FEATURE_STRUCTS lists,
# as numbers from the registry: most are absent from the 1.3.275 binding, and the table is
# built at import, before the binding (which needs a Vulkan loader) is loaded.
STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_FEATURES_NV = 1000593000
STRUCTURE_TYPE_COOPERATIVE_MATRIX_FLEXIBLE_DIMENSIONS_PROPERTIES_NV = 1000593001
STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_PROPERTIES_NV = 1000593002
STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_BFLOAT16_FEATURES_KHR = 1000141000
STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT8_FEATURES_EXT = 1000567000
STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR = 1000269000
STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_ROBUSTNESS_FEATURES_EXT = 1000068001

extra = cffi.FFI()
extra.cdef(EXTRA_CDEF)


@functools.cache
def vk() -> Any:
    """The `vulkan` module; raises VulkanUnavailableError when no loader is installed."""
    # `from None`: the binding's own exception says less than ours and would print as a
    # second traceback above it.
    try:
        import vulkan
    except ImportError:
        raise VulkanUnavailableError(
            "the `vulkan` Python package is not installed (pip install 'vulkan>=1.3.275.1')"
        ) from None
    except OSError:  # the binding dlopens libvulkan.so.1 at import
        raise VulkanUnavailableError(
            "no Vulkan loader found (libvulkan.so.1): install the loader (on Debian, "
            "libvulkan1) and a driver. " + DRIVER_ADVICE) from None
    return vulkan


def address(cdata: Any) -> int:
    """The address a cdata pointer (of either FFI) points at."""
    return int(extra.cast("uintptr_t", cdata))


def as_vk_pointer(cdata: Any) -> Any:
    """`cdata` (either FFI) as a `void *` of the binding's FFI, for a pNext field."""
    return vk().ffi.cast("void *", address(cdata))


def chain(*structs: Any) -> Any:
    """Link structures through pNext in the order given; returns the first one's pointer.

    Each element is a cdata pointer of either FFI. The caller keeps them alive.
    """
    for cur, nxt in zip(structs, structs[1:], strict=False):
        try:
            cur.pNext = as_vk_pointer(nxt)
        except TypeError:  # a structure of our own FFI wants its own pointer type
            cur.pNext = extra.cast("void *", address(nxt))
    return structs[0]


def new_struct(ctype: str, stype: int) -> Any:
    """A zeroed structure with its sType set, from whichever FFI declares `ctype`."""
    ffi = vk().ffi
    try:
        p = ffi.new(ctype + " *")
    except (cffi.FFIError, ffi.error):  # not in the binding's headers: one of ours
        p = extra.new(ctype + " *")
    p.sType = stype
    return p


def instance_proc(instance: Any, name: str, ffi: Any = None, ctype: str | None = None) -> Any:
    """A raw instance-level function pointer (not the binding's wrapper), or None if absent.

    The binding's wrappers allocate output arrays without setting each element's sType,
    which the spec requires; we call the raw pointer with arrays we fill ourselves.
    """
    v = vk()
    fn = v.lib.vkGetInstanceProcAddr(instance, name.encode())
    if fn == v.ffi.NULL:
        return None
    ffi = ffi or v.ffi
    return ffi.cast(ctype or f"PFN_{name}", int(v.ffi.cast("uintptr_t", fn)))


# VkResult codes that the 1.3.275 binding names no exception for.
_RESULT_NAMES = {
    -1000069000: "VK_ERROR_OUT_OF_POOL_MEMORY",
    -1000072003: "VK_ERROR_INVALID_EXTERNAL_HANDLE",
    -1000161000: "VK_ERROR_FRAGMENTATION",
    -1000257000: "VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS",
}


def result_name(result: int) -> str:
    if result in _RESULT_NAMES:
        return _RESULT_NAMES[result]
    v = vk()
    for key in dir(v):
        if (key.startswith("VK_ERROR_") or key in ("VK_INCOMPLETE", "VK_NOT_READY", "VK_TIMEOUT")) \
                and getattr(v, key) == result:
            return key
    return f"VkResult({result})"


def check(call: str, result: int) -> None:
    """For raw `lib.` calls, which return a VkResult instead of raising."""
    if result < 0:
        from coopmat.common.errors import VulkanError
        raise VulkanError(call, result_name(result))
