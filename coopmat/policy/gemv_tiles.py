"""Tiles of the gemv kernel (codegen/gemv.py): the default, the integer kernel's, the sweep
candidates, and whether the kernel keeps the driver's bounds checks and prefetches.

A gemv tile is (rows, cols C, splits S, unroll U, k_splits Q), see GemvTraits. The default: C = 2
columns per subgroup, S = 4 subgroups per workgroup (8 columns: N = 4096 makes 512
workgroups of 128 invocations, about four per multiprocessor of a large GPU), U = 4 for
up to 4 rows (each lane keeps U x C = 8 16-byte loads of B in flight) and U = 1 beyond
(with 8 rows the lane also holds 8 x 2 float32 vec4 sums and U x 8 units of A:
registers, hence occupancy, cost more than loads in flight gain). That default came
near the best of the 27 swept tiles at 1 to 8 rows (docs/design.md, Kernels).

With a quantized B (b_quant) a load is a whole block of 32 weights (34 bytes for q8_0, 18
for q4_0) and the matching 64 bytes of each row of A, so the default takes U = 1, and C
= 4 columns per subgroup from QUANT_COLS_FROM_ROWS rows of its format, by K (C = 2 below):
a lane then widens A's 32 elements once for four blocks (slower for q8_0 below 3 rows
against a deep weight, faster at 2 rows against K = 4096;
docs/design.md, Quantized weights). The sweep is the same 27 tiles, with tile_k in
blocks. On a CPU driver a quantized B keeps C = 2: a lane's columns are unrolled code,
which a CPU driver compiles on the first call (docs/design.md, Policy).
"""

from __future__ import annotations

from dataclasses import replace

from coopmat.codegen.traits import (
    GEMV_MAX_ROWS,
    EpilogueOps,
    GemvTraits,
    Layout,
    Tile,
    gemv_tile,
)
from coopmat.codegen.variants import khr_subgroup_size
from coopmat.common.enums import ComponentType
from coopmat.device.model import DeviceLimits

GEMV_MAX_M = GEMV_MAX_ROWS  # the policy's gemv rule reaches for it up to this many rows
DEFAULT_COLS, DEFAULT_SPLITS = 2, 4
DEFAULT_UNROLL = 4  # up to UNROLL_MAX_ROWS rows; U = 1 beyond
UNROLL_MAX_ROWS = 4
DEFAULT_QUANT_UNROLL = 1  # blocks per column and lane per step with a quantized B
QUANT_COLS = 4  # columns per subgroup with a quantized B, from this many rows by format:
# (deepest K or None for any, rows), the first entry whose deepest K the product is within.
QUANT_COLS_FROM_ROWS = {"q8_0": ((4096, 2), (None, 3)), "q4_0": ((None, 1),)}


def quant_cols_from_rows(b_quant: str, K: int | None) -> int:
    """Rows from which a b_quant weight's gemv takes QUANT_COLS columns a subgroup (K: the
    product's depth, where known)."""
    return next((rows for deepest, rows in QUANT_COLS_FROM_ROWS.get(b_quant, ())
                 if deepest is None or (K is not None and K <= deepest)), GEMV_MAX_ROWS + 1)


def gemv_rows_for(M: int) -> int:
    """Rows of D a workgroup holds for M rows: all of them up to GEMV_MAX_ROWS."""
    return max(1, min(M, GEMV_MAX_ROWS))


# One row of a quantized B: (fewest columns N, columns per subgroup C, blocks per lane
# and step U, column groups S, subgroups sharing a group's K Q), the first entry whose
# fewest N the product has: the fastest of a sweep per format; against fewer columns,
# more blocks in flight a lane and (q4_0) K shared by two subgroups.
QUANT_ONE_ROW = {"q8_0": ((0, 2, 2, DEFAULT_SPLITS, 1),),
                 "q4_0": ((8192, QUANT_COLS, 1, DEFAULT_SPLITS, 1), (0, QUANT_COLS, 2, 4, 2))}

# The integer kernel's tile (activation_quant="q8_1"; x as 8-bit blocks, so a lane's
# arithmetic for a block is a quarter of the float kernel's) up to INTEGER_TILE_MAX_ROWS
# rows, either format: (fewest columns N, C, U, S, Q) as QUANT_ONE_ROW; more columns a
# subgroup than the float kernel takes, and against fewer columns two subgroups sharing
# each group's K. More rows keep the float kernel's default (these tiles measured slower
# there: more sums and loads a lane).
INTEGER_TILES = ((8192, 8, 2, 4, 1), (0, 4, 2, 2, 2))
INTEGER_TILE_MAX_ROWS = 4


# Rows of a float B deep enough to prefetch (`prefetches` on the tile above): (C, S, U)
# by rows: at 4 rows a tile with fewer registers for the rows' sums and the carried
# loads; at 1 and 2 rows the default stays the best.
PREFETCH_TILES = {4: (2, 8, 2)}


