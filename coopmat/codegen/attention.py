"""Fused attention on VK_KHR_cooperative_matrix: softmax(Q K^T * scale + mask) V in one
pass, without the Lq x Lk score matrix ever reaching memory (online softmax).

Shape of the generated shader, per workgroup (rows [r0, r0 + rows x subgroups) of one
kv head's query rows, keys [kbeg, kend)):

    stage Q's rows into shared memory (zeros past the rows and past D); barrier
    each subgroup loads its rows' Q fragments (A matrices) into registers
    O = 0; per row: m = -inf, l = 0
    for k0 in kbeg, kbeg + keys, ... < kend:
        barrier; K and V rows [k0, k0 + keys) -> shared (zeros past Lk); barrier
        S = Q K^T on subgroup matrices (K^T: K's shared rows read column-major)
        S -> the subgroup's scratch (float32); barrier
        per row (lanes_per_row lanes a row, lanes combined by subgroup shuffles):
            s = S * scale * log2(e) (+ mask * log2(e), or -inf where a boolean mask
            is false, where causal and key > query, where key >= kend)
            m' = max(m, max_j s); p = 2^(s - m'); l = l 2^(m - m') + sum_j p
            p rounded to the operand type -> shared P; 2^(m - m') -> shared alpha
        barrier
        O = O * diag(alpha) + P V     (alpha as a matrix loaded with stride 0; P as A)
    O = O * diag(1 / l) (0 where l is 0: a fully masked row), rounded and stored through
    the subgroup's scratch with bounds checks

KHR has no reductions over a matrix's rows and does not say which elements of a matrix an
invocation holds, so the row statistics go through shared memory: the scores are stored
whole and read back by rows, and a per-row factor is applied to a whole accumulator by
multiplying it element-wise by a matrix whose rows are constant (a column-major load of
stride 0 from the per-row values). In the exponent, everything is in base 2: scale and
mask are multiplied by log2(e) once.

Rows. Query rows of one kv head are walked as rows R in [0, groups x Lq): R = g Lq + i
is query i of q head kv_head x groups + g (grouped-query attention: the q heads sharing
one kv head read its K and V once per workgroup). Without grouping (groups = 1) the rows
are plain query rows.

Causal (torch's is_causal, top-left aligned: key j is seen by query i where j <= i) and a
fully masked tail are skipped: the key range of a workgroup ends after its last row's
query. With traits.paired a workgroup computes row tile x and then row tile
tiles - 1 - x (a barrier between them), so causal workgroups walk about as many steps.
With a mask (traits.skip_blocks), a first pass (attention_blocks.py) marks each
(workgroup, key step) block that has a visible score; the key loop reads its block's word
and skips the staging, scores, softmax and P V of the others (a hidden step would change
no row's running max, sum or O). A split kernel (decode, traits.split) runs the key range
in slices, one per workgroup along y, and writes its unnormalised O and its rows' (m, l)
to a workspace that a second pass (attention_combine.py) merges.

Staging: q, k and v are read in units of 8 elements (16-byte vectors: traits.unit 8)
where their dimensions, strides and offsets allow, else element by element. Every global
load is bounds-checked (out-of-range units read index 0 and are replaced by 0) and the
mask's are clamped inside it, so the kernel reads nothing outside its bindings.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass

from coopmat.codegen.shader import Buffer, ShaderContext
from coopmat.codegen.spv import (
    BuiltIn,
    Capability,
    CooperativeMatrixLayout,
    CooperativeMatrixUse,
    GLSLstd450,
    LoopControl,
    Op,
    Scope,
)
from coopmat.codegen.types import scalar_type, type_capabilities, type_extension, vulkan_features
from coopmat.common.dtypes import element
from coopmat.common.enums import ComponentType

LOG2_E = math.log2(math.e)

# Bindings.
BINDING_Q, BINDING_K, BINDING_V, BINDING_O, BINDING_MASK, BINDING_ML = 0, 1, 2, 3, 4, 5
BINDING_BLOCKS = 6  # traits.skip_blocks: the words of the block pass (attention_blocks.py)

# Push constants, 4 bytes each (scale a float32, the rest u32), in this order. Element
# offsets and strides: *_base where an operand starts, *_ld between rows, *_outer between
# entries of the leading (batch) axes flattened, *_head between heads.
PUSH_FIELDS = (
    "Lq", "Lk", "groups", "kv_heads",
    "q_base", "q_ld", "q_outer", "q_head",
    "k_base", "k_ld", "k_outer", "k_head",
    "v_base", "v_ld", "v_outer", "v_head",
    "o_base", "o_ld", "o_outer", "o_head",
    "m_base", "m_row", "m_col", "m_outer", "m_head",
    "scale_log2", "flags", "split_keys", "splits", "rows_pad",
)
# One 32-bit word a field, in PUSH_FIELDS' order: the scale a float, the rest unsigned.
_PUSH = struct.Struct("<" + "".join("f" if name == "scale_log2" else "I"
                                    for name in PUSH_FIELDS))
_SCALE = PUSH_FIELDS.index("scale_log2")
FLAG_CAUSAL = 1
# traits.skip_blocks: the block words are the same for every z (the mask is broadcast over
# batch and heads), so the kernel reads z 0's.
FLAG_SHARED_BLOCKS = 2

FAMILIES = ("khr", "nv2", "gemv")
# What the nv2 family needs beyond KHR (VkPhysicalDeviceCooperativeMatrix2FeaturesNV).
NV2_FEATURES = ("cooperativeMatrixReductions", "cooperativeMatrixConversions",
                "cooperativeMatrixPerElementOperations")

# Shared rows are padded by 8 elements of 16 bits (16 bytes): consecutive rows start in
# different banks.
PAD_ELEMS = 8
# The float32 scratch's rows by 4 elements (16 bytes, the alignment matrix loads need).
SCRATCH_PAD = 4


class MaskKind(enum.Enum):
    """The mask a kernel reads (binding BINDING_MASK): booleans (one byte each, false
    masks the score out) or an additive float mask of the operand type."""

    BOOL = "bool"
    ADD = "add"


@dataclass(frozen=True)
class AttentionTraits:
    """Everything that changes an attention kernel's binary.

    operand: q, k, v (and P's) type, float16 or bfloat16; out: the result's type (the
    split kernel's partials are float32 whatever it is); head_dim D and value_dim Dv;
    (m, n, k): the float32-accumulating matrix shape the device lists for the operand;
    rows: query rows a subgroup owns (a multiple of m); subgroups: subgroups a workgroup
    (rows x subgroups rows a workgroup); keys: keys a step (a multiple of n and k);
    lanes_per_row: lanes that share a row of the softmax (a power of two dividing the
    subgroup and keys, and subgroup / lanes_per_row dividing rows); unit: elements a
    global load of q, k, v (8: 16-byte vectors, 1: one element); mask: the mask read, if
    any; split: write partial softmax states (decode) instead of the result; prefetch:
    the next step's K and V loads are issued before this step's multiplies; family:
    "khr" (row statistics through shared memory, this module) or "nv2" (row reductions,
    per-element operations and accumulator -> A conversions of VK_NV_cooperative_matrix2,
    attention_nv2.py) or "gemv" (no matrices, for decode: attention_gemv.py; there rows
    are the workgroup's rows, keys the subgroup and lanes_per_row the lanes that read one
    key's row); skip_blocks: skip the key steps whose block of scores the mask
    hides whole, as the block pass's words (binding BINDING_BLOCKS) say (no prefetch:
    the next visible step is not known a step ahead); fast_steps (nv2, no mask): a key
    step that no causal edge, key range end or non-positive scale touches takes a
    softmax without per-score checks (a loop of its own); paired: a workgroup computes
    row tile x and then its mirror, tiles - 1 - x, of the same kv head (where causal,
    every workgroup then walks about as many key steps: the grid stays balanced);
    direct_store (unsplit): a workgroup whose tile lies whole inside the rows, within
    whole q heads and on 16-byte boundaries stores its result matrices straight to o (the
    device lists an accumulator matrix of the result's type); others go through the
    scratch element by element."""

    operand: ComponentType
    out: ComponentType
    head_dim: int
    value_dim: int
    m: int
    n: int
    k: int
    subgroup_size: int
    rows: int
    subgroups: int
    keys: int
    lanes_per_row: int = 1
    unit: int = 8
    mask: MaskKind | None = None
    split: bool = False
    prefetch: bool = True
    family: str = "khr"
    skip_blocks: bool = False
    fast_steps: bool = False
    paired: bool = False
    direct_store: bool = False

    # -- derived sizes ------------------------------------------------------------------
    @property
    def block_rows(self) -> int:
        """Query rows a workgroup computes."""
        return self.rows * self.subgroups

    @property
    def invocations(self) -> int:
        return self.subgroups * self.subgroup_size

    @property
    def head_dim_padded(self) -> int:
        return -(-self.head_dim // self.k) * self.k

    @property
    def value_dim_padded(self) -> int:
        return -(-self.value_dim // self.n) * self.n

    @property
    def tile_stride(self) -> int:
        """Elements between rows of Q and K in shared memory."""
        return self.head_dim_padded + PAD_ELEMS

    @property
    def value_stride(self) -> int:
        return self.value_dim_padded + PAD_ELEMS

    @property
    def p_stride(self) -> int:
        return self.keys + PAD_ELEMS

    @property
    def scratch_stride(self) -> int:
        """float32 elements between rows of the scratch: khr stores a step's scores there,
        nv2 only the result and the row statistics, one accumulator column at a time."""
        return (self.n if self.family == "nv2" else self.keys) + SCRATCH_PAD

    @property
    def tile_elems(self) -> int:
        """16-bit elements of the shared tile: Q's rows first, then K's and V's."""
        return max(self.block_rows * self.tile_stride,
                   self.keys * (self.tile_stride + self.value_stride))

    @property
    def shared_memory_bytes(self) -> int:
        """The tile, the scratch and, for khr, P and the row factors (gemv: none)."""
        if self.family == "gemv":
            return 0
        item = element(self.operand).itemsize
        total = self.tile_elems * item + self.block_rows * self.scratch_stride * 4
        if self.family == "khr":
            total += self.block_rows * self.p_stride * item + self.block_rows * 4
        return total

    @property
    def passes(self) -> int:
        """Rows each lane walks in the softmax: rows / (subgroup / lanes_per_row)."""
        return self.rows * self.lanes_per_row // self.subgroup_size

    @property
    def storage_checks(self) -> bool:
        """Whether the pipeline keeps the driver's buffer bounds checks: no, every access
        is checked (or clamped) in the shader."""
        return False

    def describe(self) -> str:
        name = (f"attn-{element(self.operand).short}-d{self.head_dim}v{self.value_dim}"
                f"-{self.m}x{self.n}x{self.k}-sg{self.subgroup_size}"
                f"-r{self.rows}x{self.subgroups}-c{self.keys}-l{self.lanes_per_row}"
                f"-u{self.unit}-out{element(self.out).short}")
        if self.mask is not None:
            name += f"-mask_{self.mask.value}"
        if self.split:
            name += "-split"
        if self.prefetch:
            name += "-pf"
        if self.family != "khr":
            name += f"-{self.family}"
        if self.skip_blocks:
            name += "-skip"
        if self.fast_steps:
            name += "-fast"
        if self.paired:
            name += "-paired"
        if self.direct_store:
            name += "-ds"
        return name

    def violation(self) -> str | None:
        """Why these traits cannot be built (None: they can)."""
        if self.operand not in (ComponentType.FLOAT16, ComponentType.BFLOAT16):
            return f"operands are float16 or bfloat16, not {element(self.operand).name}"
        if self.out not in (ComponentType.FLOAT16, ComponentType.BFLOAT16,
                            ComponentType.FLOAT32):
            return f"results are float16, bfloat16 or float32, not {element(self.out).name}"
        if self.family == "gemv":
            return self._gemv_violation()
        if min(self.head_dim, self.value_dim) < 1:
            return "head and value dimensions must be positive"
        if self.rows % self.m or self.rows < self.m:
            return f"rows {self.rows} are not a positive multiple of m = {self.m}"
        if self.keys % self.n or self.keys % self.k or self.keys < 1:
            return f"keys {self.keys} are not a positive multiple of n = {self.n} and k = {self.k}"
        lpr, sg = self.lanes_per_row, self.subgroup_size
        if lpr < 1 or lpr & (lpr - 1) or sg % lpr or self.keys % lpr:
            return f"lanes_per_row {lpr} must be a power of two dividing the subgroup and keys"
        if self.rows % (sg // lpr):
            return (f"{sg // lpr} rows a pass ({sg} lanes, {lpr} a row) do not divide "
                    f"{self.rows} rows")
        if self.unit not in (1, 8):
            return f"unit {self.unit} is not 1 or 8"
        if self.unit == 8 and (self.head_dim % 8 or self.value_dim % 8):
            return "16-byte units need head and value dimensions that are multiples of 8"
        if self.subgroups < 1:
            return "a workgroup needs a subgroup"
        if self.family not in FAMILIES:
            return f"family {self.family!r} is not one of {', '.join(FAMILIES)}"
        if self.skip_blocks and self.mask is None:
            return "skip_blocks needs a mask"
        if self.skip_blocks and self.prefetch:
            return "skip_blocks prefetches nothing: prefetch must be 0"
        if self.fast_steps and (self.family != "nv2" or self.mask is not None):
            return "fast_steps needs the nv2 family and no mask"
        if self.paired and self.split:
            return "paired row tiles are for unsplit kernels"
        if self.direct_store and (self.split or self.value_dim % self.n):
            return (f"direct_store is for unsplit kernels whose value dimension is a multiple "
                    f"of n = {self.n}")
        if self.family == "nv2" and self.n != self.k:
            return (f"nv2 converts accumulators ({self.m} x {self.n}) to A matrices "
                    f"({self.m} x {self.k}): n and k must be equal")
        return None

    def _gemv_violation(self) -> str | None:
        """The gemv family (attention_gemv.py): one subgroup, a step of subgroup_size
        keys, lanes_per_row lanes a key row, 16-byte units, split, no blocks skipped."""
        sg, lanes = self.subgroup_size, self.lanes_per_row
        if self.rows < 1 or self.subgroups != 1:
            return "gemv takes one subgroup a workgroup and at least one row"
        if self.keys != sg:
            return f"gemv steps {sg} keys (the subgroup), not {self.keys}"
        if lanes < 1 or lanes & (lanes - 1) or sg % lanes:
            return f"lanes_per_row {lanes} must be a power of two dividing the subgroup"
        if self.unit != 8 or self.head_dim % 8 or self.value_dim % 8 or \
                min(self.head_dim, self.value_dim) < 1:
            return "gemv reads 16-byte units: head and value dimensions multiples of 8"
        if self.skip_blocks or self.fast_steps or self.paired:
            return "gemv takes no skip_blocks, fast_steps or paired"
        if not self.split:
            return "gemv writes partial states: it is a split kernel"
        return None


def required_capabilities(t: AttentionTraits) -> set[Capability]:
    if t.family == "gemv":  # no matrices: subgroup reductions and shuffles
        caps = {Capability.Shader, Capability.VulkanMemoryModel, Capability.GroupNonUniform,
                Capability.GroupNonUniformArithmetic, Capability.GroupNonUniformShuffle}
        if t.operand == ComponentType.FLOAT16:  # converted in registers (widen.py)
            caps.add(Capability.Float16)
        if t.mask is MaskKind.BOOL:
            caps.update({Capability.Int8, Capability.StorageBuffer8BitAccess})
        elif t.mask is MaskKind.ADD:
            caps.update(type_capabilities(t.operand, in_storage_buffer=True))
        return caps
    caps = {Capability.Shader, Capability.VulkanMemoryModel, Capability.CooperativeMatrixKHR,
            Capability.GroupNonUniform}
    caps.update(type_capabilities(t.operand, in_storage_buffer=t.unit == 1 or
                                  t.mask is MaskKind.ADD))
    if not t.split:
        caps.update(type_capabilities(t.out, in_storage_buffer=True))
    if t.mask is MaskKind.BOOL:
        caps.update({Capability.Int8, Capability.StorageBuffer8BitAccess})
    if t.lanes_per_row > 1:  # a row's lanes combine their max and sum
        caps.add(Capability.GroupNonUniformShuffle)
    if t.family == "nv2":
        caps.update({Capability.CooperativeMatrixReductionsNV,
                     Capability.CooperativeMatrixConversionsNV,
                     Capability.CooperativeMatrixPerElementOperationsNV})
    return caps


def capability_features(t: AttentionTraits) -> tuple[str, ...]:
    """The Vulkan features the kernel of `t` needs."""
    names = set(vulkan_features(required_capabilities(t)))
    names.update(element(t.operand).features)
    if t.family == "nv2":
        names.update(NV2_FEATURES)
    return tuple(sorted(names))


@dataclass(frozen=True)
class AttentionKernel:
    """A built kernel: what dispatch.pipelines needs to make its pipeline."""

    traits: AttentionTraits
    spirv: bytes
    features: tuple[str, ...]
    local_size: tuple[int, int, int]
    required_subgroup_size: int | None
    shared_memory_bytes: int
    push_constant_size: int = 4 * len(PUSH_FIELDS)

    @property
    def bindings(self) -> tuple[int, ...]:
        t = self.traits
        return (BINDING_Q, BINDING_K, BINDING_V, BINDING_O) + \
            ((BINDING_MASK,) if t.mask is not None else ()) + \
            ((BINDING_ML,) if t.split else ()) + \
            ((BINDING_BLOCKS,) if t.skip_blocks else ())

    def workgroups(self, rows: int, z: int, splits: int = 1) -> tuple[int, int, int]:
        """The grid: row tiles of `rows` query rows (groups x Lq) along x (paired: half
        of them, each workgroup taking a tile and its mirror), splits of the key range
        along y, kv heads of every batch entry along z."""
        tiles = -(-rows // self.traits.block_rows)
        return (-(-tiles // 2) if self.traits.paired else tiles, splits, z)

    @staticmethod
    def push_constants(values: dict[str, float | int]) -> bytes:
        """Pack PUSH_FIELDS from `values` (missing ones are 0)."""
        fields: list[float | int] = [int(values.get(name, 0)) for name in PUSH_FIELDS]
        fields[_SCALE] = float(values.get("scale_log2", 0.0))
        try:
            return _PUSH.pack(*fields)
        except struct.error:
            for name, v in zip(PUSH_FIELDS, fields, strict=True):
                if name != "scale_log2" and not 0 <= int(v) < 1 << 32:
                    raise ValueError(f"attention: {name} = {v} does not fit the kernel's "
                                     f"32-bit indices") from None
            raise


class _Row:
    """What a lane knows of one of the rows it walks in the softmax: which row of its
    subgroup (runtime), its query index, the mask's offset of its row, and the function
    variables of its running max and sum."""

    def __init__(self, local: int, query: int, mask_base: int | None, m_var: int,
                 l_var: int, R: int) -> None:
        self.local, self.query, self.mask_base = local, query, mask_base
        self.m_var, self.l_var, self.R = m_var, l_var, R


class AttentionEmitter:
    def __init__(self, traits: AttentionTraits) -> None:
        why = traits.violation()
        if why is not None:
            raise ValueError(f"attention kernel {traits.describe()}: {why}")
        self.t = traits
        self.s = ShaderContext()

    # -- small helpers ------------------------------------------------------------------
    def _fconst(self, x: float) -> int:
        return self.s.mb.constant(self.f32, x)

    def _fop(self, op: Op, *args: int) -> int:
        return self.s.f.op(op, self.f32, *args)

    def _ext(self, inst: GLSLstd450, *args: int) -> int:
        return self.s.f.op(Op.ExtInst, self.f32, self.glsl, inst, *args)

    def _sub(self, a: int, b: int) -> int:
        return self.s.f.op(Op.ISub, self.s.u32, a, b)

    def _min(self, a: int, b: int) -> int:
        s = self.s
        return s.select(s.u32, s.lt(a, b), a, b)

    def _load(self, type_id: int, var: int) -> int:
        return self.s.f.op(Op.Load, type_id, var)

    def _store(self, var: int, value: int) -> None:
        self.s.f.emit(Op.Store, var, value)

    def _barrier(self) -> None:
        # Workgroup barriers throughout, in workgroup-uniform control flow: lavapipe runs a
        # subgroup barrier as a workgroup barrier, and every subgroup walks the same steps.
        self.s.barrier(Scope.Workgroup)

    # -- declarations -------------------------------------------------------------------
    def _declare(self) -> None:
        s, t, mb = self.s, self.t, self.s.mb
        mb.extension("SPV_KHR_cooperative_matrix")
        if t.family == "nv2":
            mb.extension("SPV_NV_cooperative_matrix2")
        ext = type_extension(t.operand)
        if ext:
            mb.extension(ext)
        if not t.split and type_extension(t.out) and type_extension(t.out) != ext:
            mb.extension(type_extension(t.out) or "")
        mb.capability(*sorted(required_capabilities(t)))
        self.glsl = mb.ext_inst_import("GLSL.std.450")
        self.f32 = mb.type_float(32)
        self.op_el = scalar_type(mb, t.operand)
        self.out_el = scalar_type(mb, t.out) if not t.split else self.f32
        sub = int(Scope.Subgroup)
        self.mat_a = mb.type_coopmat(self.op_el, sub, t.m, t.k, CooperativeMatrixUse.MatrixA)
        self.mat_b = mb.type_coopmat(self.op_el, sub, t.k, t.n, CooperativeMatrixUse.MatrixB)
        self.mat_acc = mb.type_coopmat(self.f32, sub, t.m, t.n,
                                       CooperativeMatrixUse.MatrixAccumulator)
        # Declared only where the policy found the device listing it (direct_store).
        self.mat_out = mb.type_coopmat(self.out_el, sub, t.m, t.n,
                                       CooperativeMatrixUse.MatrixAccumulator) \
            if t.direct_store and t.out != ComponentType.FLOAT32 else self.mat_acc
        item = element(t.operand).itemsize
        if t.unit == 8:
            self.unit_t = mb.type_vector(s.u32, 4)
            unit_bytes = 16
        else:
            self.unit_t = self.op_el
            unit_bytes = item
        self.unit_zero = mb.const_null(self.unit_t)
        self.Q = s.storage_buffer(BINDING_Q, self.unit_t, unit_bytes, True, "q", restrict=True)
        self.K = s.storage_buffer(BINDING_K, self.unit_t, unit_bytes, True, "k", restrict=True)
        self.V = s.storage_buffer(BINDING_V, self.unit_t, unit_bytes, True, "v", restrict=True)
        out_bytes = 4 if t.split else element(t.out).itemsize
        self.O = s.storage_buffer(BINDING_O, self.out_el, out_bytes, False, "o", restrict=True)
        self._declare_mask()
        self.ML = s.storage_buffer(BINDING_ML, self.f32, 4, False, "ml", restrict=True) \
            if t.split else None
        self.blocks = s.storage_buffer(BINDING_BLOCKS, s.u32, 4, True, "blocks",
                                       restrict=True) if t.skip_blocks else None
        self.tiles = s.shared_array(self.unit_t, t.tile_elems // t.unit, "tiles")
        self.S_sh = s.shared_array(self.f32, t.block_rows * t.scratch_stride, "scores")
        if t.family == "khr":  # nv2 keeps P and the row statistics in registers
            self.P_sh = s.shared_array(self.op_el, t.block_rows * t.p_stride, "p")
            self.stats = s.shared_array(self.f32, t.block_rows, "row_factors")
        types = [self.f32 if name == "scale_log2" else s.u32 for name in PUSH_FIELDS]
        s.push_constants(PUSH_FIELDS, types)

    def _declare_mask(self) -> None:
        """The mask's binding, where the kernel reads one: bytes (boolean) or the
        operand type (additive)."""
        s, t, mb = self.s, self.t, self.s.mb
        self.mask_buf: Buffer | None = None
        if t.mask is MaskKind.BOOL:
            self.u8 = mb.type_int(8, False)
            self.mask_buf = s.storage_buffer(BINDING_MASK, self.u8, 1, True, "mask",
                                             restrict=True)
        elif t.mask is MaskKind.ADD:
            ext = type_extension(t.operand)
            if ext:
                mb.extension(ext)
            self.mask_buf = s.storage_buffer(BINDING_MASK, scalar_type(mb, t.operand),
                                             element(t.operand).itemsize, True, "mask",
                                             restrict=True)

    # -- setup ----------------------------------------------------------------------------
    def _setup(self) -> None:
        s, t = self.s, self.t
        v3 = s.mb.type_vector(s.u32, 3)
        wg = s.builtin(BuiltIn.WorkgroupId, v3)
        self.tid = s.builtin(BuiltIn.LocalInvocationIndex, s.u32)
        self.sgid = s.builtin(BuiltIn.SubgroupId, s.u32)
        self.lane = s.builtin(BuiltIn.SubgroupLocalInvocationId, s.u32)
        wx, wy, wz = (s.f.op(Op.CompositeExtract, s.u32, wg, i) for i in range(3))
        P = self.P = {name: s.param(name) for name in PUSH_FIELDS}
        self.split_index = wy
        self.outer = s.udiv(wz, P["kv_heads"])
        self.kv_head = s.umod(wz, P["kv_heads"])
        self.wx = wx
        self.rows_total = s.mul(P["groups"], P["Lq"])
        self.k_off = s.add(P["k_base"], s.add(s.mul(self.outer, P["k_outer"]),
                                               s.mul(self.kv_head, P["k_head"])))
        self.v_off = s.add(P["v_base"], s.add(s.mul(self.outer, P["v_outer"]),
                                               s.mul(self.kv_head, P["v_head"])))
        self.sg_row = s.mul(self.sgid, s.c(t.rows))  # the subgroup's first row in the tile
        self.causal = s.f.op(Op.INotEqual, s.bool,
                             s.f.op(Op.BitwiseAnd, s.u32, P["flags"], s.c(FLAG_CAUSAL)), s.c(0))
        self.neg_inf = self._fconst(float("-inf"))
        self.row_tiles = s.udiv(s.add(self.rows_total, s.c(t.block_rows - 1)),
                                s.c(t.block_rows))
        if t.skip_blocks:
            shared = s.f.op(Op.INotEqual, s.bool, s.f.op(
                Op.BitwiseAnd, s.u32, P["flags"], s.c(FLAG_SHARED_BLOCKS)), s.c(0))
            self.block_z = s.select(s.u32, shared, s.c(0), wz)
        self._tile_setup(wx)

    def _tile_setup(self, tile: int) -> None:
        """What depends on the workgroup's row tile (of a kv head's rows): its first row,
        its key range, where its block words start."""
        s, t, P = self.s, self.t, self.P
        self.r0 = s.mul(tile, s.c(t.block_rows))
        if t.split:  # whether the subgroup has a row (past the rows it only stages K, V)
            self.has_rows = s.lt(s.add(self.r0, self.sg_row), self.rows_total)
        self._key_range()
        if t.skip_blocks:
            steps = s.udiv(s.add(P["Lk"], s.c(t.keys - 1)), s.c(t.keys))
            self.block_words = s.mul(s.add(s.mul(self.block_z, self.row_tiles), tile), steps)

    def _row_query(self, R: int) -> tuple[int, int]:
        """(q head, query index) of row R (R < groups x Lq)."""
        s, P = self.s, self.P
        g, i = s.udiv(R, P["Lq"]), s.umod(R, P["Lq"])
        return s.add(s.mul(self.kv_head, P["groups"]), g), i

    def _row_offset(self, R: int, prefix: str) -> int:
        """Element offset of row R of q ('q'), o ('o') or the mask's row ('m')."""
        s, P = self.s, self.P
        head, i = self._row_query(R)
        ld = "m_row" if prefix == "m" else f"{prefix}_ld"
        return s.add(P[f"{prefix}_base"], s.add(
            s.add(s.mul(self.outer, P[f"{prefix}_outer"]), s.mul(head, P[f"{prefix}_head"])),
            s.mul(i, P[ld])))

    def _key_range(self) -> None:
        """[kbeg, kend): every key for a plain kernel, up to the last row's query where
        causal, a slice of split_keys where split."""
        s, f, P, t = self.s, self.s.f, self.P, self.t
        last = self._sub(self._min(s.add(self.r0, s.c(t.block_rows)), self.rows_total), s.c(1))
        # One q head in the tile: its last query; rows of two q heads: the whole range.
        same = f.op(Op.IEqual, s.bool, s.udiv(self.r0, P["Lq"]), s.udiv(last, P["Lq"]))
        last_query = s.select(s.u32, same, s.umod(last, P["Lq"]), self._sub(P["Lq"], s.c(1)))
        causal_end = self._min(P["Lk"], s.add(last_query, s.c(1)))
        # The tile's smallest query (0 where it holds rows of two q heads): keys up to it
        # are seen by every row.
        self.first_query = s.select(s.u32, same, s.umod(self.r0, P["Lq"]), s.c(0))
        kend = s.select(s.u32, self.causal, causal_end, P["Lk"])
        if t.split:
            self.kbeg = s.mul(self.split_index, P["split_keys"])
            self.kend = self._min(kend, s.add(self.kbeg, P["split_keys"]))
        else:
            self.kbeg, self.kend = s.c(0), kend

    # -- staging ----------------------------------------------------------------------------
    def _units(self, lines: int, width: int) -> list[tuple[int, int, int | None]]:
        """(line, element column, in-range condition or None) of this invocation's units of
        a lines x width tile (width a multiple of the unit)."""
        s, t = self.s, self.t
        per_line = width // t.unit
        total = lines * per_line
        out = []
        for r in range(-(-total // t.invocations)):
            u = s.add(self.tid, s.c(r * t.invocations)) if r else self.tid
            line = s.udiv(u, s.c(per_line))
            col = s.mul(s.umod(u, s.c(per_line)), s.c(t.unit))
            partial = (r + 1) * t.invocations > total
            out.append((line, col, s.lt(u, s.c(total)) if partial else None))
        return out

    def _global_unit(self, buf: Buffer, inside: int, index: int) -> int:
        """buf's unit at element `index` where `inside`, else 0 (index 0 is read instead:
        always in the binding)."""
        s, t = self.s, self.t
        if t.unit > 1:
            index = s.shr(index, s.c(3))
        safe = s.select(s.u32, inside, index, s.c(0))
        value = s.buffer_load(buf, safe)
        return s.select(self.unit_t, inside, value, self.unit_zero)

    def _stage_q(self) -> None:
        s, t = self.s, self.t
        for line, col, partial in self._units(t.block_rows, t.head_dim_padded):
            R = s.add(self.r0, line)
            inside = s.and_(s.lt(R, self.rows_total), s.lt(col, s.c(t.head_dim)))
            Rc = s.select(s.u32, inside, R, s.c(0))
            value = self._global_unit(self.Q, inside, s.add(self._row_offset(Rc, "q"), col))
            at = s.add(s.mul(line, s.c(t.tile_stride // t.unit)), s.udiv(col, s.c(t.unit)))

            def store(at: int = at, value: int = value) -> None:
                s.shared_store(self.tiles, at, value)

            if partial is None:
                store()
            else:
                s.f.if_(partial, store)

    def _kv_units(self) -> list[tuple[Buffer, int, int, int | None]]:
        """(K or V buffer, line, element column, partial) of this invocation's units of
        the K and V tiles."""
        t = self.t
        return [(buf, line, col, partial)
                for buf, width in ((self.K, t.head_dim_padded), (self.V, t.value_dim_padded))
                for line, col, partial in self._units(t.keys, width)]

    def _kv_loads(self, k0: int) -> list[int]:
        """This invocation's K and V units of the step at k0, loaded (zeros past Lk)."""
        s, t, P = self.s, self.t, self.P
        values = []
        for buf, line, col, _ in self._kv_units():
            j = s.add(k0, line)
            is_k = buf is self.K
            ld, off = (P["k_ld"], self.k_off) if is_k else (P["v_ld"], self.v_off)
            real = t.head_dim if is_k else t.value_dim
            inside = s.and_(s.lt(j, P["Lk"]), s.lt(col, s.c(real)))
            values.append(self._global_unit(buf, inside, s.add(off, s.add(s.mul(j, ld), col))))
        return values

    def _kv_store(self, values: list[int]) -> None:
        s, t = self.s, self.t
        for (buf, line, col, partial), value in zip(self._kv_units(), values, strict=True):
            base, stride = (0, t.tile_stride) if buf is self.K else \
                (t.keys * t.tile_stride, t.value_stride)
            at = s.add(s.c(base // t.unit), s.add(s.mul(line, s.c(stride // t.unit)),
                                                  s.udiv(col, s.c(t.unit))))

            def store(at: int = at, value: int = value) -> None:
                s.shared_store(self.tiles, at, value)

            if partial is None:
                store()
            else:
                s.f.if_(partial, store)

    # -- the multiplies -----------------------------------------------------------------
    def _load_q_fragments(self) -> list[list[int]]:
        s, t = self.s, self.t
        stride = t.tile_stride // t.unit
        frags = []
        for i in range(t.rows // t.m):
            row = s.add(self.sg_row, s.c(i * t.m))
            frags.append([s.coop_load_shared(
                self.mat_a, self.tiles,
                s.add(s.mul(row, s.c(stride)), s.c(kk // t.unit)),
                CooperativeMatrixLayout.RowMajor, s.c(stride))
                for kk in range(0, t.head_dim_padded, t.k)])
        return frags

    def _scores(self, qf: list[list[int]]) -> None:
        """S = Q K^T for this subgroup's rows, stored to its scratch (float32)."""
        s, t = self.s, self.t
        stride = t.tile_stride // t.unit
        zero = s.mb.const_composite(self.mat_acc, [s.mb.const_null(self.f32)])
        for j in range(t.keys // t.n):
            bs = [s.coop_load_shared(
                self.mat_b, self.tiles, s.c((j * t.n * t.tile_stride + kk) // t.unit),
                CooperativeMatrixLayout.ColumnMajor, s.c(stride))
                for kk in range(0, t.head_dim_padded, t.k)]
            for i in range(t.rows // t.m):
                acc = zero
                for a, b in zip(qf[i], bs, strict=True):
                    acc = s.f.op(Op.CooperativeMatrixMulAddKHR, self.mat_acc, a, b, acc)
                at = s.add(s.mul(s.add(self.sg_row, s.c(i * t.m)), s.c(t.scratch_stride)),
                           s.c(j * t.n))
                s.coop_store_shared(self.S_sh, at, acc, CooperativeMatrixLayout.RowMajor,
                                    s.c(t.scratch_stride))

    def _row_matrix(self, i: int) -> int:
        """The accumulator matrix whose row r holds row_factors[this subgroup's row
        i x m + r] in every column (a column-major load of stride 0)."""
        s, t = self.s, self.t
        return s.coop_load_shared(self.mat_acc, self.stats, s.add(self.sg_row, s.c(i * t.m)),
                                  CooperativeMatrixLayout.ColumnMajor, s.c(0))

    def _scale_rows(self, acc_vars: list[list[int]]) -> None:
        """O *= diag(row_factors) for this subgroup's rows."""
        s = self.s
        for i, row_vars in enumerate(acc_vars):
            factors = self._row_matrix(i)
            for var in row_vars:
                self._store(var, s.f.op(Op.FMul, self.mat_acc,
                                        self._load(self.mat_acc, var), factors))

    def _pv(self, acc_vars: list[list[int]]) -> None:
        """O += P V for this subgroup's rows."""
        s, t = self.s, self.t
        vbase = t.keys * t.tile_stride
        vstride = t.value_stride // t.unit
        for kk in range(0, t.keys, t.k):
            ps = [s.coop_load_shared(
                self.mat_a, self.P_sh,
                s.add(s.mul(s.add(self.sg_row, s.c(i * t.m)), s.c(t.p_stride)), s.c(kk)),
                CooperativeMatrixLayout.RowMajor, s.c(t.p_stride))
                for i in range(t.rows // t.m)]
            for j, _ in enumerate(acc_vars[0]):
                b = s.coop_load_shared(
                    self.mat_b, self.tiles,
                    s.c((vbase + kk * t.value_stride + j * t.n) // t.unit),
                    CooperativeMatrixLayout.RowMajor, s.c(vstride))
                for i, row_vars in enumerate(acc_vars):
                    var = row_vars[j]
                    self._store(var, s.f.op(Op.CooperativeMatrixMulAddKHR, self.mat_acc,
                                            ps[i], b, self._load(self.mat_acc, var)))

    # -- the softmax ----------------------------------------------------------------------
    def _rows(self) -> list[_Row]:
        """The rows this lane walks, with their state, set up before the key loop."""
        s, t, f = self.s, self.t, self.s.f
        lpr = t.lanes_per_row
        per_pass = t.subgroup_size // lpr
        first = s.udiv(self.lane, s.c(lpr)) if lpr > 1 else self.lane
        rows = []
        for p in range(t.passes):
            local = s.add(first, s.c(p * per_pass)) if p else first
            R = s.add(self.r0, s.add(self.sg_row, local))
            Rc = s.select(s.u32, s.lt(R, self.rows_total), R, s.c(0))
            _, query = self._row_query(Rc)
            mask_base = self._row_offset(Rc, "m") if t.mask is not None else None
            m_var = f.local(self.f32, self.neg_inf)
            l_var = f.local(self.f32, self._fconst(0.0))
            rows.append(_Row(local, query, mask_base, m_var, l_var, R))
        return rows

    def _lane_allreduce(self, value: int, combine: Callable[[int, int], int]) -> int:
        """value combined over the lanes_per_row lanes of one row (adjacent lanes)."""
        s, t = self.s, self.t
        step = 1
        while step < t.lanes_per_row:
            other = s.f.op(Op.GroupNonUniformShuffleXor, self.f32, s.c(Scope.Subgroup),
                           value, s.c(step))
            value = combine(value, other)
            step *= 2
        return value

    def _mask_value(self, row: _Row, j: int, s_val: int) -> int:
        """The score with the mask applied (j already clamped below Lk)."""
        s, t, P = self.s, self.t, self.P
        assert row.mask_base is not None and self.mask_buf is not None
        at = s.add(row.mask_base, s.mul(j, P["m_col"]))
        raw = s.buffer_load(self.mask_buf, at)
        if t.mask is MaskKind.BOOL:
            keep = s.f.op(Op.INotEqual, s.bool, raw, s.mb.const_null(self.u8))
            return s.select(self.f32, keep, s_val, self.neg_inf)
        add = s.f.op(Op.FConvert, self.f32, raw)
        return self._fop(Op.FAdd, s_val, self._fop(Op.FMul, add, self._fconst(LOG2_E)))

    def _softmax(self, rows: list[_Row], k0: int) -> None:
        s, t, P = self.s, self.t, self.P
        lpr = t.lanes_per_row
        q = s.umod(self.lane, s.c(lpr)) if lpr > 1 else s.c(0)
        last_key = self._sub(P["Lk"], s.c(1))
        for row in rows:
            srow = s.add(self.sg_row, row.local)
            s_at = s.mul(srow, s.c(t.scratch_stride))
            p_at = s.mul(srow, s.c(t.p_stride))
            values = []
            mx = self.neg_inf
            for c in range(t.keys // lpr):
                col = s.add(q, s.c(c * lpr)) if c else q
                x = self._fop(Op.FMul, s.shared_load(self.S_sh, s.add(s_at, col)),
                              P["scale_log2"])
                j = s.add(k0, col)
                if t.mask is not None:
                    x = self._mask_value(row, self._min(j, last_key), x)
                hidden = s.f.op(Op.UGreaterThan, s.bool, j, row.query)
                x = s.select(self.f32, s.and_(self.causal, hidden), self.neg_inf, x)
                x = s.select(self.f32, s.lt(j, self.kend), x, self.neg_inf)
                values.append((col, x))
                mx = self._ext(GLSLstd450.FMax, mx, x) if c else x
            mx = self._lane_allreduce(mx, lambda a, b: self._ext(GLSLstd450.FMax, a, b))
            m_old = self._load(self.f32, row.m_var)
            m_new = self._ext(GLSLstd450.FMax, m_old, mx)
            # A row with nothing seen yet keeps -inf: exponents then use 0 (2^-inf = 0).
            empty = s.f.op(Op.FOrdEqual, s.bool, m_new, self.neg_inf)
            m_use = s.select(self.f32, empty, self._fconst(0.0), m_new)
            total = None
            for col, x in values:
                p = self._ext(GLSLstd450.Exp2, self._fop(Op.FSub, x, m_use))
                total = p if total is None else self._fop(Op.FAdd, total, p)
                s.shared_store(self.P_sh, s.add(p_at, col),
                               s.f.op(Op.FConvert, self.op_el, p))
            assert total is not None
            total = self._lane_allreduce(total, lambda a, b: self._fop(Op.FAdd, a, b))
            alpha = self._ext(GLSLstd450.Exp2, self._fop(Op.FSub, m_old, m_use))
            l_old = self._load(self.f32, row.l_var)
            self._store(row.l_var, self._fop(Op.FAdd, self._fop(Op.FMul, l_old, alpha), total))
            self._store(row.m_var, m_new)
            self._lead_store(q, srow, alpha)

    def _lead_store(self, q: int, srow: int, value: int) -> None:
        """row_factors[srow] = value, from the row's first lane."""
        s, t = self.s, self.t
        if t.lanes_per_row == 1:
            s.shared_store(self.stats, srow, value)
            return
        s.f.if_(s.f.op(Op.IEqual, s.bool, q, s.c(0)),
                lambda: s.shared_store(self.stats, srow, value))

    # -- the key loop -----------------------------------------------------------------------
    def _key_loop(self, qf: list[list[int]], rows: list[_Row],
                  acc_vars: list[list[int]]) -> None:
        s, f, t = self.s, self.s.f, self.t
        k_var = f.local(s.u32)  # an initializer must be a constant: kbeg is not
        self._store(k_var, self.kbeg)
        regs: list[int] = []
        if t.prefetch:
            first = self._kv_loads(self.kbeg)
            regs = [f.local(self.unit_t) for _ in first]
            for var, value in zip(regs, first, strict=True):
                self._store(var, value)

        def run(k0: int, fast: bool) -> None:
            self._barrier()  # the previous step's K, V and P have been read
            if t.prefetch:
                self._kv_store([self._load(self.unit_t, v) for v in regs])
            else:
                self._kv_store(self._kv_loads(k0))
            self._barrier()  # K and V are in shared memory
            if t.prefetch:  # in flight while this step multiplies
                for var, value in zip(regs, self._kv_loads(s.add(k0, s.c(t.keys))),
                                      strict=True):
                    self._store(var, value)
            self._step(qf, rows, acc_vars, k0, fast)

        def body(fast: bool) -> None:
            k0 = self._load(s.u32, k_var)
            if not t.skip_blocks:
                run(k0, fast)
                return
            # One address for the whole workgroup: the branch, and the barriers in it,
            # stay in uniform control flow. A hidden step would change no row's state.
            assert self.blocks is not None
            word = s.buffer_load(self.blocks, s.add(self.block_words,
                                                    s.udiv(k0, s.c(t.keys))))
            f.if_(s.f.op(Op.INotEqual, s.bool, word, s.c(0)), lambda: run(k0, False))

        def step() -> None:
            self._store(k_var, s.add(self._load(s.u32, k_var), s.c(t.keys)))

        # Fast steps are a prefix of the key range (_fast holds until a step reaches a
        # causal edge or kend), so they take a loop of their own.
        if t.fast_steps:
            positive = f.op(Op.FOrdLessThan, s.bool, self._fconst(0.0), self.P["scale_log2"])
            f.while_(lambda: s.and_(positive, self._fast(self._load(s.u32, k_var))),
                     lambda: body(True), step, LoopControl.DontUnroll)
        f.while_(lambda: s.lt(self._load(s.u32, k_var), self.kend), lambda: body(False), step,
                 LoopControl.DontUnroll)

    def _fast(self, k0: int) -> int:
        """Whether the step at k0 needs no per-score check, given a positive scale (so
        the row max of the raw scores, scaled, is the max of the scaled ones): every key
        below kend, none past the tile's smallest query where causal. The same for the
        whole workgroup."""
        s = self.s
        end = s.add(k0, s.c(self.t.keys))
        seen = s.le(self._sub(end, s.c(1)), self.first_query)
        edge = s.select(s.bool, self.causal, seen, s.mb.const_bool(True))
        return s.and_(s.le(end, self.kend), edge)

    def _step(self, qf: list[list[int]], rows: list[_Row], acc_vars: list[list[int]],
              k0: int, fast: bool) -> None:
        """One key step once K and V are in shared memory (khr: every step checked)."""
        self._scores(qf)
        self._barrier()  # this subgroup's scores are in its scratch
        self._softmax(rows, k0)
        self._barrier()  # P and the row factors are in shared memory
        self._scale_rows(acc_vars)
        self._pv(acc_vars)

    # -- the end --------------------------------------------------------------------------
    def _finish(self, rows: list[_Row], acc_vars: list[list[int]]) -> None:
        if self.t.split:
            self._store_partials(rows, acc_vars)
        else:
            self._normalise(rows, acc_vars)
            self._store_result(rows, acc_vars)

    def _normalise(self, rows: list[_Row], acc_vars: list[list[int]]) -> None:
        """O *= diag(1 / l), 0 for rows whose every score was masked (l = 0), as torch's
        scaled_dot_product_attention gives them."""
        s, t = self.s, self.t
        lpr = t.lanes_per_row
        q = s.umod(self.lane, s.c(lpr)) if lpr > 1 else s.c(0)
        self._barrier()  # the last step's row factors have been read
        for row, (_, l_val) in zip(rows, self._row_stats(rows), strict=True):
            seen = s.f.op(Op.FOrdLessThan, s.bool, self._fconst(0.0), l_val)
            inv = s.select(self.f32, seen, self._fop(Op.FDiv, self._fconst(1.0), l_val),
                           self._fconst(0.0))
            self._lead_store(q, s.add(self.sg_row, row.local), inv)
        self._barrier()
        self._scale_rows(acc_vars)

    def _store_result(self, rows: list[_Row], acc_vars: list[list[int]]) -> None:
        """The result to o: matrices straight to memory where the tile allows
        (direct_store), else through the scratch."""
        s, t, P = self.s, self.t, self.P
        if not t.direct_store:
            self._store_scratch(rows, acc_vars)
            return
        # The same for the whole workgroup: the branch keeps the scratch path's barriers in
        # uniform control flow.
        inside = s.le(s.add(self.r0, s.c(t.block_rows)), self.rows_total)
        whole_heads = s.f.op(Op.IEqual, s.bool, s.umod(P["Lq"], s.c(t.m)), s.c(0))
        align = 16 // element(t.out).itemsize - 1  # elements below a 16-byte boundary
        offsets = s.f.op(Op.BitwiseOr, s.u32, s.f.op(Op.BitwiseOr, s.u32, P["o_base"],
                                                     P["o_ld"]),
                         s.f.op(Op.BitwiseOr, s.u32, P["o_outer"], P["o_head"]))
        aligned = s.f.op(Op.IEqual, s.bool, s.f.op(Op.BitwiseAnd, s.u32, offsets,
                                                   s.c(align)), s.c(0))
        s.f.if_(s.and_(s.and_(inside, whole_heads), aligned),
                lambda: self._store_direct(acc_vars),
                lambda: self._store_scratch(rows, acc_vars))

    def _store_direct(self, acc_vars: list[list[int]]) -> None:
        """Each accumulator, rounded to the result type, stored as a matrix: its m rows
        are rows of one q head (Lq a multiple of m), ld apart in o."""
        s, t = self.s, self.t
        for i, row_vars in enumerate(acc_vars):
            first = self._row_offset(s.add(self.r0, s.add(self.sg_row, s.c(i * t.m))), "o")
            for j, var in enumerate(row_vars):
                value = self._load(self.mat_acc, var)
                if self.mat_out != self.mat_acc:
                    value = s.f.op(Op.FConvert, self.mat_out, value)
                s.coop_store_buffer(self.O, s.add(first, s.c(j * t.n)), value,
                                    CooperativeMatrixLayout.RowMajor, self.P["o_ld"])

    def _store_scratch(self, rows: list[_Row], acc_vars: list[list[int]]) -> None:
        """Groups of accumulator columns through the subgroup's scratch, then by the
        softmax's rows and lanes, rounded to the result type, to o where inside the rows
        and Dv."""
        s, t = self.s, self.t
        lpr = t.lanes_per_row
        q = s.umod(self.lane, s.c(lpr)) if lpr > 1 else s.c(0)
        per_pass = max(1, t.scratch_stride // t.n)  # accumulator columns a pass
        ncols = len(acc_vars[0])
        targets = [(row, s.add(self.sg_row, row.local), self._row_offset(
            s.select(s.u32, s.lt(row.R, self.rows_total), row.R, s.c(0)), "o"))
            for row in rows]
        for j0 in range(0, ncols, per_pass):
            group = range(j0, min(ncols, j0 + per_pass))
            self._barrier()  # the scratch is free
            for i, row_vars in enumerate(acc_vars):
                for jj, j in enumerate(group):
                    at = s.add(s.mul(s.add(self.sg_row, s.c(i * t.m)), s.c(t.scratch_stride)),
                               s.c(jj * t.n))
                    s.coop_store_shared(self.S_sh, at, self._load(self.mat_acc, row_vars[j]),
                                        CooperativeMatrixLayout.RowMajor,
                                        s.c(t.scratch_stride))
            self._barrier()
            for row, srow, o_row in targets:
                valid = s.lt(row.R, self.rows_total)
                for c in range(0, len(group) * t.n, lpr):
                    col = s.add(q, s.c(c)) if c else q
                    d = s.add(col, s.c(j0 * t.n))
                    inside = s.and_(valid, s.lt(d, s.c(t.value_dim))) \
                        if (j0 * t.n + c + lpr) > t.value_dim else valid

                    def write(srow: int = srow, col: int = col, d: int = d,
                              o_row: int = o_row) -> None:
                        v = s.shared_load(self.S_sh, s.add(s.mul(srow, s.c(t.scratch_stride)),
                                                           col))
                        if self.out_el != self.f32:
                            v = s.f.op(Op.FConvert, self.out_el, v)
                        s.buffer_store(self.O, s.add(o_row, d), v)

                    s.f.if_(inside, write)

    def _store_partials(self, rows: list[_Row], acc_vars: list[list[int]]) -> None:
        """The split kernel's state: unnormalised O (rows_pad x Dv padded, float32, per
        (kv head, split)) and each row's (m, l)."""
        s, t, P = self.s, self.t, self.P
        wz = s.add(s.mul(self.outer, P["kv_heads"]), self.kv_head)
        slot = s.add(s.mul(wz, P["splits"]), self.split_index)
        first_row = s.add(s.mul(slot, P["rows_pad"]), self.r0)
        ld = t.value_dim_padded

        def store_o() -> None:
            for i, row_vars in enumerate(acc_vars):
                block = s.add(first_row, s.add(self.sg_row, s.c(i * t.m)))
                for j, var in enumerate(row_vars):
                    at = s.add(s.mul(block, s.c(ld)), s.c(j * t.n))
                    s.coop_store_buffer(self.O, at, self._load(self.mat_acc, var),
                                        CooperativeMatrixLayout.RowMajor, s.c(ld))

        s.f.if_(self.has_rows, store_o)  # the same for a whole subgroup
        lpr = t.lanes_per_row
        q = s.umod(self.lane, s.c(lpr)) if lpr > 1 else s.c(0)
        assert self.ML is not None
        ml = self.ML
        for row, (m_val, l_val) in zip(rows, self._row_stats(rows), strict=True):
            at = s.mul(s.add(first_row, s.add(self.sg_row, row.local)), s.c(2))

            def write(at: int = at, m_val: int = m_val, l_val: int = l_val) -> None:
                s.buffer_store(ml, at, m_val)
                s.buffer_store(ml, s.add(at, s.c(1)), l_val)

            if lpr == 1:
                write()
            else:
                s.f.if_(s.f.op(Op.IEqual, s.bool, q, s.c(0)), write)

    def _row_stats(self, rows: list[_Row]) -> list[tuple[int, int]]:
        """(running max, running sum) of each row this lane walks."""
        return [(self._load(self.f32, row.m_var), self._load(self.f32, row.l_var))
                for row in rows]

    # -- the module -------------------------------------------------------------------------
    def build(self) -> bytes:
        self._declare()
        s, t, f = self.s, self.t, self.s.f
        self._setup()
        self._tile()
        if t.paired:  # then the mirror tile, where it is another one
            mirror = self._sub(self._sub(self.row_tiles, s.c(1)), self.wx)

            def second() -> None:
                self._barrier()  # the first tile's last reads of shared memory are done
                self._tile_setup(mirror)
                self._tile()

            f.if_(s.lt(self.wx, mirror), second)
        return s.compute_module(t.invocations)

    def _tile(self) -> None:
        """One row tile, from staging its Q to storing its result."""
        s, t, f = self.s, self.t, self.s.f
        self._stage_q()
        self._barrier()
        qf = self._load_q_fragments()
        rows = self._rows()
        zero = s.mb.const_composite(self.mat_acc, [s.mb.const_null(self.f32)])
        acc_vars = [[f.local(self.mat_acc, zero) for _ in range(t.value_dim_padded // t.n)]
                    for _ in range(t.rows // t.m)]
        self._key_loop(qf, rows, acc_vars)
        self._finish(rows, acc_vars)
