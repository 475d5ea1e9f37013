"""The GEMM kernel on VK_NV_cooperative_matrix2: workgroup-scope matrices, tensor addressing.

Per workgroup (tile_m x tile_n of D at (WorkgroupId.y, WorkgroupId.x), batch WorkgroupId.z):

    acc = 0                                   (workgroup-scope TILE_M x TILE_N accumulator)
    for k0 in 0, TILE_K, ... < K:
        a = load A through its layout sliced to [m0, m0+TILE_M) x [k0, k0+TILE_K)
        b = load B through its layout sliced to [k0, k0+TILE_K) x [n0, n0+TILE_N)
        acc = a * b + acc
    D tile = alpha * acc (+ beta * C tile, loaded the same way), stored through D's layout

The implementation distributes workgroup-scope matrices over the workgroup and stages their
loads through the shared memory it reserves, so the shader has no staging code of its own.

Tensor layouts (SPV_NV_tensor_addressing) carry all the addressing:
- Each operand is a 3-D layout (batch, lines, elements in a line), dimensions
  (batch + 1, lines, line length) and strides (batch stride, leading dimension, 1). The
  batch is a coordinate, not a pointer offset: SPV_NV_cooperative_matrix2 requires the
  'Pointer' operand to be 16-byte aligned, which `&buf[batch * stride]` need not be, so every
  load and store uses &buf[0] (the descriptor's start). A batch stride of 0 (broadcast)
  uses batch coordinate 0 instead.
- Edges: the layouts' clamp mode is Constant with clamp value 0, so loads outside the
  matrix read 0 (partial K steps and edge tiles stay exact), and the spec discards stores
  to coordinates outside the layout's dimensions for every clamp mode except Undefined,
  so the edge tiles of D need no extra code.
- Column-major A (or B) is laid out as (batch, K, M) (or (batch, N, K)) and read through a
  tensor view with permutation (0, 2, 1), which swaps the two inner coordinates: the
  matrix's (row, col) lands on memory (col, row). Row-major operands need no view.
- Slices: OpTensorLayoutSliceNV at the tile's origin and span, per K step.

Requirements beyond the shared ABI: a nonzero batch stride must be at least
lines x leading dimension of its operand (OpTensorLayoutSetStrideNV's rule that an outer
stride covers the inner dimension), which contiguous batches always meet.
"""

from __future__ import annotations

from coopmat.codegen import abi
from coopmat.codegen.plan import element_bytes
from coopmat.codegen.shader import Buffer, ShaderContext
from coopmat.codegen.spv import (
    BuiltIn,
    Capability,
    CooperativeMatrixOperands,
    CooperativeMatrixUse,
    ExecutionMode,
    ExecutionModel,
    Op,
    Scope,
    TensorClampMode,
)
from coopmat.codegen.traits import GemmTraits, Layout
from coopmat.codegen.types import scalar_type, type_capabilities
from coopmat.device.enums import ComponentType

EXTENSIONS = ("SPV_KHR_cooperative_matrix", "SPV_NV_cooperative_matrix2",
              "SPV_NV_tensor_addressing")

# Vulkan features (VkPhysicalDeviceCooperativeMatrix2FeaturesNV) the module needs beyond those
# of its capabilities: matrices of Workgroup scope, and dimensions other than a listed
# VkCooperativeMatrixPropertiesKHR shape. Neither has a SPIR-V capability of its own.
NV2_FEATURES = ("cooperativeMatrixWorkgroupScope", "cooperativeMatrixFlexibleDimensions")

# Tensor-view permutation that swaps the two inner coordinates of a 3-D layout.
TRANSPOSE = (0, 2, 1)
LAYOUT_DIMS = 3

# The interior fast path (see the module docstring) uses 2-D layouts (lines, line length);
# its view swaps the two coordinates.
TRANSPOSE_2D = (1, 0)
# Byte alignment the fast path proves to the driver's compiler (16 B vector accesses).
FAST_ALIGN_BYTES = 16
# K steps written out straight-line per iteration of the fast path's K loop (the
# remainder runs one step at a time). The reference kernels let the compiler see this:
# llama.cpp's mul_mm_cm2 unrolls 8 steps by hand; the peer benchmark's trip count is a
# specialization constant. A codegen parameter: Nv2GemmEmitter(traits, unroll=...).
DEFAULT_UNROLL = 8


