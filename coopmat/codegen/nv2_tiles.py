"""Workgroup tiles of the nv2 family (VK_NV_cooperative_matrix2 workgroup-scope matrices):
what a tile is and which listed entry it runs under. Which tile runs is the policy's
(coopmat/policy/nv2_tiles.py).

A workgroup-scope matrix may be any multiple of the granularities that the device lists
for the type combination and the workgroup size (VkCooperativeMatrixFlexibleDimensions-
PropertiesNV with scope WORKGROUP; `workgroupInvocations` is the exact local size the
entry applies to). So a tile is an entry (workgroup size) plus TILE_M x TILE_N x TILE_K
multiples of its granularities.
"""

from __future__ import annotations

from collections.abc import Iterable

from coopmat.codegen.traits import Layout, Nv2Traits, Tile
from coopmat.common.enums import ComponentType as CT
from coopmat.device.model import FlexibleDimensionsProperties as FlexDims

# (operand, result) pairs the family builds (A and B share the operand type, C = result).
NV2_TYPES = frozenset({(CT.FLOAT16, CT.FLOAT16), (CT.FLOAT16, CT.FLOAT32),
                       (CT.BFLOAT16, CT.FLOAT32), (CT.UINT8, CT.UINT32),
                       (CT.SINT8, CT.SINT32)})


def _power_of_two(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def subgroup_grid(invocations: int, subgroup_size: int) -> tuple[int, int]:
    """(subgroups_m, subgroups_n) for Tile: only their product (the workgroup size) matters
    to this family, since the implementation distributes workgroup-scope matrices."""
    count = invocations // subgroup_size
    sg_m = 1 << ((count.bit_length() - 1) // 2)
    return sg_m, count // sg_m


def matching_entries(a_type: CT, result_type: CT, flex_props: Iterable[FlexDims],
                     subgroup_size: int, max_workgroup_size: int) -> list[FlexDims]:
    """Usable workgroup-scope entries for the types, in the device's order."""
    out = []
    for e in flex_props:
        if not e.workgroup_scope or e.saturating_accumulation:
            continue
        if (e.a_type, e.b_type, e.c_type, e.result_type) != (a_type, a_type, result_type,
                                                             result_type):
            continue
        inv = e.workgroup_invocations
        if (not _power_of_two(inv) or inv % subgroup_size or inv > max_workgroup_size
                or min(e.m_granularity, e.n_granularity, e.k_granularity) < 1):
            continue
        if e not in out:
            out.append(e)
    return out


def nv2_buildable(a_type: CT, result_type: CT, max_shared_memory: int,
                  reserved_shared_memory: int) -> bool:
    """Whether the family builds the types and the implementation's shared-memory
    reservation fits the device (the module declares no shared memory of its own)."""
    return (a_type, result_type) in NV2_TYPES and reserved_shared_memory <= max_shared_memory


def entry_for_tile(tile: Tile, a_type: CT, result_type: CT, flex_props: Iterable[FlexDims],
                   subgroup_size: int) -> FlexDims | None:
    """The listed entry a tile runs under (same types, workgroup size = the tile's)."""
    inv = tile.subgroups * subgroup_size
    for e in matching_entries(a_type, result_type, flex_props, subgroup_size, inv):
        if (e.workgroup_invocations == inv and tile.tile_m % e.m_granularity == 0
                and tile.tile_n % e.n_granularity == 0 and tile.tile_k % e.k_granularity == 0):
            return e
    return None


def nv2_traits(a_type: CT, result_type: CT, flex_props: Iterable[FlexDims], subgroup_size: int,
               a_layout: Layout, b_layout: Layout, has_c: bool, tile: Tile) -> Nv2Traits:
    """Nv2Traits for a tile, with the granularities of the entry it runs under."""
    entry = entry_for_tile(tile, a_type, result_type, flex_props, subgroup_size)
    if entry is None:
        raise ValueError(f"no workgroup-scope entry for {a_type.name}->{result_type.name} "
                         f"fits tile {tile.describe()} at subgroup size {subgroup_size}")
    return Nv2Traits(a_type=a_type, b_type=a_type, c_type=result_type,
                     result_type=result_type, a_layout=a_layout, b_layout=b_layout,
                     has_c=has_c, tile=tile, subgroup_size=subgroup_size,
                     m_granularity=entry.m_granularity, n_granularity=entry.n_granularity,
                     k_granularity=entry.k_granularity)
