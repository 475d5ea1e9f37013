"""The interface between a GEMM kernel and its dispatcher, shared by every kernel family.

Bindings (descriptor set 0, all storage buffers): A=0, B=1, D=2, C=3 (only with C),
bias=4 (N elements of D's stored type; with EpilogueOps.bias), residual=5 (M x N in D's
stored type, addressed exactly like D with ldd and batch_stride_d; with
EpilogueOps.residual); a split-K in one dispatch (KhrTraits.split_k = S) adds
partials=6 (float32 workspace, split_layout) and counters=7 (one u32 a tile, zero between
dispatches: the kernel leaves them so).
Push constants, 4 bytes each, in this order (offsets in PUSH_FIELDS):
M, N, K, lda, ldb, ldc, ldd, batch strides of A, B, C, D, alpha, beta, flags.
alpha/beta are float32 for float results and int32 for integer ones.
Workgroup (x, y, z) covers (column tile, row tile, batch), or (column tile, row tile,
slice of K) in a split-K, whose batch strides of A and B step from one slice to the next
and whose C and D are one matrix each.
"""

from __future__ import annotations

import struct
from dataclasses import replace
from typing import Literal

from coopmat.codegen.plan import element_bytes, plan_kernel, vector_elems
from coopmat.codegen.traits import (
    GEMV_VECTOR,
    GemmParams,
    GemmTraits,
    GemvTraits,
    KhrTraits,
    Layout,
    Nv2Traits,
    RowsTraits,
)

BINDING_A, BINDING_B, BINDING_D, BINDING_C = 0, 1, 2, 3
BINDING_BIAS, BINDING_RESIDUAL = 4, 5
BINDING_PARTIALS, BINDING_COUNTERS = 6, 7
# Tiles a split-K may have: the counters every split-K of a device shares (4 bytes each).
SPLIT_K_MAX_TILES = 1 << 14

PUSH_FIELDS = ("M", "N", "K", "lda", "ldb", "ldc", "ldd", "batch_stride_a", "batch_stride_b",
               "batch_stride_c", "batch_stride_d", "alpha", "beta", "flags")
PUSH_CONSTANT_SIZE = 4 * len(PUSH_FIELDS)

# flags bit 0: C and D are aligned enough for direct cooperative-matrix loads and stores.
FLAG_DIRECT_CD = 1

U32_MAX = 0xFFFFFFFF


def bindings(traits: GemmTraits) -> tuple[int, ...]:
    """The bindings a kernel built from `traits` declares."""
    out = [BINDING_A, BINDING_B, BINDING_D] + ([BINDING_C] if traits.has_c else [])
    if traits.ops is not None:
        out += [BINDING_BIAS] if traits.ops.bias else []
        out += [BINDING_RESIDUAL] if traits.ops.residual else []
    if isinstance(traits, KhrTraits) and traits.split_k > 1:
        out += [BINDING_PARTIALS, BINDING_COUNTERS]
    return tuple(out)


