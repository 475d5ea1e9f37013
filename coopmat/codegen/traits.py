"""What a GEMM kernel is built for (traits, tile) and what it is run with (params).

Traits have one class per kernel family, because the families read a kernel's description
differently:
- KhrTraits (VK_KHR_cooperative_matrix, subgroup scope; khr_tiled.py): the kernel is
  built from one cooperative-matrix shape the device lists (m x n x k), each subgroup owns
  a grid of those matrices, and it comes in variants (aligned, exact, specialized);
- Nv2Traits (VK_NV_cooperative_matrix2, workgroup scope; nv2_workgroup.py): the matrices
  are the whole workgroup tile, any multiple of the granularities the device lists, and one
  kernel serves every alignment and shape.
GemmTraits, their base, holds what both share (types, layouts, C, the tile, the result's
type in memory); callers outside codegen hold traits as GemmTraits and read a family's own
fields only after an isinstance check.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from coopmat.common.dtypes import element, known
from coopmat.common.enums import ComponentType
from coopmat.common.quant_formats import BLOCK_ELEMS, quant_format


class Layout(enum.Enum):
    """How A or B lies in memory; the values are SPIR-V's CooperativeMatrixLayout."""

    ROW_MAJOR = 0
    COLUMN_MAJOR = 1


@dataclass(frozen=True)
class Tile:
    """What one workgroup computes: a tile_m x tile_n block of D, walking K in steps of
    tile_k, with a subgroups_m x subgroups_n grid of subgroups and a buffering mode.

    One type for both families, as tuning tables record (family, tile) in one form
    (coopmat/dispatch/tuning.py); what the grid and buffering mean is the family's (see
    KhrTraits and Nv2Traits). In both, the workgroup has subgroups x subgroup size
    invocations.
    """

    tile_m: int
    tile_n: int
    tile_k: int
    subgroups_m: int
    subgroups_n: int
    buffering: int = 2

    @property
    def subgroups(self) -> int:
        return self.subgroups_m * self.subgroups_n

    def describe(self) -> str:
        return (f"{self.tile_m}x{self.tile_n}x{self.tile_k} "
                f"sg{self.subgroups_m}x{self.subgroups_n} buf{self.buffering}")


def _short(t: ComponentType) -> str:
    return element(t).short if known(t) else str(int(t))


class Activation(enum.Enum):
    """Element-wise activations of the fused epilogue (values: the public names)."""

    RELU = "relu"
    GELU_TANH = "gelu_tanh"  # torch.nn.functional.gelu(x, approximate="tanh")
    SILU = "silu"


@dataclass(frozen=True)
class EpilogueOps:
    """What a kernel fuses after alpha * acc + beta * C: a bias per column of D (binding
    abi.BINDING_BIAS), an activation, a residual shaped and addressed like D (binding
    abi.BINDING_RESIDUAL)."""

    bias: bool = False
    activation: Activation | None = None
    residual: bool = False

    @property
    def fused(self) -> bool:
        """Whether anything is fused (traits hold None rather than an empty EpilogueOps)."""
        return self.bias or self.activation is not None or self.residual

    def describe(self) -> str:
        """The suffix of a kernel's name ("" where nothing is fused)."""
        parts = (["bias"] if self.bias else []) + \
            ([self.activation.value] if self.activation else []) + \
            (["res"] if self.residual else [])
        return "-epi_" + "_".join(parts) if parts else ""


_LAYOUT_LETTER = {Layout.ROW_MAJOR: "r", Layout.COLUMN_MAJOR: "c"}


