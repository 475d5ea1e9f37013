"""What a device's capabilities imply for codegen: tiles and every kernel variant.

The device is a PhysicalDeviceInfo, from a live device or a recorded list
(coopmat.device.record); this module is where its limits meet the tile arithmetic of
tiles.py and nv2_tiles.py, so nothing else unpacks them.
"""

from __future__ import annotations

from dataclasses import replace

from coopmat.codegen.nv2_tiles import NV2_TYPES, nv2_tile_candidates, nv2_traits
from coopmat.codegen.rows_tiles import default_rows_tile
from coopmat.codegen.tiles import (
    SMALL_M,
    covering_rows_tile,
    deep_few_row_tile,
    default_tile,
    filling_ladder,
    kernel_subgroup_size,
    quant_few_row_tile,
    quant_general_tile,
    small_m_tile,
    tune_candidates,
)
from coopmat.codegen.traits import (
    EpilogueOps,
    GemmTraits,
    GemvTraits,
    KhrTraits,
    Layout,
    Nv2Traits,
    RowsTraits,
    Tile,
)
from coopmat.common.dtypes import OPERAND_TYPES, RESULT_TYPES
from coopmat.common.enums import ComponentType, Scope
from coopmat.device.model import (
    SHADER_STAGE_COMPUTE,
    CooperativeMatrixProperties,
    DeviceLimits,
    PhysicalDeviceInfo,
)
from coopmat.device.record import nv2_usable


def buildable(cfg: CooperativeMatrixProperties) -> bool:
    """Configs the khr family can use: subgroup scope, non-saturating, C = Result, types
    it knows."""
    return (cfg.scope == Scope.SUBGROUP and not cfg.saturating_accumulation
            and cfg.a_type in OPERAND_TYPES and cfg.b_type in OPERAND_TYPES
            and cfg.result_type in RESULT_TYPES and cfg.c_type == cfg.result_type)


def khr_subgroup_size(limits: DeviceLimits) -> int:
    """The subgroup size khr kernels are built for and require on a device (tiles.py says
    why): the smallest it lets a compute pipeline require, else its subgroupSize."""
    return kernel_subgroup_size(
        limits.subgroup_size, limits.min_subgroup_size, limits.max_subgroup_size,
        bool(limits.required_subgroup_size_stages & SHADER_STAGE_COMPUTE))


def is_cpu(info: PhysicalDeviceInfo) -> bool:
    """Whether the device is a CPU driver (lavapipe), which gets small tiles."""
    return info.device_type == "CPU"


def khr_tile(cfg: CooperativeMatrixProperties, limits: DeviceLimits,
             small_m: bool = False, *, cpu: bool = False) -> Tile:
    """The default khr tile for a config on a device (the few-rows tile with small_m;
    `cpu` for a CPU driver)."""
    pick = small_m_tile if small_m else default_tile
    return pick(cfg.a_type, cfg.result_type, cfg.M, cfg.N, cfg.K, khr_subgroup_size(limits),
                limits.max_compute_shared_memory_size,
                limits.max_compute_work_group_invocations, cpu=cpu)


def khr_covering_tile(cfg: CooperativeMatrixProperties, limits: DeviceLimits, tile: Tile,
                      M: int) -> Tile:
    """`tile` widened to hold M few rows in one row block (tiles.covering_rows_tile)."""
    return covering_rows_tile(tile, M, cfg.a_type, cfg.result_type, cfg.M, cfg.N, cfg.K,
                              khr_subgroup_size(limits), limits.max_compute_shared_memory_size,
                              limits.max_compute_work_group_invocations)


def khr_filling_ladder(cfg: CooperativeMatrixProperties,
                       limits: DeviceLimits) -> tuple[Tile, ...]:
    """The tiles small products may take on this device (tiles.filling_ladder)."""
    return filling_ladder(cfg.a_type, cfg.result_type, cfg.M, cfg.N, cfg.K,
                          khr_subgroup_size(limits), limits.max_compute_shared_memory_size,
                          limits.max_compute_work_group_invocations)


