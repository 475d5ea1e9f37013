"""Which attention kernel runs a call: its tile, and how many slices of the keys a split
(flash-decoding) run takes. Pure functions of the device (live or recorded) and the
problem's sizes.

- The matrices: the float32-accumulating configuration the device lists first for the
  operand type (float16 or bfloat16), the subgroup size the khr kernels require.
- A subgroup owns m query rows (one row of accumulators); lanes share a row of the
  softmax where the subgroup has more lanes than rows (32 lanes, 16 rows: 2 a row).
- Prefill: up to 4 subgroups a workgroup on a GPU, 8 for nv2 without a mask (K and V
  staged once for 128 rows where m is 16; with a mask, 64-row blocks are hidden whole
  more often than 128-row ones; fewer where the rows of a kv head need fewer, or where
  the tiles would not fit), 2 on a CPU driver; the key step is the largest of 64, 32, 16
  (multiples of the matrices' n and k) whose tiles fit the device's shared memory; 32
  first where one workgroup holds the rows of a kv head (decode).
- Decode on a GPU (at most GEMV_ROWS rows a kv head, GEMV_MIN_KEYS keys or more,
  16-byte units, a mask or none) takes the gemv family: no matrices, K and V read straight into
  registers (the next step's K prefetched where it takes at most PREFETCH_REGISTERS of
  them), the keys split to about GEMV_SPLIT_TARGET single-subgroup workgroups.
- Other few rows (decode: groups x Lq of at most m) take one subgroup a workgroup, and where
  the grid is small the keys are split over workgroups, each slice a whole number of key
  steps, about SPLIT_TARGET workgroups in all; a second pass merges the slices. Where an
  nv2 slice has STAGING_STEPS key steps or more, a second subgroup with no rows helps
  stage K and V (half the loads a lane) and skips the multiplies.
- The next step's K and V loads are prefetched into registers where they take at most
  PREFETCH_REGISTERS of them (prefill's tiles; decode's single subgroup loads too much a
  lane and relies on many workgroups instead).
  A caller may force the slice count (Options.attention_splits; 1: no split, one slice
  for gemv).
- The family: nv2 (row reductions, per-element operations and accumulator -> A
  conversions of VK_NV_cooperative_matrix2) on a GPU that offers them, where the
  matrices' n equals k (measured faster than khr for prefill and no slower for decode:
  docs/design.md, Attention); khr elsewhere.
- With a mask (either kind) and more than one key step, the kernel skips the steps whose
  block of scores the mask hides whole (a first pass marks the blocks), on every device;
  it then prefetches nothing.
- nv2 without a mask takes fast steps, except for decode's single subgroup: a step that
  no causal edge or key range end touches skips the per-score checks. Its causal
  prefill on a grid of at most PAIRED_GRID workgroups pairs row tiles: a workgroup
  computes tile x and tile (tiles - 1 - x), so that all walk about as many key steps.
- An unsplit kernel stores its result matrices straight to memory (direct_store) where
  the device lists an accumulator matrix of the result's type and Dv is a multiple of n
  (through the scratch, element by element, measured far slower); the kernel falls back
  to the scratch for a tile the matrices cannot cover (ragged rows, unaligned views).
- A caller may replace fields of the chosen tile, for measuring others
  (Options.attention_tile, COOPMAT_ATTENTION_TILE):
  "rows=32,subgroups=4,keys=64,lanes_per_row=2,prefetch=0,skip_blocks=0,fast_steps=0,
  paired=0,direct_store=0,family=nv2" (any of them); family=gemv starts from the gemv kernel
  for the problem.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from coopmat.codegen.attention import FAMILIES, NV2_FEATURES, AttentionTraits, MaskKind
from coopmat.codegen.attention_combine import INVOCATIONS, merged_at_once
from coopmat.codegen.attention_gemv import row_lanes
from coopmat.codegen.variants import is_cpu, khr_subgroup_size, lists_out_matrix
from coopmat.common.enums import ComponentType
from coopmat.device.model import CooperativeMatrixProperties, DeviceLimits, PhysicalDeviceInfo
from coopmat.policy.types import TypePair, config_for

OPERANDS = (ComponentType.FLOAT16, ComponentType.BFLOAT16)
TILE_FIELDS = ("rows", "subgroups", "keys", "lanes_per_row", "prefetch", "skip_blocks",
               "fast_steps", "paired", "direct_store", "family")
BOOL_FIELDS = ("prefetch", "skip_blocks", "fast_steps", "paired", "direct_store")
# A split run aims at about this many workgroups (kv heads x row tiles x slices) on a GPU;
# runs whose unsplit grid already has SPLIT_BELOW workgroups are not split, decode's (one
# workgroup a kv head) where it already has SPLIT_TARGET.
SPLIT_TARGET = 512
SPLIT_BELOW = 128
# Slices of fewer key steps than this are not worth their merge.
MIN_SPLIT_STEPS = 2
# Decode slices of this many key steps or more take a second, staging-only subgroup.
STAGING_STEPS = 8
# The next key step's K and V loads are held in registers (prefetch) where they take at
# most this many 32-bit registers an invocation; more would spill.
PREFETCH_REGISTERS = 64
KEY_STEPS = (64, 32, 16)
# The merge's workgroup size where no size merges every slice in one round of loads: the
# first of these the device allows (1024 measured slower than 512 on a GPU for 64 to 1024
# slices; docs/design.md, Attention).
MERGE_INVOCATIONS = (512, 256)
# Where one workgroup holds all the rows of a kv head (decode: it streams K and V, split
# over many workgroups), 32 keys a step measured faster than 64.
DECODE_KEY_STEPS = (32, 64, 16)
GPU_SUBGROUPS = 4
# The gemv family (no matrices) runs decode with at most GEMV_ROWS rows a kv head against
# at least GEMV_MIN_KEYS keys (below, the matrix kernels measured faster); a grid of fewer
# than GEMV_SPLIT_TARGET single-subgroup workgroups is split to about that many.
GEMV_ROWS = 4
GEMV_MIN_KEYS = 16384
GEMV_SPLIT_TARGET = 1024
NV2_SUBGROUPS = 8
# Causal nv2 prefill pairs row tiles where its unpaired grid has at most this many
# workgroups.
PAIRED_GRID = 1024
CPU_SUBGROUPS = 2


@dataclass(frozen=True)
class AttentionProblem:
    """The sizes a kernel is chosen by: rows = groups x Lq query rows per kv head, z = kv
    heads of every batch entry, aligned: q, k and v may be read in 16-byte units, causal:
    the call's (the kernel takes it as a flag; the policy pairs row tiles for it)."""

    operand: ComponentType
    out: ComponentType
    head_dim: int
    value_dim: int
    rows: int
    Lk: int
    z: int
    mask: MaskKind | None = None
    aligned: bool = True
    causal: bool = False


