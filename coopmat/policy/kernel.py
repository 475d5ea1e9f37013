"""Kernel choice: one pure function from (device, problem, options) to a kernel.

Given a device's capabilities (PhysicalDeviceInfo, live or recorded), a problem (types,
sizes, how A and B sit in memory) and Options, `choose` returns the kernel to run: family,
tile and variant (KhrTraits or Nv2Traits), the push-constant values, the 8-bit repacks to
run first, and the read-past margins the operands' buffers need. It touches no Vulkan
object and reads no environment variable, so it is tested against recorded devices
without a GPU; the dispatcher (coopmat.dispatch.gemm) carries the choice out.

The rules (their measurements: docs/design.md, Policy):
- family: forced by Options; else gemv where `gemv_by_default` says so (GEMV_DEFAULT: at
  most gemv_max_m rows, a column-major B, a GPU, gemv_violation None); else the
  tuned choice for the device, dtype pair and shape class (rows and gemv run where their
  preconditions hold, else khr), else khr;
- quantized B (Problem.b_quant): khr or gemv only, forced by Options
  (other families are an error); else gemv where `gemv_quant_by_default` says so
  (GEMV_QUANT_DEFAULT: at most gemv_max_m rows by format and N, a GPU), else khr; never
  a tuned tile (the tables time float B); khr with its default tile for the shape class,
  tile_k whole blocks (on a GPU with more than SMALL_M rows tiles.quant_general_tile and a
  staging unit by format, QUANT_GENERAL_UNIT), gemv with its default quantized tile; or, where
  `dequantizes_first` says so (Options.dequant, else many rows on a GPU), a pass into a
  float16/bfloat16 B first (codegen/dequant.py, a PackChoice), then the float problem's
  choice by every rule here;
- gemv: the tuned tile where the table names gemv, else the default (policy/gemv_tiles.py);
- rows tile: tuned, else the default for the device and M (policy/rows_tiles.py); its aligned
  variant (A read 16 bytes at a time) where A allows;
- khr tile: tuned, else the default for the shape class (few rows, or general); on a
  GPU, a few-row tile with fewer rows than M is widened to hold them all
  (tiles.covering_rows_tile);
- khr variant: exact (whole tiles, no bounds checks) > exact with clamped rows and
  columns (K whole tiles, M and N any; N whole for a quantized B) > aligned (vector
  loads) > general, whichever the sizes and strides allow; sizes and strides compiled in
  for problems of SPECIALIZE_MIN_OPS or more, and for few-row products on a covering tile of
  SPECIALIZE_COVERING_MIN_OPS or more (Options.specialize);
- 8-bit operands that are not K-contiguous are repacked first when M > SMALL_M;
- split-K (KernelChoice.split_k = S > 1: the khr GEMM over S slices of K in one
  dispatch, the last workgroup of each tile summing the float32 partials and applying
  the epilogue, KhrTraits.split_k): forced by Options.split_k where
  `split_k_violation` allows it (else unsplit); else, while SPLIT_K_DEFAULT is on,
  `split_k_for`: a GPU, the khr family, batch 1; M <= SMALL_M: S by the tile's rows and
  unsplit grid (SPLIT_K_BY_TILE_ROWS) or by its workgroup count; more rows:
  `mid_split_k`, S that fills the GPU with the general tile where K is long (a quantized
  B's own general tile, on grids of up to MID_SPLIT_QUANT_MAX_GROUPS).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import overload

from coopmat.codegen import (
    GemmParams,
    GemmTraits,
    GemvTraits,
    KhrTraits,
    Layout,
    RowsTraits,
    Tile,
    abi,
)
from coopmat.codegen.nv2_tiles import nv2_traits
from coopmat.codegen.pack import PackKernel, wide_ok
from coopmat.codegen.plan import SPLIT_MIN_QUANT_UNIT, element_bytes, plan_kernel
from coopmat.codegen.rows import RowsPlan
from coopmat.codegen.traits import EpilogueOps
from coopmat.codegen.variants import GEMV_OPERANDS, is_cpu, khr_traits
from coopmat.common.enums import ComponentType
from coopmat.common.errors import MissingFeatureError
from coopmat.common.quant_formats import BLOCK_ELEMS
from coopmat.device.model import CooperativeMatrixProperties, DeviceLimits, PhysicalDeviceInfo
from coopmat.device.record import nv2_usable
from coopmat.policy.gemv_tiles import gemv_traits
from coopmat.policy.options import Options
from coopmat.policy.rows_tiles import rows_traits
from coopmat.policy.tiles import (
    FILL_GROUPS,
    SMALL_M,
    filling_tile,
    khr_covering_tile,
    khr_deep_tile,
    khr_filling_ladder,
    khr_quant_tile,
    khr_tile,
    nv2_tiles,
)
from coopmat.policy.types import TypePair, config_for

# The thresholds below are the measured crossovers recorded in docs/design.md (Policy);
# each comment says the reason for its rule.

# Problems of at least this many operations get a kernel with their sizes and strides
# compiled in: address arithmetic folds away, worth one extra build per shape (kept in
# the disk caches).
SPECIALIZE_MIN_OPS = 2 ** 36
# Few-row products on a covering tile (more rows than the few-row tile: 32 or 64 rows in
# one row block) of at least this many operations are specialized too; few rows on their
# own tile measured slower specialized, so only covering tiles. 2^30: 32 rows against a
# 4096^2 weight and up.
SPECIALIZE_COVERING_MIN_OPS = 2 ** 30
# Few-row products on a GPU whose workgroups take at least this many K steps get their K
# loop marked DontUnroll (KhrTraits.k_loop_rolled): a fully unrolled long loop measured
# slower, a short one (4-8 steps) faster unrolled.
ROLLED_MIN_K_STEPS = 16
# Output sizes up to this many elements form the "@medium" shape class: with the big tiles
# that win at 4096^3 they leave most of a large GPU's cores idle (a 1024^2 output is 32
# tiles of 128x256).
MEDIUM_MN = 2048 * 2048
# 8-bit operands that are not K-contiguous (a row-major B, a column-major A) are repacked
# K-contiguous for problems of more than SMALL_M rows: tensor cores take 8-bit fragments
# K-contiguous, and with few rows the GEMM reads B about once, so a repack (one more read
# and a write) would cost more than it saves.
PACK_MIN_M = SMALL_M + 1
# Few-row products whose B has at most this many elements may take a filling tile
# (fills_small): the largest B measured faster on one.
FILL_FEW_ROWS_MAX_B = 1 << 18
K_CONTIGUOUS = (Layout.ROW_MAJOR, Layout.COLUMN_MAJOR)  # A's, B's

# The gemv family (no cooperative matrices; few rows against a column-major B) as the
# default for decode shapes (`gemv_by_default`): against a float16 weight it beats the
# khr kernel up to 4 rows, past which its float32 FMAs (8 per weight and row) become the
# bound. Forced (Options.family) or tuned, it runs whatever this says.
GEMV_DEFAULT = True
GEMV_DEFAULT_MAX_M = 4
# The same for a quantized B (`gemv_quant_by_default`; gemv_quant.py reads the blocks), up
# to GEMV_QUANT_MAX_M[format] rows: gemv's time grows with the rows while the khr
# kernel's few-row tile takes the same time up to 16, so gemv leads only for the first
# few rows.
GEMV_QUANT_DEFAULT = True
GEMV_QUANT_MAX_M = {"q8_0": 4, "q4_0": 4}
# Fewer rows of gemv against a wide weight, by B's format (None: float): (from N columns,
# at most R rows). Against many columns the khr kernel's exact variant with clamped rows
# overtakes gemv sooner.
GEMV_WIDE_MAX_M: dict[str | None, tuple[int, int]] = {
    None: (8192, 1), "q8_0": (8192, 3), "q4_0": (8192, 3)}


def gemv_max_m(fmt: str | None, N: int) -> int:
    """Rows up to which the policy runs gemv for a B of format `fmt` (None: float) with
    N columns."""
    most = GEMV_DEFAULT_MAX_M if fmt is None else GEMV_QUANT_MAX_M[fmt]
    wide, rows = GEMV_WIDE_MAX_M.get(fmt, (0, most))
    return min(most, rows) if N >= wide else most

# Split-K for few-row products on the khr family (`split_k_for`), one dispatch whose last
# workgroup of each tile finishes it (KhrTraits.split_k). S by the rows of the few-row
# tile and the unsplit grid G: (largest G, S, S of an exact kernel of a float B) triples,
# the first that holds applies, none: unsplit. A grid too small to fill the GPU gains
# workgroups by splitting K; a float B's exact kernel (unchecked, K loop rolled, the
# deeper K step of _deepened) needs fewer. A quantized B on the same tiles
# (tiles.quant_few_row_tile) takes the same S. Other tiles (other devices) keep the
# workgroup-count rule below.
SPLIT_K_BY_TILE_ROWS: dict[int, tuple[tuple[int, int, int], ...]] = {
    16: ((128, 8, 8), (256, 2, 1)),
    32: ((128, 4, 4),),
    64: ((128, 4, 4),),
}
SPLIT_K_DEFAULT = True
# The workgroup-count rule: S nearest SPLIT_K_TARGET_GROUPS / G, G <= SPLIT_K_MAX_GROUPS:
# enough workgroups to keep a large GPU's memory system busy (about two per
# multiprocessor of a 132-SM GPU).
SPLIT_K_TARGET_GROUPS = 256
SPLIT_K_MAX_GROUPS = 128
SPLIT_K_CHOICES = (2, 4, 8)
# Products of more than SMALL_M rows split K (mid_split_k) into at most MID_SPLIT_MAX
# slices of at least MID_SPLIT_MIN_SLICE each: shorter slices measured slower. Eight
# slices keep the general tile where four would leave the grid short of filling the GPU
# (the filling tile then); where eight would be too shallow, at most MID_SPLIT_SHALLOW_MAX.
MID_SPLIT_MAX = 8
MID_SPLIT_SHALLOW_MAX = 4
MID_SPLIT_MIN_SLICE = 1792
# A quantized B's grid splits only up to this many workgroups: its fused kernel measured
# slower split from 224 workgroups, faster from 128 and fewer.
MID_SPLIT_QUANT_MAX_GROUPS = 128
# Slices shorter than this leave each workgroup too little of K to stream.
SPLIT_K_MIN_SLICE = 512

# Weights per staged unit of a quantized B on the khr kernel (KhrTraits.b_quant_unit): 8,
# and with more than SMALL_M rows on a GPU by format, on the tiles.quant_general_tile
# tile, whichever measured faster for that format.
QUANT_UNIT_DEFAULT = 8
QUANT_GENERAL_UNIT = {"q8_0": 4, "q4_0": 8}

# A quantized B is dequantized into a float B by a pass of its own first (dequantizes_first)
# on a GPU from DEQUANT_FIRST_MIN_M rows where the result has more than
# DEQUANT_FIRST_MIN_OUTPUT elements: with many rows the float kernel's speed outweighs
# the pass, with few the fused kernel reads B once and wins.
DEQUANT_FIRST_MIN_M = 128
DEQUANT_FIRST_MIN_OUTPUT = 1 << 21

# Tuned choices: shape-class key -> (family, tile) (coopmat.policy.tuning reads them).
Tuned = Mapping[str, tuple[str, Tile]]


@dataclass(frozen=True)
class OperandLayout:
    """How an operand sits in memory: layout, leading dimension and batch stride (in
    elements; a batch stride of 0 shares the operand across the batch)."""

    layout: Layout
    ld: int
    batch_stride: int = 0


@dataclass(frozen=True)
class Problem:
    """One batched product D[i] = alpha * A[i] @ B[i] (+ beta * C[i]), with the fused
    epilogue `ops` (bias, activation, residual; None: none) applied after it."""

    pair: TypePair
    M: int
    N: int
    K: int
    a: OperandLayout
    b: OperandLayout
    batch: int = 1
    has_c: bool = False
    c_batch_stride: int = 0
    alpha: float | int = 1
    beta: float | int = 0
    ops: EpilogueOps | None = None
    # B as GGUF blocks of this format (coopmat/quant_formats.py): one column-major N x K
    # weight, dequantized by the khr kernel while staging or read by the gemv kernel.
    # None: a plain B.
    b_quant: str | None = None


@dataclass(frozen=True)
class PackChoice:
    """Repack operand 0 (A) or 1 (B), `lines` lines of `other` elements, K-contiguous
    before the GEMM (codegen/pack.py)."""

    operand: int
    wide: bool
    lines: int  # K
    other: int  # M for A, N for B
    source: OperandLayout
    packed: OperandLayout
    packed_elems: int  # elements of the packed copy, whole batch
    # The source is GGUF blocks of this format (B only), dequantized into the packed
    # float B (codegen/dequant.py) rather than repacked.
    quant: str | None = None


@dataclass(frozen=True)
class KernelChoice:
    traits: GemmTraits
    params: GemmParams
    packs: tuple[PackChoice, ...] = ()
    # Bytes the kernel may read past the end of A and of B as it reads them (after any
    # repack): their buffers must be that much larger (codegen.overread_elems).
    margins: tuple[int, int] = (0, 0)
    why: str = ""  # "tuned", "default" or "forced", for listings and the bench
    # S > 1: `traits` and `params` are the split-K over S slices of K in one dispatch
    # (KhrTraits.split_k): slice s in workgroups of z = s, whose float32 partials the last
    # workgroup of each tile sums and finishes with the problem's epilogue.
    split_k: int = 1


def shape_class(pair: TypePair, M: int, N: int = 1 << 30) -> str:
    """The key tuning results are kept under: the pair, then '@small-m' for few rows
    (M <= SMALL_M), '@medium' for outputs of at most MEDIUM_MN elements, else nothing."""
    if M <= SMALL_M:
        return pair.describe() + "@small-m"
    return pair.describe() + ("@medium" if M * N <= MEDIUM_MN else "")


def tuned_choice(tuned: Tuned, pair: TypePair, M: int, N: int) -> tuple[str, Tile] | None:
    key = shape_class(pair, M, N)
    found = tuned.get(key)
    if found is None and key.endswith("@medium"):  # tuned before the class existed
        found = tuned.get(pair.describe())
    return found


def choose_family(info: PhysicalDeviceInfo, pair: TypePair, options: Options, tuned: Tuned,
                  M: int = 1 << 30, N: int = 1 << 30) -> tuple[str, Tile | None]:
    """(family, tuned tile or None): Options.family forces one; otherwise the tuned
    choice (where the device can run its family), else khr."""
    if options.family == "nv2" and not nv2_usable(info):
        raise MissingFeatureError(
            f"the nv2 kernel family needs VK_NV_cooperative_matrix2 with "
            f"cooperativeMatrixWorkgroupScope, cooperativeMatrixFlexibleDimensions and "
            f"cooperativeMatrixTensorAddressing, which device {info.index} ({info.name}) "
            f"lacks")
    found = tuned_choice(tuned, pair, M, N) if options.tuning else None
    if options.family is not None:
        return options.family, found[1] if found and found[0] == options.family else None
    if found and (found[0] != "nv2" or nv2_usable(info)):
        return found
    return "khr", None


def repacks(info: PhysicalDeviceInfo, pair: TypePair, operand: int, layout: Layout, M: int,
            traits: GemmTraits | None = None) -> bool:
    """Whether operand 0 (A) or 1 (B), in `layout`, is repacked K-contiguous first:
    explicit traits asking for the K-contiguous layout decide; otherwise 8-bit operands
    and more than SMALL_M rows."""
    want = K_CONTIGUOUS[operand]
    if layout is want:
        return False
    if traits is not None:
        return (traits.a_layout, traits.b_layout)[operand] is want
    return (pair.operand.bits == 8 and M >= PACK_MIN_M
            and info.has("storageBuffer8BitAccess") and info.has("shaderInt8"))


def _pack(operand: int, src: OperandLayout, lines: int, other: int,
          batch: int) -> PackChoice:
    ld = PackKernel.leading_dimension(lines)
    packed = OperandLayout(K_CONTIGUOUS[operand], ld, other * ld if src.batch_stride else 0)
    copies = batch if src.batch_stride else 1
    return PackChoice(operand, wide_ok(other, src.ld, src.batch_stride), lines, other, src,
                      packed, copies * other * ld)


@functools.lru_cache(maxsize=256)
def _default_tile(cfg: CooperativeMatrixProperties, limits: DeviceLimits,
                  small_m: bool, cpu: bool) -> Tile:
    return khr_tile(cfg, limits, small_m, cpu=cpu)


@functools.lru_cache(maxsize=256)
def _quant_tile(cfg: CooperativeMatrixProperties, limits: DeviceLimits, tile: Tile,
                M: int) -> Tile:
    return khr_quant_tile(cfg, limits, tile, M)


@functools.lru_cache(maxsize=256)
def _filling_ladder(cfg: CooperativeMatrixProperties, limits: DeviceLimits) -> tuple[Tile, ...]:
    return khr_filling_ladder(cfg, limits)


def fills_small(problem: Problem) -> bool:
    """Whether a small product may leave its usual tile for a smaller one that gives the
    GPU more workgroups (tiles.filling_tile): always with more than SMALL_M rows; with
    fewer only where B holds at most FILL_FEW_ROWS_MAX_B elements. A few-row product on
    a large B is a stream over B whose tile, covering tiles and split-K were measured for
    that; smaller row blocks would read B more times."""
    return problem.M > SMALL_M or problem.K * problem.N <= FILL_FEW_ROWS_MAX_B


@functools.lru_cache(maxsize=256)
def _covering_tile(cfg: CooperativeMatrixProperties, limits: DeviceLimits, tile: Tile,
                   M: int) -> Tile:
    """The few-row tile holding M rows in one row block (tiles.covering_rows_tile)."""
    return khr_covering_tile(cfg, limits, tile, M)


def specializes(traits: GemmTraits, params: GemmParams, batch: int, options: Options,
                covering: bool = False) -> bool:
    """Whether a khr kernel gets this problem's sizes and strides compiled in: always or
    never where options say so, else problems of SPECIALIZE_MIN_OPS or more, and few-row
    products on a covering tile (`covering`) of SPECIALIZE_COVERING_MIN_OPS or more."""
    if not isinstance(traits, KhrTraits) or options.specialize == "never":
        return False
    ops = 2 * params.M * params.N * params.K * batch
    return options.specialize == "always" or ops >= SPECIALIZE_MIN_OPS or \
        (covering and ops >= SPECIALIZE_COVERING_MIN_OPS)


def rolls_k_loop(traits: KhrTraits, params: GemmParams, covering: bool) -> bool:
    """Whether a few-row product's kernel keeps its K loop rolled: at least
    ROLLED_MIN_K_STEPS K steps per workgroup (params.K is a split-K slice's), except a
    bounds-checked kernel on a covering tile (partial row blocks measured slower rolled)."""
    steps = -(-params.K // traits.tile.tile_k)
    return steps >= ROLLED_MIN_K_STEPS and (traits.exact or not covering)


def bounds_checked(traits: KhrTraits) -> KhrTraits:
    """The bounds-checked (aligned) variant of exact traits, for operands without the
    exact variant's read-past margins: with the driver's checks back on."""
    return replace(traits, exact=False, clamp_rows=False, clamp_cols=False,
                   storage_checks=True)


def checks_off(traits: KhrTraits) -> bool:
    """Whether the kernel runs without the driver's bounds checks on its storage buffers
    (KhrTraits.storage_checks): the exact variant, which stays inside its bindings by
    construction; with a quantized B only with its K loop rolled. Without the checks the
    exact kernels run faster, while bounds-checked variants and quantized exact kernels
    with an unrolled K loop run slower (docs/design.md, Kernels)."""
    return traits.exact and (traits.b_quant is None or traits.k_loop_rolled)


def general_variant(traits: KhrTraits) -> KhrTraits:
    """The variant of khr traits that takes any sizes and strides: bounds-checked loads,
    no shape compiled in, the driver's checks on."""
    return replace(traits, aligned=False, exact=False, clamp_rows=False, clamp_cols=False,
                   specialized=(), storage_checks=True, k_loop_rolled=False)


@overload
def fastest_variant(traits: KhrTraits, params: GemmParams, batch: int = 1,
                    options: Options | None = None, covering: bool = False,
                    few_rows: bool = False) -> KhrTraits: ...


@overload
def fastest_variant(traits: GemmTraits, params: GemmParams, batch: int = 1,
                    options: Options | None = None, covering: bool = False,
                    few_rows: bool = False) -> GemmTraits: ...


def fastest_variant(traits: GemmTraits, params: GemmParams, batch: int = 1,
                    options: Options | None = None, covering: bool = False,
                    few_rows: bool = False) -> GemmTraits:
    """khr traits with the fastest variant `params` allow: exact (whole tiles, no bounds
    checks), else exact with clamped rows and columns (K whole tiles), else aligned (vector
    loads), else general; specialized for these sizes and
    strides where `specializes` says so (`covering`: the tile was widened to hold a
    few-row product's rows); the K loop rolled where `few_rows` (a few-row product on a
    GPU) and `rolls_k_loop` say so; without the driver's bounds checks where `checks_off`
    says so."""
    if not isinstance(traits, KhrTraits):  # nv2: one kernel for every alignment and shape
        return traits
    general = general_variant(traits)
    aligned = replace(general, aligned=True)
    if not abi.aligned_ok(aligned, params):
        best = general
    else:
        t = traits.tile  # clamped where M or N ends inside a tile (none: whole tiles)
        exact = replace(aligned, exact=True, clamp_rows=params.M % t.tile_m != 0,
                        clamp_cols=params.N % t.tile_n != 0 and traits.b_quant is None)
        best = exact if abi.clamped_ok(exact, params) else aligned
    if specializes(best, params, batch, options or Options(), covering):
        best = replace(best, specialized=abi.shape_values(params))
    if few_rows and rolls_k_loop(best, params, covering):
        best = replace(best, k_loop_rolled=True)
    if checks_off(best):
        best = replace(best, storage_checks=False)
    return best


def rows_choice(info: PhysicalDeviceInfo, problem: Problem, a_layout: Layout,
                b_layout: Layout, params: GemmParams,
                tile: Tile | None = None) -> tuple[RowsTraits | None, str]:
    """(rows traits, "") for the problem, the aligned variant where A allows it, with
    `tile` where it fits the problem, else the default tile; (None, why not) where the
    rows kernel cannot run it."""
    cfg = config_for(info, problem.pair)
    if cfg is None:
        return None, f"the device offers no subgroup-scope matrix for {problem.pair.describe()}"
    why = ""
    for t in (tile, None) if tile is not None else (None,):
        try:
            general = rows_traits(cfg, info.limits, a_layout, b_layout, problem.has_c,
                                  problem.M, tile=t, out_type=problem.pair.out,
                                  cpu=is_cpu(info))
            shared = RowsPlan(general).shared_bytes
            if shared > info.limits.max_compute_shared_memory_size:
                raise ValueError(f"rows tile {general.tile.describe()} needs {shared} bytes "
                                 f"of shared memory")
        except ValueError as exc:
            why = str(exc)
            continue
        why = abi.rows_violation(general, params) or ""
        if why:
            continue
        if a_layout == Layout.ROW_MAJOR:
            aligned = replace(general, aligned=True)
            if abi.rows_violation(aligned, params) is None:
                return aligned, ""
        return general, ""
    return None, why


def gemv_violation(info: PhysicalDeviceInfo, problem: Problem, a_layout: Layout,
                   b_layout: Layout, params: GemmParams) -> str | None:
    """Why the gemv kernel cannot run the problem (as the kernel reads it), or None."""
    pair = problem.pair
    if pair.operand not in GEMV_OPERANDS or not pair.result.is_float or \
            not pair.stored.is_float:
        return (f"it computes float16 and bfloat16 products with float results, not "
                f"{pair.describe_result()}")
    if b_layout != Layout.COLUMN_MAJOR:
        return ("B is not column-major (it reads B's columns along K: a weight stored N x K, "
                "used as x @ w.T)")
    if a_layout != Layout.ROW_MAJOR:
        return "A is not row-major (it reads A's rows along K)"
    if info.limits.subgroup_arithmetic is False:
        return (f"device {info.index} ({info.name}) lacks subgroup arithmetic in compute "
                f"shaders")
    return abi.gemv_violation_params(params, problem.b_quant)


def gemv_by_default(info: PhysicalDeviceInfo, problem: Problem, a_layout: Layout,
                    b_layout: Layout, params: GemmParams) -> bool:
    """The rule that picks gemv unforced and untuned: at most gemv_max_m rows (by B's
    format and N) against a column-major B on a GPU (not a CPU driver), where its
    preconditions hold. The policy applies it while GEMV_DEFAULT is on, to a float B (a
    quantized one: gemv_quant_by_default)."""
    most = gemv_max_m(problem.b_quant, problem.N)
    return (problem.M <= most and b_layout == Layout.COLUMN_MAJOR and not is_cpu(info)
            and gemv_violation(info, problem, a_layout, b_layout, params) is None)


def gemv_quant_by_default(info: PhysicalDeviceInfo, problem: Problem, a_layout: Layout,
                          b_layout: Layout, params: GemmParams) -> bool:
    """The rule that picks gemv for a quantized B unforced: gemv_by_default's (at most
    GEMV_QUANT_MAX_M rows of its format, a GPU, gemv's preconditions). The policy applies it while
    GEMV_QUANT_DEFAULT is on."""
    return problem.b_quant is not None and \
        gemv_by_default(info, problem, a_layout, b_layout, params)


def gemv_choice(info: PhysicalDeviceInfo, problem: Problem, a_layout: Layout,
                b_layout: Layout, params: GemmParams,
                tile: Tile | None = None) -> tuple[GemvTraits | None, str]:
    """(gemv traits, "") for the problem, with `tile` where it fits the device (its
    subgroup size sets tile_k), else the default tile; (None, why not) where the gemv
    kernel cannot run it."""
    why = gemv_violation(info, problem, a_layout, b_layout, params)
    if why is not None:
        return None, why
    pair = problem.pair
    for t in (tile, None) if tile is not None else (None,):
        gemv = gemv_traits(pair.operand, pair.result, info.limits, problem.has_c, problem.M,
                           tile=t, out_type=pair.out, ops=problem.ops,
                           b_quant=problem.b_quant, K=problem.K, N=problem.N,
                           cpu=is_cpu(info))
        try:
            gemv.check_tile()
        except ValueError as exc:
            why = str(exc)
            continue
        if gemv.invocations > info.limits.max_compute_work_group_invocations:
            why = f"gemv tile {gemv.tile.describe()} has too many invocations"
            continue
        return gemv, ""
    return None, why or "no gemv tile fits"


def default_traits(info: PhysicalDeviceInfo, problem: Problem, a_layout: Layout,
                   b_layout: Layout, params: GemmParams, options: Options,
                   tuned: Tuned) -> tuple[GemmTraits, str]:
    """(traits, why) for the problem as the kernel reads it (after any repack)."""
    pair = problem.pair
    if problem.b_quant is not None:
        return _quant_traits(info, problem, a_layout, b_layout, params, options)
    fam, tile = choose_family(info, pair, options, tuned, problem.M, problem.N)
    why = "forced" if options.family else "tuned" if tile is not None else "default"
    if not options.family and fam != "gemv" and GEMV_DEFAULT and \
            gemv_by_default(info, problem, a_layout, b_layout, params):
        # Over a tuned choice of another family too: the tables predate the gemv family.
        fam, tile, why = "gemv", None, "default"
    if fam == "gemv":
        gemv, why_not = gemv_choice(info, problem, a_layout, b_layout, params, tile)
        if gemv is not None:
            return gemv, why
        if options.family == "gemv":
            raise ValueError(f"the gemv kernel family cannot run this {problem.M}x"
                             f"{problem.N}x{problem.K} product: {why_not}")
        fam, tile, why = "khr", None, "default"  # a tuned gemv choice that does not fit
    if fam == "nv2" and problem.ops is not None and \
            not info.has("cooperativeMatrixPerElementOperations"):
        if options.family == "nv2":
            raise MissingFeatureError(
                f"a fused epilogue on the nv2 kernel family needs "
                f"cooperativeMatrixPerElementOperations, which device {info.index} "
                f"({info.name}) lacks")
        fam, tile, why = "khr", None, "default"
    # The rows family runs only when forced or tuned: its default tiles measured slower
    # than the khr kernel for most decode shapes (docs/design.md, Kernels).
    if fam == "rows":
        rows, why_not = rows_choice(info, problem, a_layout, b_layout, params, tile)
        if problem.ops is not None:
            rows, why_not = None, "it has no fused epilogue (bias, activation, residual) yet"
        if rows is not None:
            return rows, why
        if options.family == "rows":
            raise ValueError(f"the rows kernel family cannot run this {problem.M}x"
                             f"{problem.N}x{problem.K} product: {why_not}")
        fam, tile, why = "khr", None, "default"  # a tuned rows choice that does not fit
    if fam == "nv2":
        if tile is None:
            tile = next(iter(nv2_tiles(info, pair.operand, pair.result)), None)
        if tile is None:
            raise MissingFeatureError(
                f"device {info.index} ({info.name}) lists no workgroup-scope matrix for "
                f"{pair.describe()}")
        nv2 = nv2_traits(pair.operand, pair.result, info.flexible_dimensions_properties,
                         info.limits.subgroup_size, a_layout, b_layout, problem.has_c, tile)
        return replace(nv2, out_type=pair.out, ops=problem.ops), why
    cfg = config_for(info, pair)
    if cfg is None:
        raise MissingFeatureError(f"device {info.index} ({info.name}) offers no "
                                  f"subgroup-scope matrix for {pair.describe()}")
    if tile is None:
        tile = _default_tile(cfg, info.limits, problem.M <= SMALL_M, is_cpu(info))
    covering = not is_cpu(info) and tile.tile_m < problem.M <= SMALL_M
    if covering:
        tile = _covering_tile(cfg, info.limits, tile, 32 if problem.M <= 32 else 64)
        covering = tile.tile_m >= problem.M  # widened (it fits in shared memory)
    if not is_cpu(info) and fills_small(problem):
        filled = filling_tile(tile, _filling_ladder(cfg, info.limits), problem.M, problem.N,
                              problem.batch)
        covering = covering and filled == tile
        tile = filled
    khr = replace(khr_traits(cfg, info, a_layout, b_layout, problem.has_c, tile,
                             out_type=pair.out), ops=problem.ops)
    few_rows = not is_cpu(info) and problem.M <= SMALL_M
    return fastest_variant(khr, params, problem.batch, options, covering, few_rows), why


def quant_tile(tile: Tile) -> Tile:
    """A tile whose K steps are whole quantized blocks (tile_k a multiple of 32): the
    default's tile_k rounded up (f16 GPU defaults already are: 32, or 64 for few rows)."""
    block = BLOCK_ELEMS
    return replace(tile, tile_k=-(-tile.tile_k // block) * block)


def _quant_traits(info: PhysicalDeviceInfo, problem: Problem, a_layout: Layout,
                  b_layout: Layout, params: GemmParams,
                  options: Options) -> tuple[GemmTraits, str]:
    """(traits, why) for a quantized B: the gemv family where forced, or where
    gemv_quant_by_default says so while GEMV_QUANT_DEFAULT is on (its default quantized
    tile); else the khr family (its staging path dequantizes), on the default tile for
    the shape class with whole blocks per K step. Tuned tiles are float B's and are not
    used."""
    pair = problem.pair
    why = "forced" if options.family else "default"
    if options.family not in (None, "khr", "gemv"):
        raise ValueError(f"a quantized B ({problem.b_quant}) runs on the khr or gemv kernel "
                         f"families only, not {options.family!r}")
    forced = options.family == "gemv"
    if forced or (options.family is None and GEMV_QUANT_DEFAULT and
                  gemv_quant_by_default(info, problem, a_layout, b_layout, params)):
        gemv, why_not = gemv_choice(info, problem, a_layout, b_layout, params)
        if gemv is not None:
            return gemv, why
        if forced:
            raise ValueError(f"the gemv kernel family cannot run this {problem.M}x"
                             f"{problem.N}x{problem.K} product: {why_not}")
    cfg = config_for(info, pair)
    if cfg is None:
        raise MissingFeatureError(f"device {info.index} ({info.name}) offers no "
                                  f"subgroup-scope matrix for {pair.describe()}")
    small = problem.M <= SMALL_M
    tile = quant_tile(_default_tile(cfg, info.limits, small, is_cpu(info)))
    unit = QUANT_UNIT_DEFAULT
    covering = False
    if not is_cpu(info):
        tile = _quant_tile(cfg, info.limits, tile, min(problem.M, SMALL_M + 1))
        # more rows than one matrix, all in one row block: specialized as the float
        # product's covering tiles are (faster there too)
        covering = cfg.M < problem.M <= SMALL_M and tile.tile_m >= problem.M
        if not small:
            unit = QUANT_GENERAL_UNIT.get(problem.b_quant or "", unit)
    # The dequantization's magic held in a register: measured faster on few-row tiles only.
    khr = replace(khr_traits(cfg, info, a_layout, b_layout, problem.has_c, tile,
                             out_type=pair.out), b_quant=problem.b_quant,
                  b_quant_unit=unit, b_quant_held_magic=tile.tile_m <= SMALL_M,
                  ops=problem.ops)
    few_rows = not is_cpu(info) and small
    return fastest_variant(khr, params, problem.batch, options, covering, few_rows), why


def split_k_violation(info: PhysicalDeviceInfo, problem: Problem, S: int) -> str | None:
    """Why `problem` cannot run as a split-K of S slices, or None where it can: one
    product (batch 1), float32 accumulation with a float result, K a multiple of S (of
    32 x S for a quantized B: whole blocks a slice). (split_choice checks the tiles
    against the counters there are.)"""
    p = problem
    if p.batch != 1:
        return f"it is a batch of {p.batch} products"
    if p.pair.result != ComponentType.FLOAT32 or not p.pair.stored.is_float:
        return (f"it splits float32 accumulation with float results only, not "
                f"{p.pair.describe_result()}")
    if p.K % S:
        return f"K={p.K} is not a multiple of {S} slices"
    if p.b_quant is not None and (p.K // S) % BLOCK_ELEMS:
        return (f"slices of K={p.K} / {S} are not whole {BLOCK_ELEMS}-weight blocks of the "
                f"quantized B ({p.b_quant})")
    # The slices' float32 partials admit the aligned variant where D's own rows (C's and
    # D's leading dimension is N) need not start on 16 bytes; the general variant's split
    # gave wrong results there on an H200 (lavapipe: right), so those run unsplit.
    if p.N * element_bytes(p.pair.stored) % 16:
        return (f"D's rows of {p.N} {p.pair.stored.name.lower()} elements do not start "
                f"on 16-byte boundaries")
    return None


def split_k_for(info: PhysicalDeviceInfo, problem: Problem, traits: GemmTraits,
                deepens: bool = True) -> int:
    """The split-K rule (applied while SPLIT_K_DEFAULT is on): on a GPU, for the khr
    family, batch 1; more than SMALL_M rows: mid_split_k; else, unsplit grid G
    workgroups: on a tile of
    SPLIT_K_BY_TILE_ROWS' rows, that table's S for G; otherwise, where G <=
    SPLIT_K_MAX_GROUPS, S = the power of two of SPLIT_K_CHOICES nearest ceil(
    SPLIT_K_TARGET_GROUPS / G) (on a log scale: powers of two are geometric; ties go to
    the smaller). S halves until K % (S * tile_k) == 0 (whole K steps per slice) and
    K / S >= SPLIT_K_MIN_SLICE; 1: unsplit.
    `traits`: the unsplit kernel's; `deepens`: whether unsplit it would take the deeper
    K step (_deep_traits), which the table's entries for an exact kernel of a float B
    count on (a row-major B's deeper tile does not fit 48 KiB of shared memory)."""
    p = problem
    if is_cpu(info) or not isinstance(traits, KhrTraits) or p.batch != 1:
        return 1
    if p.M > SMALL_M:
        return mid_split_k(info, p)
    t = traits.tile
    groups = -(-p.M // t.tile_m) * -(-p.N // t.tile_n)
    table = SPLIT_K_BY_TILE_ROWS.get(t.tile_m)
    if table is not None:
        exact_float = traits.exact and p.b_quant is None and deepens
        S = next((s_exact if exact_float else s for most, s, s_exact in table
                  if groups <= most), 1)
    elif groups > SPLIT_K_MAX_GROUPS:
        return 1
    else:
        want = -(-SPLIT_K_TARGET_GROUPS // groups)
        S = min(SPLIT_K_CHOICES, key=lambda s: (abs(math.log2(s) - math.log2(want)), s))
    while S > 1 and (p.K % (S * t.tile_k) or p.K // S < SPLIT_K_MIN_SLICE):
        S //= 2  # fewer, longer slices where K does not make S whole ones
    return S if S > 1 and split_k_violation(info, p, S) is None else 1


def mid_split_k(info: PhysicalDeviceInfo, problem: Problem) -> int:
    """The split-K of a product of more than SMALL_M rows whose general tile's grid G
    leaves the GPU part idle (G < FILL_GROUPS): the smallest power of two S with
    G S >= FILL_GROUPS, at most MID_SPLIT_MAX (MID_SPLIT_SHALLOW_MAX where that many
    slices would be too shallow), each slice at least MID_SPLIT_MIN_SLICE deep and whole
    K steps; else 1 (unsplit: the filling tile runs it). The slices take
    the tile the batch of S slices gets (tiles.filling_tile): the general tile where
    G S fills the GPU, which outruns the smaller filling tiles on long K
    (docs/design.md, Policy). A quantized B (where it is not dequantized first) counts
    G on its own general tile (tiles.quant_general_tile), which its slices run, and
    splits only G <= MID_SPLIT_QUANT_MAX_GROUPS."""
    p = problem
    cfg = config_for(info, p.pair)
    if cfg is None:
        return 1
    t = _default_tile(cfg, info.limits, False, False)
    if p.b_quant is not None:
        t = _quant_tile(cfg, info.limits, quant_tile(t), SMALL_M + 1)
    groups = -(-p.M // t.tile_m) * -(-p.N // t.tile_n)
    if groups >= FILL_GROUPS or (p.b_quant is not None and groups > MID_SPLIT_QUANT_MAX_GROUPS):
        return 1
    S = min(MID_SPLIT_MAX, 1 << max(0, math.ceil(math.log2(FILL_GROUPS / groups))))

    def too_shallow(S: int) -> bool:
        return bool(p.K % (S * t.tile_k)) or p.K // S < MID_SPLIT_MIN_SLICE

    if S > MID_SPLIT_SHALLOW_MAX and too_shallow(S):
        S = MID_SPLIT_SHALLOW_MAX
    if too_shallow(S):
        return 1
    return S if split_k_violation(info, p, S) is None else 1


def slice_problem(problem: Problem, S: int) -> Problem:
    """The batched product a split-K of S runs: slice s is A[:, s Ks:(s+1) Ks] @
    B[s Ks:(s+1) Ks, :] (Ks = K / S), its batch strides stepping along K inside the one
    A and B (Ks elements where K is contiguous, Ks lines where it is not), the result
    float32 partials (alpha 1, no C, no fused operations). Requires split_k_violation
    None."""
    p = problem
    Ks = p.K // S
    a_step = Ks if p.a.layout is Layout.ROW_MAJOR else Ks * p.a.ld
    b_step = Ks * p.b.ld if p.b.layout is Layout.ROW_MAJOR else Ks
    return Problem(TypePair(p.pair.operand, ComponentType.FLOAT32), p.M, p.N, Ks,
                   replace(p.a, batch_stride=a_step), replace(p.b, batch_stride=b_step),
                   batch=S, b_quant=p.b_quant)


def _split_tiles_violation(traits: KhrTraits, p: Problem) -> str | None:
    """Why a split-K on `traits`' tile cannot count its tiles' arrivals, or None: more
    tiles than the device's shared counters (abi.SPLIT_K_MAX_TILES)."""
    tiles = abi.split_layout(traits, p.M, p.N)[0]
    if tiles <= abi.SPLIT_K_MAX_TILES:
        return None
    return (f"a split-K counts arrivals for at most {abi.SPLIT_K_MAX_TILES} tiles; this "
            f"product has {tiles}")


def split_choice(problem: Problem, sliced: KernelChoice, S: int) -> KernelChoice:
    """The split-K of S in one dispatch, from the choice for its slices (slice_problem):
    the slices' tile and strides, with the problem's own D type, C, alpha, beta and fused
    operations, which the last workgroup of each tile applies (KhrTraits.split_k)."""
    p = problem
    t = sliced.traits
    assert isinstance(t, KhrTraits)
    why_not = _split_tiles_violation(t, p)
    if why_not is not None:
        raise ValueError(why_not)
    stored = p.pair.stored
    unit = max(t.b_quant_unit, SPLIT_MIN_QUANT_UNIT)  # plan.SPLIT_MIN_QUANT_UNIT says why
    traits = replace(t, split_k=S, has_c=p.has_c, ops=p.ops, b_quant_unit=unit,
                     out_type=None if stored == t.result_type else stored)
    params = replace(sliced.params, alpha=p.alpha, beta=p.beta if p.has_c else 0)
    return replace(sliced, traits=traits, params=params, split_k=S)


def choose(info: PhysicalDeviceInfo, problem: Problem, options: Options | None = None,
           tuned: Tuned | None = None, traits: GemmTraits | None = None, *,
           split_k: int = 1) -> KernelChoice:
    """The kernel for `problem` on `info`. With `traits` (the tuner's candidates), those
    traits run: only repacks, parameters and margins are derived; with `split_k` S > 1
    too, `traits` are the slice GEMM's of a split-K of S (the problem must allow it), and
    so they are for Options.split_k's S where the problem allows it (khr traits).
    Without `traits`, a split-K where Options.split_k forces one (and the problem allows
    it) or the rule chooses one (SPLIT_K_DEFAULT)."""
    options = options or Options()
    tuned = tuned or {}
    p = problem
    if p.b_quant is not None and (dequantizes_first(info, p, options) if traits is None
                                  else getattr(traits, "b_quant", None) is None):
        return _dequantized(info, p, options, tuned, traits, split_k)
    if p.ops is not None and not p.ops.fused:  # one kernel, one name for "nothing fused"
        p = replace(p, ops=None)
    if p.ops is not None and p.ops.activation is not None and not p.pair.result.is_float:
        raise ValueError(f"the {p.ops.activation.value} activation needs a float result, "
                         f"not {p.pair.describe_result()}")
    if traits is not None:
        forced = options.split_k or 1
        if split_k == 1 and forced > 1 and isinstance(traits, KhrTraits) and \
                split_k_violation(info, p, forced) is None and \
                _split_tiles_violation(traits, p) is None:
            split_k = forced  # as without traits: where the product allows it
        if split_k > 1:
            why_not = split_k_violation(info, p, split_k)
            if why_not is not None:
                raise ValueError(f"no split-K of {split_k} for this product: {why_not}")
            return split_choice(p, _choose(info, slice_problem(p, split_k), options, tuned,
                                           traits), split_k)
        if traits.stored_type != p.pair.stored:  # D's buffer is sized for the pair's type
            raise ValueError(f"traits {traits.describe()} store "
                             f"{traits.stored_type.name} results, the product "
                             f"{p.pair.describe_result()}")
        return _choose(info, p, options, tuned, traits)
    choice = _choose(info, p, options, tuned, None)
    if not isinstance(choice.traits, KhrTraits):  # split-K is the khr family's
        return choice
    deep = _deep_traits(info, p, options, choice)
    if options.split_k is not None:
        S = options.split_k
    else:
        S = split_k_for(info, p, choice.traits, deep is not None) if SPLIT_K_DEFAULT else 1
    if S <= 1 or split_k_violation(info, p, S) is not None:
        return _deepened(info, p, options, tuned, choice, deep)
    sliced = _choose(info, slice_problem(p, S), replace(options, family="khr"), tuned, None)
    assert isinstance(sliced.traits, KhrTraits)
    if _split_tiles_violation(sliced.traits, p) is not None:
        return _deepened(info, p, options, tuned, choice, deep)
    return replace(split_choice(p, sliced, S), why="forced" if options.split_k else choice.why)


def dequantizes_first(info: PhysicalDeviceInfo, problem: Problem, options: Options) -> bool:
    """Whether a quantized B is dequantized into a float B by a pass of its own before a
    float kernel runs the product: Options.dequant 'first' / 'fused' decide; else ('auto')
    on a GPU, unforced family, at least DEQUANT_FIRST_MIN_M rows and more than
    DEQUANT_FIRST_MIN_OUTPUT results. Never where the float copy would not fit one buffer
    binding (maxStorageBufferRange)."""
    p = problem
    if p.b_quant is None or options.dequant == "fused":
        return False
    if p.N * p.K * (p.pair.operand.bits // 8) > info.limits.max_storage_buffer_range:
        return False
    if options.dequant == "first":
        return True
    return (options.family is None and not is_cpu(info) and p.M >= DEQUANT_FIRST_MIN_M
            and p.M * p.N > DEQUANT_FIRST_MIN_OUTPUT)


def _dequantized(info: PhysicalDeviceInfo, p: Problem, options: Options, tuned: Tuned,
                 traits: GemmTraits | None, split_k: int) -> KernelChoice:
    """The choice for the float problem whose B is the quantized weight dequantized
    (column-major, ld = K), behind the dequantizing pass."""
    packed = OperandLayout(Layout.COLUMN_MAJOR, p.K)
    pack = PackChoice(1, True, p.K, p.N, p.b, packed, p.N * p.K, quant=p.b_quant)
    choice = choose(info, replace(p, b=packed, b_quant=None), options, tuned, traits,
                    split_k=split_k)
    return replace(choice, packs=(pack, *choice.packs))


def _deep_traits(info: PhysicalDeviceInfo, p: Problem, options: Options,
                 choice: KernelChoice) -> KhrTraits | None:
    """The traits of `choice` (unsplit) on the few-row tile with twice the K step
    (tiles.deep_few_row_tile), where the policy takes it: a few-row product of a float B
    on a GPU, on the few-row tile, no family forced, and the deeper tile fitting the
    device's shared memory; else None."""
    t = choice.traits
    if (options.family is not None or is_cpu(info) or p.b_quant is not None
            or not isinstance(t, KhrTraits) or p.M > SMALL_M):
        return None
    cfg = config_for(info, p.pair)
    deep = khr_deep_tile(cfg, t.tile) if cfg is not None else t.tile
    if deep == t.tile:
        return None
    traits = fastest_variant(replace(t, tile=deep), choice.params, p.batch, options,
                             few_rows=True)
    # The bounds-checked variant too: a plan falls back to it where the operands' buffers
    # lack the exact variant's read-past margins (dispatch.gemm._make_plan), and it stages
    # more (over 48 KiB for 16 x 256 @ 256^2 on the deeper tile).
    try:
        if max(plan_kernel(v).shared_bytes for v in {traits, bounds_checked(traits)}) \
                > info.limits.max_compute_shared_memory_size:
            return None
    except ValueError:  # a tile the kernel cannot lay out
        return None
    return traits


def _deepened(info: PhysicalDeviceInfo, p: Problem, options: Options, tuned: Tuned,
              choice: KernelChoice, deep: KhrTraits | None) -> KernelChoice:
    """An unsplit few-row product of a float B on a GPU, on the few-row tile: that tile
    with twice the K step where `_deep_traits` gave `deep`."""
    if deep is None:
        return choice
    return replace(_choose(info, p, options, tuned, deep), why=choice.why)


def _choose(info: PhysicalDeviceInfo, p: Problem, options: Options, tuned: Tuned,
            traits: GemmTraits | None) -> KernelChoice:
    """choose's single kernel (no split-K), for a normalized problem."""
    packs: list[PackChoice] = []
    a, b = p.a, p.b  # as the GEMM kernel reads them
    if repacks(info, p.pair, 0, a.layout, p.M, traits):  # column-major A: K lines of M
        packs.append(_pack(0, a, p.K, p.M, p.batch))
        a = packs[-1].packed
    if repacks(info, p.pair, 1, b.layout, p.M, traits):  # row-major B: K lines of N
        packs.append(_pack(1, b, p.K, p.N, p.batch))
        b = packs[-1].packed
    params = GemmParams(
        M=p.M, N=p.N, K=p.K, lda=a.ld, ldb=b.ld, ldc=p.N, ldd=p.N,
        batch_stride_a=a.batch_stride, batch_stride_b=b.batch_stride,
        batch_stride_c=p.c_batch_stride, batch_stride_d=p.M * p.N,
        alpha=p.alpha, beta=p.beta if p.has_c else 0)
    why = "explicit"
    if traits is None:
        traits, why = default_traits(info, p, a.layout, b.layout, params, options, tuned)
    item = p.pair.operand.bits // 8
    margins = (abi.overread_elems(traits, a.ld, "a") * item,
               abi.overread_bytes_b(traits, b.ld, item))
    sizes = (_elems(p, a, 0), _elems(p, b, 1))
    too_big = max(sizes[0] * item + margins[0], sizes[1] * item + margins[1]) > \
        info.limits.max_storage_buffer_range
    if too_big and isinstance(traits, KhrTraits):  # only khr kernels have margins
        # No room for the exact variant's margin: the bounds-checked one needs none.
        traits = bounds_checked(traits)
        margins = (0, abi.overread_bytes_b(traits, b.ld, item))  # a quantized B's pad
    return KernelChoice(traits, params, tuple(packs), margins, why)


def _elems(p: Problem, x: OperandLayout, operand: int) -> int:
    """Elements an operand's buffer holds (batch copies x lines x ld; less where the
    batch entries overlap, as a split-K's slices of one matrix do)."""
    lines = {(0, Layout.ROW_MAJOR): p.M, (0, Layout.COLUMN_MAJOR): p.K,
             (1, Layout.ROW_MAJOR): p.K, (1, Layout.COLUMN_MAJOR): p.N}[(operand, x.layout)]
    copies = p.batch if x.batch_stride else 1
    return min(copies * lines * x.ld, (copies - 1) * x.batch_stride + lines * x.ld)
