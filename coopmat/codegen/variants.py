"""Every kernel variant a device's cooperative-matrix configs imply.

A config is anything with the fields of VkCooperativeMatrixPropertiesKHR: an object with
M, N, K, a_type, b_type, c_type, result_type, scope and saturating_accumulation
attributes (coopmat.device's CooperativeMatrixProperties), or a mapping in the recorded
JSON form (M, N, K, A, B, C, R, sat, scope).

Where a device offers VK_NV_cooperative_matrix2 workgroup-scope matrices with tensor
addressing, its VkCooperativeMatrixFlexibleDimensionsPropertiesNV list implies the nv2
family's variants too (nv2_variants_for).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coopmat.codegen.flexdims import as_flex_list, flexible_dims_beside, load_flexible_dims
from coopmat.codegen.nv2_tiles import NV2_TYPES, default_nv2_tile, nv2_traits
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
    """Config x A layout x B layout x with/without C x exact/aligned/general, default
    tiles."""
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
                    for aligned, exact in ((True, True), (True, False), (False, False)):
                        t = GemmTraits(cfg.a_type, cfg.b_type, cfg.c_type, cfg.result_type,
                                       cfg.m, cfg.n, cfg.k, subgroup_size, a_layout, b_layout,
                                       has_c, aligned, tile, exact=exact)
                        if t not in out:
                            out.append(t)
    return out


def nv2_variants_for(flex_props: Iterable[Any], subgroup_size: int,
                     max_shared_memory: int = DEFAULT_SHARED_MEMORY,
                     max_workgroup_size: int = DEFAULT_INVOCATIONS, *,
                     reserved_shared_memory: int = 0,
                     max_dimension: int | None = None) -> list[GemmTraits]:
    """Type pair x A layout x B layout x with/without C, default nv2 tiles.

    `flex_props` must be empty where the device lacks the cooperativeMatrixWorkgroupScope
    or cooperativeMatrixTensorAddressing feature (DeviceRecord.nv2_flexible_dims does that).
    """
    flex = as_flex_list(flex_props)
    pairs: list[tuple[ComponentType, ComponentType]] = []
    for e in flex:
        a, r = e.component("a_type"), e.component("result_type")
        if e.workgroup_scope and a is not None and r is not None and (a, r) in NV2_TYPES \
                and (a, r) not in pairs:
            pairs.append((a, r))
    out: list[GemmTraits] = []
    for a, r in pairs:
        tile = default_nv2_tile(a, r, flex, subgroup_size, max_shared_memory,
                                max_workgroup_size, reserved_shared_memory=reserved_shared_memory,
                                max_dimension=max_dimension)
        if tile is None:
            continue
        for a_layout in Layout:
            for b_layout in Layout:
                for has_c in (False, True):
                    t = nv2_traits(a, r, flex, subgroup_size, a_layout, b_layout, has_c, tile)
                    if t not in out:
                        out.append(t)
    return out


@dataclass(frozen=True)
class DeviceRecord:
    """What variants_for needs of a device, from a recorded property list or a live one.

    The nv2 fields describe VK_NV_cooperative_matrix2: the flexible-dimensions list, whether
    workgroup-scope matrices with tensor addressing are usable (both features on), and the
    extension's limits (None where unknown)."""

    name: str
    configs: tuple[Any, ...]
    subgroup_size: int
    max_shared_memory: int
    max_invocations: int
    flexible_dims: tuple[Any, ...] = ()
    nv2_workgroup: bool = False
    workgroup_scope_max_workgroup_size: int | None = None
    workgroup_scope_reserved_shared_memory: int | None = None
    flexible_dimensions_max_dimension: int | None = None

    @property
    def nv2_flexible_dims(self) -> tuple[Any, ...]:
        """The flexible-dimensions list where the nv2 family can run, else ()."""
        return self.flexible_dims if self.nv2_workgroup else ()


