"""Vulkan enum values the cooperative-matrix layer speaks in.

The `vulkan` 1.3.275 binding predates VK_KHR_shader_bfloat16, VK_EXT_shader_float8 and
VK_NV_cooperative_matrix2, so the values are spelled out here from the registry rather
than read from the binding.
"""

from __future__ import annotations

import enum


class ComponentType(enum.IntEnum):
    """VkComponentTypeKHR."""

    FLOAT16 = 0
    FLOAT32 = 1
    FLOAT64 = 2
    SINT8 = 3
    SINT16 = 4
    SINT32 = 5
    SINT64 = 6
    UINT8 = 7
    UINT16 = 8
    UINT32 = 9
    UINT64 = 10
    BFLOAT16 = 1000141000  # VK_KHR_shader_bfloat16
    SINT8_PACKED_NV = 1000491000  # VK_NV_cooperative_vector
    UINT8_PACKED_NV = 1000491001  # VK_NV_cooperative_vector
    FLOAT8_E4M3 = 1000491002  # VK_EXT_shader_float8
    FLOAT8_E5M2 = 1000491003  # VK_EXT_shader_float8

    @property
    def bits(self) -> int:
        return _BITS[self]

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_signed(self) -> bool:
        return self in _SIGNED


_BITS = {
    ComponentType.FLOAT16: 16, ComponentType.FLOAT32: 32, ComponentType.FLOAT64: 64,
    ComponentType.SINT8: 8, ComponentType.SINT16: 16, ComponentType.SINT32: 32,
    ComponentType.SINT64: 64, ComponentType.UINT8: 8, ComponentType.UINT16: 16,
    ComponentType.UINT32: 32, ComponentType.UINT64: 64, ComponentType.BFLOAT16: 16,
    ComponentType.SINT8_PACKED_NV: 32, ComponentType.UINT8_PACKED_NV: 32,
    ComponentType.FLOAT8_E4M3: 8, ComponentType.FLOAT8_E5M2: 8,
}
_FLOATS = {
    ComponentType.FLOAT16, ComponentType.FLOAT32, ComponentType.FLOAT64,
    ComponentType.BFLOAT16, ComponentType.FLOAT8_E4M3, ComponentType.FLOAT8_E5M2,
}
_SIGNED = {
    ComponentType.SINT8, ComponentType.SINT16, ComponentType.SINT32, ComponentType.SINT64,
    ComponentType.SINT8_PACKED_NV,
}


class Scope(enum.IntEnum):
    """VkScopeKHR (the same numbers as SPIR-V's Scope)."""

    DEVICE = 1
    WORKGROUP = 2
    SUBGROUP = 3
    QUEUE_FAMILY = 5


def component_type_name(value: int) -> str:
    """The enum's name without prefix, or the bare number for a value we don't know."""
    try:
        return ComponentType(value).name
    except ValueError:
        return str(int(value))


def scope_name(value: int) -> str:
    try:
        return Scope(value).name
    except ValueError:
        return str(int(value))


def parse_component_type(value: int | str) -> int:
    """Accept a number, a short name (FLOAT16) or a full one (VK_COMPONENT_TYPE_FLOAT16_KHR).

    Unknown numbers stay numbers: they are kept, never dropped.
    """
    if isinstance(value, int):
        return value
    s = value.strip()
    if s.lstrip("-").isdigit():
        return int(s)
    s = s.removeprefix("VK_COMPONENT_TYPE_")
    for suffix in ("_KHR", "_EXT", "_NV"):
        s = s.removesuffix(suffix)
    aliases = {"FLOAT_E4M3": "FLOAT8_E4M3", "FLOAT_E5M2": "FLOAT8_E5M2"}
    s = aliases.get(s, s)
    if s + "_NV" in ComponentType.__members__:
        return int(ComponentType[s + "_NV"])
    return int(ComponentType[s])


def parse_scope(value: int | str) -> int:
    if isinstance(value, int):
        return value
    s = value.strip()
    if s.isdigit():
        return int(s)
    s = s.removeprefix("VK_SCOPE_").removesuffix("_KHR").removesuffix("_NV")
    return int(Scope[s])
