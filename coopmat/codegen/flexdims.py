"""VkCooperativeMatrixFlexibleDimensionsPropertiesNV entries, from any source.

VK_NV_cooperative_matrix2 lists, per type combination, scope and workgroup size, the
granularities that flexible-dimension matrices must be multiples of. Entries come from the
live device (coopmat.device's FlexibleDimensionsProperties), from `coopmat.info --json`
(`flexibleDimensionsProperties`), or from the recorded text form in tests/data:

    VK_NV_cooperative_matrix2 flexible dimension properties: 25
      [0] MGranularity=16 NGranularity=16 KGranularity=16 A=float16_t(0) B=float16_t(0) \
C=float16_t(0) Result=float16_t(0) saturating=0 scope=subgroup(3) workgroupInvocations=0

(one entry per line; a type or scope is a name with its Vulkan enum value in parentheses).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from coopmat.device.enums import parse_component_type, parse_scope
from coopmat.device.model import FlexibleDimensionsProperties

# The device layer's own record of an entry; recorded text and JSON parse into it too.
FlexDims = FlexibleDimensionsProperties


_ENTRY = re.compile(r"^\s*\[\d+\]\s+(?P<fields>.*\S)\s*$")
_FIELD = re.compile(r"(\w+)=(\S+)")
_ENUM = re.compile(r"^[^(]*\((-?\d+)\)$")


def _enum_value(text: str) -> int:
    """`float16_t(0)` -> 0, `workgroup(2)` -> 2, `7` -> 7."""
    m = _ENUM.match(text)
    return int(m.group(1) if m else text)


def parse_flexible_dims_text(text: str) -> list[FlexDims]:
    """Entries of the recorded text form (see the module docstring); other lines are ignored.

    Raise ValueError for an entry line that lacks a field."""
    out = []
    for line in text.splitlines():
        m = _ENTRY.match(line)
        if not m:
            continue
        f = dict(_FIELD.findall(m.group("fields")))
        try:
            out.append(FlexDims(
                m_granularity=int(f["MGranularity"]), n_granularity=int(f["NGranularity"]),
                k_granularity=int(f["KGranularity"]), a_type=_enum_value(f["A"]),
                b_type=_enum_value(f["B"]), c_type=_enum_value(f["C"]),
                result_type=_enum_value(f["Result"]),
                saturating_accumulation=f["saturating"] not in ("0", "false"),
                scope=_enum_value(f["scope"]),
                workgroup_invocations=int(f["workgroupInvocations"])))
        except (KeyError, ValueError) as e:
            raise ValueError(f"malformed flexible-dimensions entry: {line.strip()!r}") from e
    return out


def as_flex(entry: Any) -> FlexDims:
    """Normalize a device-layer FlexibleDimensionsProperties or a JSON mapping."""
    if isinstance(entry, FlexDims):
        return entry
    if isinstance(entry, Mapping):
        def get(*keys: str, default: Any = None) -> Any:
            return next((entry[k] for k in keys if k in entry), default)
        return FlexDims(
            int(get("MGranularity")), int(get("NGranularity")), int(get("KGranularity")),
            parse_component_type(get("AType", "A")), parse_component_type(get("BType", "B")),
            parse_component_type(get("CType", "C")),
            parse_component_type(get("ResultType", "Result", "R")),
            bool(get("saturatingAccumulation", "saturating", "sat", default=False)),
            parse_scope(get("scope")), int(get("workgroupInvocations", default=0)))
    raise TypeError(f"not a flexible-dimensions entry: {entry!r}")


def as_flex_list(entries: Iterable[Any]) -> list[FlexDims]:
    return [as_flex(e) for e in entries]


def load_flexible_dims(path: str | Path) -> list[FlexDims]:
    return parse_flexible_dims_text(Path(path).read_text())


FLEX_SUFFIX = "-nv-coopmat2-flexible-dims.txt"
_RECORD_SUFFIXES = ("-khr-coopmat",)


def flexible_dims_beside(properties: str | Path) -> Path | None:
    """The recorded flexible-dimensions list that goes with a recorded property list.

    `dir/nvidia-h200-khr-coopmat.json` -> `dir/nvidia-h200-nv-coopmat2-flexible-dims.txt`
    (the device stem is the file stem less a `-khr-coopmat` suffix); None if absent."""
    p = Path(properties)
    stem = p.stem
    for suffix in _RECORD_SUFFIXES:
        stem = stem.removesuffix(suffix)
    candidate = p.with_name(stem + FLEX_SUFFIX)
    return candidate if candidate.is_file() else None