def khr_deep_tile(cfg: CooperativeMatrixProperties, tile: Tile) -> Tile:
    """`tile` with twice the K step where it is the few-row tile (tiles.deep_few_row_tile)."""
    return deep_few_row_tile(tile, cfg.M, cfg.N, cfg.K)


def khr_quant_tile(cfg: CooperativeMatrixProperties, limits: DeviceLimits, tile: Tile,
                   M: int) -> Tile:
    """The khr tile for a quantized B and M rows on a GPU (tiles.quant_few_row_tile up to
    SMALL_M rows, else tiles.quant_general_tile); `tile` where that does not fit."""
    sizes = (cfg.a_type, cfg.result_type, cfg.M, cfg.N, cfg.K, khr_subgroup_size(limits),
             limits.max_compute_shared_memory_size, limits.max_compute_work_group_invocations)
    if M <= SMALL_M:
        return quant_few_row_tile(tile, M, *sizes)
    return quant_general_tile(tile, *sizes)


def khr_tune_tiles(cfg: CooperativeMatrixProperties, limits: DeviceLimits,
                   small_m: bool = False, *, cpu: bool = False) -> list[Tile]:
    """The khr tiles `python -m coopmat.bench --tune` times, default first."""
    return tune_candidates(cfg.a_type, cfg.result_type, cfg.M, cfg.N, cfg.K,
                           khr_subgroup_size(limits), limits.max_compute_shared_memory_size,
                           limits.max_compute_work_group_invocations, small_m=small_m,
                           cpu=cpu)


def nv2_tiles(info: PhysicalDeviceInfo, operand: ComponentType,
              result: ComponentType) -> list[Tile]:
    """The nv2 tiles the device's workgroup-scope list and limits allow, default first;
    none where the device cannot run the nv2 family."""
    if not nv2_usable(info):
        return []
    lim = info.limits
    return nv2_tile_candidates(
        operand, result, info.flexible_dimensions_properties, lim.subgroup_size,
        lim.max_compute_shared_memory_size,
        lim.cooperative_matrix_workgroup_scope_max_workgroup_size
        or lim.max_compute_work_group_invocations,
        reserved_shared_memory=lim.cooperative_matrix_workgroup_scope_reserved_shared_memory
        or 0, max_dimension=lim.cooperative_matrix_flexible_dimensions_max_dimension)


def lists_out_matrix(info: PhysicalDeviceInfo, cfg: CooperativeMatrixProperties,
                     out_type: ComponentType | None) -> bool:
    """Whether a khr kernel of `cfg` may hold D's type `out_type` as an accumulator matrix
    (KhrTraits.out_matrix): the device lists a subgroup-scope entry of the config's
    MSize x NSize with that CType or ResultType (a cooperative-matrix type that matches
    no entry is undefined behaviour, SPV_KHR_cooperative_matrix's validity rules). Always
    where D holds the accumulator's own type (out_type None). Not so on Intel Xe-HPG,
    which lists float32 accumulation only, for a float16 D."""
    if out_type is None or out_type == cfg.result_type:
        return True
    return any(c.scope == Scope.SUBGROUP and (c.M, c.N) == (cfg.M, cfg.N)
               and out_type in (c.c_type, c.result_type)
               for c in info.cooperative_matrix_properties)


def khr_traits(cfg: CooperativeMatrixProperties, info: PhysicalDeviceInfo, a_layout: Layout,
               b_layout: Layout, has_c: bool, tile: Tile, *, aligned: bool = False,
               exact: bool = False, out_type: ComponentType | None = None) -> KhrTraits:
    """khr traits for a config on a device (variant flags as given), at the subgroup size
    khr_subgroup_size chooses, storing D as a matrix of out_type only where the device
    lists one (lists_out_matrix)."""
    return KhrTraits(a_type=cfg.a_type, b_type=cfg.b_type, c_type=cfg.c_type,
                     result_type=cfg.result_type, a_layout=a_layout, b_layout=b_layout,
                     has_c=has_c, tile=tile, subgroup_size=khr_subgroup_size(info.limits),
                     out_type=out_type, m=cfg.M, n=cfg.N, k=cfg.K, aligned=aligned,
                     exact=exact, out_matrix=lists_out_matrix(info, cfg, out_type))