def required_capabilities(traits: GemmTraits) -> set[Capability]:
    caps = {Capability.Shader, Capability.VulkanMemoryModel, Capability.CooperativeMatrixKHR,
            Capability.CooperativeMatrixTensorAddressingNV, Capability.TensorAddressingNV}
    for ct in {traits.a_type, traits.b_type, traits.result_type}:
        caps.update(type_capabilities(ct, in_storage_buffer=True))
    return caps


def check_traits(traits: GemmTraits) -> None:
    """Raise ValueError for traits this family cannot build."""
    t, tile = traits, traits.tile
    if t.family != "nv2":
        raise ValueError(f"traits of family {t.family!r}, not 'nv2'")
    if t.aligned:
        raise ValueError("the nv2 family has one variant for every alignment (aligned=False)")
    if t.a_type != t.b_type or t.c_type != t.result_type:
        raise ValueError("nv2 kernels need A and B of one type and C of the result type")
    from coopmat.codegen.nv2_tiles import NV2_TYPES

    if (t.a_type, t.result_type) not in NV2_TYPES:
        raise ValueError(f"nv2 does not build {t.a_type!r} -> {t.result_type!r}")
    if min(t.m, t.n, t.k) < 1:
        raise ValueError("granularities (m, n, k) must be positive")
    if tile.tile_m % t.m or tile.tile_n % t.n or tile.tile_k % t.k:
        raise ValueError(f"tile {tile.describe()} is not a multiple of the granularities "
                         f"{t.m}x{t.n}x{t.k}")
    inv = invocations(traits)
    if inv < 1 or inv & (inv - 1):
        raise ValueError(f"workgroup size {inv} is not a power of two")
    if tile.buffering not in (1, 2):
        raise ValueError(f"buffering must be 1 or 2, not {tile.buffering}")


def invocations(traits: GemmTraits) -> int:
    return traits.tile.subgroups * traits.subgroup_size


class _Operand:
    """A or B: its buffer, matrix type, base layout and how to slice it at a K step."""

    def __init__(self, buf: Buffer, mat: int, layout: int, batch: int, view: int | None,
                 k_outer: bool, origin: int, span: int) -> None:
        self.buf, self.mat, self.layout, self.batch, self.view = buf, mat, layout, batch, view
        self.k_outer = k_outer  # K is the layout's middle dimension (else its inner one)
        self.origin, self.span = origin, span  # tile origin and extent along M (A) / N (B)


