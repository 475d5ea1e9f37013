"""Default and candidate tiles of the nv2 family (codegen/nv2_tiles.py says what a tile
is).

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
best fp32-result and int8 figures this way: it sweeps TILE_M, TILE_N over 128 and 256
at 128 or 256 invocations, with TILE_K 64 for 8-bit inputs, 32 for f16 results and 16
otherwise, and never runs 256 x 256 with 32-bit results (too slow). The implementation
stages workgroup-scope loads through shared memory itself; that memory is the
`cooperativeMatrixWorkgroupScopeReservedSharedMemory` it reserves out of
maxComputeSharedMemorySize (the module declares no shared memory of its own).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from coopmat.codegen.nv2_tiles import matching_entries, nv2_buildable, subgroup_grid
from coopmat.codegen.traits import Tile
from coopmat.common.enums import ComponentType as CT
from coopmat.device.model import FlexibleDimensionsProperties as FlexDims

# Workgroups of 128 invocations first: the tuner found the 2x2-subgroup tiles faster than
# the 2x4 ones for every pair, and 128x128x32 first for f32 results (docs/design.md,
# Kernels).
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


def ranked_entries(a_type: CT, result_type: CT, flex_props: Iterable[FlexDims],
                   subgroup_size: int, max_workgroup_size: int) -> list[FlexDims]:
    """Usable workgroup-scope entries for the types, preferred workgroup sizes first."""
    out = matching_entries(a_type, result_type, flex_props, subgroup_size,
                           max_workgroup_size)

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


def nv2_tile_candidates(a_type: CT, result_type: CT, flex_props: Iterable[FlexDims],
                        subgroup_size: int, max_shared_memory: int, max_workgroup_size: int,
                        *, reserved_shared_memory: int = 0,
                        max_dimension: int | None = None) -> list[Tile]:
    """A few tiles worth timing, the default first; [] where the family cannot run."""
    if not nv2_buildable(a_type, result_type, max_shared_memory, reserved_shared_memory):
        return []
    entries = ranked_entries(a_type, result_type, flex_props, subgroup_size,
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
