"""Default khr tiles per config and device, the few-row, covering, filling and quantized
tiles, and the tuner's candidates. (The subgroup size they are for: codegen/tiles.py.)

Tiles, for the chosen subgroup width:

| device class        | subgroups | D block / subgroup | invocations | tile_k          | buf |
|---------------------|-----------|--------------------|-------------|-----------------|-----|
| GPU, 32-wide        | 2 x 4     | 64 x 32            | 256         | 64 bytes of A/B | 2   |
| GPU, 64-wide        | 2 x 2     | 64 x 64            | 256         | 64 bytes of A/B | 2   |
| GPU, 16-wide        | 4 x 4     | 32 x 32            | 256         | 64 bytes of A/B | 2   |
| GPU, 8-wide         | 4 x 8     | 32 x 16            | 256         | 64 bytes of A/B | 2   |
| CPU (any width)     | 2 x 2     | 2 x 2 matrices     |             | 2 x K           | 2   |

Why:
- Every GPU row is a 128 x 128 block of D from 256 invocations: each staged A row is reused
  128 times and B column 128 times whatever the width, and a 16-bit 128 x 32 A or B tile is
  512 16-byte loads, two per invocation.
- 64 accumulator elements per invocation (the D block is 64 x width elements): on NVIDIA
  the 64 x 32 block of 16 x 16 matrices, 8 accumulators (16 for 16 x 8) in 64 of a
  thread's 255 registers, keeps tensor cores busy between fragment loads without
  exhausting registers (docs/design.md, Kernels); on AMD at wave32 it
  is 64 VGPRs, as on NVIDIA. On Intel a SIMD8 thread then holds
  2 KiB of accumulators (4 x 2 matrices of 8 x 8 float32) of Xe-HPG's 4 KiB register
  file (128 x 32 bytes) and a SIMD16 thread 4 KiB (4 x 2 of 8 x 16) of Xe2's 16 KiB
  (256 x 64 bytes), leaving room for the A/B fragments of a K step and the next step's
  loads; on Xe-HPG the 64 x 32 block alone would fill the thread's registers. A 64-wide
  subgroup gets a square 64 x 64 block (4 x 4 accumulators of 16 x 16), 4 of them to a
  workgroup.
- tile_k of 64 bytes per row (32 f16 / 64 int8): two cooperative-matrix K steps per
  barrier pair (four where int8 matrices have K = 16, as on RADV), and one 16-byte vector
  load covers a quarter of a row.
- buffering 2: the next K step's global loads are issued before the multiply, so their
  latency overlaps it; the cost is a few registers per invocation (4 uvec4 here).
- Shared memory, 16-bit operands (128 x 128 x 32): 10 KiB A + 10 KiB B + one accumulator
  per subgroup of edge scratch (8 KiB of float32 on every recorded GPU), about 28 KiB: inside
  the 48 KiB of NVIDIA and of ANV (which caps what it reports at 48 KiB) and RADV's 64 KiB.
  Vulkan guarantees only 16 KiB, and tiles shrink to fit (below). A tile fits when the
  non-exact variants, which all hold the scratch, fit; so does the exact variant where it
  holds one too (KhrTraits.scratch_epilogue: Xe-HPG's float16 D).
- CPU drivers (lavapipe: 8 lanes, 8 x 8 x 8): a 32 x 32 tile keeps dispatches small and
  still exercises several subgroups, accumulator grids, and multiple K steps per tile.
  Device class is the device type, not the subgroup width: Xe-HPG's 8-wide subgroups are
  as narrow as lavapipe's.
Tiles shrink (tile_k first, then the accumulator grid, then the subgroup grid) until they
fit the device's shared memory and invocation limits.

Buffering 3 (two shared stages, one barrier per K step) and 4 (buffering 2 with streamed B
fragments) are never defaults; tune_candidates offers them for GPUs, on the large
per-subgroup blocks, for `python -m coopmat.bench --tune` to time. Buffering 5 (two
register sets, loads two K steps ahead) is the covering few-row tiles' (covering_rows_tile).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from coopmat.codegen.plan import element_bytes
from coopmat.codegen.tiles import tile_fits
from coopmat.codegen.traits import Tile
from coopmat.codegen.variants import khr_subgroup_size
from coopmat.common.enums import ComponentType
from coopmat.device.model import CooperativeMatrixProperties, DeviceLimits, PhysicalDeviceInfo
from coopmat.device.record import nv2_usable
from coopmat.policy.nv2_tiles import nv2_tile_candidates

TILE_K_BYTES = 64
GPU_INVOCATIONS = 256  # per workgroup, at every subgroup width (table above)
GPU_TILE_MN = 128  # the GPU default's block of D, rows and columns
ACC_ELEMS_PER_LANE = 64  # accumulator elements per invocation of a GPU default tile
COVERING_BUFFERING = 5  # covering_rows_tile's: two register sets, loads two K steps ahead
# tune_candidates stops adding buffering 3/4 tiles here (each is compiled and timed).
MAX_TUNE_CANDIDATES = 80


def gpu_block(subgroup_size: int) -> tuple[int, int]:
    """Rows and columns of D one subgroup of a GPU default tile holds: 64 x 32 at 32 lanes,
    64 x 64 at 64, 32 x 32 at 16, 32 x 16 at 8 (ACC_ELEMS_PER_LANE elements per lane)."""
    rows = 64 if subgroup_size >= 32 else 32
    return rows, max(1, ACC_ELEMS_PER_LANE * subgroup_size // rows)


def _candidates(a_type: ComponentType, m: int, n: int, k: int,
                subgroup_size: int, cpu: bool) -> Iterator[Tile]:
    """Tiles from the preferred one downwards."""
    if cpu:
        sg_m, sg_n, acc_m, acc_n, tile_k = 2, 2, 2, 2, 2 * k
    else:
        rows, cols = gpu_block(subgroup_size)
        sg_m, sg_n = max(1, GPU_TILE_MN // rows), max(1, GPU_TILE_MN // cols)
        acc_m, acc_n = max(1, rows // m), max(1, cols // n)
        tile_k = max(k, TILE_K_BYTES // element_bytes(a_type) // k * k)
    while True:
        tk = tile_k
        while tk >= k:
            yield Tile(sg_m * acc_m * m, sg_n * acc_n * n, tk, sg_m, sg_n, 2)
            tk //= 2
        if acc_m > 1 or acc_n > 1:
            if acc_m >= acc_n:
                acc_m = max(1, acc_m // 2)
            else:
                acc_n = max(1, acc_n // 2)
        elif sg_m > 1 or sg_n > 1:
            if sg_n >= sg_m:
                sg_n = max(1, sg_n // 2)
            else:
                sg_m = max(1, sg_m // 2)
        else:
            return


def default_tile(a_type: ComponentType, result_type: ComponentType, m: int, n: int, k: int,
                 subgroup_size: int, max_shared_memory: int, max_invocations: int, *,
                 cpu: bool = False) -> Tile:
    """The preferred tile for a config that fits the device's limits (ValueError if none);
    `cpu` for a CPU driver's tile (module docstring)."""
    for tile in _candidates(a_type, m, n, k, subgroup_size, cpu):
        if tile_fits(tile, a_type, result_type, m, n, k, subgroup_size, max_shared_memory,
                     max_invocations):
            return tile
    raise ValueError(f"no tile fits {m}x{n}x{k} with subgroup {subgroup_size}, "
                     f"{max_shared_memory} bytes of shared memory, "
                     f"{max_invocations} invocations")


