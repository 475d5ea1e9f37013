"""Read features, properties and cooperative-matrix lists of a physical device."""

from __future__ import annotations

from typing import Any

from coopmat.device import vkffi
from coopmat.device.model import (
    RELEVANT_EXTENSIONS,
    SHADER_STAGE_COMPUTE,
    CooperativeMatrixProperties,
    DeviceLimits,
    FlexibleDimensionsProperties,
    PhysicalDeviceInfo,
    format_pci_bus_id,
    format_uuid,
)
from coopmat.device.vkffi import extra, new_struct, vk

# Feature names reported, grouped by the structure that holds them. The coopmat2,
# bfloat16 and float8 groups are read only when their extension is present.
CORE_FEATURES = {
    "VkPhysicalDeviceVulkan11Features": ("storageBuffer16BitAccess",),
    "VkPhysicalDeviceVulkan12Features": (
        "shaderFloat16", "shaderInt8", "storageBuffer8BitAccess",
        "vulkanMemoryModel", "vulkanMemoryModelDeviceScope",
    ),
    "VkPhysicalDeviceVulkan13Features": ("subgroupSizeControl", "computeFullSubgroups",
                                         "shaderIntegerDotProduct"),
}
COOPMAT_FEATURES = ("cooperativeMatrix", "cooperativeMatrixRobustBufferAccess")
COOPMAT2_FEATURES = (
    "cooperativeMatrixWorkgroupScope", "cooperativeMatrixFlexibleDimensions",
    "cooperativeMatrixReductions", "cooperativeMatrixConversions",
    "cooperativeMatrixPerElementOperations", "cooperativeMatrixTensorAddressing",
    "cooperativeMatrixBlockLoads",
)
BFLOAT16_FEATURES = ("shaderBFloat16Type", "shaderBFloat16CooperativeMatrix")
FLOAT8_FEATURES = ("shaderFloat8", "shaderFloat8CooperativeMatrix")
PIPELINE_STATS_FEATURES = ("pipelineExecutableInfo",)
# Lets a pipeline ask for no bounds checks on its storage buffers (coopmat's kernels keep
# every access in bounds themselves): NVIDIA's driver checks each load by default.
PIPELINE_ROBUSTNESS_FEATURES = ("pipelineRobustness",)
BASE_FEATURES = ("shaderInt16", "shaderInt64")
SUBGROUP_FEATURE_ARITHMETIC = 0x4  # VK_SUBGROUP_FEATURE_ARITHMETIC_BIT

# (extension, features structure of our own FFI, its sType, its feature names): read, and
# enabled at device creation, only where the extension is offered.
EXTENSION_FEATURE_STRUCTS: tuple[tuple[str, str, int, tuple[str, ...]], ...] = (
    ("VK_NV_cooperative_matrix2", "VkPhysicalDeviceCooperativeMatrix2FeaturesNV",
     vkffi.STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_FEATURES_NV, COOPMAT2_FEATURES),
    ("VK_KHR_shader_bfloat16", "VkPhysicalDeviceShaderBfloat16FeaturesKHR",
     vkffi.STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_BFLOAT16_FEATURES_KHR, BFLOAT16_FEATURES),
    ("VK_EXT_shader_float8", "VkPhysicalDeviceShaderFloat8FeaturesEXT",
     vkffi.STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT8_FEATURES_EXT, FLOAT8_FEATURES),
    ("VK_KHR_pipeline_executable_properties",
     "VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR",
     vkffi.STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR,
     PIPELINE_STATS_FEATURES),
    ("VK_EXT_pipeline_robustness", "VkPhysicalDevicePipelineRobustnessFeaturesEXT",
     vkffi.STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_ROBUSTNESS_FEATURES_EXT,
     PIPELINE_ROBUSTNESS_FEATURES),
)

_STYPE = {  # VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1x_FEATURES
    "VkPhysicalDeviceVulkan11Features": 49,
    "VkPhysicalDeviceVulkan12Features": 51,
    "VkPhysicalDeviceVulkan13Features": 53,
}

_DEVICE_TYPES = {0: "OTHER", 1: "INTEGRATED_GPU", 2: "DISCRETE_GPU", 3: "VIRTUAL_GPU", 4: "CPU"}


def _version(v: int) -> str:
    return f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


def _driver_version(vendor_id: int, v: int) -> str:
    if vendor_id == 0x10DE:  # NVIDIA packs 10.8.8.6 bits and prints the third two-digit
        build = v & 0x3F
        text = f"{v >> 22}.{(v >> 14) & 0xFF}.{(v >> 6) & 0xFF:02d}"
        return f"{text}.{build}" if build else text
    return _version(v)


def _extensions(pd: Any) -> set[str]:
    v = vk()
    return {e.extensionName for e in v.vkEnumerateDeviceExtensionProperties(pd, None)}


