"""Mid-size products (#49): would the nv2 family's workgroup-scope tiles run a split-K's
slices faster than khr? A split of M x N x K in S slices runs the work of an unsplit
(S M) x N x (K / S) product (the same workgroups, each as deep), so this times those on
every nv2 tile the device allows beside the policy's (khr) kernel.

    python lab/nv2_slices.py [--shapes 1024x4096x1792,...] [--max-tiles 8]
        [--tiles 128x128x64/8/1,...] [--khr-tiles 128x128x64,...] [--serial 20]

A split's slices read B once in all (no row tile shares it) where the shape is
M x (S N) x (K / S): 128 x 16384 x 3584 is the work of 128 rows x 4096 x 14336 split 4.
`--tiles` adds nv2 tiles (tile_m x tile_n x tile_k / subgroups / buffering), `--khr-tiles`
khr tiles run unsplit (2 x 2 subgroups, buffering 2).

Each line: shape, family and tile, kernel us (median of --repeat, one call a submission,
or of --repeat submissions of --serial runs back to back), TFLOP/s, and whether rows 0-7
match float64 numpy.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

import numpy as np
from split_tiles import float16_setup, time_one, timing_args  # as the split sweep

from coopmat import codegen, policy
from coopmat.codegen import GemmParams, Layout
from coopmat.codegen.nv2_tiles import nv2_traits
from coopmat.codegen.traits import ComponentType, Tile
from coopmat.policy import Options
from coopmat.policy.tiles import nv2_tiles
from coopmat.tools.bench import make_operands


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1024x4096x1792,1024x4096x3584,512x4096x3584")
    ap.add_argument("--tiles", default="", help="more nv2 tiles: MxNxK/SUBGROUPS/BUFFERING,...")
    ap.add_argument("--khr-tiles", default="", help="khr tiles run unsplit: MxNxK,...")
    timing_args(ap, 8)
    args = ap.parse_args()
    rt, info, pair = float16_setup()
    offered = nv2_tiles(info, ComponentType.FLOAT16, ComponentType.FLOAT32)
    tiles = offered[:args.max_tiles]
    if offered:  # asked-for tiles only where the device runs the family at all
        tiles += [_tile(v) for v in args.tiles.split(",") if v]
    config = policy.config_for(info, pair)
    khr_tiles = [Tile(*(int(x) for x in v.split("x")), 2, 2, 2)
                 for v in args.khr_tiles.split(",") if v]
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        M, N, K = (int(v) for v in shape.split("x"))
        a, b = make_operands(np.dtype(np.float16), M, N, K, "nt", rng)
        ref = a[:8].astype(np.float64) @ b.astype(np.float64)
        flops = 2.0 * M * N * K
        candidates: list[Any] = [None]
        for tile in khr_tiles:
            assert config is not None
            try:
                base = replace(codegen.khr_traits(config, info, Layout.ROW_MAJOR,
                                                  Layout.COLUMN_MAJOR, False, tile),
                               out_type=pair.out)
                params = GemmParams(M, N, K, K, K, N, N, 0, 0, 0, M * N)
                candidates.append(policy.fastest_variant(base, params, 1,
                                                         Options(split_k=1)))
            except ValueError as e:  # a tile this device's subgroups cannot stage
                print(f"{shape} khr {tile.describe()}: {e}")
        for tile in tiles:
            try:
                candidates.append(replace(nv2_traits(
                    ComponentType.FLOAT16, ComponentType.FLOAT32,
                    info.flexible_dimensions_properties, info.limits.subgroup_size,
                    Layout.ROW_MAJOR, Layout.COLUMN_MAJOR, False, tile), out_type=pair.out))
            except ValueError as e:
                print(f"{shape} nv2 {tile.describe()}: {e}")
        for traits in candidates:
            try:
                t, ok, _, name = time_one(rt, pair, a, b, ref, traits,
                                          1 if traits is not None else None, args.repeat,
                                          args.serial)
            except Exception as e:  # a tile the driver or the plan refuses: say so, go on
                print(f"{shape} {traits.tile.describe() if traits else 'policy'}: "
                      f"{str(e)[:100]}", flush=True)
                continue
            print(f"{shape} {1e6 * t:8.1f} us {flops / t / 1e12:6.1f} T ok={ok} {name}",
                  flush=True)
    return 0


def _tile(text: str) -> Tile:
    """An nv2 tile from 'MxNxK/SUBGROUPS/BUFFERING' (the subgroups as subgroup_grid lays
    them out: only their count matters to the family)."""
    dims, subgroups, buffering = text.split("/")
    m, n, k = (int(v) for v in dims.split("x"))
    sg = int(subgroups)
    sg_m = 1 << ((sg.bit_length() - 1) // 2)
    return Tile(m, n, k, sg_m, sg // sg_m, int(buffering))


if __name__ == "__main__":
    sys.exit(main())
