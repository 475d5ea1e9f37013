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

Interior fast path (what makes the reference kernels fast; without it a 4096^3 f16 GEMM
ran at a third of their speed). Where the workgroup's tile lies inside M x N and A's and
B's leading dimensions and batch offsets are multiples of 16 bytes (all uniform values),
the K loop instead uses:
- 2-D layouts (lines, line length) with clamp mode Undefined, so the implementation does
  no per-element bounds work; the batch becomes the Pointer's element offset (16-byte
  aligned there, as the Pointer operand must be);
- strides and offsets written `x & ~(align - 1)` (x itself on this path), so the driver's
  compiler can prove 16-byte aligned rows and use wide copies. jeffbolznv/
  vk_cooperative_matrix_perf (shaders/workgroup.comp) gets this from specialization
  constants (its M, N, K, strides are compile-time values, its buffers uvec4 arrays);
  llama.cpp's ggml-vulkan mul_mm_cm2.comp does it with these masks, as here;
- `unroll` K steps straight-line per loop iteration (llama.cpp unrolls 8), then the
  remaining full steps, then where TILE_K does not divide K one step through clamp-mode-
  Constant 2-D layouts (zeros past K).
Edge tiles and unaligned operands take the fully clamped 3-D loop above. The epilogue (one
C load and D store per tile) is shared and stays clamped.

Fused epilogue (traits.ops): after alpha * acc + beta * C as matrices, bias and
activation go through one OpCooperativeMatrixPerElementOpNV, which calls a function of
this module on every element of the accumulator with its (row, column) in the tile and,
as extra operands, the tile's origin and batch; the function adds bias[col] and applies
the activation (epilogue.ElementOps, shared with the khr kernel). The residual is then
loaded as a matrix like C, added, and the result rounded to D's type as a matrix.
Elements outside M x N (edge tiles) read bias[0] (always in the buffer), the residual's
clamped load gives them 0, and the clamped store discards them.

Requirements beyond the shared ABI: a nonzero batch stride must be at least
lines x leading dimension of its operand (OpTensorLayoutSetStrideNV's rule that an outer
stride covers the inner dimension), which contiguous batches always meet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from coopmat.codegen import abi
from coopmat.codegen.epilogue import ElementOps, Epilogue, EpilogueOps, Types, epilogue_buffers
from coopmat.codegen.plan import element_bytes
from coopmat.codegen.shader import Buffer, ShaderContext
from coopmat.codegen.spv import (
    BuiltIn,
    Capability,
    CooperativeMatrixUse,
    Op,
    Scope,
    TensorClampMode,
)
from coopmat.codegen.traits import Layout, Nv2Traits
from coopmat.codegen.types import (
    scalar_type,
    signedness_operands,
    type_capabilities,
    type_extension,
)
from coopmat.common.enums import ComponentType

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


def required_capabilities(traits: Nv2Traits) -> set[Capability]:
    caps = {Capability.Shader, Capability.VulkanMemoryModel, Capability.CooperativeMatrixKHR,
            Capability.CooperativeMatrixTensorAddressingNV, Capability.TensorAddressingNV}
    for ct in {traits.a_type, traits.b_type, traits.result_type, traits.stored_type}:
        caps.update(type_capabilities(ct, in_storage_buffer=True))
    if traits.ops is not None:
        caps.add(Capability.CooperativeMatrixPerElementOperationsNV)
    return caps


def check_traits(traits: Nv2Traits) -> None:
    """Raise ValueError for traits this family cannot build."""
    t, tile = traits, traits.tile
    if not isinstance(t, Nv2Traits):
        raise ValueError(f"traits of family {t.family!r}, not 'nv2'")
    if t.a_type != t.b_type or t.c_type != t.result_type:
        raise ValueError("nv2 kernels need A and B of one type and C of the result type")
    from coopmat.codegen.nv2_tiles import NV2_TYPES

    if (t.a_type, t.result_type) not in NV2_TYPES:
        raise ValueError(f"nv2 does not build {t.a_type!r} -> {t.result_type!r}")
    if t.out_type not in (None, t.result_type) and not (
            t.out_type == ComponentType.FLOAT16 and t.result_type == ComponentType.FLOAT32):
        raise ValueError(f"nv2 stores a {t.result_type!r} accumulator as itself or, for "
                         f"float32, as float16; not as {t.out_type!r}")
    if min(t.granularity) < 1:
        raise ValueError("granularities must be positive")
    if tile.tile_m % t.m_granularity or tile.tile_n % t.n_granularity or \
            tile.tile_k % t.k_granularity:
        raise ValueError(f"tile {tile.describe()} is not a multiple of the granularities "
                         f"{'x'.join(map(str, t.granularity))}")
    inv = t.invocations
    if inv < 1 or inv & (inv - 1):
        raise ValueError(f"workgroup size {inv} is not a power of two")
    if tile.buffering not in (1, 2):
        raise ValueError(f"buffering must be 1 or 2, not {tile.buffering}")