def _features(pd: Any, api: int, exts: set[str]) -> tuple[dict[str, bool], list[str]]:
    v = vk()
    notes: list[str] = []
    structs: dict[str, Any] = {}
    if api >= (1 << 22 | 3 << 12):
        for ctype, stype in _STYPE.items():
            structs[ctype] = new_struct(ctype, stype)
    else:
        notes.append(f"device API {_version(api)} < 1.3: Vulkan 1.1-1.3 features not read")
    groups: dict[str, tuple[str, ...]] = dict(CORE_FEATURES) if structs else {}
    if "VK_KHR_cooperative_matrix" in exts:
        structs["VkPhysicalDeviceCooperativeMatrixFeaturesKHR"] = new_struct(
            "VkPhysicalDeviceCooperativeMatrixFeaturesKHR",
            v.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR)
        groups["VkPhysicalDeviceCooperativeMatrixFeaturesKHR"] = COOPMAT_FEATURES
    for ext, ctype, stype, names in EXTENSION_FEATURE_STRUCTS:
        if ext in exts:
            structs[ctype] = new_struct(ctype, stype)
            groups[ctype] = names
    f2 = new_struct("VkPhysicalDeviceFeatures2", v.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2)
    vkffi.chain(f2, *structs.values())
    v.vkGetPhysicalDeviceFeatures2(pd, f2)

    out: dict[str, bool] = {}
    for name in BASE_FEATURES:
        out[name] = bool(getattr(f2.features, name))
    every = [*COOPMAT_FEATURES, *(n for g in CORE_FEATURES.values() for n in g),
             *BFLOAT16_FEATURES, *FLOAT8_FEATURES, *COOPMAT2_FEATURES,
             *PIPELINE_STATS_FEATURES, *PIPELINE_ROBUSTNESS_FEATURES]
    for name in every:
        out[name] = False
    for ctype, names in groups.items():
        for name in names:
            out[name] = bool(getattr(structs[ctype], name))
    return out, notes


def _limits(pd: Any, exts: set[str]) -> DeviceLimits:
    v = vk()
    subgroup = new_struct("VkPhysicalDeviceSubgroupProperties",
                          v.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES)
    size_control = new_struct(
        "VkPhysicalDeviceSubgroupSizeControlProperties",
        v.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES)
    chain_: list[Any] = [subgroup, size_control]
    coopmat = nv = None
    if "VK_KHR_cooperative_matrix" in exts:
        coopmat = new_struct("VkPhysicalDeviceCooperativeMatrixPropertiesKHR",
                             v.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_KHR)
        chain_.append(coopmat)
    if "VK_NV_cooperative_matrix2" in exts:
        nv = extra.new("VkPhysicalDeviceCooperativeMatrix2PropertiesNV *")
        nv.sType = vkffi.STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_PROPERTIES_NV
        chain_.append(nv)
    p2 = new_struct("VkPhysicalDeviceProperties2", v.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2)
    vkffi.chain(p2, *chain_)
    v.vkGetPhysicalDeviceProperties2(pd, p2)
    lim = p2.properties.limits
    return DeviceLimits(
        subgroup_size=subgroup.subgroupSize,
        min_subgroup_size=size_control.minSubgroupSize,
        max_subgroup_size=size_control.maxSubgroupSize,
        required_subgroup_size_stages=size_control.requiredSubgroupSizeStages,
        cooperative_matrix_supported_stages=coopmat.cooperativeMatrixSupportedStages
        if coopmat is not None else 0,
        max_compute_shared_memory_size=lim.maxComputeSharedMemorySize,
        max_compute_work_group_invocations=lim.maxComputeWorkGroupInvocations,
        max_compute_work_group_size=tuple(lim.maxComputeWorkGroupSize),  # type: ignore[arg-type]
        max_compute_work_group_count=tuple(lim.maxComputeWorkGroupCount),  # type: ignore[arg-type]
        max_storage_buffer_range=lim.maxStorageBufferRange,
        max_push_constants_size=lim.maxPushConstantsSize,
        timestamp_period=float(lim.timestampPeriod),
        cooperative_matrix_workgroup_scope_max_workgroup_size=(
            nv.cooperativeMatrixWorkgroupScopeMaxWorkgroupSize if nv is not None else None),
        cooperative_matrix_flexible_dimensions_max_dimension=(
            nv.cooperativeMatrixFlexibleDimensionsMaxDimension if nv is not None else None),
        cooperative_matrix_workgroup_scope_reserved_shared_memory=(
            nv.cooperativeMatrixWorkgroupScopeReservedSharedMemory if nv is not None else None),
        subgroup_arithmetic=bool(subgroup.supportedOperations & SUBGROUP_FEATURE_ARITHMETIC
                                 and subgroup.supportedStages & SHADER_STAGE_COMPUTE),
    )


