"""The base of coopmat's Vulkan enums: a value newer than the enum (a driver may list one)
becomes a member named by its number, so lists keep it and nothing downstream handles raw
ints."""

from __future__ import annotations

import enum
from typing import Any


class VkEnum(enum.IntEnum):
    @classmethod
    def _missing_(cls, value: object) -> Any:
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        member = int.__new__(cls, value)
        member._name_ = str(value)
        member._value_ = value
        return member