@dataclass(frozen=True, kw_only=True)
class GemmTraits(ABC):
    """Everything that changes the generated binary: the part every family shares.

    `subgroup_size` is the device's; with the tile's subgroup grid it sets the workgroup
    size. `out_type`: the element type of C and D in memory where it differs from the
    accumulator (result_type): float16 results of a float32-accumulating config, rounded
    once in the epilogue. None: C and D hold result_type. `ops`: the fused epilogue
    (bias, activation, residual; epilogue.py); None: none.
    """

    # The name of the KernelFamily (codegen/family.py) that builds these traits.
    family: ClassVar[str]

    a_type: ComponentType
    b_type: ComponentType
    c_type: ComponentType
    result_type: ComponentType
    a_layout: Layout
    b_layout: Layout
    has_c: bool
    tile: Tile
    subgroup_size: int
    out_type: ComponentType | None = None
    ops: EpilogueOps | None = None

    @property
    def stored_type(self) -> ComponentType:
        """The element type of C and D in memory."""
        return self.out_type if self.out_type is not None else self.result_type

    @property
    def invocations(self) -> int:
        """The workgroup size."""
        return self.tile.subgroups * self.subgroup_size

    @abstractmethod
    def describe(self) -> str:
        """A short stable name, used for listings, --dump and the bench's records."""

    def _name(self, shape: tuple[int, int, int], variant: str, extra: str = "") -> str:
        """The shared form of describe(): the family's matrix shape, its variant name and
        any suffix of its own (before the stored type's) fill the family's slots. These
        names are recorded (docs/*.json), so the form must not change."""
        tile = self.tile
        return (f"{self.family}-{_short(self.a_type)}{_short(self.b_type)}"
                f"-{_short(self.result_type)}-{'x'.join(map(str, shape))}"
                f"-sg{self.subgroup_size}"
                f"-{_LAYOUT_LETTER[self.a_layout]}{_LAYOUT_LETTER[self.b_layout]}"
                f"-{'c' if self.has_c else 'noc'}-{variant}"
                f"-t{tile.tile_m}x{tile.tile_n}x{tile.tile_k}"
                f"s{tile.subgroups_m}x{tile.subgroups_n}b{tile.buffering}"
                + extra
                + (f"-out{_short(self.out_type)}" if self.out_type is not None else "")
                + (self.ops.describe() if self.ops is not None else ""))


# KhrTraits' tile buffering modes: 1 load-then-multiply, 2 register prefetch, 3 register
# prefetch into two shared stages (one barrier per K step), 4 as 2 with streamed B
# fragments, 5 as 2 with two register sets (loads two K steps ahead).
BUFFERING_MODES = (1, 2, 3, 4, 5)