@dataclass(frozen=True)
class AttentionChoice:
    traits: AttentionTraits
    splits: int = 1  # > 1: the keys in slices of split_keys, merged by a second pass
    split_keys: int = 0


def attention_config(info: PhysicalDeviceInfo,
                     operand: ComponentType) -> CooperativeMatrixProperties | None:
    """The matrix configuration attention uses for `operand`: float32 accumulation."""
    if operand not in OPERANDS:
        return None
    return config_for(info, TypePair(operand, ComponentType.FLOAT32))


def attention_operands(info: PhysicalDeviceInfo) -> tuple[ComponentType, ...]:
    """The operand types attention runs on the device."""
    return tuple(t for t in OPERANDS if attention_config(info, t) is not None)


def attention_results(info: PhysicalDeviceInfo) -> tuple[ComponentType, ...]:
    """The result types it can write: float32 and the operand types it runs."""
    return (*attention_operands(info), ComponentType.FLOAT32)


def parse_tile(text: str) -> dict[str, int | bool | str]:
    """"rows=32,keys=64,family=nv2" -> {"rows": 32, "keys": 64, "family": "nv2"};
    ValueError naming a bad field."""
    out: dict[str, int | bool | str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, value = (x.strip() for x in part.partition("="))
        if name == "family" and value in FAMILIES:
            out[name] = value
        elif name in TILE_FIELDS and name != "family" and value.isdigit():
            out[name] = bool(int(value)) if name in BOOL_FIELDS else int(value)
        else:
            raise ValueError(f"attention tile {text!r}: expected NAME=NUMBER with NAME one "
                             f"of {', '.join(TILE_FIELDS[:-1])}, or "
                             f"family={'|'.join(FAMILIES)}; got {part!r}")
    return out


def nv2_offered(info: PhysicalDeviceInfo) -> bool:
    """Whether the device runs the nv2 family (reductions, conversions, per-element
    operations)."""
    return all(info.has(f) for f in NV2_FEATURES)


def prefetch_registers(t: AttentionTraits) -> int:
    """32-bit registers an invocation holds one key step of K and V in."""
    units = t.keys * (t.head_dim_padded + t.value_dim_padded) // t.unit
    return -(-units // t.invocations) * t.unit * element_bits(t) // 32


def element_bits(t: AttentionTraits) -> int:
    return t.operand.bits


def _fits(t: AttentionTraits, info: PhysicalDeviceInfo) -> bool:
    limits = info.limits
    return t.shared_memory_bytes <= limits.max_compute_shared_memory_size and \
        t.invocations <= limits.max_compute_work_group_invocations


def attention_traits(info: PhysicalDeviceInfo, p: AttentionProblem, *,
                     decode: bool) -> AttentionTraits:
    """The tile for `p` on the device (decode: one subgroup a workgroup)."""
    cfg = attention_config(info, p.operand)
    if cfg is None:
        raise ValueError(f"device {info.name} lists no float32-accumulating matrices of "
                         f"{p.operand.name}")
    sg = khr_subgroup_size(info.limits)
    rows = cfg.M
    lanes = sg // rows if sg > rows else 1
    family = "nv2" if not is_cpu(info) and nv2_offered(info) and cfg.N == cfg.K else "khr"
    # A CPU driver takes one tile for every call (few kernels to compile, and small).
    if is_cpu(info):
        most = CPU_SUBGROUPS
    elif decode:
        most = 1
    else:  # no idle subgroups where the rows of a kv head fill fewer
        wide = family == "nv2" and p.mask is None
        most = min(NV2_SUBGROUPS if wide else GPU_SUBGROUPS, -(-p.rows // rows))
    step = math.lcm(cfg.N, cfg.K)
    unit = load_unit(p)
    choice = None
    for subgroups in sorted({most, *(n for n in (4, 2, 1) if n < most)}, reverse=True):
        order = DECODE_KEY_STEPS if p.rows <= subgroups * rows else KEY_STEPS
        steps = [c for c in order if c % step == 0 and c % lanes == 0] or [step * lanes]
        if is_cpu(info):  # the smallest step: lavapipe's compile time grows with the tile
            steps = [step * lanes]
        for keys in steps:
            t = AttentionTraits(p.operand, p.out, p.head_dim, p.value_dim, cfg.M, cfg.N,
                                cfg.K, sg, rows=rows, subgroups=subgroups, keys=keys,
                                lanes_per_row=lanes, unit=unit, mask=p.mask, prefetch=True,
                                family=family)
            skip = p.mask is not None and p.Lk > keys
            t = replace(t, skip_blocks=skip,
                        prefetch=not skip and prefetch_registers(t) <= PREFETCH_REGISTERS,
                        fast_steps=fast_steps(t, decode),
                        paired=paired_tiles(t, p, decode),
                        direct_store=direct_store(info, t))
            if _fits(t, info):
                choice = t
                break
        if choice is not None:
            break
    if choice is None:
        raise ValueError(f"attention with head dimension {p.head_dim} and value dimension "
                         f"{p.value_dim} does not fit the device's "
                         f"{info.limits.max_compute_shared_memory_size} bytes of shared memory")
    return choice


def load_unit(p: AttentionProblem) -> int:
    """Elements a load of q, k and v takes: 8 (16-byte units) where their strides and
    offsets and both dimensions allow, else 1."""
    return 8 if p.aligned and p.head_dim % 8 == 0 and p.value_dim % 8 == 0 else 1


def gemv_decode(info: PhysicalDeviceInfo, p: AttentionProblem) -> bool:
    """Whether the gemv family runs `p`: a GPU, at most GEMV_ROWS rows a kv head against
    GEMV_MIN_KEYS keys or more, q, k and v read in 16-byte units (with or without a mask:
    it reads every key, and still measured faster than the matrix kernels that skip the
    hidden blocks: docs/design.md, Attention)."""
    return not is_cpu(info) and p.rows <= GEMV_ROWS and p.Lk >= GEMV_MIN_KEYS and \
        load_unit(p) == 8


def gemv_traits(info: PhysicalDeviceInfo, p: AttentionProblem) -> AttentionTraits:
    """The gemv kernel for `p`: every row of a kv head in one workgroup (at most
    GEMV_ROWS), the lanes of a key row its 16-byte units rounded up to a power of two,
    the next step's K in flight during each step where its loads take at most
    PREFETCH_REGISTERS registers a lane (more measured slower: docs/design.md,
    Attention)."""
    cfg = attention_config(info, p.operand)
    if cfg is None:
        raise ValueError(f"device {info.name} lists no float32-accumulating matrices of "
                         f"{p.operand.name}")
    sg = khr_subgroup_size(info.limits)
    lanes = row_lanes(p.head_dim, sg)
    # A lane loads `lanes` keys' units of K a step, 4 registers a unit.
    k_registers = 4 * lanes * -(-p.head_dim // (8 * lanes))
    # The matrix shape only pads the split workspace's rows, as for the other families.
    return AttentionTraits(p.operand, p.out, p.head_dim, p.value_dim, cfg.M, cfg.N, cfg.K,
                           sg, rows=min(p.rows, GEMV_ROWS), subgroups=1, keys=sg,
                           lanes_per_row=lanes, unit=load_unit(p), mask=p.mask,
                           split=True, prefetch=k_registers <= PREFETCH_REGISTERS,
                           family="gemv")


def choose_attention(info: PhysicalDeviceInfo, p: AttentionProblem,
                     splits: int | None = None, tile: str = "") -> AttentionChoice:
    """The kernel and the key slices for `p`; `splits` forces the slice count, `tile`
    (parse_tile's form) replaces fields of the chosen kernel."""
    cfg = attention_config(info, p.operand)
    decode = cfg is not None and p.rows <= cfg.M
    forced = splits
    fields = parse_tile(tile)
    family = fields.pop("family", None)
    if family == "gemv" or (family is None and gemv_decode(info, p)):
        traits = gemv_traits(info, p)
    else:
        traits = attention_traits(info, p, decode=decode)
        if family is not None:
            fields["family"] = family
    if fields or family is not None:
        if p.mask is None:  # nothing to skip: the field is moot
            fields.pop("skip_blocks", None)
        traits = replace(traits, **fields)  # type: ignore[arg-type]
        if "fast_steps" not in fields:  # the policy's rule, for the family forced too
            traits = replace(traits, fast_steps=fast_steps(traits, decode))
        if "paired" not in fields:
            traits = replace(traits, paired=paired_tiles(traits, p, decode))
        if "direct_store" not in fields:
            traits = replace(traits, direct_store=direct_store(info, traits))
        why = traits.violation()
        if why is None and traits.family == "nv2" and not nv2_offered(info):
            why = f"device {info.name} lacks {', '.join(NV2_FEATURES)}"
        if why is not None:
            raise ValueError(f"attention tile {tile!r}: {why}")
    count = forced if forced is not None else split_count(info, p, traits)
    count = max(1, min(count, -(-p.Lk // traits.keys)))
    if count == 1 and not traits.split:  # gemv always writes partial states
        return AttentionChoice(traits)
    steps = -(-p.Lk // traits.keys)
    split_keys = -(-steps // count) * traits.keys
    count = -(-p.Lk // split_keys)
    traits = replace(traits, split=True, paired=False, direct_store=False)
    if decode and "subgroups" not in fields and traits.family == "nv2" and \
            not traits.prefetch and split_keys >= STAGING_STEPS * traits.keys:
        staged = replace(traits, subgroups=2)
        traits = staged if _fits(staged, info) else traits
    return AttentionChoice(traits, count, split_keys)


def fast_steps(t: AttentionTraits, decode: bool) -> bool:
    """nv2 without a mask, but not decode's single subgroup (measured slower with them
    there: docs/design.md, Attention)."""
    return t.family == "nv2" and t.mask is None and not decode


def direct_store(info: PhysicalDeviceInfo, t: AttentionTraits) -> bool:
    """Whether an unsplit matrix kernel stores its result as matrices: Dv a multiple of
    n, a result of the operand type or float32, and the device listing an accumulator
    matrix of that type at m x n (an unlisted matrix type may not be declared)."""
    cfg = attention_config(info, t.operand)
    return cfg is not None and t.family != "gemv" and not t.split and \
        t.value_dim % t.n == 0 and t.out in (t.operand, ComponentType.FLOAT32) and \
        lists_out_matrix(info, cfg, t.out)


def paired_tiles(t: AttentionTraits, p: AttentionProblem, decode: bool) -> bool:
    """Whether a workgroup takes a row tile and its mirror: causal nv2 prefill without a
    mask whose grid has at most PAIRED_GRID workgroups unpaired (every workgroup then
    walks about as many key steps; larger grids balance themselves, and there pairing
    and non-causal runs measured slower: docs/design.md, Attention)."""
    grid = p.z * -(-p.rows // t.block_rows)
    return t.family == "nv2" and t.mask is None and not decode and p.causal and \
        grid <= PAIRED_GRID


def split_count(info: PhysicalDeviceInfo, p: AttentionProblem, t: AttentionTraits) -> int:
    """Slices of the keys for a GPU's grid: 1 where the grid is large enough or the keys
    few, else about SPLIT_TARGET workgroups in all."""
    if is_cpu(info):
        return 1
    grid = p.z * -(-p.rows // t.block_rows)
    steps = -(-p.Lk // t.keys)
    # Decode (a kv head's rows in one workgroup of one or two subgroups) splits any grid
    # short of its target; gemv workgroups are one subgroup each.
    if t.family == "gemv":
        below = target = GEMV_SPLIT_TARGET
    elif p.rows <= t.block_rows:
        below = target = SPLIT_TARGET
    else:
        below, target = SPLIT_BELOW, SPLIT_TARGET
    if grid >= below or steps < 2 * MIN_SPLIT_STEPS:
        return 1
    return max(1, min(-(-target // grid), steps // MIN_SPLIT_STEPS))


def merge_invocations(limits: DeviceLimits, splits: int | None = None) -> int:
    """The split run's merge workgroup size, among those the device's
    maxComputeWorkGroupInvocations and maxComputeWorkGroupSize[0] allow: the smallest that
    merges `splits` slices in one round of loads (measured faster than larger ones there:
    docs/design.md, Attention), else the first of MERGE_INVOCATIONS."""
    most = min(limits.max_compute_work_group_invocations, limits.max_compute_work_group_size[0])
    allowed = [n for n in INVOCATIONS if n <= most]
    if splits is not None:
        at_once = sorted(n for n in allowed if merged_at_once(n) >= splits)
        if at_once:
            return at_once[0]
    return next((n for n in MERGE_INVOCATIONS if n in allowed), min(INVOCATIONS))