def khr_variants(info: PhysicalDeviceInfo) -> list[KhrTraits]:
    """Config x A layout x B layout x with/without C x exact/aligned/general, default
    tiles; for f32-accumulating float16 configs also the float16-result kernels."""
    out: list[KhrTraits] = []
    for cfg in info.cooperative_matrix_properties:
        if not buildable(cfg):
            continue
        tile = khr_tile(cfg, info.limits, cpu=is_cpu(info))
        for out_type in out_types(cfg.a_type, cfg.result_type):
            for a_layout in Layout:
                for b_layout in Layout:
                    for has_c in (False, True):
                        for aligned, exact in ((True, True), (True, False), (False, False)):
                            t = khr_traits(cfg, info, a_layout, b_layout, has_c, tile,
                                           aligned=aligned, exact=exact, out_type=out_type)
                            if t not in out:
                                out.append(t)
    return out


def out_types(operand: ComponentType, accumulator: ComponentType) -> list[ComponentType | None]:
    """Result types kernels of a config write: its own (None), plus float16 for a float16
    config accumulating in float32 (matmul's default float16 result)."""
    extra = operand == ComponentType.FLOAT16 and accumulator == ComponentType.FLOAT32
    return [None, ComponentType.FLOAT16] if extra else [None]


def nv2_variants(info: PhysicalDeviceInfo) -> list[Nv2Traits]:
    """Type pair x A layout x B layout x with/without C, default nv2 tiles."""
    pairs: list[tuple[ComponentType, ComponentType]] = []
    for e in info.flexible_dimensions_properties if nv2_usable(info) else ():
        pair = (e.a_type, e.result_type)
        if e.workgroup_scope and pair in NV2_TYPES and pair not in pairs:
            pairs.append(pair)
    out: list[Nv2Traits] = []
    for a, r in pairs:
        tiles = nv2_tiles(info, a, r)
        if not tiles:
            continue
        for out_type in out_types(a, r):
            for a_layout in Layout:
                for b_layout in Layout:
                    for has_c in (False, True):
                        t = replace(nv2_traits(a, r, info.flexible_dimensions_properties,
                                               info.limits.subgroup_size, a_layout, b_layout,
                                               has_c, tiles[0]), out_type=out_type)
                        if t not in out:
                            out.append(t)
    return out


def rows_traits(cfg: CooperativeMatrixProperties, limits: DeviceLimits, a_layout: Layout,
                b_layout: Layout, has_c: bool, M: int, *, tile: Tile | None = None,
                aligned: bool = False, out_type: ComponentType | None = None) -> RowsTraits:
    """rows traits for a config on a device and M rows: `tile` (its tile_m replaced by the
    row fragments M needs), else the default tile (rows_tiles.py)."""
    from coopmat.codegen.rows_tiles import ROWS_MAX_M, row_frags_for

    base = RowsTraits(a_type=cfg.a_type, b_type=cfg.b_type, c_type=cfg.c_type,
                      result_type=cfg.result_type, a_layout=a_layout, b_layout=b_layout,
                      has_c=has_c, tile=Tile(cfg.M, cfg.N, cfg.K, 1, 1, 1),
                      subgroup_size=khr_subgroup_size(limits), out_type=out_type,
                      m=cfg.M, n=cfg.N, k=cfg.K, aligned=aligned)
    if tile is None:
        tile = default_rows_tile(base, M, limits.max_compute_shared_memory_size)
    else:
        tile = replace(tile, tile_m=row_frags_for(min(M, ROWS_MAX_M), cfg.M) * cfg.M)
    return replace(base, tile=tile)