@dataclass(frozen=True, kw_only=True)
class KhrTraits(GemmTraits):
    """Traits of the khr family (VK_KHR_cooperative_matrix, subgroup scope).

    m, n, k: the cooperative-matrix shape (MSize, NSize, KSize of the device's
    VkCooperativeMatrixPropertiesKHR entry), not the GEMM's sizes, which are runtime values
    in GemmParams. The kernel requires `subgroup_size` of its pipeline.

    The tile: each subgroup of the grid owns a (tile_m / subgroups_m) x
    (tile_n / subgroups_n) block of D, held as a grid of m x n accumulators (see
    `accumulators`). buffering = 2 keeps the next K step's global loads in registers while
    the current one is multiplied; 1 loads, then multiplies. buffering = 3 stages A/B in
    two shared-memory copies (twice the staging memory) with one workgroup barrier per K
    step: while the multiply reads one copy, the K step prefetched into registers is stored
    into the other and the one after it is loaded. buffering = 4 is buffering 2's pipeline
    (one copy, two barriers per K step). buffering = 5 is buffering 2 with two sets of
    registers: each K step's loads go out two steps before it is staged (twice the
    registers; for few-row tiles, which wait on memory). Both 3 and 4 multiply in the
    order that holds the fewest fragments: a K step's A fragments, then one B fragment at
    a time against all of them (buffering 1, 2 and 5 load every fragment of the K step
    first).

    Variants: `aligned` loads A and B a vector at a time (abi.aligned_ok says when it may
    run). `exact` (with aligned): the problem is a whole number of workgroup tiles in M, N
    and K, so the kernel skips every bounds check and edge path. `specialized`: the values
    of M, N, K, lda, ldb, ldc, ldd and the four batch strides baked into the code as
    constants (the driver's compiler then folds the address arithmetic); empty: all read
    from push constants.

    `out_matrix`: whether the device lists an accumulator matrix of `out_type` at m x n
    (variants.lists_out_matrix decides, from the device's list, in variants.khr_traits).
    Where it does, the epilogue converts the accumulator to that matrix and stores it
    whole (interior tiles; every tile of the exact variant). Where it does not (Intel
    Xe-HPG: no float16 accumulation), declaring that matrix would be undefined behaviour,
    so the kernel never does: every tile takes the scratch path, element by element
    (`scratch_epilogue`). Always True without an out_type (the accumulator's own type
    is listed by its config).
    """

    family: ClassVar[str] = "khr"

    m: int
    n: int
    k: int
    aligned: bool = False
    exact: bool = False
    specialized: tuple[int, ...] = ()
    # Quantized B (coopmat/quant_formats.py name, e.g. "q8_0"): B is column-major GGUF
    # blocks, dequantized to b_type as it is staged into shared memory, b_quant_unit
    # weights (4 or 8 within one block, or 32: a whole block) per invocation and unit.
    # None: plain B.
    b_quant: str | None = None
    b_quant_unit: int = 8
    # With b_quant: the dequantization's float magic held in a register
    # (quant.held_constant) instead of written as a literal; the policy's choice
    # (policy.kernel, few-row tiles). Not in `describe`: the same product either way.
    b_quant_held_magic: bool = False
    out_matrix: bool = True
    # S > 1: a split-K of one product in one dispatch. Workgroup z is slice s of K (A and
    # B offset by their batch strides); each workgroup stores its float32 accumulators
    # to a workspace (abi.BINDING_PARTIALS), and the last of a tile's S workgroups to
    # arrive (a counter per tile, abi.BINDING_COUNTERS) sums the S partials and applies
    # the epilogue into D (abi.split_layout; khr_tiled._split_epilogue).
    split_k: int = 1
    # The K loop marked DontUnroll: NVIDIA's compiler otherwise unrolls a long K loop (16
    # steps of a few-row tile: 36 KB of code), which measured slower for few-row tiles
    # with many K steps (policy.kernel.rolls_k_loop).
    k_loop_rolled: bool = False
    # False: the pipeline asks for no driver bounds checks on its storage buffers
    # (VK_EXT_pipeline_robustness; dispatch.pipelines). Only for kernels that stay inside
    # their bindings by construction (the exact variant: whole tiles, read-past margins
    # allocated); policy.kernel.checks_off decides. NVIDIA's driver otherwise checks each
    # load.
    storage_checks: bool = True
    # With exact: K is whole tiles but M may end inside the last row block (clamp_rows)
    # and N inside the last column block (clamp_cols). A's loads read row min(row, M - 1)
    # and B's column min(col, N - 1) (inside the matrix, no check; what they feed is
    # never stored), and workgroups straddling M or N store D through the scratch,
    # element by element. So few rows on a tile of more (8 rows on the 16-row tile) keep
    # the exact kernel's unchecked loads (abi.clamped_ok says when it may run). Not with
    # a quantized B's columns.
    clamp_rows: bool = False
    clamp_cols: bool = False

    @property
    def variant(self) -> str:
        return "exact" if self.exact else "aligned" if self.aligned else "general"

    @property
    def edges(self) -> bool:
        """Whether some workgroup's tile may straddle M or N (every variant but exact
        without clamping)."""
        return not self.exact or self.clamp_rows or self.clamp_cols

    @property
    def scratch_epilogue(self) -> bool:
        """Whether every tile's epilogue goes through the subgroup's shared scratch,
        element by element (the exact variant's too): where D's type has no listed
        accumulator matrix (not out_matrix), so that no matrix of it is declared, fused
        operations included. Otherwise only edge tiles do (fused operations on direct
        tiles act on whole matrices), and the exact variant has no scratch."""
        return not self.out_matrix

    @property
    def accumulators(self) -> tuple[int, int]:
        """Accumulator grid (rows, columns) per subgroup."""
        t = self.tile
        return (t.tile_m // t.subgroups_m // self.m, t.tile_n // t.subgroups_n // self.n)

    def check_tile(self) -> None:
        """Raise ValueError unless the tile splits evenly into m x n x k matrices."""
        t = self.tile
        if t.buffering not in BUFFERING_MODES:
            raise ValueError(f"buffering must be one of {BUFFERING_MODES}, not {t.buffering}")
        if min(t.subgroups_m, t.subgroups_n) < 1:
            raise ValueError("the subgroup grid needs at least one subgroup each way")
        if t.tile_m % (t.subgroups_m * self.m) or t.tile_n % (t.subgroups_n * self.n):
            raise ValueError(f"{t} does not split into {self.m}x{self.n} accumulators per "
                             f"subgroup")
        if t.tile_k % self.k:
            raise ValueError(f"tile_k={t.tile_k} is not a multiple of K={self.k}")

    def describe(self) -> str:
        extra = f"-for{'x'.join(map(str, self.specialized))}" if self.specialized else ""
        if self.b_quant is not None:
            extra += f"-b{self.b_quant}u{self.b_quant_unit}"
        if not self.out_matrix:  # D stored element by element from the scratch
            extra += "-estore"
        if self.split_k > 1:
            extra += f"-split{self.split_k}"
        if self.k_loop_rolled:
            extra += "-rolled"
        if not self.storage_checks:
            extra += "-unchecked"
        if self.clamp_rows:
            extra += "-clamped"
        if self.clamp_cols:
            extra += "-clampedcols"
        return self._name((self.m, self.n, self.k), self.variant, extra)


@dataclass(frozen=True, kw_only=True)
class Nv2Traits(GemmTraits):
    """Traits of the nv2 family (VK_NV_cooperative_matrix2, workgroup-scope matrices).

    m_granularity, n_granularity, k_granularity: the granularities (MGranularity,
    NGranularity, KGranularity) of the device's VkCooperativeMatrixFlexibleDimensions-
    PropertiesNV entry the tile runs under; the tile is a multiple of them, and its
    tile_m x tile_k, tile_k x tile_n and tile_m x tile_n are the kernel's matrices.

    The tile's subgroup grid only sets the workgroup size (`invocations`, the entry's
    workgroupInvocations): the implementation distributes workgroup-scope matrices itself.
    buffering is 1 (load, then multiply) or 2 (each K step's successor loads issued before
    its multiply). No variants: the kernel handles every alignment and shape.
    """

    family: ClassVar[str] = "nv2"

    m_granularity: int
    n_granularity: int
    k_granularity: int

    @property
    def granularity(self) -> tuple[int, int, int]:
        return (self.m_granularity, self.n_granularity, self.k_granularity)

    def describe(self) -> str:
        # "general" fills the variant slot the khr names have: one kernel for every case.
        return self._name(self.granularity, "general")


@dataclass(frozen=True, kw_only=True)
class RowsTraits(GemmTraits):
    """Traits of the rows family (VK_KHR_cooperative_matrix, subgroup scope; rows.py): a
    few rows of D per workgroup, streaming B from global memory.

    m, n, k: the cooperative-matrix shape, as in KhrTraits. The tile reads:
    tile_m = row_frags * m rows of D (all of M for M <= tile_m; more row blocks go to
    WorkgroupId.y), tile_n = nf * n columns (one strip), tile_k = kc (A is staged in
    shared memory kc elements of K at a time), subgroups_m = splits (subgroups that
    split K between them), subgroups_n = 1, buffering = unroll (k steps whose B
    fragments are loaded together before they are multiplied). These are the sizes to
    sweep on a GPU (`rows_tile` builds one).

    aligned: A is read 16 bytes at a time (row-major A only; abi.rows_violation says
    when it may run); otherwise element by element.
    """

    family: ClassVar[str] = "rows"

    m: int
    n: int
    k: int
    aligned: bool = False

    @property
    def row_frags(self) -> int:
        return self.tile.tile_m // self.m

    @property
    def nf(self) -> int:
        return self.tile.tile_n // self.n

    @property
    def splits(self) -> int:
        return self.tile.subgroups_m

    @property
    def unroll(self) -> int:
        return self.tile.buffering

    @property
    def kc(self) -> int:
        return self.tile.tile_k

    def check_tile(self) -> None:
        """Raise ValueError unless the tile fits the rows kernel's structure."""
        t = self.tile
        if min(t.tile_m, t.tile_n, t.tile_k, t.subgroups_m, t.buffering) < 1 or \
                t.subgroups_n != 1:
            raise ValueError(f"rows tile {t.describe()}: sizes must be positive and "
                             f"subgroups_n 1")
        if t.tile_m % self.m or t.tile_n % self.n:
            raise ValueError(f"rows tile {t.describe()} is not whole {self.m}x{self.n} "
                             f"fragments")
        if t.tile_k % (self.k * t.subgroups_m * t.buffering):
            raise ValueError(f"rows tile {t.describe()}: kc={t.tile_k} must be a multiple "
                             f"of k * splits * unroll = {self.k * t.subgroups_m * t.buffering}")
        if self.c_type != self.result_type:
            raise ValueError("C and Result component types must match")
        if self.aligned and self.a_layout != Layout.ROW_MAJOR:
            raise ValueError("the rows kernel's aligned variant reads a row-major A")

    def describe(self) -> str:
        return self._name((self.m, self.n, self.k), "aligned" if self.aligned else "general")


GEMV_MAX_ROWS = 8  # rows of D one gemv workgroup holds (M*C float32 sums per lane)
GEMV_VECTOR = 8  # 16-bit elements of A and B per 16-byte load along K


def gemv_lane_elems(b_quant: str | None) -> int:
    """Elements of K a gemv lane takes per column and load: a 16-byte unit of a float B
    (GEMV_VECTOR), a whole block of a quantized one (BLOCK_ELEMS)."""
    return GEMV_VECTOR if b_quant is None else BLOCK_ELEMS


@dataclass(frozen=True, kw_only=True)
class GemvTraits(GemmTraits):
    """Traits of the gemv family (no cooperative matrices; gemv.py): a few rows of D
    against a column-major B (a weight stored N x K, used as x @ w.T), read once at memory
    bandwidth with 16-byte loads along K and reduced across the subgroup.

    The tile reads: tile_m = R rows of D per workgroup (<= GEMV_MAX_ROWS; more rows go to
    further row blocks, WorkgroupId.y, each reading B again), tile_n = S * C columns per
    workgroup (subgroup s owns columns s * C .. s * C + C - 1 of the workgroup's strip),
    tile_k = 8 * subgroup_size * U * Q elements of K per step of a workgroup (each lane
    reads 8 elements, 16 bytes, of each of its C columns U times), subgroups_m = S
    (`splits`), subgroups_n = Q (`k_splits`: Q subgroups share each C columns, each taking
    every Q-th subgroup-wide stretch of K, their sums added through shared memory; 1: a
    subgroup walks all of K), buffering = U (`unroll`: the U x C loads of a step are issued
    before any is used). `gemv_tile` builds one from (rows, cols, splits, unroll,
    k_splits).

    A and B are float16 or bfloat16 (the same type), read as 32-bit words; the sums are
    float32 whatever result_type, which (with out_type) only sets what D and C hold.

    b_quant (a coopmat/quant_formats.py name, e.g. "q8_0"): B is the N x K weight's GGUF
    blocks (gemv_quant.py), b_type the type of A it multiplies; each lane then takes a
    whole block (32 elements of K) of each of its columns per load, so tile_k = 32 *
    subgroup_size * U. None: a plain B.
    """

    family: ClassVar[str] = "gemv"

    b_quant: str | None = None
    # False: the pipeline asks for no driver bounds checks on its storage buffers
    # (dispatch.pipelines), as KhrTraits.storage_checks. Every gemv kernel may: each load
    # is of a valid column, row and K unit (clamped, or unit 0 past K), and a quantized
    # B's words end at most 2 bytes past its last block, inside the pad its buffer keeps.
    # policy.gemv_tiles.checks_storage says where the checks measured faster.
    storage_checks: bool = True
    # True: each K step's loads are issued before the previous step's products, their
    # values carried across the loop (gemv.py's `_walk_k`), so a lane's arithmetic
    # overlaps the next step's memory latency. policy.gemv_tiles.prefetches says where.
    prefetch: bool = False

    @property
    def rows(self) -> int:
        return self.tile.tile_m

    @property
    def splits(self) -> int:
        return self.tile.subgroups_m

    @property
    def cols(self) -> int:
        return self.tile.tile_n // self.tile.subgroups_m

    @property
    def unroll(self) -> int:
        return self.tile.buffering

    @property
    def k_splits(self) -> int:
        return self.tile.subgroups_n

    def check_tile(self) -> None:
        """Raise ValueError unless the traits fit the gemv kernel's structure."""
        t = self.tile
        if min(t.tile_m, t.tile_n, t.tile_k, t.subgroups_m, t.subgroups_n, t.buffering) < 1:
            raise ValueError(f"gemv tile {t.describe()}: sizes must be positive")
        if t.tile_m > GEMV_MAX_ROWS:
            raise ValueError(f"gemv tile {t.describe()}: at most {GEMV_MAX_ROWS} rows")
        if t.tile_n % t.subgroups_m:
            raise ValueError(f"gemv tile {t.describe()}: tile_n must be splits x cols")
        lane = gemv_lane_elems(self.b_quant)
        step = lane * self.subgroup_size * t.buffering * t.subgroups_n
        if t.tile_k != step:
            raise ValueError(f"gemv tile {t.describe()}: tile_k must be {lane} x subgroup "
                             f"size x unroll x k_splits = {step}")
        if self.b_quant is not None:
            quant_format(self.b_quant)  # ValueError for an unknown format
        if self.a_type != self.b_type or \
                self.a_type not in (ComponentType.FLOAT16, ComponentType.BFLOAT16):
            raise ValueError("the gemv kernel reads float16 or bfloat16 A and B (one type)")
        if not self.result_type.is_float or not self.stored_type.is_float:
            raise ValueError("the gemv kernel computes float results only")
        if self.c_type != self.result_type:
            raise ValueError("C and Result component types must match")
        if self.a_layout != Layout.ROW_MAJOR or self.b_layout != Layout.COLUMN_MAJOR:
            raise ValueError("the gemv kernel reads a row-major A and a column-major B "
                             "(both contiguous along K)")

    def describe(self) -> str:
        extra = f"-b{self.b_quant}" if self.b_quant is not None else ""
        if not self.storage_checks:
            extra += "-unchecked"
        if self.prefetch:
            extra += "-prefetch"
        return self._name((self.rows, self.cols, self.unroll), "general", extra)


def gemv_tile(*, rows: int, cols: int, splits: int, unroll: int, subgroup_size: int,
              b_quant: str | None = None, k_splits: int = 1) -> Tile:
    """The Tile of a gemv kernel (see GemvTraits): `rows` rows of D, `splits` groups of
    `k_splits` subgroups, each group on `cols` columns, `unroll` loads per column and lane
    per step (16 bytes of a float B, a block of a quantized one: b_quant)."""
    return Tile(rows, splits * cols,
                gemv_lane_elems(b_quant) * subgroup_size * unroll * k_splits,
                splits, k_splits, unroll)


def rows_tile(m: int, n: int, *, row_frags: int, nf: int, splits: int, unroll: int,
              kc: int) -> Tile:
    """The Tile of a rows kernel (see RowsTraits): row_frags x nf fragments of m x n per
    workgroup, K split over `splits` subgroups, `unroll` k steps per load batch, A staged
    `kc` elements of K at a time."""
    return Tile(row_frags * m, nf * n, kc, splits, 1, unroll)


@dataclass(frozen=True)
class GemmParams:
    """Runtime values of one dispatch (they go in push constants).

    Leading dimensions and batch strides are in elements; a batch stride of 0 broadcasts
    that operand over the batch. alpha/beta are float for float results, int otherwise.
    """

    M: int
    N: int
    K: int
    lda: int
    ldb: int
    ldc: int
    ldd: int
    batch_stride_a: int = 0
    batch_stride_b: int = 0
    batch_stride_c: int = 0
    batch_stride_d: int = 0
    alpha: float | int = 1
    beta: float | int = 0
