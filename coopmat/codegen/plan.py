"""The arithmetic of a tiled kernel: staging geometry, shared-memory use, invocation counts.

Kept apart from emission so that tile selection can ask "does this fit?" without
generating SPIR-V, and so that Kernel metadata and the emitted code agree by construction.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from coopmat.codegen.traits import KhrTraits, Layout, Tile
from coopmat.common.enums import ComponentType

# Shared rows are padded by 16 bytes: consecutive rows then start in different banks,
# so the column-wise accesses of cooperative-matrix loads don't all hit one bank.
SHARED_PAD_BYTES = 16
# The widest global load the aligned variant issues (a uvec4).
MAX_VECTOR_BYTES = 16


def element_bytes(t: ComponentType) -> int:
    return t.bits // 8


@dataclass(frozen=True)
class StagePlan:
    """How one operand's workgroup tile moves from global to shared memory.

    The tile is `lines` runs of `inner` elements that are contiguous in global memory
    (rows for a row-major operand, columns for a column-major one). Shared memory keeps
    the same orientation, so a run is copied unit by unit, where a unit is one element
    (general variant) or a vector of `unit_elems` elements packed in 32-bit words
    (aligned variant).
    """

    lines: int
    inner: int
    unit_elems: int
    unit_words: int  # 0: the unit is one element of the operand's own type
    pad_units: int
    invocations: int

    @property
    def units_per_line(self) -> int:
        return self.inner // self.unit_elems

    @property
    def stride_units(self) -> int:
        return self.units_per_line + self.pad_units

    @property
    def total_units(self) -> int:
        return self.lines * self.units_per_line

    @property
    def units_per_invocation(self) -> int:
        return self.total_units // self.invocations

    @property
    def shared_units(self) -> int:
        return self.lines * self.stride_units


@dataclass(frozen=True)
class KernelPlan:
    traits: KhrTraits
    a: StagePlan
    b: StagePlan
    acc_rows: int
    acc_cols: int

    @property
    def tile(self) -> Tile:
        return self.traits.tile

    @property
    def invocations(self) -> int:
        return self.traits.invocations

    @property
    def scratch_elems(self) -> int:
        """Per-subgroup room for one accumulator, for edge tiles' bounds-checked stores
        and every tile's element-wise epilogue where D's type has no listed accumulator
        matrix (KhrTraits.scratch_epilogue); none in the exact variant without either,
        which has no edge tiles (clamping rows or columns makes the last blocks ones).
        None in a split-K (KhrTraits.split_k): its accumulators go whole to a workspace
        padded to whole tiles."""
        t = self.traits
        if t.split_k > 1 or not (t.edges or t.scratch_epilogue):
            return 0
        return t.m * t.n

    @property
    def stages(self) -> int:
        """Copies of the A/B staging in shared memory: 2 for buffering 3 (the multiply
        reads one while the next K step is stored into the other), else 1."""
        return 2 if self.tile.buffering == 3 else 1

    @property
    def shared_bytes(self) -> int:
        t = self.traits
        a = self.a.shared_units * _unit_bytes(self.a, t.a_type)
        b = self.b.shared_units * _unit_bytes(self.b, t.b_type)
        scratch = self.tile.subgroups * self.scratch_elems * element_bytes(t.result_type)
        flag = 4 if t.split_k > 1 else 0  # a split-K's "this workgroup finishes the tile"
        return self.stages * (a + b) + scratch + flag


def _unit_bytes(s: StagePlan, t: ComponentType) -> int:
    return 4 * s.unit_words if s.unit_words else element_bytes(t)


def vector_elems(t: ComponentType, granularity: int) -> int:
    """Elements per wide unit: as many as fit 16 bytes and divide the cooperative-matrix
    granularity along the contiguous dimension (so fragment offsets land on whole units)."""
    es = element_bytes(t)
    v = MAX_VECTOR_BYTES // es
    while v > 1 and (granularity % v or (v * es) % 4):
        v //= 2
    return v if (v * es) % 4 == 0 else 1


def _stage(t: ComponentType, layout: Layout, outer_dim: int, k_dim: int, outer_gran: int,
           k_gran: int, aligned: bool, invocations: int, k_contiguous: Layout) -> StagePlan:
    """Stage geometry; `k_contiguous` is the layout in which K is the contiguous dimension."""
    if layout == k_contiguous:
        lines, inner, gran = outer_dim, k_dim, k_gran
    else:
        lines, inner, gran = k_dim, outer_dim, outer_gran
    es = element_bytes(t)
    v = vector_elems(t, gran) if aligned else 1
    words = v * es // 4 if aligned and v > 1 else 0
    if not words:
        v = 1
    unit_bytes = 4 * words if words else es
    return StagePlan(lines=lines, inner=inner, unit_elems=v, unit_words=words,
                     pad_units=max(1, SHARED_PAD_BYTES // unit_bytes), invocations=invocations)


# Weights per staged unit of a quantized B: a uvec2 or uvec4 of f16, or a whole block
# (BLOCK_UNIT), whose raw words an invocation keeps in registers while they load and
# dequantizes into four uvec4 units as it stores them to shared memory.
BLOCK_UNIT = 32
QUANT_UNITS = (4, 8, BLOCK_UNIT)
# Split-K kernels with units of 4 weights gave wrong sums on an NVIDIA GPU (every tile
# tried, q8_0 and q4_0) and right ones on lavapipe; units of 8 and whole blocks were
# right on both. Cause not found: such kernels are refused.
SPLIT_MIN_QUANT_UNIT = 8


def _quant_stage(t: KhrTraits, invocations: int) -> StagePlan:
    """A quantized B's stage: the same shared layout as the aligned variant's column-major
    B (lines along N, K contiguous, units of b_quant_unit 16-bit elements; of 8 for whole
    blocks), whatever the variant, since each unit is dequantized from one block."""
    from coopmat.common.quant_formats import BLOCK_ELEMS, quant_format

    quant_format(t.b_quant or "")
    q = t.b_quant_unit
    if t.b_layout != Layout.COLUMN_MAJOR:
        raise ValueError("a quantized B is column-major (row n of the N x K weight)")
    if element_bytes(t.b_type) != 2:
        raise ValueError("a quantized B dequantizes to a 16-bit operand type")
    if q not in QUANT_UNITS or t.k % min(q, 8):
        raise ValueError(f"b_quant_unit={q} must be one of {QUANT_UNITS}, its shared "
                         f"unit ({min(q, 8)} weights) dividing K={t.k}")
    if t.split_k > 1 and q < SPLIT_MIN_QUANT_UNIT:
        raise ValueError(f"a split-K of a quantized B stages units of at least "
                         f"{SPLIT_MIN_QUANT_UNIT} weights, not {q}")
    if t.tile.tile_k % BLOCK_ELEMS:
        raise ValueError(f"tile_k={t.tile.tile_k} must be a multiple of the quantized "
                         f"block ({BLOCK_ELEMS} weights)")
    if q == BLOCK_UNIT:
        blocks = t.tile.tile_n * t.tile.tile_k // BLOCK_ELEMS
        if blocks % invocations:
            raise ValueError(f"B tile of {blocks} blocks does not split evenly over "
                             f"{invocations} invocations ({t.tile.describe()})")
        q = 8
    words = q * 2 // 4
    return StagePlan(lines=t.tile.tile_n, inner=t.tile.tile_k, unit_elems=q,
                     unit_words=words, pad_units=max(1, SHARED_PAD_BYTES // (4 * words)),
                     invocations=invocations)


@functools.cache  # traits are frozen; dispatch asks for the same plan every call
def plan_kernel(traits: KhrTraits) -> KernelPlan:
    """Raise ValueError where the tile does not fit the traits."""
    t, tile = traits, traits.tile
    t.check_tile()
    if t.specialized and len(t.specialized) != 11:
        raise ValueError("specialized holds M, N, K, lda, ldb, ldc, ldd and 4 batch strides")
    if t.exact and not t.aligned:
        raise ValueError("the exact variant is a refinement of the khr aligned variant")
    if (t.clamp_rows or t.clamp_cols) and not t.exact:
        raise ValueError("clamp_rows and clamp_cols are refinements of the exact variant")
    if t.clamp_cols and t.b_quant is not None:
        raise ValueError("a quantized B's columns are not clamped")
    if t.c_type != t.result_type:
        raise ValueError("C and Result component types must match (accumulators double as C)")
    if not t.out_matrix and t.out_type in (None, t.result_type):
        raise ValueError("out_matrix=False is for a D type other than the accumulator's "
                         "(out_type)")
    inv = t.invocations
    a = _stage(t.a_type, t.a_layout, tile.tile_m, tile.tile_k, t.m, t.k, t.aligned, inv,
               k_contiguous=Layout.ROW_MAJOR)
    b = _quant_stage(t, inv) if t.b_quant is not None else _stage(
        t.b_type, t.b_layout, tile.tile_n, tile.tile_k, t.n, t.k, t.aligned, inv,
        k_contiguous=Layout.COLUMN_MAJOR)
    for name, s in (("A", a), ("B", b)):
        if s.total_units % inv:
            raise ValueError(f"{name} tile of {s.total_units} units does not split evenly "
                             f"over {inv} invocations ({tile.describe()})")
    if (t.m * t.n) % t.subgroup_size:
        raise ValueError("accumulator elements must split evenly over the subgroup")
    rows, cols = t.accumulators
    return KernelPlan(traits=t, a=a, b=b, acc_rows=rows, acc_cols=cols)