def cooperative_matrix_properties(pd: Any) -> tuple[CooperativeMatrixProperties, ...]:
    """The driver's list, in the driver's order (its order of preference)."""
    v = vk()
    name = "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"
    from coopmat.device.instance import instance
    fn = vkffi.instance_proc(instance(), name)
    if fn is None:
        return ()
    count = v.ffi.new("uint32_t *")
    vkffi.check(name, fn(pd, count, v.ffi.NULL))
    arr = v.ffi.new("VkCooperativeMatrixPropertiesKHR[]", count[0])
    for i in range(count[0]):
        arr[i].sType = v.VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR
    vkffi.check(name, fn(pd, count, arr))
    return tuple(
        CooperativeMatrixProperties(
            M=e.MSize, N=e.NSize, K=e.KSize, a_type=e.AType, b_type=e.BType, c_type=e.CType,
            result_type=e.ResultType, saturating_accumulation=bool(e.saturatingAccumulation),
            scope=e.scope,
        )
        for e in (arr[i] for i in range(count[0]))
    )


def flexible_dimensions_properties(pd: Any) -> tuple[FlexibleDimensionsProperties, ...]:
    name = "vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV"
    from coopmat.device.instance import instance
    fn = vkffi.instance_proc(instance(), name, ffi=extra, ctype="PFN_" + name)
    if fn is None:
        return ()
    pd_ptr = extra.cast("void *", int(vk().ffi.cast("uintptr_t", pd)))
    count = extra.new("uint32_t *")
    vkffi.check(name, fn(pd_ptr, count, extra.NULL))
    arr = extra.new("VkCooperativeMatrixFlexibleDimensionsPropertiesNV[]", count[0])
    for i in range(count[0]):
        arr[i].sType = vkffi.STRUCTURE_TYPE_COOPERATIVE_MATRIX_FLEXIBLE_DIMENSIONS_PROPERTIES_NV
    vkffi.check(name, fn(pd_ptr, count, arr))
    return tuple(
        FlexibleDimensionsProperties(
            m_granularity=e.MGranularity, n_granularity=e.NGranularity,
            k_granularity=e.KGranularity, a_type=e.AType, b_type=e.BType, c_type=e.CType,
            result_type=e.ResultType, saturating_accumulation=bool(e.saturatingAccumulation),
            scope=e.scope, workgroup_invocations=e.workgroupInvocations,
        )
        for e in (arr[i] for i in range(count[0]))
    )


def read_device(index: int, pd: Any) -> PhysicalDeviceInfo:
    v = vk()
    exts = _extensions(pd)
    props = v.vkGetPhysicalDeviceProperties(pd)
    driver = new_struct("VkPhysicalDeviceDriverProperties",
                        v.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES)
    ids = new_struct("VkPhysicalDeviceIDProperties",
                     v.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES)
    chain_: list[Any] = [driver, ids]
    pci = None
    if "VK_EXT_pci_bus_info" in exts:
        pci = new_struct("VkPhysicalDevicePCIBusInfoPropertiesEXT",
                         v.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PCI_BUS_INFO_PROPERTIES_EXT)
        chain_.append(pci)
    p2 = new_struct("VkPhysicalDeviceProperties2", v.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2)
    vkffi.chain(p2, *chain_)
    v.vkGetPhysicalDeviceProperties2(pd, p2)
    uuid = bytes(v.ffi.buffer(ids.deviceUUID))
    features, notes = _features(pd, props.apiVersion, exts)
    has_coopmat = "VK_KHR_cooperative_matrix" in exts
    return PhysicalDeviceInfo(
        index=index,
        name=props.deviceName,
        vendor_id=props.vendorID,
        device_id=props.deviceID,
        device_type=_DEVICE_TYPES.get(props.deviceType, str(props.deviceType)),
        api_version=_version(props.apiVersion),
        driver_version=_driver_version(props.vendorID, props.driverVersion),
        driver_name=v.ffi.string(driver.driverName).decode(errors="replace"),
        driver_info=v.ffi.string(driver.driverInfo).decode(errors="replace"),
        extensions={e: e in exts for e in RELEVANT_EXTENSIONS},
        features=features,
        limits=_limits(pd, exts),
        cooperative_matrix_properties=cooperative_matrix_properties(pd) if has_coopmat else (),
        flexible_dimensions_properties=(
            flexible_dimensions_properties(pd) if "VK_NV_cooperative_matrix2" in exts else ()),
        notes=tuple(notes),
        device_uuid=format_uuid(uuid) if any(uuid) else "",
        pci_bus_id=format_pci_bus_id(pci.pciDomain, pci.pciBus, pci.pciDevice,
                                     pci.pciFunction) if pci is not None else "",
    )
