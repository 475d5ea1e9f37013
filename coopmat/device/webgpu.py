"""The WebGPU subgroup-matrix view of a device.

Implements "Properties > Vulkan" and "API" of the WebGPU subgroup matrix proposal
(specs/webgpu-subgroup-matrix-proposal.md): raw VkCooperativeMatrixPropertiesKHR entries
become GPUSubgroupMatrixConfig values, and the `subgroup-matrix` feature is available only
when all of its Vulkan requirements hold. Every dropped entry and every unmet requirement
carries its reason, so nothing disappears silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from coopmat.common.enums import ComponentType, Scope, component_type_name, scope_name
from coopmat.device.model import SHADER_STAGE_COMPUTE, CooperativeMatrixProperties

# VkComponentTypeKHR -> GPUSubgroupMatrixComponentType, the proposal's table.
WEBGPU_COMPONENT_TYPES: dict[int, str] = {
    ComponentType.FLOAT32: "f32",
    ComponentType.FLOAT16: "f16",
    ComponentType.SINT32: "i32",
    ComponentType.UINT32: "u32",
    ComponentType.SINT8: "i8",
    ComponentType.UINT8: "u8",
}


@dataclass(frozen=True)
class GPUSubgroupMatrixConfig:
    component_type: str
    result_component_type: str
    M: int
    N: int
    K: int

    def to_dict(self) -> dict[str, Any]:
        return {"componentType": self.component_type,
                "resultComponentType": self.result_component_type,
                "M": self.M, "N": self.N, "K": self.K}

    def __str__(self) -> str:
        return f"{self.component_type}->{self.result_component_type} {self.M}x{self.N}x{self.K}"


@dataclass(frozen=True)
class FilteredEntry:
    """One raw entry and what the filter made of it: a config, or the reasons it was dropped."""

    properties: CooperativeMatrixProperties
    config: GPUSubgroupMatrixConfig | None
    reasons: tuple[str, ...]

    @property
    def kept(self) -> bool:
        return self.config is not None


def exclusion_reasons(p: CooperativeMatrixProperties, *, shader_f16: bool,
                      device_shader_float16: bool) -> tuple[str, ...]:
    """Every rule of the proposal that `p` breaks (empty when it becomes a config)."""
    name = component_type_name
    reasons: list[str] = []
    if p.a_type != p.b_type:
        reasons.append(f"A type {name(p.a_type)} != B type {name(p.b_type)}")
    if p.c_type != p.result_type:
        reasons.append(f"C type {name(p.c_type)} != Result type {name(p.result_type)}")
    for role, t in (("A", p.a_type), ("B", p.b_type), ("C", p.c_type), ("Result", p.result_type)):
        if t not in WEBGPU_COMPONENT_TYPES:
            reasons.append(f"{role} type {name(t)} is not a WebGPU component type")
    if p.saturating_accumulation:
        reasons.append("saturatingAccumulation is true")
    if p.scope != Scope.SUBGROUP:
        reasons.append(f"scope is {scope_name(p.scope)}, not SUBGROUP")
    uses_f16 = ComponentType.FLOAT16 in (p.a_type, p.b_type, p.c_type, p.result_type)
    if uses_f16 and not shader_f16:
        reasons.append("f16 entry and shader-f16 not requested")
    if uses_f16 and not device_shader_float16:
        reasons.append("f16 entry and the device lacks shaderFloat16")
    return tuple(reasons)


def filter_configs(properties: Iterable[CooperativeMatrixProperties], *, shader_f16: bool,
                   device_shader_float16: bool) -> list[FilteredEntry]:
    """The raw list in driver order, each entry with its config or its exclusion reasons."""
    out = []
    for p in properties:
        reasons = exclusion_reasons(p, shader_f16=shader_f16,
                                    device_shader_float16=device_shader_float16)
        config = None if reasons else GPUSubgroupMatrixConfig(
            WEBGPU_COMPONENT_TYPES[p.a_type], WEBGPU_COMPONENT_TYPES[p.result_type], p.M, p.N, p.K)
        out.append(FilteredEntry(p, config, reasons))
    return out


def configs_of(entries: Iterable[FilteredEntry]) -> list[GPUSubgroupMatrixConfig]:
    return [e.config for e in entries if e.config is not None]


def unmet_requirements(features: Mapping[str, bool], supported_stages: int,
                       configs: list[GPUSubgroupMatrixConfig]) -> list[str]:
    """The `subgroup-matrix` feature's Vulkan requirements that do not hold, by name."""
    unmet = []
    if not features.get("cooperativeMatrix"):
        unmet.append("cooperativeMatrix")
    if not supported_stages & SHADER_STAGE_COMPUTE:
        unmet.append("cooperativeMatrixSupportedStages lacks COMPUTE")
    if not configs:
        unmet.append("subgroupMatrixConfigs is empty")
    for name in ("vulkanMemoryModel", "subgroupSizeControl", "computeFullSubgroups"):
        if not features.get(name):
            unmet.append(name)
    return unmet


@dataclass(frozen=True)
class SubgroupMatrixSupport:
    entries: tuple[FilteredEntry, ...]
    configs: tuple[GPUSubgroupMatrixConfig, ...]
    unmet: tuple[str, ...]

    @property
    def available(self) -> bool:
        return not self.unmet


def subgroup_matrix_support(properties: Iterable[CooperativeMatrixProperties],
                            features: Mapping[str, bool], supported_stages: int, *,
                            shader_f16: bool = True) -> SubgroupMatrixSupport:
    entries = filter_configs(properties, shader_f16=shader_f16,
                             device_shader_float16=bool(features.get("shaderFloat16")))
    configs = configs_of(entries)
    unmet = unmet_requirements(features, supported_stages, configs)
    return SubgroupMatrixSupport(tuple(entries), tuple(configs), tuple(unmet))
