"""Workgroup tiles for the nv2 family (VK_NV_cooperative_matrix2 workgroup-scope matrices).

A workgroup-scope matrix may be any multiple of the granularities that the device lists
for the type combination and the workgroup size (VkCooperativeMatrixFlexibleDimensions-
PropertiesNV with scope WORKGROUP; `workgroupInvocations` is the exact local size the
entry applies to). So a tile is an entry (workgroup size) plus TILE_M x TILE_N x TILE_K
multiples of its granularities.

| result      | default tile       | invocations | why                                            |
|-------------|--------------------|-------------|------------------------------------------------|
| f16         | 128 x 256 x 32     | 256         | 16-bit accumulators: a wide tile fits in       |
|             |                    |             | registers (64 KiB of f16 over 256 lanes)       |
| f32         | 128 x 128 x 16     | 256         | 32-bit accumulators double the register cost;  |
|             |                    |             | TILE_K 16 as the peer benchmark found fastest  |
| i32 / u32   | 128 x 128 x 64     | 256         | 64 bytes of K per step, as for the peer's int8 |

Smaller listed workgroup sizes (a device without 256/128 entries, or a lower
cooperativeMatrixWorkgroupScopeMaxWorkgroupSize) get the same shapes halved until each
invocation holds at most twice the default's accumulator elements.

Buffering 1 is the plain K loop both reference kernels use; each entry's preferred shape is
also offered with buffering 2 (loads one K step ahead) for the tuner to time.

These follow jeffbolznv/vk_cooperative_matrix_perf's workgroup-scope kernel, which got its
best H200 fp32-result and int8 figures this way: it sweeps TILE_M, TILE_N over 128 and 256
at 128 or 256 invocations, with TILE_K 64 for 8-bit inputs, 32 for f16 results and 16
otherwise, and never runs 256 x 256 with 32-bit results (too slow). The implementation
stages workgroup-scope loads through shared memory itself; that memory is the
`cooperativeMatrixWorkgroupScopeReservedSharedMemory` it reserves out of
maxComputeSharedMemorySize (the module declares no shared memory of its own).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from coopmat.codegen.traits import Layout, Nv2Traits, Tile
from coopmat.common.enums import ComponentType as CT
from coopmat.device.model import FlexibleDimensionsProperties as FlexDims

# (operand, result) pairs the family builds (A and B share the operand type, C = result).
NV2_TYPES = frozenset({(CT.FLOAT16, CT.FLOAT16), (CT.FLOAT16, CT.FLOAT32),
                       (CT.BFLOAT16, CT.FLOAT32), (CT.UINT8, CT.UINT32),
                       (CT.SINT8, CT.SINT32)})

# Workgroups of 128 invocations first: on the H200 (driver 580, `python -m coopmat.bench
# --tune`, 4096^3, 2026-11-21) the 2x2-subgroup tiles beat the 2x4 ones for every pair:
# f16->f32 and bf16->f32 187 against 108, int8 357 against 314, f16->f16 276 against 246.
# For f32 results 128x128x32 first: 262 TFLOP/s at 8192^3 in a dedicated run that day.
PREFERRED_INVOCATIONS = (128, 256)

# (tile_m, tile_n, tile_k) from the preferred one down, per kind of result.
_SHAPES: dict[str, tuple[tuple[int, int, int], ...]] = {
    "f16": ((256, 128, 32), (128, 256, 32), (128, 128, 32), (256, 256, 32), (64, 64, 32)),
    "f32": ((128, 128, 32), (128, 128, 16), (128, 256, 16), (256, 128, 16), (64, 64, 32)),
    "int": ((128, 128, 64), (128, 256, 64), (256, 128, 64), (128, 128, 32), (64, 64, 64)),
}


def _kind(result_type: CT) -> str:
    if not result_type.is_float:
        return "int"
    return "f16" if result_type.bits == 16 else "f32"


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
    """Usable workgroup-scope entries for the types, preferred workgroup sizes first."""
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

    def rank(e: FlexDims) -> tuple[int, int]:
        inv = e.workgroup_invocations
        pref = PREFERRED_INVOCATIONS.index(inv) if inv in PREFERRED_INVOCATIONS else len(
            PREFERRED_INVOCATIONS)
        return pref, -inv

    return sorted(out, key=rank)


def _round_up(x: int, g: int) -> int:
    return -(-x // g) * g


def _lane_budget(kind: str) -> int:
    """Accumulator elements per invocation a tile may hold: twice the default tile's at 256
    invocations (so smaller workgroups get proportionally smaller tiles)."""
    tm, tn, _ = _SHAPES[kind][0]
    return 2 * tm * tn // 256


def _shrink(tm: int, tn: int, entry: FlexDims, budget: int) -> tuple[int, int]:
    """Halve the longer side (keeping granularity multiples) until the accumulator fits."""
    inv = entry.workgroup_invocations
    while tm * tn > budget * inv:
        if tn >= tm and (tn // 2) % entry.n_granularity == 0 and tn // 2 >= entry.n_granularity:
            tn //= 2
        elif (tm // 2) % entry.m_granularity == 0 and tm // 2 >= entry.m_granularity:
            tm //= 2
        else:
            break
    return tm, tn


def _tiles_for(entry: FlexDims, result_type: CT, subgroup_size: int,
               max_dimension: int | None) -> list[Tile]:
    sg_m, sg_n = subgroup_grid(entry.workgroup_invocations, subgroup_size)
    kind = _kind(result_type)
    out: list[Tile] = []
    for tm, tn, tk in _SHAPES[kind]:
        tm, tn = _round_up(tm, entry.m_granularity), _round_up(tn, entry.n_granularity)
        tm, tn = _shrink(tm, tn, entry, _lane_budget(kind))
        tk = _round_up(tk, entry.k_granularity)
        if max_dimension is not None and max(tm, tn, tk) > max_dimension:
            continue
        t = Tile(tm, tn, tk, sg_m, sg_n, 1)
        if t not in out:
            out.append(t)
    # The preferred shape once more with buffering 2 (each K step's successor loads issued
    # before its multiply): whether that beats the driver's own scheduling is for the tuner.
    if out:
        out.insert(1, dataclasses.replace(out[0], buffering=2))
    return out


def _usable(a_type: CT, result_type: CT, max_shared_memory: int,
            reserved_shared_memory: int) -> bool:
    # The module declares no shared memory; the implementation's reservation must fit.
    return (a_type, result_type) in NV2_TYPES and reserved_shared_memory <= max_shared_memory


def nv2_tile_candidates(a_type: CT, result_type: CT, flex_props: Iterable[FlexDims],
                        subgroup_size: int, max_shared_memory: int, max_workgroup_size: int,
                        *, reserved_shared_memory: int = 0,
                        max_dimension: int | None = None) -> list[Tile]:
    """A few tiles worth timing, the default first; [] where the family cannot run."""
    if not _usable(a_type, result_type, max_shared_memory, reserved_shared_memory):
        return []
    entries = matching_entries(a_type, result_type, flex_props, subgroup_size,
                               max_workgroup_size)
    # Workgroups of 128 and 256 invocations where listed, else the largest one listed.
    preferred = [e for e in entries if e.workgroup_invocations in PREFERRED_INVOCATIONS]
    out: list[Tile] = []
    for entry in preferred or entries[:1]:
        out += [t for t in _tiles_for(entry, result_type, subgroup_size, max_dimension)
                if t not in out]
    return out


def default_nv2_tile(a_type: CT, result_type: CT, flex_props: Iterable[FlexDims],
                     subgroup_size: int, max_shared_memory: int, max_workgroup_size: int,
                     *, reserved_shared_memory: int = 0,
                     max_dimension: int | None = None) -> Tile | None:
    """The preferred tile, or None where the device lists no usable workgroup-scope entry.

    `flex_props` is the device's flexible-dimensions list (FlexibleDimensionsProperties);
    an empty list (no VK_NV_cooperative_matrix2, or workgroup scope / tensor addressing
    off: pass () then) gives None. `max_workgroup_size` is
    cooperativeMatrixWorkgroupScopeMaxWorkgroupSize (or maxComputeWorkGroupInvocations)."""
    tiles = nv2_tile_candidates(a_type, result_type, flex_props, subgroup_size,
                                max_shared_memory, max_workgroup_size,
                                reserved_shared_memory=reserved_shared_memory,
                                max_dimension=max_dimension)
    return tiles[0] if tiles else None


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
