"""Recorded devices: the same PhysicalDeviceInfo a live device gives, from files.

Two JSON forms are read:
- `python -m coopmat.info --json` (schema in docs/info-json.md): complete.
- the short device lists in tests/data (`name`, `api`, `khr_coopmat`, `nv_coopmat2`,
  `configs` with A/B/C/R/sat/scope, `subgroup` [min, max]); optional `limits`,
  `features`, `extensions`, `vendorID`, `deviceID`, `deviceType` complete them.

Where a record omits something, it is inferred and the inference is listed in the info's
`notes`: limits default to RECORD_SHARED_MEMORY / RECORD_INVOCATIONS; without `features`,
the features a listed component type needs count as present (a driver lists a type only
where it can run it), and VK_NV_cooperative_matrix2's workgroup scope and tensor
addressing count as present where the flexible-dimensions list has workgroup-scope
entries.

VK_NV_cooperative_matrix2's flexible-dimensions list comes from the record's
`flexibleDimensionsProperties`, else from the recorded text list beside the file
(`NAME-khr-coopmat.json` -> `NAME-nv-coopmat2-flexible-dims.txt`), one entry a line:

      [0] MGranularity=16 NGranularity=16 KGranularity=16 A=float16_t(0) B=float16_t(0) \
C=float16_t(0) Result=float16_t(0) saturating=0 scope=subgroup(3) workgroupInvocations=0

(a type or scope is a name with its Vulkan enum value in parentheses).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from coopmat.device.model import (
    RECORD_INVOCATIONS,
    RECORD_SHARED_MEMORY,
    RELEVANT_EXTENSIONS,
    SHADER_STAGE_COMPUTE,
    CooperativeMatrixProperties,
    DeviceLimits,
    FlexibleDimensionsProperties,
    PhysicalDeviceInfo,
)

FLEX_SUFFIX = "-nv-coopmat2-flexible-dims.txt"
_RECORD_SUFFIX = "-khr-coopmat"

_ENTRY = re.compile(r"^\s*\[\d+\]\s+(?P<fields>.*\S)\s*$")
_FIELD = re.compile(r"(\w+)=(\S+)")
_ENUM = re.compile(r"^[^(]*\((-?\d+)\)$")

# What the base of every kernel needs (coopmat.device.logical.REQUIRED_FEATURES).
_BASE_FEATURES = ("cooperativeMatrix", "vulkanMemoryModel", "vulkanMemoryModelDeviceScope",
                  "subgroupSizeControl", "computeFullSubgroups")
_NV2_FEATURES = ("cooperativeMatrixWorkgroupScope", "cooperativeMatrixFlexibleDimensions",
                 "cooperativeMatrixTensorAddressing")


def _enum_value(text: str) -> int:
    """`float16_t(0)` -> 0, `workgroup(2)` -> 2, `7` -> 7."""
    m = _ENUM.match(text)
    return int(m.group(1) if m else text)


def parse_flexible_dims_text(text: str) -> list[FlexibleDimensionsProperties]:
    """Entries of the recorded text form (module docstring); other lines are ignored.

    Raise ValueError for an entry line that lacks a field."""
    out = []
    for line in text.splitlines():
        m = _ENTRY.match(line)
        if not m:
            continue
        f = dict(_FIELD.findall(m.group("fields")))
        try:
            out.append(FlexibleDimensionsProperties.from_record({
                "MGranularity": f["MGranularity"], "NGranularity": f["NGranularity"],
                "KGranularity": f["KGranularity"], "A": _enum_value(f["A"]),
                "B": _enum_value(f["B"]), "C": _enum_value(f["C"]),
                "Result": _enum_value(f["Result"]),
                "saturating": f["saturating"] not in ("0", "false"),
                "scope": _enum_value(f["scope"]),
                "workgroupInvocations": f["workgroupInvocations"]}))
        except (KeyError, ValueError) as e:
            raise ValueError(f"malformed flexible-dimensions entry: {line.strip()!r}") from e
    return out


def load_flexible_dims(path: str | Path) -> list[FlexibleDimensionsProperties]:
    return parse_flexible_dims_text(Path(path).read_text())


def flexible_dims_beside(properties: str | Path) -> Path | None:
    """The recorded flexible-dimensions list that goes with a recorded property list
    (`dir/nvidia-h200-khr-coopmat.json` -> `dir/nvidia-h200-nv-coopmat2-flexible-dims.txt`);
    None if absent."""
    p = Path(properties)
    candidate = p.with_name(p.stem.removesuffix(_RECORD_SUFFIX) + FLEX_SUFFIX)
    return candidate if candidate.is_file() else None


def _vendor_id(d: dict[str, Any]) -> int:
    if "vendorID" in d:
        return int(d["vendorID"], 0) if isinstance(d["vendorID"], str) else int(d["vendorID"])
    name = str(d.get("name", "")).lower()
    guesses = {"llvmpipe": 0x10005, "nvidia": 0x10DE, "radv": 0x1002, "amd": 0x1002,
               "intel": 0x8086}
    return next((v for k, v in guesses.items() if k in name), 0)


def _api_version(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and value < 1000:  # tests/data writes 1.4 as 104
        return f"{value // 100}.{value % 100}.0"
    return "1.3.0"


def _limits(d: dict[str, Any], notes: list[str]) -> DeviceLimits:
    lim = d.get("limits", {})
    sub = d.get("subgroup") or [lim.get("subgroupSize", 0)] * 2
    lo, hi = int(sub[0]), int(sub[-1])
    subgroup = int(lim.get("subgroupSize", lo if lo == hi else hi))
    shared = lim.get("maxComputeSharedMemorySize")
    invocations = lim.get("maxComputeWorkGroupInvocations")
    if shared is None or invocations is None:
        notes.append(f"limits not recorded: assumed {RECORD_SHARED_MEMORY} bytes of shared "
                     f"memory and {RECORD_INVOCATIONS} invocations")

    def opt(key: str) -> int | None:
        return None if lim.get(key) is None else int(lim[key])

    def stages(key: str) -> int:
        value = lim.get(key)
        if isinstance(value, list):
            return SHADER_STAGE_COMPUTE if "COMPUTE" in value else 0
        return SHADER_STAGE_COMPUTE if value is None else int(value)

    return DeviceLimits(
        subgroup_size=subgroup, min_subgroup_size=int(lim.get("minSubgroupSize", lo)),
        max_subgroup_size=int(lim.get("maxSubgroupSize", hi)),
        required_subgroup_size_stages=stages("requiredSubgroupSizeStages"),
        cooperative_matrix_supported_stages=stages("cooperativeMatrixSupportedStages"),
        max_compute_shared_memory_size=int(shared or RECORD_SHARED_MEMORY),
        max_compute_work_group_invocations=int(invocations or RECORD_INVOCATIONS),
        max_compute_work_group_size=tuple(lim.get("maxComputeWorkGroupSize",
                                                  (1024, 1024, 64))),  # type: ignore[arg-type]
        max_compute_work_group_count=tuple(lim.get(  # type: ignore[arg-type]
            "maxComputeWorkGroupCount", (2 ** 31 - 1, 65535, 65535))),
        max_storage_buffer_range=int(lim.get("maxStorageBufferRange", 2 ** 32 - 1)),
        max_push_constants_size=int(lim.get("maxPushConstantsSize", 256)),
        timestamp_period=float(lim.get("timestampPeriod", 1.0)),
        cooperative_matrix_workgroup_scope_max_workgroup_size=opt(
            "cooperativeMatrixWorkgroupScopeMaxWorkgroupSize"),
        cooperative_matrix_flexible_dimensions_max_dimension=opt(
            "cooperativeMatrixFlexibleDimensionsMaxDimension"),
        cooperative_matrix_workgroup_scope_reserved_shared_memory=opt(
            "cooperativeMatrixWorkgroupScopeReservedSharedMemory"),
        subgroup_arithmetic=None if lim.get("subgroupArithmetic") is None
        else bool(lim["subgroupArithmetic"]))


def _inferred_features(configs: tuple[CooperativeMatrixProperties, ...],
                       flex: tuple[FlexibleDimensionsProperties, ...],
                       nv2_ext: bool, extensions: dict[str, bool],
                       notes: list[str]) -> dict[str, bool]:
    """Features (and, into `extensions`, the extensions) the listed types imply, for a
    record that lists none."""
    from coopmat.common.dtypes import ELEMENT_TYPES

    features = dict.fromkeys(_BASE_FEATURES, True)
    for p in configs:
        for t in (p.a_type, p.b_type, p.c_type, p.result_type):
            row = ELEMENT_TYPES.get(t)
            features.update(dict.fromkeys(row.features if row else (), True))
            if row is not None and row.vk_extension:
                extensions.setdefault(row.vk_extension, True)
    if nv2_ext and any(e.workgroup_scope for e in flex):
        features.update(dict.fromkeys(_NV2_FEATURES, True))
    notes.append("features not recorded: inferred from the listed component types")
    return features


def from_record(d: dict[str, Any], index: int = 0, *, source: str = "",
                flex_beside: tuple[FlexibleDimensionsProperties, ...] = ()
                ) -> PhysicalDeviceInfo:
    """One recorded device (either JSON form) as a PhysicalDeviceInfo."""
    notes: list[str] = [f"recorded: {source}"] if source else []
    configs = tuple(CooperativeMatrixProperties.from_record(e) for e in (
        d.get("cooperativeMatrixProperties") or d.get("configs") or []))
    flex = tuple(FlexibleDimensionsProperties.from_record(e)
                 for e in d.get("flexibleDimensionsProperties") or ()) or flex_beside
    extensions = {"VK_KHR_cooperative_matrix": bool(d.get("khr_coopmat", bool(configs))),
                  "VK_NV_cooperative_matrix2": bool(d.get("nv_coopmat2", bool(flex)))}
    extensions.update({k: bool(v) for k, v in d.get("extensions", {}).items()})
    recorded = d.get("features")
    features = ({k: bool(v) for k, v in recorded.items()} if isinstance(recorded, dict)
                else _inferred_features(configs, flex,
                                        extensions["VK_NV_cooperative_matrix2"], extensions,
                                        notes))
    extensions = {e: extensions.get(e, False) for e in RELEVANT_EXTENSIONS} | extensions
    limits = _limits(d, notes)
    vendor = _vendor_id(d)
    name = str(d.get("name", source or "recorded device"))
    cpu = vendor == 0x10005 or "llvmpipe" in name
    return PhysicalDeviceInfo(
        index=int(d.get("index", index)), name=name, vendor_id=vendor,
        device_id=int(d.get("deviceID", 0)),
        device_type=str(d.get("deviceType", "CPU" if cpu else "DISCRETE_GPU")),
        api_version=_api_version(d.get("apiVersion", d.get("api"))),
        driver_version=str(d.get("driverVersion", "")),
        driver_name=str(d.get("driverName", "llvmpipe" if cpu else "")),
        driver_info=str(d.get("driverInfo", "")),
        extensions=extensions, features=features, limits=limits,
        cooperative_matrix_properties=configs, flexible_dimensions_properties=flex,
        notes=tuple(notes + list(d.get("notes", ()))),
        device_uuid=str(d.get("deviceUUID") or "").lower(),
        pci_bus_id=str(d.get("pciBusID") or "").lower())


def load_records(path: str | Path) -> list[PhysicalDeviceInfo]:
    """Every device in a recorded property list (a tests/data file or `coopmat.info
    --json` output)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read a recorded device list from {p}: {e}") from None
    try:
        devices = data if isinstance(data, list) else data.get("devices", [data])
        beside = flexible_dims_beside(p)
        flex = tuple(load_flexible_dims(beside)) if beside else ()
        return [from_record(d, i, source=p.name, flex_beside=flex)
                for i, d in enumerate(devices)]
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{p} is not a recorded device list: {type(e).__name__}: {e}") \
            from None


def nv2_usable(info: PhysicalDeviceInfo) -> bool:
    """Whether the nv2 family can run: VK_NV_cooperative_matrix2 with workgroup scope,
    flexible dimensions and tensor addressing."""
    return info.extensions.get("VK_NV_cooperative_matrix2", False) and all(
        info.has(f) for f in _NV2_FEATURES)


__all__ = ["FLEX_SUFFIX", "flexible_dims_beside", "from_record", "load_flexible_dims",
           "load_records", "nv2_usable", "parse_flexible_dims_text"]
