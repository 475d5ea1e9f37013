"""Tiles of the gemv kernel (gemv.py): the default and the sweep candidates.

A gemv tile is (rows, cols C, splits S, unroll U), see GemvTraits. The default, before any
measurement on a GPU: C = 2 columns per subgroup, S = 4 subgroups per workgroup (8
columns: N = 4096 makes 512 workgroups of 128 invocations, about four per multiprocessor
of an H200), U = 2 (each lane keeps U x C = 4 16-byte loads of B in flight; with 8 rows
the lane also holds 8 x 2 float32 vec4 sums and U x 8 units of A, so larger U and C trade
registers, hence occupancy, for loads in flight: the sweep decides).
"""

from __future__ import annotations

from coopmat.codegen.traits import GEMV_MAX_ROWS, Tile, gemv_tile

GEMV_MAX_M = GEMV_MAX_ROWS  # the policy's gemv rule reaches for it up to this many rows
DEFAULT_COLS, DEFAULT_SPLITS, DEFAULT_UNROLL = 2, 4, 2


def gemv_rows_for(M: int) -> int:
    """Rows of D a workgroup holds for M rows: all of them up to GEMV_MAX_ROWS."""
    return max(1, min(M, GEMV_MAX_ROWS))


def default_gemv_tile(M: int, subgroup_size: int) -> Tile:
    return gemv_tile(rows=gemv_rows_for(M), cols=DEFAULT_COLS, splits=DEFAULT_SPLITS,
                     unroll=DEFAULT_UNROLL, subgroup_size=subgroup_size)


def gemv_sweep(M: int, subgroup_size: int, max_invocations: int = 1024) -> list[Tile]:
    """Tiles worth timing on a GPU for M rows: C in {1, 2, 4}, S in {2, 4, 8}, U in
    {1, 2, 4} (27 tiles; fewer where S subgroups exceed the workgroup limit), default
    first."""
    default = default_gemv_tile(M, subgroup_size)
    out = [default]
    for cols in (1, 2, 4):
        for splits in (2, 4, 8):
            for unroll in (1, 2, 4):
                if splits * subgroup_size > max_invocations:
                    continue
                t = gemv_tile(rows=gemv_rows_for(M), cols=cols, splits=splits, unroll=unroll,
                              subgroup_size=subgroup_size)
                if t not in out:
                    out.append(t)
    return out