def record_variants(record: DeviceRecord) -> list[GemmTraits]:
    """Every variant of every family that `record` implies (khr first, then nv2)."""
    out = variants_for(record.configs, record.subgroup_size, record.max_shared_memory,
                       record.max_invocations)
    max_wg = record.workgroup_scope_max_workgroup_size or record.max_invocations
    out += [t for t in nv2_variants_for(
        record.nv2_flexible_dims, record.subgroup_size, record.max_shared_memory, max_wg,
        reserved_shared_memory=record.workgroup_scope_reserved_shared_memory or 0,
        max_dimension=record.flexible_dimensions_max_dimension) if t not in out]
    return out


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def load_properties(path: str | Path) -> list[DeviceRecord]:
    """Devices in a recorded JSON property list (tests/data/*.json or `coopmat.info --json`).

    A device's flexible-dimensions list comes from its `flexibleDimensionsProperties`
    (coopmat.info --json), else from the recorded text list beside the file
    (`NAME-khr-coopmat.json` -> `NAME-nv-coopmat2-flexible-dims.txt`). Workgroup scope and
    tensor addressing count as usable where the record's `features` say so; a record with
    no `features` (tests/data's) counts them usable if it lists workgroup-scope entries and
    does not say VK_NV_cooperative_matrix2 is absent.
    """
    data = json.loads(Path(path).read_text())
    devices = data if isinstance(data, list) else data.get("devices", [data])
    beside = flexible_dims_beside(path)
    beside_flex = tuple(load_flexible_dims(beside)) if beside else ()
    out = []
    for d in devices:
        limits = d.get("limits", {})
        sub = d.get("subgroup") or [limits.get("subgroupSize", 0)]
        subgroup = int(sub[0]) if len(sub) == 1 or sub[0] == sub[-1] else int(
            limits.get("subgroupSize", sub[-1]))
        configs = d.get("configs") or d.get("cooperativeMatrixProperties") or d.get(
            "cooperative_matrix_properties", [])
        flex = tuple(d.get("flexibleDimensionsProperties") or beside_flex)
        features = d.get("features")
        extensions = d.get("extensions", {})
        has_ext = bool(d.get("nv_coopmat2", extensions.get("VK_NV_cooperative_matrix2", True)))
        if isinstance(features, dict):
            nv2 = has_ext and bool(features.get("cooperativeMatrixWorkgroupScope")) and bool(
                features.get("cooperativeMatrixTensorAddressing"))
        else:
            nv2 = has_ext and any(e.workgroup_scope for e in as_flex_list(flex))
        out.append(DeviceRecord(
            name=str(d.get("name", path)), configs=tuple(configs), subgroup_size=subgroup,
            max_shared_memory=int(limits.get("maxComputeSharedMemorySize",
                                             DEFAULT_SHARED_MEMORY)),
            max_invocations=int(limits.get("maxComputeWorkGroupInvocations",
                                           DEFAULT_INVOCATIONS)),
            flexible_dims=flex, nv2_workgroup=nv2,
            workgroup_scope_max_workgroup_size=_opt_int(
                limits.get("cooperativeMatrixWorkgroupScopeMaxWorkgroupSize")),
            workgroup_scope_reserved_shared_memory=_opt_int(
                limits.get("cooperativeMatrixWorkgroupScopeReservedSharedMemory")),
            flexible_dimensions_max_dimension=_opt_int(
                limits.get("cooperativeMatrixFlexibleDimensionsMaxDimension"))))
    return out


def current_device() -> DeviceRecord:
    """The device coopmat.device selects (needs Vulkan)."""
    from coopmat import device

    info = device.select_info()
    lim = info.limits
    nv2 = bool(info.features.get("cooperativeMatrixWorkgroupScope")) and bool(
        info.features.get("cooperativeMatrixTensorAddressing"))
    return DeviceRecord(info.name, tuple(info.cooperative_matrix_properties), lim.subgroup_size,
                        lim.max_compute_shared_memory_size, lim.max_compute_work_group_invocations,
                        flexible_dims=tuple(info.flexible_dimensions_properties),
                        nv2_workgroup=nv2,
                        workgroup_scope_max_workgroup_size=(
                            lim.cooperative_matrix_workgroup_scope_max_workgroup_size),
                        workgroup_scope_reserved_shared_memory=(
                            lim.cooperative_matrix_workgroup_scope_reserved_shared_memory),
                        flexible_dimensions_max_dimension=(
                            lim.cooperative_matrix_flexible_dimensions_max_dimension))
