"""Default workgroup tiles, per config and device.

| device class          | subgroups     | accumulators / subgroup | tile_k           | buffering |
|-----------------------|---------------|-------------------------|------------------|-----------|
| subgroup >= 32 (GPUs) | 2 x 4 (256)   | 64 x 32 block of D      | 64 bytes of A/B  | 2         |
| subgroup < 32 (CPUs)  | 2 x 2         | 2 x 2 matrices          | 2 x K            | 2         |

Why:
- GPU: 8 subgroups give each SM enough warps to hide latency while the 128 x 128 output
  tile (for 16 x 16 matrices) reuses every staged A row 128 times and B column 128 times;
  8 accumulators of 16 x 16 per subgroup (16 for 16 x 8) keep tensor cores busy between
  shared-memory fragment loads without exhausting registers.
- tile_k of 64 bytes per row (32 f16 / 64 int8): two cooperative-matrix K steps per
  barrier pair, and one 16-byte vector load covers a quarter of a row, so 256 invocations
  load a 128-row tile in two rounds.
- buffering 2: the next K step's global loads are issued before the multiply, so their
  latency overlaps it; the cost is a few registers per invocation (4 uvec4 here).
- Shared use for f16 (128x128x32, f32 results): 10 KiB A + 8.5-10 KiB B + 8 KiB edge
  scratch, well inside the 48 KiB Vulkan guarantees.
- Small subgroups (lavapipe: 8 lanes, 8 x 8 x 8): a 32 x 32 tile keeps dispatches small and
  still exercises several subgroups, accumulator grids, and multiple K steps per tile.
Tiles shrink (tile_k first, then the accumulator grid, then the subgroup grid) until they
fit the device's shared memory and invocation limits.

Buffering 3 (two shared stages, one barrier per K step) and 4 (buffering 2 with streamed B
fragments) are never defaults; tune_candidates offers them for GPUs, on the large
per-subgroup blocks, for `python -m coopmat.bench --tune` to time.
"""

from __future__ import annotations

from collections.abc import Iterator

from coopmat.codegen.plan import element_bytes, plan_kernel
from coopmat.codegen.traits import KhrTraits, Layout, Tile
from coopmat.device.enums import ComponentType

GPU_SUBGROUP = 32
TILE_K_BYTES = 64
# tune_candidates stops adding buffering 3/4 tiles here (each is compiled and timed).
MAX_TUNE_CANDIDATES = 80


def _fits(tile: Tile, a_type: ComponentType, result_type: ComponentType, m: int, n: int,
          k: int, subgroup_size: int, max_shared_memory: int, max_invocations: int) -> bool:
    if tile.subgroups * subgroup_size > max_invocations:
        return False
    for a_layout in Layout:
        for b_layout in Layout:
            for aligned in (False, True):
                traits = KhrTraits(a_type=a_type, b_type=a_type, c_type=result_type,
                                   result_type=result_type, a_layout=a_layout,
                                   b_layout=b_layout, has_c=True, tile=tile,
                                   subgroup_size=subgroup_size, m=m, n=n, k=k,
                                   aligned=aligned)
                try:
                    plan = plan_kernel(traits)
                except ValueError:
                    return False
                if plan.shared_bytes > max_shared_memory:
                    return False
    return True


