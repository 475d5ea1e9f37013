"""Tiles of the rows kernel (rows.py): the default for a device and the sweep candidates.

A rows tile is (row_frags, nf, splits, unroll, kc), see RowsTraits. The default, before
any measurement: NF = 2 fragments of columns per workgroup (N = 4096 then makes 4096 /
(2 n) workgroups, enough to cover a large GPU), S = 4 subgroups splitting K, U = 4 k steps
per batch of B loads (U x NF fragments in flight per subgroup), and the largest kc up to
MAX_KC whose two A stages fit half the shared memory (two workgroups per multiprocessor),
else all of it; where even one group of S x U k steps does not fit, unroll and then splits
give way (64 rows on a 48 KiB device: S = 4, U = 2, kc = 128).

On a CPU driver (lavapipe) the default is S = 2, U = 2 and kc one group of S x U k steps:
the kernel unrolls its chunk, and a CPU driver compiles it on the first call (tens of
seconds for a chunk of a thousand; docs/design.md, Policy), where the GPU's reason for a
long chunk, fewer barriers, buys a CPU little.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from coopmat.codegen.rows_tiles import row_frags_for, rows_tile_fits
from coopmat.codegen.traits import Layout, RowsTraits, Tile, rows_tile
from coopmat.codegen.variants import khr_subgroup_size
from coopmat.common.enums import ComponentType
from coopmat.device.model import CooperativeMatrixProperties, DeviceLimits

ROWS_MAX_M = 64  # the policy's default reaches for the rows kernel up to this many rows
MAX_KC = 1024
DEFAULT_NF = 2
# (splits, unroll) in order of preference where shared memory runs short.
_SPLITS_UNROLL = ((4, 4), (4, 2), (2, 2), (2, 1), (1, 1))
CPU_SPLITS_UNROLL = (2, 2)


def _largest_kc(base: RowsTraits, splits: int, unroll: int, budget: int) -> Tile | None:
    t = base.tile
    step = base.k * splits * unroll
    for kc in range(MAX_KC - MAX_KC % step, 0, -step):
        tile = Tile(t.tile_m, t.tile_n, kc, splits, 1, unroll)
        if rows_tile_fits(replace(base, tile=tile), budget):
            return tile
    return None


@functools.lru_cache(maxsize=256)
def default_rows_tile(base: RowsTraits, M: int, shared_limit: int, *,
                      cpu: bool = False) -> Tile:
    """The default tile for `base` (its tile is replaced) and M rows, `cpu` for a CPU
    driver's (module docstring); ValueError where no tile fits the device's shared
    memory."""
    rf = row_frags_for(min(M, ROWS_MAX_M), base.m)
    base = replace(base, tile=rows_tile(base.m, base.n, row_frags=rf, nf=DEFAULT_NF,
                                        splits=1, unroll=1, kc=base.k))
    if cpu:
        splits, unroll = CPU_SPLITS_UNROLL
        t = base.tile
        one_group = Tile(t.tile_m, t.tile_n, base.k * splits * unroll, splits, 1, unroll)
        if rows_tile_fits(replace(base, tile=one_group), shared_limit):
            return one_group
    for splits, unroll in _SPLITS_UNROLL:
        for budget in (shared_limit // 2, shared_limit):
            tile = _largest_kc(base, splits, unroll, budget)
            if tile is not None:
                return tile
    raise ValueError(f"no rows tile for {rf * base.m} rows fits {shared_limit} bytes of "
                     f"shared memory")


def rows_sweep(base: RowsTraits, shared_limit: int) -> list[Tile]:
    """Tiles worth timing on a GPU for `base`'s row_frags (its tile's tile_m): NF in
    {1, 2, 4}, S in {2, 4, 8, 16}, U in {2, 4, 8}, kc the largest that fits and half of
    it. More subgroups a workgroup put more of B's loads in flight per multiprocessor,
    which is what a kernel bound by reading B needs."""
    out: list[Tile] = []
    rf = base.row_frags
    for nf in (1, 2, 4):
        for splits in (2, 4, 8, 16):
            for unroll in (2, 4, 8):
                b = replace(base, tile=rows_tile(base.m, base.n, row_frags=rf, nf=nf,
                                                 splits=splits, unroll=unroll, kc=base.k))
                top = _largest_kc(b, splits, unroll, shared_limit)
                if top is None:
                    continue
                out.append(top)
                half = replace(top, tile_k=top.tile_k // 2)
                if half.tile_k % (b.k * splits * unroll) == 0 and \
                        rows_tile_fits(replace(b, tile=half), shared_limit):
                    out.append(half)
    return out


def rows_traits(cfg: CooperativeMatrixProperties, limits: DeviceLimits, a_layout: Layout,
                b_layout: Layout, has_c: bool, M: int, *, tile: Tile | None = None,
                aligned: bool = False, out_type: ComponentType | None = None,
                cpu: bool = False) -> RowsTraits:
    """rows traits for a config on a device (`cpu`: a CPU driver) and M rows: `tile` (its
    tile_m replaced by the row fragments M needs), else the default tile."""
    base = RowsTraits(a_type=cfg.a_type, b_type=cfg.b_type, c_type=cfg.c_type,
                      result_type=cfg.result_type, a_layout=a_layout, b_layout=b_layout,
                      has_c=has_c, tile=Tile(cfg.M, cfg.N, cfg.K, 1, 1, 1),
                      subgroup_size=khr_subgroup_size(limits), out_type=out_type,
                      m=cfg.M, n=cfg.N, k=cfg.K, aligned=aligned)
    if tile is None:
        tile = default_rows_tile(base, M, limits.max_compute_shared_memory_size, cpu=cpu)
    else:
        tile = replace(tile, tile_m=row_frags_for(min(M, ROWS_MAX_M), cfg.M) * cfg.M)
    return replace(base, tile=tile)