class Nv2GemmEmitter:
    def __init__(self, traits: GemmTraits) -> None:
        check_traits(traits)
        self.t = traits
        self.s = ShaderContext()

    def _declare(self) -> None:
        s, t, mb = self.s, self.t, self.s.mb
        tile = t.tile
        for ext in EXTENSIONS:
            mb.extension(ext)
        if ComponentType.BFLOAT16 in (t.a_type, t.b_type):
            mb.extension("SPV_KHR_bfloat16")
        mb.capability(*sorted(required_capabilities(t)))
        self.a_el = scalar_type(mb, t.a_type)
        self.b_el = scalar_type(mb, t.b_type)
        self.r_el = scalar_type(mb, t.result_type)
        wg = int(Scope.Workgroup)
        self.mat_a = mb.type_coopmat(self.a_el, wg, tile.tile_m, tile.tile_k,
                                     CooperativeMatrixUse.MatrixA)
        self.mat_b = mb.type_coopmat(self.b_el, wg, tile.tile_k, tile.tile_n,
                                     CooperativeMatrixUse.MatrixB)
        self.mat_acc = mb.type_coopmat(self.r_el, wg, tile.tile_m, tile.tile_n,
                                       CooperativeMatrixUse.MatrixAccumulator)
        self.layout_t = mb.type_tensor_layout(LAYOUT_DIMS, TensorClampMode.Constant)
        if Layout.COLUMN_MAJOR in (t.a_layout, t.b_layout):
            self.view_t = mb.type_tensor_view(LAYOUT_DIMS, False, TRANSPOSE)
        self.float_result = t.result_type.is_float
        alpha_t = mb.type_float(32) if self.float_result else self.r_el

        self.bufs: dict[str, Buffer] = {}
        for name, binding, elem, ct, readonly in (
                ("A", abi.BINDING_A, self.a_el, t.a_type, True),
                ("B", abi.BINDING_B, self.b_el, t.b_type, True),
                ("D", abi.BINDING_D, self.r_el, t.result_type, False),
                ("C", abi.BINDING_C, self.r_el, t.result_type, True)):
            if name == "C" and not t.has_c:
                continue
            # C may be bound to D's memory (an in-place update), so only A and B are restrict.
            self.bufs[name] = s.storage_buffer(binding, elem, element_bytes(ct), readonly,
                                               name, restrict=name in ("A", "B"))
        s.push_constants(abi.PUSH_FIELDS, [s.u32] * 11 + [alpha_t, alpha_t, s.u32])

    # -- layouts ------------------------------------------------------------------------
    def _layout(self, lines: int, line_len: int, ld: int, batch_stride: int) -> tuple[int, int]:
        """(base layout, batch coordinate) of a (batch, lines, line_len) operand."""
        s = self.s
        broadcast = s.f.op(Op.IEqual, s.bool, batch_stride, s.c(0))
        coord = s.select(s.u32, broadcast, s.c(0), self.batch)
        # A zero stride would break SetStride's rule stride[0] >= stride[1] * dim[1]; the
        # value is never used then (coordinate 0), so give the packed one.
        stride0 = s.select(s.u32, broadcast, s.mul(lines, ld), batch_stride)
        layout = s.tensor_layout(self.layout_t, [s.add(coord, s.c(1)), lines, line_len],
                                 [stride0, ld, s.c(1)], clamp_value=s.c(0))
        return layout, coord

    def _tile_slice(self, layout: int, batch: int, rows: tuple[int, int],
                    cols: tuple[int, int]) -> int:
        return self.s.tensor_slice(self.layout_t, layout,
                                   [(batch, self.s.c(1)), rows, cols])

    def _setup(self) -> None:
        s, t, tile = self.s, self.t, self.t.tile
        v3 = s.mb.type_vector(s.u32, 3)
        wg = s.builtin(BuiltIn.WorkgroupId, v3)
        wx, wy, self.batch = (s.f.op(Op.CompositeExtract, s.u32, wg, i) for i in range(3))
        P = self.P = {name: s.param(name) for name in abi.PUSH_FIELDS}
        self.m0 = s.mul(wy, s.c(tile.tile_m))
        self.n0 = s.mul(wx, s.c(tile.tile_n))
        if self.float_result and t.result_type != ComponentType.FLOAT32:
            self.alpha = s.f.op(Op.FConvert, self.r_el, P["alpha"])
            self.beta = s.f.op(Op.FConvert, self.r_el, P["beta"])
        else:
            self.alpha, self.beta = P["alpha"], P["beta"]
        view = s.tensor_view(self.view_t) if Layout.COLUMN_MAJOR in (t.a_layout,
                                                                      t.b_layout) else None
        # A is M x K: row-major lines are rows (M of them, K long), column-major lines are
        # columns (K of them, M long). B is K x N likewise.
        a_row = t.a_layout == Layout.ROW_MAJOR
        lines, line_len = (P["M"], P["K"]) if a_row else (P["K"], P["M"])
        layout, batch = self._layout(lines, line_len, P["lda"], P["batch_stride_a"])
        self.A = _Operand(self.bufs["A"], self.mat_a, layout, batch, None if a_row else view,
                          k_outer=not a_row, origin=self.m0, span=tile.tile_m)
        b_row = t.b_layout == Layout.ROW_MAJOR
        lines, line_len = (P["K"], P["N"]) if b_row else (P["N"], P["K"])
        layout, batch = self._layout(lines, line_len, P["ldb"], P["batch_stride_b"])
        self.B = _Operand(self.bufs["B"], self.mat_b, layout, batch, None if b_row else view,
                          k_outer=b_row, origin=self.n0, span=tile.tile_n)
        self.zero_a = s.mb.const_composite(self.mat_a, [s.mb.const_null(self.a_el)])
        self.zero_b = s.mb.const_composite(self.mat_b, [s.mb.const_null(self.b_el)])
        self.zero_acc = s.mb.const_composite(self.mat_acc, [s.mb.const_null(self.r_el)])

    # -- main loop ----------------------------------------------------------------------
    def _load_operand(self, op: _Operand, zero: int, k0: int) -> int:
        s, tk = self.s, self.t.tile.tile_k
        k_range, mn_range = (k0, s.c(tk)), (op.origin, s.c(op.span))
        rows, cols = (k_range, mn_range) if op.k_outer else (mn_range, k_range)
        sliced = self._tile_slice(op.layout, op.batch, rows, cols)
        return s.coop_load_tensor(op.mat, op.buf, s.c(0), zero, sliced, op.view)

    def _load_ab(self, k0: int) -> tuple[int, int]:
        return (self._load_operand(self.A, self.zero_a, k0),
                self._load_operand(self.B, self.zero_b, k0))

    def _mul_operands(self) -> tuple[int, ...]:
        t = self.t
        flags = CooperativeMatrixOperands.NONE
        for ct, bit in ((t.a_type, CooperativeMatrixOperands.MatrixASigned),
                        (t.b_type, CooperativeMatrixOperands.MatrixBSigned),
                        (t.c_type, CooperativeMatrixOperands.MatrixCSigned),
                        (t.result_type, CooperativeMatrixOperands.MatrixResultSigned)):
            if not ct.is_float and ct.is_signed:
                flags |= bit
        return (int(flags),) if flags else ()

    def _k_loop(self) -> int:
        """Run the K loop; return the final accumulator."""
        s, f, tile = self.s, self.s.f, self.t.tile
        acc_var = f.local(self.mat_acc, self.zero_acc)
        k_var = f.local(s.u32, s.c(0))
        flags = self._mul_operands()
        prefetch = tile.buffering == 2
        if prefetch:  # the next K step's loads are issued before this step's multiply
            a_var, b_var = f.local(self.mat_a), f.local(self.mat_b)
            a0, b0 = self._load_ab(s.c(0))
            f.emit(Op.Store, a_var, a0)
            f.emit(Op.Store, b_var, b0)

        def body() -> None:
            k0 = f.op(Op.Load, s.u32, k_var)
            if prefetch:
                a, b = f.op(Op.Load, self.mat_a, a_var), f.op(Op.Load, self.mat_b, b_var)
                a_next, b_next = self._load_ab(s.add(k0, s.c(tile.tile_k)))
                f.emit(Op.Store, a_var, a_next)
                f.emit(Op.Store, b_var, b_next)
            else:
                a, b = self._load_ab(k0)
            acc = f.op(Op.Load, self.mat_acc, acc_var)
            f.emit(Op.Store, acc_var,
                   f.op(Op.CooperativeMatrixMulAddKHR, self.mat_acc, a, b, acc, *flags))

        def step() -> None:
            f.emit(Op.Store, k_var, s.add(f.op(Op.Load, s.u32, k_var), s.c(tile.tile_k)))

        f.while_(lambda: s.lt(f.op(Op.Load, s.u32, k_var), self.P["K"]), body, step)
        return f.op(Op.Load, self.mat_acc, acc_var)

    # -- epilogue -----------------------------------------------------------------------
    def _scale(self, mat: int, factor: int) -> int:
        s = self.s
        if self.float_result:
            return s.f.op(Op.MatrixTimesScalar, self.mat_acc, mat, factor)
        splat = s.f.op(Op.CompositeConstruct, self.mat_acc, factor)
        return s.f.op(Op.IMul, self.mat_acc, mat, splat)

    def _epilogue(self, acc: int) -> None:
        s, t, P, tile = self.s, self.t, self.P, self.t.tile
        rows, cols = (self.m0, s.c(tile.tile_m)), (self.n0, s.c(tile.tile_n))
        result = self._scale(acc, self.alpha)
        if t.has_c:
            layout, batch = self._layout(P["M"], P["N"], P["ldc"], P["batch_stride_c"])
            c = s.coop_load_tensor(self.mat_acc, self.bufs["C"], s.c(0), self.zero_acc,
                                   self._tile_slice(layout, batch, rows, cols))
            add = Op.FAdd if self.float_result else Op.IAdd
            result = s.f.op(add, self.mat_acc, result, self._scale(c, self.beta))
        layout, batch = self._layout(P["M"], P["N"], P["ldd"], P["batch_stride_d"])
        # Clamp mode Constant: elements outside M x N (edge tiles) are not stored.
        s.coop_store_tensor(self.bufs["D"], s.c(0), result,
                            self._tile_slice(layout, batch, rows, cols))

    def build(self) -> bytes:
        self._declare()
        self._setup()
        self._epilogue(self._k_loop())
        s = self.s
        s.f.finish()
        s.mb.entry_point(ExecutionModel.GLCompute, s.f.id, "main")
        s.mb.execution_mode(s.f.id, ExecutionMode.LocalSize, invocations(self.t), 1, 1)
        return s.mb.assemble()


def emit_nv2_gemm(traits: GemmTraits) -> bytes:
    return Nv2GemmEmitter(traits).build()