def default_gemv_tile(M: int, subgroup_size: int, b_quant: str | None = None,
                      N: int | None = None, K: int | None = None, *,
                      cpu: bool = False) -> Tile:
    """The default tile for M rows (b_quant: for a quantized B of that format; N and K:
    the product's columns and depth where known; cpu: on a CPU driver)."""
    rows = gemv_rows_for(M)
    unroll = DEFAULT_QUANT_UNROLL if b_quant is not None else \
        DEFAULT_UNROLL if rows <= UNROLL_MAX_ROWS else 1
    wide = not cpu and b_quant is not None and rows >= quant_cols_from_rows(b_quant, K)
    cols, splits, k_splits = (QUANT_COLS if wide else DEFAULT_COLS), DEFAULT_SPLITS, 1
    if b_quant is not None and M == 1 and N is not None:
        cols, unroll, splits, k_splits = next(
            (shape for least, *shape in QUANT_ONE_ROW.get(b_quant, ()) if N >= least),
            (cols, unroll, splits, k_splits))
    tile = gemv_tile(rows=rows, cols=cols, splits=splits, unroll=unroll,
                     subgroup_size=subgroup_size, b_quant=b_quant, k_splits=k_splits)
    if K is not None and rows in PREFETCH_TILES and prefetches(K, tile, b_quant):
        cols, splits, unroll = PREFETCH_TILES[rows]
        tile = gemv_tile(rows=rows, cols=cols, splits=splits, unroll=unroll,
                         subgroup_size=subgroup_size, b_quant=b_quant)
    return tile


def integer_gemv_tile(M: int, subgroup_size: int, b_quant: str, N: int, *,
                     cpu: bool = False) -> Tile:
    """The integer kernel's tile for M rows against a b_quant weight of N columns (cpu: on
    a CPU driver, the float kernel's default, whose fewer unrolled columns compile
    sooner; so too beyond INTEGER_TILE_MAX_ROWS rows)."""
    if cpu or M > INTEGER_TILE_MAX_ROWS:
        return default_gemv_tile(M, subgroup_size, b_quant, N, cpu=cpu)
    cols, unroll, splits, k_splits = next(shape for least, *shape in INTEGER_TILES
                                          if N >= least)
    return gemv_tile(rows=gemv_rows_for(M), cols=cols, splits=splits, unroll=unroll,
                     subgroup_size=subgroup_size, b_quant=b_quant, k_splits=k_splits)


# Rows up to which a quantized B's gemv kernel keeps the driver's bounds checks, by
# format. Without them (GemvTraits.storage_checks) every gemv kernel the policy runs
# measured as fast or faster, so none keeps them.
CHECKED_QUANT_ROWS: dict[str, int] = {}


def checks_storage(M: int, b_quant: str | None = None) -> bool:
    """Whether the gemv kernel for M rows (of a B quantized as b_quant) keeps the driver's
    bounds checks."""
    return b_quant is not None and M <= CHECKED_QUANT_ROWS.get(b_quant, 0)


# Full K steps (of tile_k) from which the gemv kernel of a float B loads each step a step
# ahead (GemvTraits.prefetch): a long K loop hides the loads' latency that way, a short
# one (4 steps) measured as fast or slower; with a quantized B it measured slower, so
# it is off there.
PREFETCH_MIN_STEPS = 8


def prefetches(K: int, tile: Tile, b_quant: str | None = None) -> bool:
    """Whether the gemv kernel for K (its tile `tile`) prefetches a step ahead."""
    return b_quant is None and K >= PREFETCH_MIN_STEPS * tile.tile_k


def gemv_sweep(M: int, subgroup_size: int, max_invocations: int = 1024,
               b_quant: str | None = None) -> list[Tile]:
    """Tiles worth timing on a GPU for M rows (b_quant: with a quantized B of that
    format): C in {1, 2, 4}, S in {2, 4, 8}, U in {1, 2, 4} (27 tiles; fewer where S
    subgroups exceed the workgroup limit), default first."""
    default = default_gemv_tile(M, subgroup_size, b_quant)
    out = [default]
    for cols in (1, 2, 4):
        for splits in (2, 4, 8):
            for unroll in (1, 2, 4):
                if splits * subgroup_size > max_invocations:
                    continue
                t = gemv_tile(rows=gemv_rows_for(M), cols=cols, splits=splits, unroll=unroll,
                              subgroup_size=subgroup_size, b_quant=b_quant)
                if t not in out:
                    out.append(t)
    return out


def gemv_traits(operand: ComponentType, result: ComponentType, limits: DeviceLimits,
                has_c: bool, M: int, *, tile: Tile | None = None,
                out_type: ComponentType | None = None,
                ops: EpilogueOps | None = None, b_quant: str | None = None,
                K: int | None = None, N: int | None = None, cpu: bool = False) -> GemvTraits:
    """gemv traits (row-major A, column-major B; b_quant: B as GGUF blocks of that
    format) for M rows on a device: `tile` (its tile_m replaced by the rows M needs), else
    the default tile; at the subgroup size khr kernels use (the smallest
    the device lets a pipeline require); without the driver's bounds checks where
    checks_storage says, and for a known K loading a step ahead where
    prefetches says (N, where known, shapes a quantized B's one-row tile; cpu: on a CPU
    driver)."""
    sg = khr_subgroup_size(limits)
    tile = default_gemv_tile(M, sg, b_quant, N, K, cpu=cpu) if tile is None else \
        replace(tile, tile_m=gemv_rows_for(M))
    return GemvTraits(a_type=operand, b_type=operand, c_type=result, result_type=result,
                      a_layout=Layout.ROW_MAJOR, b_layout=Layout.COLUMN_MAJOR, has_c=has_c,
                      tile=tile, subgroup_size=sg, out_type=out_type, ops=ops,
                      b_quant=b_quant, storage_checks=checks_storage(M, b_quant),
                      prefetch=K is not None and prefetches(K, tile, b_quant))
