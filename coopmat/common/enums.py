"""Vulkan enum values the cooperative-matrix layer speaks in.

The `vulkan` 1.3.275 binding predates VK_KHR_shader_bfloat16, VK_EXT_shader_float8 and
VK_NV_cooperative_matrix2, so the values are spelled out from the registry rather than read
from the binding: here, and VkComponentTypeKHR beside the element-type table (dtypes.py).
"""

from __future__ import annotations

# VkComponentTypeKHR lives with the element-type table, whose rows give its size and kind.
from coopmat.common.dtypes import ComponentType
from coopmat.common.vkenum import VkEnum

__all__ = ["ComponentType", "Scope", "component_type_name", "parse_component_type",
           "parse_scope", "scope_name"]


class Scope(VkEnum):
    """VkScopeKHR (the same numbers as SPIR-V's Scope)."""

    DEVICE = 1
    WORKGROUP = 2
    SUBGROUP = 3
    QUEUE_FAMILY = 5


def component_type_name(value: int) -> str:
    """The enum's name without prefix, or the bare number for a value we don't know."""
    return ComponentType(value).name


def scope_name(value: int) -> str:
    return Scope(value).name


def parse_component_type(value: int | str) -> ComponentType:
    """Accept a number, a short name (FLOAT16) or a full one (VK_COMPONENT_TYPE_FLOAT16_KHR).

    Unknown numbers stay numbers: they are kept, never dropped.
    """
    if isinstance(value, int):
        return ComponentType(value)
    s = value.strip()
    if s.lstrip("-").isdigit():
        return ComponentType(int(s))
    s = s.removeprefix("VK_COMPONENT_TYPE_")
    for suffix in ("_KHR", "_EXT", "_NV"):
        s = s.removesuffix(suffix)
    aliases = {"FLOAT_E4M3": "FLOAT8_E4M3", "FLOAT_E5M2": "FLOAT8_E5M2"}
    s = aliases.get(s, s)
    if s + "_NV" in ComponentType.__members__:
        return ComponentType[s + "_NV"]
    return ComponentType[s]


def parse_scope(value: int | str) -> Scope:
    if isinstance(value, int):
        return Scope(value)
    s = value.strip()
    if s.isdigit():
        return Scope(int(s))
    s = s.removeprefix("VK_SCOPE_").removesuffix("_KHR").removesuffix("_NV")
    return Scope[s]