def rows_variants(info: PhysicalDeviceInfo) -> list[RowsTraits]:
    """Config x B layout x with/without C, each as the aligned variant for one row
    fragment (row-major A) and the general one for 64 rows (column-major A), default
    tiles; f16->f32 configs also with float16 results."""
    out: list[RowsTraits] = []
    for cfg in info.cooperative_matrix_properties:
        if not buildable(cfg):
            continue
        for out_type in out_types(cfg.a_type, cfg.result_type):
            for b_layout in Layout:
                for has_c in (False, True):
                    for M, a_layout, aligned in ((1, Layout.ROW_MAJOR, True),
                                                 (64, Layout.COLUMN_MAJOR, False)):
                        t = rows_traits(cfg, info.limits, a_layout, b_layout, has_c, M,
                                        aligned=aligned, out_type=out_type)
                        if t not in out:
                            out.append(t)
    return out


# Operand types the gemv kernel reads (as 32-bit words; gemv.py).
GEMV_OPERANDS = (ComponentType.FLOAT16, ComponentType.BFLOAT16)


def gemv_traits(operand: ComponentType, result: ComponentType, limits: DeviceLimits,
                has_c: bool, M: int, *, tile: Tile | None = None,
                out_type: ComponentType | None = None,
                ops: EpilogueOps | None = None, b_quant: str | None = None,
                K: int | None = None, N: int | None = None) -> GemvTraits:
    """gemv traits (row-major A, column-major B; b_quant: B as GGUF blocks of that
    format) for M rows on a device: `tile` (its tile_m replaced by the rows M needs), else
    the default tile (gemv_tiles.py); at the subgroup size khr kernels use (the smallest
    the device lets a pipeline require); without the driver's bounds checks where
    gemv_tiles.checks_storage says, and for a known K loading a step ahead where
    gemv_tiles.prefetches says (N, where known, shapes a quantized B's one-row tile)."""
    from coopmat.codegen.gemv_tiles import (
        checks_storage,
        default_gemv_tile,
        gemv_rows_for,
        prefetches,
    )

    sg = khr_subgroup_size(limits)
    tile = default_gemv_tile(M, sg, b_quant, N, K) if tile is None else \
        replace(tile, tile_m=gemv_rows_for(M))
    return GemvTraits(a_type=operand, b_type=operand, c_type=result, result_type=result,
                      a_layout=Layout.ROW_MAJOR, b_layout=Layout.COLUMN_MAJOR, has_c=has_c,
                      tile=tile, subgroup_size=sg, out_type=out_type, ops=ops,
                      b_quant=b_quant, storage_checks=checks_storage(M, b_quant),
                      prefetch=K is not None and prefetches(K, tile, b_quant))


def gemv_variants(info: PhysicalDeviceInfo) -> list[GemvTraits]:
    """Per float16/bfloat16 config accumulating in float32 (gemv needs no matrix of its
    own; the configs say which products matmul offers): with and without C, for one row
    and for GEMV_MAX_M rows, default tiles; float16 operands also with float16 results.
    Then the same without C (a quantized B takes none) for each quantized format."""
    from coopmat.codegen.gemv_tiles import GEMV_MAX_M
    from coopmat.common.quant_formats import FORMATS

    out: list[GemvTraits] = []
    for b_quant in (None, *FORMATS):
        for cfg in info.cooperative_matrix_properties:
            if not buildable(cfg) or cfg.a_type not in GEMV_OPERANDS or \
                    cfg.result_type != ComponentType.FLOAT32:
                continue
            for out_type in out_types(cfg.a_type, cfg.result_type):
                for has_c in (False, True) if b_quant is None else (False,):
                    for M in (1, GEMV_MAX_M):
                        t = gemv_traits(cfg.a_type, cfg.result_type, info.limits, has_c, M,
                                        out_type=out_type, b_quant=b_quant)
                        if t not in out:
                            out.append(t)
    return out


def device_variants(info: PhysicalDeviceInfo) -> list[GemmTraits]:
    """Every variant of every family the device implies (khr, nv2, rows, then gemv)."""
    return [*khr_variants(info), *nv2_variants(info), *rows_variants(info),
            *gemv_variants(info)]


def current_device() -> PhysicalDeviceInfo:
    """The device coopmat.device selects (needs Vulkan)."""
    from coopmat import device

    return device.select_info()
