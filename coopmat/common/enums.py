"""Vulkan enum values the cooperative-matrix layer speaks in.

The `vulkan` 1.3.275 binding predates VK_KHR_shader_bfloat16, VK_EXT_shader_float8 and
VK_NV_cooperative_matrix2, so the values are spelled out here from the registry rather
than read from the binding.
"""

from __future__ import annotations

import enum
from typing import Any


def _pseudo_member(cls: Any, value: object) -> Any:
    """A value newer than the enum (a driver may list one) becomes a member named by its
    number, so lists keep it and nothing downstream handles raw ints."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    member = int.__new__(cls, value)
    member._name_ = str(value)
    member._value_ = value
    return member


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

    @classmethod
    def _missing_(cls, value: object) -> ComponentType | None:
        return _pseudo_member(cls, value)

    @property
    def known(self) -> bool:
        return self.name in type(self).__members__

    # Size and kind live in coopmat.common.dtypes' table, with everything else about a type.
    @property
    def bits(self) -> int:
        from coopmat.common.dtypes import element
        return element(self).bits

    @property
    def is_float(self) -> bool:
        from coopmat.common.dtypes import element
        return element(self).is_float

    @property
    def is_signed(self) -> bool:
        from coopmat.common.dtypes import element
        return element(self).is_signed


class Scope(enum.IntEnum):
    """VkScopeKHR (the same numbers as SPIR-V's Scope)."""

    DEVICE = 1
    WORKGROUP = 2
    SUBGROUP = 3
    QUEUE_FAMILY = 5

    @classmethod
    def _missing_(cls, value: object) -> Scope | None:
        return _pseudo_member(cls, value)


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