SMALL_M = 64  # problems with at most this many rows form their own shape class


def small_m_tile(a_type: ComponentType, result_type: ComponentType, m: int, n: int, k: int,
                 subgroup_size: int, max_shared_memory: int, max_invocations: int, *,
                 cpu: bool = False) -> Tile:
    """For few rows (LLM decode shapes, M <= SMALL_M): a narrow, deep tile. Such a GEMM is
    a stream over B; a 128-wide tile would leave most of a GPU's cores idle, so tiles are
    two subgroups of 2 x 2 matrices (many workgroups) and 128 bytes deep (few K steps)."""
    if cpu:
        return default_tile(a_type, result_type, m, n, k, subgroup_size, max_shared_memory,
                            max_invocations, cpu=cpu)
    tk = max(k, 128 // element_bytes(a_type) // k * k)
    tile = Tile(2 * m, 2 * 2 * n, tk, 1, 2, 2)
    if tile_fits(tile, a_type, result_type, m, n, k, subgroup_size, max_shared_memory,
                 max_invocations):
        return tile
    return default_tile(a_type, result_type, m, n, k, subgroup_size, max_shared_memory,
                        max_invocations)


def covering_rows_tile(tile: Tile, M: int, a_type: ComponentType, result_type: ComponentType,
                       m: int, n: int, k: int, subgroup_size: int, max_shared_memory: int,
                       max_invocations: int) -> Tile:
    """A few-row tile (M <= SMALL_M) that holds all M rows in one row block, where `tile`
    holds fewer: each row block reads all of B again, and with few rows the product is a
    stream over B. 32 or 64 rows by 4 matrices' columns, 2 x 2 subgroups, `tile`'s K step,
    two register sets (buffering 5: loads two K steps ahead); `tile` itself where that
    does not fit the device, and for 17-31 rows (a partial 32-row tile measured slower
    than two 16-row blocks). Buffering 5 measured faster than 2 on these tiles
    (docs/design.md, Kernels)."""
    if M <= tile.tile_m or M > SMALL_M or 16 < M < 32:
        return tile
    rows = 32 if M <= 32 else 64
    wide = Tile(rows, 4 * n, tile.tile_k, 2, 2, COVERING_BUFFERING)
    if rows % (2 * m) or not tile_fits(wide, a_type, result_type, m, n, k, subgroup_size,
                                       max_shared_memory, max_invocations):
        return tile
    return wide


# A grid of at least this many workgroups keeps a large GPU busy: about two per
# multiprocessor of a 132-SM GPU, the split-K rule's target too.
FILL_GROUPS = 256


def filling_ladder(a_type: ComponentType, result_type: ComponentType, m: int, n: int, k: int,
                   subgroup_size: int, max_shared_memory: int,
                   max_invocations: int) -> tuple[Tile, ...]:
    """Tiles for problems too small to fill the GPU with the usual ones, largest first,
    those that fit the device: 4 x 4 matrices on 2 x 2 subgroups, 2 x 4 on 1 x 2, then
    one matrix per subgroup on 1 x 2 (loads, then multiplies); each 128 bytes of K deep.
    (filling_tile says which one a problem takes.) None below 32 lanes (Intel's 8- and
    16-wide subgroups): there these tiles would be workgroups of 16 to 64 invocations,
    not measured on any such device."""
    if subgroup_size < 32:
        return ()
    tk = max(k, 128 // element_bytes(a_type) // k * k)
    ladder = (Tile(4 * m, 4 * n, tk, 2, 2, 2), Tile(2 * m, 4 * n, tk, 1, 2, 2),
              Tile(m, 2 * n, tk, 1, 2, 1))
    return tuple(t for t in ladder if tile_fits(t, a_type, result_type, m, n, k,
                                                subgroup_size, max_shared_memory,
                                                max_invocations))


def filling_tile(tile: Tile, ladder: tuple[Tile, ...], M: int, N: int, batch: int) -> Tile:
    """`tile` where its grid has FILL_GROUPS workgroups or more; else the largest tile of
    `ladder` (filling_ladder) smaller than it whose grid has, else the ladder's smallest.
    A small product on a large tile runs on a few workgroups, each walking all of K, and
    leaves most of the GPU idle; once the large tile's grid fills the GPU it is the
    faster again (docs/design.md, Kernels)."""
    def groups(t: Tile) -> int:
        return batch * -(-M // t.tile_m) * -(-N // t.tile_n)

    if groups(tile) >= FILL_GROUPS:
        return tile
    best = tile
    for t in ladder:
        if t.tile_m * t.tile_n >= best.tile_m * best.tile_n:
            continue
        best = t
        if groups(t) >= FILL_GROUPS:
            break
    return best


def deep_few_row_tile(tile: Tile, m: int, n: int, k: int) -> Tile:
    """The one-row-block few-row tile (m rows, 4 subgroups across N) with 256 elements of K
    a step instead of 128, for products the split-K rule leaves whole: more of B in flight
    per workgroup. `tile` itself for other tiles (the caller checks that the kernel's
    shared memory fits: it depends on the layouts). Where the split-K rule splits a
    product, the split stays ahead: the rule runs first."""
    if (tile.tile_m, tile.tile_n, tile.tile_k, tile.subgroups_m, tile.subgroups_n) != \
            (m, 4 * n, 128, 1, 4):
        return tile
    return tile if 256 % k else replace(tile, tile_k=256)


def quant_few_row_tile(tile: Tile, M: int, a_type: ComponentType, result_type: ComponentType,
                       m: int, n: int, k: int, subgroup_size: int, max_shared_memory: int,
                       max_invocations: int) -> Tile:
    """The khr tile for a quantized B with at most SMALL_M rows on a GPU: 4 n columns, 128
    elements of K (four blocks) a step, two buffers; m rows on 1 x 4 subgroups up to m
    rows, 2 m or 4 m rows on 2 x 2 past that (the tiles the float product runs: the tuned
    few-row tile, and the covering ones); `tile` where that does not fit."""
    if M <= m:
        few = Tile(m, 4 * n, 128, 1, 4, 2)
    else:
        few = Tile(2 * m if M <= 2 * m else 4 * m, 4 * n, 128, 2, 2, 2)
    if 128 % k or not tile_fits(few, a_type, result_type, m, n, k, subgroup_size,
                                max_shared_memory, max_invocations):
        return tile
    return few


def quant_general_tile(tile: Tile, a_type: ComponentType, result_type: ComponentType, m: int,
                       n: int, k: int, subgroup_size: int, max_shared_memory: int,
                       max_invocations: int) -> Tile:
    """The khr tile for a quantized B (GGUF blocks dequantized while staged) with more than
    SMALL_M rows on a GPU: 8 x 4 matrices (128 x 64 with 16 x 16 ones), 2 x 2 subgroups,
    64 elements of K (two blocks) a step, two buffers; `tile` where that does not fit.
    Half the general default's columns leave registers for the dequantization (the best
    or near it of the swept tiles; docs/design.md, Quantized weights)."""
    wide = Tile(8 * m, 4 * n, 64, 2, 2, 2)
    if 64 % k or not tile_fits(wide, a_type, result_type, m, n, k, subgroup_size,
                               max_shared_memory, max_invocations):
        return tile
    return wide


def tune_candidates(a_type: ComponentType, result_type: ComponentType, m: int, n: int, k: int,
                    subgroup_size: int, max_shared_memory: int,
                    max_invocations: int, small_m: bool = False, *,
                    cpu: bool = False) -> list[Tile]:
    """Tiles worth timing on a device (`python -m coopmat.bench --tune`): the default plus
    other subgroup grids, accumulator grids and K depths that fit its limits. `small_m`
    asks for the candidates of the few-rows shape class instead."""
    out: list[Tile] = []
    if small_m and not cpu:
        for sg_m, sg_n in [(1, 1), (1, 2), (1, 4), (2, 2)]:
            for acc_m, acc_n in [(1, 1), (1, 2), (2, 2), (1, 4), (2, 1)]:
                for kb in (64, 128, 256):
                    tk = max(k, kb // element_bytes(a_type) // k * k)
                    tile = Tile(sg_m * acc_m * m, sg_n * acc_n * n, tk, sg_m, sg_n, 2)
                    if tile not in out and tile_fits(tile, a_type, result_type, m, n, k,
                                                     subgroup_size, max_shared_memory,
                                                     max_invocations):
                        out.append(tile)
        first = small_m_tile(a_type, result_type, m, n, k, subgroup_size, max_shared_memory,
                             max_invocations)
        big = default_tile(a_type, result_type, m, n, k, subgroup_size, max_shared_memory,
                           max_invocations)
        return [first, *[t for t in [big, *out] if t != first]]
    if cpu:
        sg_grids = [(1, 1), (2, 2)]
        acc_grids = [(1, 1), (2, 2)]
        k_bytes = [k * element_bytes(a_type), 2 * k * element_bytes(a_type)]
    else:
        sg_grids = [(2, 2), (2, 4), (4, 2), (4, 4)]
        if subgroup_size < 32:  # narrow subgroups: more of them (the default has 16 or 32)
            sg_grids += [(4, 8), (8, 4)]
        acc_grids = [(2, 2), (4, 2), (2, 4), (4, 4)]
        k_bytes = [32, 64, 128]
    if not cpu and element_bytes(result_type) == 2:
        acc_grids += [(8, 4), (4, 8)]  # 16-bit accumulators leave registers for more of them
    for sg_m, sg_n in sg_grids:
        for acc_m, acc_n in acc_grids:
            for kb in k_bytes:
                tk = max(k, kb // element_bytes(a_type) // k * k)
                tile = Tile(sg_m * acc_m * m, sg_n * acc_n * n, tk, sg_m, sg_n, 2)
                if tile not in out and tile_fits(tile, a_type, result_type, m, n, k,
                                                 subgroup_size, max_shared_memory,
                                                 max_invocations):
                    out.append(tile)
    if not cpu:
        staged = _staged_candidates(a_type, result_type, m, n, k, subgroup_size,
                                    max_shared_memory, max_invocations, out)
        out += staged[:max(0, MAX_TUNE_CANDIDATES - 1 - len(out))]
    default = default_tile(a_type, result_type, m, n, k, subgroup_size, max_shared_memory,
                           max_invocations, cpu=cpu)
    if default in out:
        out.remove(default)
    return [default, *out]


def _staged_candidates(a_type: ComponentType, result_type: ComponentType, m: int, n: int,
                       k: int, subgroup_size: int, max_shared_memory: int,
                       max_invocations: int, seen: list[Tile]) -> list[Tile]:
    """GPU candidates for buffering 3 (two shared stages, one barrier per K step) and 4
    (buffering 2 with streamed B fragments), limited to the large per-subgroup blocks that
    the buffering-2 measurements favour: buffering 3 needs twice the staging memory, so it
    gets the shallower K depths; buffering 4 the depth vk_cooperative_matrix_perf uses."""
    es = element_bytes(a_type)
    out: list[Tile] = []
    for sg_m, sg_n in [(2, 2), (2, 4), (4, 2)]:
        for acc_m, acc_n in [(2, 4), (4, 2), (4, 4), (8, 4), (4, 8)]:
            if acc_m * acc_n * m * n * element_bytes(result_type) > 32 * 16 * 16 * 2:
                continue  # more accumulator registers than 32 16x16 f16 matrices
            for buffering, k_bytes in ((3, (32, 64)), (4, (64,))):
                if buffering == 4 and acc_m * acc_n * m * n < 16 * 16 * 16:
                    continue
                for kb in k_bytes:
                    tk = max(k, kb // es // k * k)
                    tile = Tile(sg_m * acc_m * m, sg_n * acc_n * n, tk, sg_m, sg_n, buffering)
                    if tile not in seen and tile not in out and tile_fits(
                            tile, a_type, result_type, m, n, k, subgroup_size,
                            max_shared_memory, max_invocations):
                        out.append(tile)
    return out


# -- the same for a config on a device -------------------------------------------------

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
    """`tile` widened to hold M few rows in one row block (covering_rows_tile)."""
    return covering_rows_tile(tile, M, cfg.a_type, cfg.result_type, cfg.M, cfg.N, cfg.K,
                              khr_subgroup_size(limits), limits.max_compute_shared_memory_size,
                              limits.max_compute_work_group_invocations)


def khr_filling_ladder(cfg: CooperativeMatrixProperties,
                       limits: DeviceLimits) -> tuple[Tile, ...]:
    """The tiles small products may take on this device (filling_ladder)."""
    return filling_ladder(cfg.a_type, cfg.result_type, cfg.M, cfg.N, cfg.K,
                          khr_subgroup_size(limits), limits.max_compute_shared_memory_size,
                          limits.max_compute_work_group_invocations)


def khr_deep_tile(cfg: CooperativeMatrixProperties, tile: Tile) -> Tile:
    """`tile` with twice the K step where it is the few-row tile (deep_few_row_tile)."""
    return deep_few_row_tile(tile, cfg.M, cfg.N, cfg.K)


def khr_quant_tile(cfg: CooperativeMatrixProperties, limits: DeviceLimits, tile: Tile,
                   M: int) -> Tile:
    """The khr tile for a quantized B and M rows on a GPU (quant_few_row_tile up to
    SMALL_M rows, else quant_general_tile); `tile` where that does not fit."""
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