def _candidates(a_type: ComponentType, m: int, n: int, k: int,
                subgroup_size: int) -> Iterator[Tile]:
    """Tiles from the preferred one downwards."""
    if subgroup_size >= GPU_SUBGROUP:
        sg_m, sg_n = 2, 4
        acc_m, acc_n = max(1, 64 // m), max(1, 32 // n)
        tile_k = max(k, TILE_K_BYTES // element_bytes(a_type) // k * k)
    else:
        sg_m, sg_n, acc_m, acc_n, tile_k = 2, 2, 2, 2, 2 * k
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
                 subgroup_size: int, max_shared_memory: int, max_invocations: int) -> Tile:
    """The preferred tile for a config that fits the device's limits (ValueError if none)."""
    for tile in _candidates(a_type, m, n, k, subgroup_size):
        if _fits(tile, a_type, result_type, m, n, k, subgroup_size, max_shared_memory,
                 max_invocations):
            return tile
    raise ValueError(f"no tile fits {m}x{n}x{k} with subgroup {subgroup_size}, "
                     f"{max_shared_memory} bytes of shared memory, "
                     f"{max_invocations} invocations")


SMALL_M = 64  # problems with at most this many rows form their own shape class


def small_m_tile(a_type: ComponentType, result_type: ComponentType, m: int, n: int, k: int,
                 subgroup_size: int, max_shared_memory: int, max_invocations: int) -> Tile:
    """For few rows (LLM decode shapes, M <= SMALL_M): a narrow, deep tile. Such a GEMM is
    a stream over B; a 128-wide tile would leave most of a GPU's cores idle, so tiles are
    2 x 2 matrices wide (many workgroups) and 128 bytes deep (few K steps)."""
    if subgroup_size < GPU_SUBGROUP:
        return default_tile(a_type, result_type, m, n, k, subgroup_size, max_shared_memory,
                            max_invocations)
    tk = max(k, 128 // element_bytes(a_type) // k * k)
    tile = Tile(2 * m, 2 * 2 * n, tk, 1, 2, 2)
    if _fits(tile, a_type, result_type, m, n, k, subgroup_size, max_shared_memory,
             max_invocations):
        return tile
    return default_tile(a_type, result_type, m, n, k, subgroup_size, max_shared_memory,
                        max_invocations)


def tune_candidates(a_type: ComponentType, result_type: ComponentType, m: int, n: int, k: int,
                    subgroup_size: int, max_shared_memory: int,
                    max_invocations: int, small_m: bool = False) -> list[Tile]:
    """Tiles worth timing on a device (`python -m coopmat.bench --tune`): the default plus
    other subgroup grids, accumulator grids and K depths that fit its limits. `small_m`
    asks for the candidates of the few-rows shape class instead."""
    out: list[Tile] = []
    if small_m and subgroup_size >= GPU_SUBGROUP:
        for sg_m, sg_n in [(1, 1), (1, 2), (1, 4), (2, 2)]:
            for acc_m, acc_n in [(1, 1), (1, 2), (2, 2), (1, 4), (2, 1)]:
                for kb in (64, 128, 256):
                    tk = max(k, kb // element_bytes(a_type) // k * k)
                    tile = Tile(sg_m * acc_m * m, sg_n * acc_n * n, tk, sg_m, sg_n, 2)
                    if tile not in out and _fits(tile, a_type, result_type, m, n, k,
                                                 subgroup_size, max_shared_memory,
                                                 max_invocations):
                        out.append(tile)
        first = small_m_tile(a_type, result_type, m, n, k, subgroup_size, max_shared_memory,
                             max_invocations)
        big = default_tile(a_type, result_type, m, n, k, subgroup_size, max_shared_memory,
                           max_invocations)
        return [first, *[t for t in [big, *out] if t != first]]
    if subgroup_size >= GPU_SUBGROUP:
        sg_grids = [(2, 2), (2, 4), (4, 2), (4, 4)]
        acc_grids = [(2, 2), (4, 2), (2, 4), (4, 4)]
        k_bytes = [32, 64, 128]
    else:
        sg_grids = [(1, 1), (2, 2)]
        acc_grids = [(1, 1), (2, 2)]
        k_bytes = [k * element_bytes(a_type), 2 * k * element_bytes(a_type)]
    if subgroup_size >= GPU_SUBGROUP and element_bytes(result_type) == 2:
        acc_grids += [(8, 4), (4, 8)]  # 16-bit accumulators leave registers for more of them
    for sg_m, sg_n in sg_grids:
        for acc_m, acc_n in acc_grids:
            for kb in k_bytes:
                tk = max(k, kb // element_bytes(a_type) // k * k)
                tile = Tile(sg_m * acc_m * m, sg_n * acc_n * n, tk, sg_m, sg_n, 2)
                if tile not in out and _fits(tile, a_type, result_type, m, n, k, subgroup_size,
                                             max_shared_memory, max_invocations):
                    out.append(tile)
    if subgroup_size >= GPU_SUBGROUP:
        staged = _staged_candidates(a_type, result_type, m, n, k, subgroup_size,
                                    max_shared_memory, max_invocations, out)
        out += staged[:max(0, MAX_TUNE_CANDIDATES - 1 - len(out))]
    default = default_tile(a_type, result_type, m, n, k, subgroup_size, max_shared_memory,
                           max_invocations)
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
                    if tile not in seen and tile not in out and _fits(
                            tile, a_type, result_type, m, n, k, subgroup_size,
                            max_shared_memory, max_invocations):
                        out.append(tile)
    return out
