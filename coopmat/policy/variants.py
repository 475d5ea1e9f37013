"""Every kernel variant a device implies: each family's default kernels for each config
the device lists (the tiles the policy chooses by default, every layout, with and without
C, each variant), for building and validating all of them (`coopmat-codegen
--validate-all`) and for tests. What one product runs is policy/kernel.py's choice.
"""

from __future__ import annotations

from dataclasses import replace

from coopmat.codegen.nv2_tiles import NV2_TYPES, nv2_traits
from coopmat.codegen.traits import GemmTraits, GemvTraits, KhrTraits, Layout, Nv2Traits, RowsTraits
from coopmat.codegen.variants import GEMV_OPERANDS, buildable, is_cpu, khr_traits
from coopmat.common.enums import ComponentType
from coopmat.common.quant_formats import FORMATS
from coopmat.device.model import PhysicalDeviceInfo
from coopmat.device.record import nv2_usable
from coopmat.policy.gemv_tiles import GEMV_MAX_M, gemv_traits
from coopmat.policy.rows_tiles import rows_traits
from coopmat.policy.tiles import khr_tile, nv2_tiles


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
                                        aligned=aligned, out_type=out_type,
                                        cpu=is_cpu(info))
                        if t not in out:
                            out.append(t)
    return out


def gemv_variants(info: PhysicalDeviceInfo) -> list[GemvTraits]:
    """Per float16/bfloat16 config accumulating in float32 (gemv needs no matrix of its
    own; the configs say which products matmul offers): with and without C, for one row
    and for GEMV_MAX_M rows, default tiles; float16 operands also with float16 results.
    Then the same without C (a quantized B takes none) for each quantized format."""
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
                                        out_type=out_type, b_quant=b_quant,
                                        cpu=is_cpu(info))
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