def split_layout(traits: KhrTraits, M: int, N: int) -> tuple[int, int, int]:
    """(tiles, ldp, stride_p) of a split-K's workspace: `tiles` workgroup tiles (one
    counter each), float32 partials padded to whole tiles, row stride ldp, slice stride
    stride_p elements, so every workgroup stores its accumulators without bounds checks."""
    t = traits.tile
    tiles_x, tiles_y = -(-N // t.tile_n), -(-M // t.tile_m)
    ldp = tiles_x * t.tile_n
    return tiles_x * tiles_y, ldp, tiles_y * t.tile_m * ldp


def split_workspace_bytes(traits: KhrTraits, M: int, N: int) -> int:
    """Bytes of a split-K's float32 partials: S slices of split_layout's padded tiles."""
    return traits.split_k * split_layout(traits, M, N)[2] * 4


def cd_alignment_elems(traits: GemmTraits) -> int:
    """Element alignment that cooperative-matrix loads/stores of C and D need.

    Vulkan asks the pointer and the stride of such accesses to be aligned to the lesser
    of 16 bytes and one row of the matrix (khr: an n-column accumulator). nv2 kernels do
    not read the flag this decides (tensor layouts address C and D); for them it is
    computed alike, from the column granularity.
    """
    es = element_bytes(traits.stored_type)
    if isinstance(traits, (KhrTraits, RowsTraits)):
        cols = traits.n
    elif isinstance(traits, Nv2Traits):
        cols = traits.n_granularity
    elif isinstance(traits, GemvTraits):
        cols = 1  # stores element by element; the flag goes unread
    else:
        raise TypeError(f"traits of no known family: {traits!r}")
    return min(16, cols * es) // es


def direct_cd_ok(traits: GemmTraits, p: GemmParams) -> bool:
    al = cd_alignment_elems(traits)
    vals = [p.ldd, p.batch_stride_d] + ([p.ldc, p.batch_stride_c] if traits.has_c else [])
    return all(v % al == 0 for v in vals)


def aligned_ok(traits: GemmTraits, p: GemmParams) -> bool:
    """Whether `p` meets the preconditions of the aligned variant of `traits`' kernel.

    The aligned variant loads A and B a whole vector at a time; each vector must be either
    entirely inside the matrix or entirely outside, and start on a vector boundary. Its
    interior output tiles use direct cooperative-matrix stores, which need C/D alignment.
    """
    if not isinstance(traits, KhrTraits):
        return False  # only the khr family has an aligned variant
    plan = plan_kernel(replace(traits, aligned=True))
    a_inner = p.K if traits.a_layout == Layout.ROW_MAJOR else p.M
    b_inner = p.N if traits.b_layout == Layout.ROW_MAJOR else p.K
    for s, inner, ld, bs in ((plan.a, a_inner, p.lda, p.batch_stride_a),
                             (plan.b, b_inner, p.ldb, p.batch_stride_b)):
        if inner % s.unit_elems or ld % s.unit_elems or bs % s.unit_elems:
            return False
    return direct_cd_ok(traits, p)


def exact_ok(traits: GemmTraits, p: GemmParams) -> bool:
    """Whether `p` may run on the exact variant: the aligned variant's preconditions, and
    M, N, K whole multiples of the workgroup tile (no edge tiles, no partial K step):
    clamped_ok with neither clamp."""
    return isinstance(traits, KhrTraits) and clamped_ok(
        replace(traits, clamp_rows=False, clamp_cols=False), p)


def clamped_ok(traits: GemmTraits, p: GemmParams) -> bool:
    """Whether `p` may run on the exact variant with its clamping (KhrTraits.clamp_rows,
    clamp_cols): the aligned variant's preconditions, K a whole multiple of the workgroup
    tile, and M and N too unless their clamp is on."""
    if not isinstance(traits, KhrTraits):
        return False  # only the khr family has an exact variant
    t = traits.tile
    rows = traits.clamp_rows or p.M % t.tile_m == 0
    cols = traits.clamp_cols or p.N % t.tile_n == 0
    return aligned_ok(traits, p) and rows and cols and p.K % t.tile_k == 0


def lookahead_steps(traits: KhrTraits) -> int:
    """K steps past K that the khr kernel's unchecked look-ahead reads: none but in the
    exact variant with a register prefetch; there one, two with two shared stages
    (buffering 3) or two register sets (buffering 5)."""
    t = traits.tile
    if not traits.exact or t.buffering == 1:
        return 0
    return 2 if t.buffering in (3, 5) else 1


def overread_elems(traits: GemmTraits, ld: int, operand: Literal["a", "b"]) -> int:
    """Elements past operand `operand`'s ("a" or "b") last one that its kernel may read,
    for that operand read with leading dimension `ld`: the buffer must extend that far
    (the values are never used). The exact variant's register look-ahead runs
    `lookahead_steps` K steps past K without bounds checks: where K runs along lines (A
    column-major, B row-major) that is tile_k more lines of ld elements a step; where K
    is contiguous, each line's look-ahead lands in the next line, and the last line's
    runs tile_k elements a step past its K (so a few-row A needs no more than that)."""
    if not isinstance(traits, KhrTraits):
        return 0
    layout = traits.a_layout if operand == "a" else traits.b_layout
    k_contiguous = layout == (Layout.ROW_MAJOR if operand == "a" else Layout.COLUMN_MAJOR)
    return lookahead_steps(traits) * traits.tile.tile_k * (1 if k_contiguous else ld)


def rows_b_alignment_elems(traits: RowsTraits) -> int:
    """Element alignment of B's leading dimension and offsets for the rows kernel's
    cooperative-matrix loads straight from global memory: the lesser of 16 bytes and one
    row (row-major: n elements) or column (column-major: k elements) of the fragment."""
    es = element_bytes(traits.b_type)
    line = traits.n if traits.b_layout == Layout.ROW_MAJOR else traits.k
    return min(16, line * es) // es


def rows_a_vector_elems(traits: RowsTraits) -> int:
    """Elements per A load of the rows kernel's aligned variant (1: element loads)."""
    if not traits.aligned:
        return 1
    return vector_elems(traits.a_type, traits.k)


def rows_violation(traits: RowsTraits, p: GemmParams) -> str | None:
    """Why `p` cannot run on the rows kernel `traits`, or None where it can: N a multiple
    of the column strip, K of the fragment's k, B's leading dimension and batch stride
    aligned for direct cooperative-matrix loads, and for the aligned variant A's."""
    t = traits
    if p.N % t.tile.tile_n:
        return f"N={p.N} is not a multiple of the rows kernel's column strip {t.tile.tile_n}"
    if p.K % t.k:
        return f"K={p.K} is not a multiple of the cooperative matrix's K={t.k}"
    al = rows_b_alignment_elems(t)
    if p.ldb % al or p.batch_stride_b % al:
        return (f"B's leading dimension {p.ldb} and batch stride {p.batch_stride_b} must be "
                f"multiples of {al} elements (cooperative-matrix loads from memory)")
    v = rows_a_vector_elems(t)
    if v > 1 and (p.K % v or p.lda % v or p.batch_stride_a % v):
        return (f"the aligned variant reads A {v} elements at a time: K={p.K}, lda={p.lda} "
                f"and A's batch stride {p.batch_stride_a} must be multiples of {v}")
    return None


def gemv_violation(traits: GemvTraits, p: GemmParams) -> str | None:
    """Why `p` cannot run on the gemv kernel `traits`, or None where it can: A and B are
    read 16 bytes (8 elements) at a time along K, so K, lda, ldb and the batch strides of
    A and B must be multiples of 8 (A row-major and B column-major: the traits' own
    precondition, GemvTraits.check_tile); a quantized B is one weight of whole blocks
    (quant_violation). The traits ask nothing more of `p`."""
    return gemv_violation_params(p, traits.b_quant)


def quant_violation(p: GemmParams, slices: bool = False) -> str | None:
    """Why `p` cannot have a quantized B, or None: B is one N x K weight of whole
    32-weight blocks (row n of the weight is B's column n; no batch of weights). With
    `slices` (the khr kernel) B may also be slices of whole blocks along a wider weight's
    rows, as a split-K reads them: ldb (the weight's K) and the batch stride multiples of
    32."""
    if slices:
        if p.K % 32 or p.ldb % 32 or p.batch_stride_b % 32:
            return (f"a quantized B's slices are whole 32-weight blocks (K={p.K}, ldb="
                    f"{p.ldb} and batch stride {p.batch_stride_b} multiples of 32)")
        return None
    if p.K % 32 or p.ldb != p.K or p.batch_stride_b:
        return ("a quantized B is one N x K weight of whole 32-weight blocks (K % 32 == 0, "
                "ldb == K, no batch stride)")
    return None


def gemv_violation_params(p: GemmParams, b_quant: str | None = None) -> str | None:
    """gemv_violation's checks, which depend on the parameters (and whether B is
    quantized: b_quant) only."""
    if b_quant is not None:
        why = quant_violation(p)
        if why is not None:
            return why
    v = GEMV_VECTOR
    if p.K % v:
        return f"K={p.K} is not a multiple of {v} (the gemv kernel reads 16 bytes of K at once)"
    if p.lda % v or p.batch_stride_a % v:
        return (f"A's leading dimension {p.lda} and batch stride {p.batch_stride_a} must be "
                f"multiples of {v} elements (16-byte loads)")
    if p.ldb % v or p.batch_stride_b % v:
        return (f"B's leading dimension {p.ldb} and batch stride {p.batch_stride_b} must be "
                f"multiples of {v} elements (16-byte loads)")
    return None


def b_quant(traits: GemmTraits) -> str | None:
    """The format of a quantized B (khr and gemv kernels), or None for a plain B."""
    return traits.b_quant if isinstance(traits, (KhrTraits, GemvTraits)) else None


def overread_bytes_b(traits: GemmTraits, ldb: int, itemsize: int) -> int:
    """Bytes past B's data its kernel may read: overread_elems in bytes, or for a
    quantized B the pad of the funnel-shifted word loads (codegen/quant.py), plus, for
    the khr exact variant, the blocks its look-ahead reaches past the last row. The gemv
    kernel reads no block past the last (gemv_quant.py)."""
    fmt_name = b_quant(traits)
    if fmt_name is None:
        return overread_elems(traits, ldb, "b") * itemsize
    from coopmat.codegen.quant import QUANT_PAD_BYTES, overread_bytes
    from coopmat.common.quant_formats import quant_format

    if not isinstance(traits, KhrTraits):
        return QUANT_PAD_BYTES
    steps = lookahead_steps(traits)
    fmt = quant_format(fmt_name)
    return overread_bytes(fmt, traits.tile.tile_k, steps) if steps else QUANT_PAD_BYTES


SPECIALIZED_FIELDS = PUSH_FIELDS[:11]


def shape_values(p: GemmParams) -> tuple[int, ...]:
    """The values a specialized kernel bakes in (SPECIALIZED_FIELDS, in order)."""
    return tuple(int(getattr(p, name)) for name in SPECIALIZED_FIELDS)


def check_params(traits: GemmTraits, p: GemmParams) -> None:
    """Raise ValueError for sizes the kernels do not handle (32-bit indexing, M,N,K >= 1)."""
    if isinstance(traits, KhrTraits) and traits.specialized and \
            traits.specialized != shape_values(p):
        raise ValueError(f"kernel specialized for {traits.specialized}, called with "
                         f"{shape_values(p)}")
    if min(p.M, p.N, p.K) < 1:
        raise ValueError("M, N and K must be at least 1")
    if b_quant(traits) is not None:
        why = quant_violation(p, slices=isinstance(traits, KhrTraits))
        if why is not None:
            raise ValueError(why)
        if p.N * p.ldb // 32 * 34 > U32_MAX:
            raise ValueError("the kernels index with 32 bits; the quantized B is too large")
    a_lines = p.M if traits.a_layout == Layout.ROW_MAJOR else p.K
    b_lines = p.K if traits.b_layout == Layout.ROW_MAJOR else p.N
    if p.lda < (p.K if traits.a_layout == Layout.ROW_MAJOR else p.M):
        raise ValueError("lda is smaller than A's contiguous dimension")
    if p.ldb < (p.N if traits.b_layout == Layout.ROW_MAJOR else p.K):
        raise ValueError("ldb is smaller than B's contiguous dimension")
    if p.ldd < p.N or (traits.has_c and p.ldc < p.N):
        raise ValueError("ldc/ldd are smaller than N")
    for v in (a_lines * p.lda, b_lines * p.ldb, p.M * p.ldd, p.M * p.ldc,
              p.batch_stride_a, p.batch_stride_b, p.batch_stride_c, p.batch_stride_d):
        if v > U32_MAX:
            raise ValueError("the kernels index with 32 bits; an operand is too large")


def push_constants(traits: GemmTraits, p: GemmParams) -> bytes:
    check_params(traits, p)
    if traits.result_type.is_float:
        scal = struct.pack("<ff", float(p.alpha), float(p.beta))
    else:
        scal = struct.pack("<II", int(p.alpha) & U32_MAX, int(p.beta) & U32_MAX)
    flags = FLAG_DIRECT_CD if direct_cd_ok(traits, p) else 0
    head = struct.pack("<11I", p.M, p.N, p.K, p.lda, p.ldb, p.ldc, p.ldd, p.batch_stride_a,
                       p.batch_stride_b, p.batch_stride_c, p.batch_stride_d)
    return head + scal + struct.pack("<I", flags)
