"""What the device layer reports, as plain data.

Names follow the Vulkan spec; `to_dict` gives the JSON form `python -m coopmat.info --json`
prints (keys documented in README.md), with component types and scopes by name and
unknown enum values kept as numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from coopmat.common.enums import (
    ComponentType,
    Scope,
    component_type_name,
    parse_component_type,
    parse_scope,
    scope_name,
)

# Assumed where a recorded device list does not say (the GPUs recorded without limits,
# NVIDIA's, report these).
RECORD_SHARED_MEMORY = 49152
RECORD_INVOCATIONS = 1024


def _type_json(value: ComponentType) -> str | int:
    return value.name if value.known else int(value)


def _scope_json(value: Scope) -> str | int:
    return value.name if value.name in Scope.__members__ else int(value)


def _get(d: dict[str, Any], *keys: str, default: Any = KeyError) -> Any:
    """The first of `keys` present in a recorded entry (formats name fields differently)."""
    for k in keys:
        if k in d:
            return d[k]
    if default is KeyError:
        raise KeyError(keys[0])
    return default


def _typed_fields(entry: Any) -> None:
    """A matrix list entry's component types and scope typed, whatever the caller passed:
    unknown values become members named by their number (enums.py), never bare ints."""
    for name in ("a_type", "b_type", "c_type", "result_type"):
        object.__setattr__(entry, name, ComponentType(getattr(entry, name)))
    object.__setattr__(entry, "scope", Scope(entry.scope))


@dataclass(frozen=True)
class CooperativeMatrixProperties:
    """One VkCooperativeMatrixPropertiesKHR entry, as the driver listed it."""

    M: int
    N: int
    K: int
    a_type: ComponentType
    b_type: ComponentType
    c_type: ComponentType
    result_type: ComponentType
    saturating_accumulation: bool
    scope: Scope

    def __post_init__(self) -> None:
        _typed_fields(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "M": self.M, "N": self.N, "K": self.K,
            "AType": _type_json(self.a_type), "BType": _type_json(self.b_type),
            "CType": _type_json(self.c_type), "ResultType": _type_json(self.result_type),
            "saturatingAccumulation": self.saturating_accumulation,
            "scope": _scope_json(self.scope),
        }

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> CooperativeMatrixProperties:
        """From a recorded entry: `coopmat.info --json`'s keys or the short ones of the
        recorded device lists in tests/data (A, B, C, R, sat)."""
        def get(*keys: str) -> Any:
            return _get(d, *keys)
        return cls(
            M=int(get("M", "MSize")), N=int(get("N", "NSize")), K=int(get("K", "KSize")),
            a_type=parse_component_type(get("AType", "A")),
            b_type=parse_component_type(get("BType", "B")),
            c_type=parse_component_type(get("CType", "C")),
            result_type=parse_component_type(get("ResultType", "R", "Result")),
            saturating_accumulation=bool(get("saturatingAccumulation", "sat")),
            scope=parse_scope(get("scope")),
        )

    def describe(self) -> str:
        t = component_type_name
        sat = " saturating" if self.saturating_accumulation else ""
        return (f"{self.M}x{self.N}x{self.K} A={t(self.a_type)} B={t(self.b_type)} "
                f"C={t(self.c_type)} Result={t(self.result_type)} scope={scope_name(self.scope)}"
                f"{sat}")


@dataclass(frozen=True)
class FlexibleDimensionsProperties:
    """One VkCooperativeMatrixFlexibleDimensionsPropertiesNV entry (VK_NV_cooperative_matrix2)."""

    m_granularity: int
    n_granularity: int
    k_granularity: int
    a_type: ComponentType
    b_type: ComponentType
    c_type: ComponentType
    result_type: ComponentType
    saturating_accumulation: bool
    scope: Scope
    workgroup_invocations: int

    def __post_init__(self) -> None:
        _typed_fields(self)

    @property
    def workgroup_scope(self) -> bool:
        return self.scope == Scope.WORKGROUP

    def component(self, which: str) -> ComponentType | None:
        """The named type field ('a_type', ...), None where its value is unknown."""
        value: ComponentType = getattr(self, which)
        return value if value.known else None

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> FlexibleDimensionsProperties:
        """From `coopmat.info --json`'s keys or the recorded text form's (see record.py)."""
        def get(*keys: str, default: Any = KeyError) -> Any:
            return _get(d, *keys, default=default)
        return cls(
            int(get("MGranularity")), int(get("NGranularity")), int(get("KGranularity")),
            parse_component_type(get("AType", "A")), parse_component_type(get("BType", "B")),
            parse_component_type(get("CType", "C")),
            parse_component_type(get("ResultType", "Result", "R")),
            bool(get("saturatingAccumulation", "saturating", "sat", default=False)),
            parse_scope(get("scope")), int(get("workgroupInvocations", default=0)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "MGranularity": self.m_granularity, "NGranularity": self.n_granularity,
            "KGranularity": self.k_granularity,
            "AType": _type_json(self.a_type), "BType": _type_json(self.b_type),
            "CType": _type_json(self.c_type), "ResultType": _type_json(self.result_type),
            "saturatingAccumulation": self.saturating_accumulation,
            "scope": _scope_json(self.scope),
            "workgroupInvocations": self.workgroup_invocations,
        }


@dataclass(frozen=True)
class DeviceLimits:
    """The properties and limits that shape the kernels."""

    subgroup_size: int
    min_subgroup_size: int
    max_subgroup_size: int
    required_subgroup_size_stages: int
    cooperative_matrix_supported_stages: int
    max_compute_shared_memory_size: int
    max_compute_work_group_invocations: int
    max_compute_work_group_size: tuple[int, int, int]
    max_compute_work_group_count: tuple[int, int, int]
    max_storage_buffer_range: int
    max_push_constants_size: int
    timestamp_period: float
    # VK_NV_cooperative_matrix2 properties; None where the extension is absent.
    cooperative_matrix_workgroup_scope_max_workgroup_size: int | None = None
    cooperative_matrix_flexible_dimensions_max_dimension: int | None = None
    cooperative_matrix_workgroup_scope_reserved_shared_memory: int | None = None
    # Whether compute shaders have subgroup arithmetic (VkPhysicalDeviceSubgroupProperties:
    # VK_SUBGROUP_FEATURE_ARITHMETIC_BIT and the compute stage; the gemv family's
    # reduction); None where not recorded (assumed: every driver with cooperative matrices
    # offers it).
    subgroup_arithmetic: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "subgroupSize": self.subgroup_size,
            "minSubgroupSize": self.min_subgroup_size,
            "maxSubgroupSize": self.max_subgroup_size,
            "requiredSubgroupSizeStages": stage_names(self.required_subgroup_size_stages),
            "cooperativeMatrixSupportedStages": stage_names(
                self.cooperative_matrix_supported_stages),
            "maxComputeSharedMemorySize": self.max_compute_shared_memory_size,
            "maxComputeWorkGroupInvocations": self.max_compute_work_group_invocations,
            "maxComputeWorkGroupSize": list(self.max_compute_work_group_size),
            "maxComputeWorkGroupCount": list(self.max_compute_work_group_count),
            "maxStorageBufferRange": self.max_storage_buffer_range,
            "maxPushConstantsSize": self.max_push_constants_size,
            "timestampPeriod": self.timestamp_period,
        }
        nv = {
            "cooperativeMatrixWorkgroupScopeMaxWorkgroupSize":
                self.cooperative_matrix_workgroup_scope_max_workgroup_size,
            "cooperativeMatrixFlexibleDimensionsMaxDimension":
                self.cooperative_matrix_flexible_dimensions_max_dimension,
            "cooperativeMatrixWorkgroupScopeReservedSharedMemory":
                self.cooperative_matrix_workgroup_scope_reserved_shared_memory,
        }
        d.update({k: v for k, v in nv.items() if v is not None})
        if self.subgroup_arithmetic is not None:
            d["subgroupArithmetic"] = self.subgroup_arithmetic
        return d


_STAGES = [
    (0x1, "VERTEX"), (0x2, "TESSELLATION_CONTROL"), (0x4, "TESSELLATION_EVALUATION"),
    (0x8, "GEOMETRY"), (0x10, "FRAGMENT"), (0x20, "COMPUTE"), (0x40, "TASK"), (0x80, "MESH"),
    (0x100, "RAYGEN"), (0x200, "ANY_HIT"), (0x400, "CLOSEST_HIT"), (0x800, "MISS"),
    (0x1000, "INTERSECTION"), (0x2000, "CALLABLE"),
]
SHADER_STAGE_COMPUTE = 0x20


def stage_names(mask: int) -> list[str]:
    names = [name for bit, name in _STAGES if mask & bit]
    rest = mask & ~sum(bit for bit, _ in _STAGES)
    if rest:
        names.append(hex(rest))
    return names


# The extensions the layer looks for, in the order `info` shows them.
RELEVANT_EXTENSIONS = (
    "VK_KHR_cooperative_matrix",
    "VK_NV_cooperative_matrix2",
    "VK_KHR_shader_bfloat16",
    "VK_EXT_shader_float8",
    "VK_KHR_pipeline_executable_properties",  # compiler statistics of our pipelines
    "VK_EXT_external_memory_host",  # numpy pages imported for transfers
    "VK_EXT_pipeline_robustness",  # kernels that need no driver bounds checks ask for none
)


@dataclass(frozen=True, repr=False)
class PhysicalDeviceInfo:
    """Everything the device layer knows of one VkPhysicalDevice (its repr names it in one
    line; `python -m coopmat.info` shows the rest)."""

    index: int
    name: str
    vendor_id: int
    device_id: int
    device_type: str
    api_version: str
    driver_version: str
    driver_name: str
    driver_info: str
    extensions: dict[str, bool]
    features: dict[str, bool]
    limits: DeviceLimits
    cooperative_matrix_properties: tuple[CooperativeMatrixProperties, ...]
    flexible_dimensions_properties: tuple[FlexibleDimensionsProperties, ...] = ()
    notes: tuple[str, ...] = field(default=())
    # Identity that outlives the enumeration order (which a driver or CUDA_VISIBLE_DEVICES
    # may change): VkPhysicalDeviceIDProperties.deviceUUID as 8-4-4-4-12 hex, and the
    # PCI address (domain:bus:device.function) where VK_EXT_pci_bus_info is offered; ""
    # where unknown.
    device_uuid: str = ""
    pci_bus_id: str = ""

    @property
    def vendor(self) -> str:
        return VENDORS.get(self.vendor_id, hex(self.vendor_id))

    @property
    def has_cooperative_matrix(self) -> bool:
        return self.extensions.get("VK_KHR_cooperative_matrix", False)

    def has(self, feature: str) -> bool:
        """Whether the device offers the feature (a VkPhysicalDevice*Features member name)."""
        return self.features.get(feature, False)

    @property
    def driver(self) -> str:
        """The driver in a few words: its name and version ('llvmpipe Mesa 24.0.5')."""
        return " ".join(x for x in (self.driver_name, self.driver_info or self.driver_version)
                        if x)

    def describe(self) -> str:
        """index, name, driver and type: what tells devices apart in a listing."""
        return f"{self.index}: {self.name!r}, driver {self.driver!r}, {self.device_type}"

    def __repr__(self) -> str:
        return f"<PhysicalDeviceInfo {self.describe()}>"


def format_uuid(raw: bytes) -> str:
    """16 bytes as the usual 8-4-4-4-12 lowercase hex (nvidia-smi's form, less its GPU-)."""
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def format_pci_bus_id(domain: int, bus: int, device: int, function: int) -> str:
    """lspci's form: 0000:41:00.0."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


VENDORS = {
    0x1002: "AMD", 0x1010: "ImgTec", 0x10DE: "NVIDIA", 0x13B5: "ARM", 0x5143: "Qualcomm",
    0x8086: "Intel", 0x106B: "Apple", 0x10005: "Mesa",
}
