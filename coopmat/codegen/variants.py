"""Every kernel variant a device's cooperative-matrix configs imply.

A config is anything with the fields of VkCooperativeMatrixPropertiesKHR: an object with
M, N, K, a_type, b_type, c_type, result_type, scope and saturating_accumulation
attributes (coopmat.device's CooperativeMatrixProperties), or a mapping in the recorded
JSON form (M, N, K, A, B, C, R, sat, scope).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coopmat.codegen.tiles import default_tile
from coopmat.codegen.traits import GemmTraits, Layout
from coopmat.codegen.types import OPERAND_TYPES, RESULT_TYPES
from coopmat.device.enums import ComponentType, Scope, parse_component_type, parse_scope

# Shared memory Vulkan guarantees, assumed where a record does not say.
DEFAULT_SHARED_MEMORY = 49152
DEFAULT_INVOCATIONS = 1024


@dataclass(frozen=True)
class Config:
    m: int
    n: int
    k: int
    a_type: ComponentType
    b_type: ComponentType
    c_type: ComponentType
    result_type: ComponentType
    scope: int = int(Scope.SUBGROUP)
    saturating: bool = False


def _component(value: Any) -> ComponentType | None:
    try:
        return ComponentType(parse_component_type(value))
    except (ValueError, KeyError):
        return None


def as_config(cfg: Any) -> Config | None:
    """Normalize one config; None for component types this package does not know."""
    if isinstance(cfg, Mapping):
        def get(*keys: str, default: Any = None) -> Any:
            return next((cfg[k] for k in keys if k in cfg), default)
        fields = (get("M", "MSize"), get("N", "NSize"), get("K", "KSize"),
                  get("A", "AType"), get("B", "BType"), get("C", "CType"),
                  get("R", "ResultType", "Result"), get("scope", default=Scope.SUBGROUP),
                  get("sat", "saturatingAccumulation", default=False))
    else:
        fields = (cfg.M, cfg.N, cfg.K, cfg.a_type, cfg.b_type, cfg.c_type, cfg.result_type,
                  getattr(cfg, "scope", Scope.SUBGROUP),
                  getattr(cfg, "saturating_accumulation", False))
    m, n, k, a, b, c, r, scope, sat = fields
    at, bt, ct, rt = (_component(x) for x in (a, b, c, r))
    if at is None or bt is None or ct is None or rt is None:
        return None
    return Config(int(m), int(n), int(k), at, bt, ct, rt, parse_scope(scope), bool(sat))


def buildable(cfg: Config) -> bool:
    """Configs the KHR tiled family can use: subgroup scope, non-saturating, C = Result."""
    return (cfg.scope == Scope.SUBGROUP and not cfg.saturating
            and cfg.a_type in OPERAND_TYPES and cfg.b_type in OPERAND_TYPES
            and cfg.result_type in RESULT_TYPES and cfg.c_type == cfg.result_type)


def variants_for(configs: Iterable[Any], subgroup_size: int,
                 max_shared_memory: int = DEFAULT_SHARED_MEMORY,
                 max_invocations: int = DEFAULT_INVOCATIONS) -> list[GemmTraits]:
    """Config x A layout x B layout x with/without C x aligned/general, default tiles."""
    out: list[GemmTraits] = []
    for raw in configs:
        cfg = as_config(raw)
        if cfg is None or not buildable(cfg):
            continue
        tile = default_tile(cfg.a_type, cfg.result_type, cfg.m, cfg.n, cfg.k, subgroup_size,
                            max_shared_memory, max_invocations)
        for a_layout in Layout:
            for b_layout in Layout:
                for has_c in (False, True):
                    for aligned in (True, False):
                        t = GemmTraits(cfg.a_type, cfg.b_type, cfg.c_type, cfg.result_type,
                                       cfg.m, cfg.n, cfg.k, subgroup_size, a_layout, b_layout,
                                       has_c, aligned, tile)
                        if t not in out:
                            out.append(t)
    return out


@dataclass(frozen=True)
class DeviceRecord:
    """What variants_for needs of a device, from a recorded property list or a live one."""

    name: str
    configs: tuple[Any, ...]
    subgroup_size: int
    max_shared_memory: int
    max_invocations: int


def load_properties(path: str | Path) -> list[DeviceRecord]:
    """Devices in a recorded JSON property list (tests/data/*.json or `coopmat.info --json`)."""
    data = json.loads(Path(path).read_text())
    devices = data if isinstance(data, list) else data.get("devices", [data])
    out = []
    for d in devices:
        limits = d.get("limits", {})
        sub = d.get("subgroup") or [limits.get("subgroupSize", 0)]
        subgroup = int(sub[0]) if len(sub) == 1 or sub[0] == sub[-1] else int(
            limits.get("subgroupSize", sub[-1]))
        configs = d.get("configs") or d.get("cooperativeMatrixProperties") or d.get(
            "cooperative_matrix_properties", [])
        out.append(DeviceRecord(
            name=str(d.get("name", path)), configs=tuple(configs), subgroup_size=subgroup,
            max_shared_memory=int(limits.get("maxComputeSharedMemorySize",
                                             DEFAULT_SHARED_MEMORY)),
            max_invocations=int(limits.get("maxComputeWorkGroupInvocations",
                                           DEFAULT_INVOCATIONS))))
    return out


def current_device() -> DeviceRecord:
    """The device coopmat.device selects (needs Vulkan)."""
    from coopmat import device

    info = device.select_info()
    lim = info.limits
    return DeviceRecord(info.name, tuple(info.cooperative_matrix_properties), lim.subgroup_size,
                        lim.max_compute_shared_memory_size, lim.max_compute_work_group_invocations)