class _Operand:
    """A or B: its buffer, matrix type, base layout and how to slice it at a K step."""

    def __init__(self, buf: Buffer, mat: int, layout: int, batch: int, view: int | None,
                 k_outer: bool, origin: int, span: int) -> None:
        self.buf, self.mat, self.layout, self.batch, self.view = buf, mat, layout, batch, view
        self.k_outer = k_outer  # K is the layout's middle dimension (else its inner one)
        self.origin, self.span = origin, span  # tile origin and extent along M (A) / N (B)


class _FastOperand:
    """A or B on the fast path: element offset of its batch, unclamped and clamped 2-D
    layouts, the 2-D transposing view where column-major."""

    def __init__(self, op: _Operand, base: int, fast: int, tail: int,
                 view: int | None) -> None:
        self.op, self.base, self.fast, self.tail, self.view = op, base, fast, tail, view


class Nv2GemmEmitter:
    """`fast_path` adds the unclamped interior branch; `unroll` is its K steps per loop
    iteration. Both are codegen parameters for experiments (the family uses the defaults)."""

    def __init__(self, traits: Nv2Traits, *, fast_path: bool = True,
                 unroll: int = DEFAULT_UNROLL) -> None:
        check_traits(traits)
        if unroll < 1:
            raise ValueError(f"unroll must be at least 1, not {unroll}")
        self.t = traits
        self.s = ShaderContext()
        self.fast_path, self.unroll = fast_path, unroll

    def _declare(self) -> None:
        s, t, mb = self.s, self.t, self.s.mb
        tile = t.tile
        for ext in EXTENSIONS:
            mb.extension(ext)
        for type_ext in dict.fromkeys(type_extension(ct) for ct in (t.a_type, t.b_type)):
            if type_ext:
                mb.extension(type_ext)
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
        # C and D in memory: the accumulator's type, or a narrower one (out_type).
        self.o_el = scalar_type(mb, t.stored_type)
        self.mat_out = mb.type_coopmat(self.o_el, wg, tile.tile_m, tile.tile_n,
                                       CooperativeMatrixUse.MatrixAccumulator)
        self.layout_t = mb.type_tensor_layout(LAYOUT_DIMS, TensorClampMode.Constant)
        if Layout.COLUMN_MAJOR in (t.a_layout, t.b_layout):
            self.view_t = mb.type_tensor_view(LAYOUT_DIMS, False, TRANSPOSE)
        if self.fast_path:
            self.fast_t = mb.type_tensor_layout(2, TensorClampMode.Undefined)
            self.tail_t = mb.type_tensor_layout(2, TensorClampMode.Constant)
            if Layout.COLUMN_MAJOR in (t.a_layout, t.b_layout):
                self.view2_t = mb.type_tensor_view(2, False, TRANSPOSE_2D)
        self.float_result = t.result_type.is_float
        alpha_t = mb.type_float(32) if self.float_result else self.r_el

        self.bufs: dict[str, Buffer] = {}
        for name, binding, elem, ct, readonly in (
                ("A", abi.BINDING_A, self.a_el, t.a_type, True),
                ("B", abi.BINDING_B, self.b_el, t.b_type, True),
                ("D", abi.BINDING_D, self.o_el, t.stored_type, False),
                ("C", abi.BINDING_C, self.o_el, t.stored_type, True)):
            if name == "C" and not t.has_c:
                continue
            # C may be bound to D's memory (an in-place update), so only A and B are restrict.
            self.bufs[name] = s.storage_buffer(binding, elem, element_bytes(ct), readonly,
                                               name, restrict=name in ("A", "B"))
        ob = element_bytes(t.stored_type)
        bias, residual = epilogue_buffers(s, t.ops, self.o_el, ob)
        self.bufs.update({name: buf for name, buf in (("bias", bias), ("residual", residual))
                          if buf is not None})
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
        self.epilogue = Epilogue(s, float_result=self.float_result, acc_el=self.r_el,
                                 acc_is_f32=t.result_type == ComponentType.FLOAT32,
                                 alpha=P["alpha"], beta=P["beta"])
        view = s.tensor_view(self.view_t) if Layout.COLUMN_MAJOR in (t.a_layout,
                                                                      t.b_layout) else None
        # A is M x K: row-major lines are rows (M of them, K long), column-major lines are
        # columns (K of them, M long). B is K x N likewise.
        a_row = t.a_layout == Layout.ROW_MAJOR
        self.a_shape = (P["M"], P["K"]) if a_row else (P["K"], P["M"])
        layout, batch = self._layout(*self.a_shape, P["lda"], P["batch_stride_a"])
        self.A = _Operand(self.bufs["A"], self.mat_a, layout, batch, None if a_row else view,
                          k_outer=not a_row, origin=self.m0, span=tile.tile_m)
        b_row = t.b_layout == Layout.ROW_MAJOR
        self.b_shape = (P["K"], P["N"]) if b_row else (P["N"], P["K"])
        layout, batch = self._layout(*self.b_shape, P["ldb"], P["batch_stride_b"])
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
        flags = signedness_operands(t.a_type, t.b_type, t.c_type, t.result_type)
        return (flags,) if flags else ()

    def _k_loop(self) -> int:
        """Run the K loop (the fast path where the workgroup qualifies); return the final
        accumulator."""
        f = self.s.f
        acc_var = f.local(self.mat_acc, self.zero_acc)
        if self.fast_path:
            f.if_(self._fast_ok(), lambda: self._fast_k_loop(acc_var),
                  lambda: self._clamped_k_loop(acc_var))
        else:
            self._clamped_k_loop(acc_var)
        return f.op(Op.Load, self.mat_acc, acc_var)

    def _clamped_k_loop(self, acc_var: int) -> None:
        """Every K step through the 3-D clamp-mode-Constant layouts (exact at any edge)."""
        s, f, tile = self.s, self.s.f, self.t.tile
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

    # -- interior fast path -------------------------------------------------------------
    def _align(self, ct: ComponentType) -> int:
        """Elements per FAST_ALIGN_BYTES of an operand type."""
        return max(1, FAST_ALIGN_BYTES // element_bytes(ct))

    def _fast_ok(self) -> int:
        """Whether the workgroup's tile lies inside M x N and A's and B's leading dimensions
        and batch offsets are multiples of 16 bytes (uniform over the workgroup)."""
        s, t, P, tile = self.s, self.t, self.P, self.t.tile
        conds = [s.le(s.add(self.m0, s.c(tile.tile_m)), P["M"]),
                 s.le(s.add(self.n0, s.c(tile.tile_n)), P["N"])]
        for ct, ld, stride in ((t.a_type, "lda", "batch_stride_a"),
                               (t.b_type, "ldb", "batch_stride_b")):
            low = s.c(self._align(ct) - 1)
            for value in (P[ld], s.mul(self.batch, P[stride])):
                bits = s.f.op(Op.BitwiseAnd, s.u32, value, low)
                conds.append(s.f.op(Op.IEqual, s.bool, bits, s.c(0)))
        ok = conds[0]
        for c in conds[1:]:
            ok = s.and_(ok, c)
        return ok

    def _fast_operand(self, op: _Operand, ct: ComponentType, shape: tuple[int, int],
                      ld: str, batch_stride: str, view: int | None) -> _FastOperand:
        """2-D layouts at the batch's element offset with the alignment made visible to the
        compiler: `x & ~(align - 1)` is x itself here (checked by _fast_ok), but lets the
        driver prove 16-byte aligned rows and base, as llama.cpp's mul_mm_cm2 does for its
        strides and the peer benchmark gets from specialization constants."""
        s = self.s
        mask = s.c(~(self._align(ct) - 1) & 0xFFFFFFFF)
        ld_al = s.f.op(Op.BitwiseAnd, s.u32, self.P[ld], mask)
        base = s.f.op(Op.BitwiseAnd, s.u32, s.mul(self.batch, self.P[batch_stride]), mask)
        fast = s.tensor_layout(self.fast_t, list(shape), [ld_al, s.c(1)])
        tail = s.tensor_layout(self.tail_t, list(shape), [ld_al, s.c(1)], clamp_value=s.c(0))
        return _FastOperand(op, base, fast, tail, view)

    def _fast_load(self, fo: _FastOperand, zero: int, k0: int, tail: bool) -> int:
        s, tk = self.s, self.t.tile.tile_k
        op = fo.op
        k_range, mn_range = (k0, s.c(tk)), (op.origin, s.c(op.span))
        rows, cols = (k_range, mn_range) if op.k_outer else (mn_range, k_range)
        lt, layout = (self.tail_t, fo.tail) if tail else (self.fast_t, fo.fast)
        sliced = s.tensor_slice(lt, layout, [rows, cols])
        return s.coop_load_tensor(op.mat, op.buf, fo.base, zero, sliced, fo.view)

    def _fast_k_loop(self, acc_var: int) -> None:
        """Interior tile: K // TILE_K steps through unclamped (clamp mode Undefined) 2-D
        layouts, `unroll` of them per loop iteration, then the remaining full steps one at a
        time and, where TILE_K does not divide K, one last step through the clamped 2-D
        layouts (zeros past K)."""
        s, f, t, tile = self.s, self.s.f, self.t, self.t.tile
        view = s.tensor_view(self.view2_t) if Layout.COLUMN_MAJOR in (t.a_layout,
                                                                       t.b_layout) else None
        fa = self._fast_operand(self.A, t.a_type, self.a_shape, "lda", "batch_stride_a",
                                None if self.A.view is None else view)
        fb = self._fast_operand(self.B, t.b_type, self.b_shape, "ldb", "batch_stride_b",
                                None if self.B.view is None else view)
        flags = self._mul_operands()
        tk = s.c(tile.tile_k)
        steps = s.udiv(self.P["K"], tk)
        i_var = f.local(s.u32, s.c(0))

        def load(k0: int, tail: bool = False) -> tuple[int, int]:
            return (self._fast_load(fa, self.zero_a, k0, tail),
                    self._fast_load(fb, self.zero_b, k0, tail))

        def mma(ab: tuple[int, int]) -> None:
            acc = f.op(Op.Load, self.mat_acc, acc_var)
            f.emit(Op.Store, acc_var, f.op(Op.CooperativeMatrixMulAddKHR, self.mat_acc,
                                           ab[0], ab[1], acc, *flags))

        def run(count: int) -> None:
            i = f.op(Op.Load, s.u32, i_var)
            k0s = [s.mul(s.add(i, s.c(j)), tk) if j else s.mul(i, tk) for j in range(count)]
            if tile.buffering == 2:  # each step's successor loads go out before its multiply
                ab = load(k0s[0])
                for j in range(count):
                    nxt = load(k0s[j + 1]) if j + 1 < count else None
                    mma(ab)
                    if nxt is not None:
                        ab = nxt
            else:
                for k0 in k0s:
                    mma(load(k0))

        def advance(by: int) -> Callable[[], None]:
            return lambda: f.emit(Op.Store, i_var,
                                  s.add(f.op(Op.Load, s.u32, i_var), s.c(by)))

        u = self.unroll
        if u > 1:
            f.while_(lambda: s.le(s.add(f.op(Op.Load, s.u32, i_var), s.c(u)), steps),
                     lambda: run(u), advance(u))
        f.while_(lambda: s.lt(f.op(Op.Load, s.u32, i_var), steps), lambda: run(1),
                 advance(1))
        rest = s.f.op(Op.INotEqual, s.bool, s.umod(self.P["K"], tk), s.c(0))
        f.if_(rest, lambda: mma(load(s.mul(steps, tk), tail=True)))

    # -- epilogue -----------------------------------------------------------------------
    def _epilogue(self, acc: int) -> None:
        s, t, P, tile = self.s, self.t, self.P, self.t.tile
        rows, cols = (self.m0, s.c(tile.tile_m)), (self.n0, s.c(tile.tile_n))

        def load_tile(buf: str, ld: str, batch_stride: str) -> Callable[[int], int]:
            """Loader of this tile of C (or of the residual, addressed like D) in D's
            type; clamp mode Constant: zeros outside M x N."""
            def load(mat_type: int) -> int:
                layout, batch = self._layout(P["M"], P["N"], P[ld], P[batch_stride])
                zero = s.mb.const_composite(mat_type, [s.mb.const_null(self.o_el)])
                return s.coop_load_tensor(mat_type, self.bufs[buf], s.c(0), zero,
                                          self._tile_slice(layout, batch, rows, cols))
            return load

        load_c = load_tile("C", "ldc", "batch_stride_c") if t.has_c else None
        types = Types(self.mat_acc, self.mat_out)
        if t.ops is None:
            result = self.epilogue.apply(types, acc, load_c, matrix=True)
        else:
            value = self.epilogue.combine(types, acc, load_c, matrix=True)
            result = self._fused(value, load_tile("residual", "ldd", "batch_stride_d"))
        layout, batch = self._layout(P["M"], P["N"], P["ldd"], P["batch_stride_d"])
        # Clamp mode Constant: elements outside M x N (edge tiles) are not stored.
        s.coop_store_tensor(self.bufs["D"], s.c(0), result,
                            self._tile_slice(layout, batch, rows, cols))

    def _fused(self, value: int, load_residual: Callable[[int], int]) -> int:
        """act(value + bias) + residual, rounded to D's type once: in float32 whatever
        the accumulator (a float16 one is widened first; integer results: in their
        accumulator's type). Bias and activation go through the per-element function
        (bias needs each element's column); the residual is a matrix loaded like C (one
        coalesced tensor load, not a load per element, which measured twice the cost).
        The activation on this invocation's components in a loop instead, as the khr
        kernel does, measured slower here."""
        s, f, t, tile = self.s, self.s.f, self.t, self.t.tile
        assert t.ops is not None
        add = Op.FAdd if self.float_result else Op.IAdd
        convert = Op.FConvert if self.float_result else Op.SConvert
        work_el = s.mb.type_float(32) if self.float_result else self.r_el
        work = s.mb.type_coopmat(work_el, int(Scope.Workgroup), tile.tile_m, tile.tile_n,
                                 CooperativeMatrixUse.MatrixAccumulator)
        if work != self.mat_acc:
            value = f.op(convert, work, value)
        in_function = replace(t.ops, residual=False)
        if in_function.fused:
            value = f.op(Op.CooperativeMatrixPerElementOpNV, work, value,
                         self._per_element_function(in_function, work_el), self.m0,
                         self.n0, self.batch)
        if t.ops.residual:
            res = load_residual(self.mat_out)
            value = f.op(add, work, value, res if self.mat_out == work else
                         f.op(convert, work, res))
        return value if work == self.mat_out else f.op(
            Op.FConvert if self.float_result else Op.UConvert, self.mat_out, value)

    def _per_element_function(self, ops: EpilogueOps, work_el: int) -> int:
        """The function OpCooperativeMatrixPerElementOpNV calls: (row, column, element,
        m0, n0, batch) -> the element with `ops` (bias, activation) applied, all of type
        work_el. It reads the push constants itself (ids do not cross functions).
        Elements outside M x N (edge tiles) read bias[0] (always in the buffer); the
        clamped store discards them."""
        s, mb = self.s, self.s.mb
        params = [s.u32, s.u32, work_el, s.u32, s.u32, s.u32]
        fb = mb.function(work_el, mb.type_function(work_el, *params), params)
        main, s.f = s.f, fb  # the ShaderContext helpers emit into the current function
        try:
            row, col, value, m0, n0, _batch = fb.params
            gi, gj = s.add(m0, row), s.add(n0, col)
            bias = self.bufs.get("bias")

            def load_bias(r: int, c: int) -> int:
                assert bias is not None
                inside = s.and_(s.lt(gi, s.param("M")), s.lt(gj, s.param("N")))
                return s.buffer_load(bias, s.select(s.u32, inside, c, s.c(0)))

            eops = ElementOps(s, ops, float_result=self.float_result, stored_el=self.o_el,
                              load_bias=load_bias if ops.bias else None,
                              load_residual=None, work_el=work_el)
            fb.finish(eops.apply(value, work_el, gi, gj, work_el))
        finally:
            s.f = main
        return fb.id

    def build(self) -> bytes:
        self._declare()
        self._setup()
        self._epilogue(self._k_loop())
        s = self.s
        return s.compute_module(self.t.invocations)


def emit_nv2_gemm(traits: Nv2Traits, *, fast_path: bool = True,
                  unroll: int = DEFAULT_UNROLL) -> bytes:
    return Nv2GemmEmitter(traits, fast_path=fast_path, unroll=unroll).build()
