"""The epilogue every kernel family ends with: D = alpha * acc + beta * C, in D's type,
and the optional fused operations after it (EpilogueOps, emitted by ElementOps):

    D[m, n] = act(alpha * acc + beta * C[m, n] + bias[n]) + residual[m, n]

One emitter for both families and both granularities (a whole cooperative matrix, or one
element: the khr kernel's bounds-checked edge path, and its every tile where the kernel
takes the scratch path throughout, KhrTraits.scratch_epilogue). A whole matrix is rounded
to D's type as an accumulator matrix of that type, so the khr kernel uses that form only
where the device lists one (KhrTraits.out_matrix). The arithmetic runs in the
accumulator's type; C is read in D's type and widened; the result is rounded to D's type
once, at the end (a float16 result of a float32 accumulator is numpy's accuracy).

alpha and beta arrive as push constants: float32 for float results, the result's integer
type otherwise (abi.py); a float16 accumulator takes them converted once, up front.

The fused operations run on the khr kernel's whole matrices where it stores them
directly (bias and residual as matrices, the activation on each invocation's components)
and element by element elsewhere, in float32 whatever the accumulator (integer results:
bias and residual only, in the accumulator's type); bias and residual are read in D's
type and widened, and the result is rounded to D's type once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from coopmat.codegen import abi
from coopmat.codegen.shader import Buffer, ShaderContext
from coopmat.codegen.spv import GLSLstd450, Op
from coopmat.codegen.traits import Activation, EpilogueOps

__all__ = ["Activation", "ElementOps", "Epilogue", "EpilogueOps", "Types", "buffer_element_ops",
           "epilogue_buffers"]


ElementLoader = Callable[[int, int], int]

LOG2_E = math.log2(math.e)
# gelu_tanh's exponent: -2 sqrt(2/pi) (x + 0.044715 x^3) log2(e) = x (GELU_K0 + GELU_K1 x^2).
GELU_K0 = -2.0 * math.sqrt(2.0 / math.pi) * LOG2_E
GELU_K1 = GELU_K0 * 0.044715
EXP2_MAX = 64.0  # gelu_tanh and silu: 2^power at most 2^64 (_over_one_plus_exp2)


class ElementOps:
    """Emits the fused operations for one element: act(value + bias[col]) +
    residual[row, col]. Shared by every kernel family (the khr kernel's per-element store,
    nv2's per-element function); a kernel gives the loaders, each emitting the load of
    the element at (row, col) in D's stored type (`load_bias` reads only col). Loaders
    run inside whatever function is being emitted (ShaderContext.f) at the time."""

    def __init__(self, s: ShaderContext, ops: EpilogueOps, *, float_result: bool,
                 stored_el: int, load_bias: ElementLoader | None,
                 load_residual: ElementLoader | None, work_el: int | None = None) -> None:
        """`work_el`: the arithmetic's type for integer results (their accumulator);
        float results always compute in float32."""
        if ops.activation is not None and not float_result:
            raise ValueError(f"the {ops.activation.value} activation needs a float result")
        if ops.bias != (load_bias is not None) or ops.residual != (load_residual is not None):
            raise ValueError("a loader is needed for bias and residual, and only for them")
        self.s, self.ops, self.float_result = s, ops, float_result
        self.stored_el = stored_el
        self.load_bias, self.load_residual = load_bias, load_residual
        if float_result:
            self.work = s.mb.type_float(32)
        elif work_el is not None:
            self.work = work_el
        else:
            raise ValueError("integer results need work_el (their accumulator type)")
        self.glsl = s.mb.ext_inst_import("GLSL.std.450") if ops.activation else 0

    def convert(self, value: int, src: int, dst: int) -> int:
        if src == dst:
            return value
        return self.s.f.op(Op.FConvert if self.float_result else Op.UConvert, dst, value)

    def _const(self, x: float) -> int:
        return self.s.mb.constant(self.work, x)

    def _ext(self, inst: GLSLstd450, *args: int) -> int:
        return self.s.f.op(Op.ExtInst, self.work, self.glsl, inst, *args)

    def activate(self, x: int) -> int:
        """The activation of `x` (a scalar of the work type); x itself where there is none."""
        return self._activation(x) if self.ops.activation is not None else x

    def _activation(self, x: int) -> int:
        f, w, act = self.s.f, self.work, self.ops.activation
        if act is Activation.RELU:
            # x < 0 ? 0 : x keeps NaN a NaN (GLSL's FMax may return either operand).
            neg = f.op(Op.FOrdLessThan, self.s.bool, x, self._const(0.0))
            return f.op(Op.Select, w, neg, self._const(0.0), x)
        if act is Activation.GELU_TANH:
            # 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3) is x / (1 + e^(-2u)),
            # and -2u log2(e) = x (GELU_K0 + GELU_K1 x^2): constants folded here, as the
            # driver keeps every multiplication it is given.
            x2 = f.op(Op.FMul, w, x, x)
            poly = f.op(Op.FAdd, w, self._const(GELU_K0),
                        f.op(Op.FMul, w, self._const(GELU_K1), x2))
            return self._over_one_plus_exp2(x, f.op(Op.FMul, w, x, poly))
        if act is Activation.SILU:
            # x / (1 + e^-x), e^-x = 2^(-log2(e) x).
            return self._over_one_plus_exp2(x, f.op(Op.FMul, w, x, self._const(-LOG2_E)))
        raise ValueError(f"unknown activation {act!r}")

    def _over_one_plus_exp2(self, x: int, power: int) -> int:
        """x / (1 + 2^power), power clamped to EXP2_MAX: divisors of inf are slow on
        NVIDIA GPUs. Past the clamp the quotient is below 2^-64 |x| either way (x / inf
        was -0). NaN stays NaN through x, whichever operand FMin returns for a NaN power.
        Exp2, not Exp: GLSL.std.450 Exp (or Tanh) measured several times slower, Exp2
        nothing measurable (docs/design.md, Kernels); callers fold log2(e) into their
        constants."""
        f, w = self.s.f, self.work
        e = self._ext(GLSLstd450.Exp2, self._ext(GLSLstd450.FMin, power,
                                                 self._const(EXP2_MAX)))
        return f.op(Op.FDiv, w, x, f.op(Op.FAdd, w, self._const(1.0), e))

    def apply(self, value: int, value_el: int, row: int, col: int, result_el: int) -> int:
        """The fused operations on `value` (of type value_el: alpha * acc + beta * C in
        the accumulator's type) at D's (row, col); returned in type result_el."""
        s, w = self.s, self.work
        add = Op.FAdd if self.float_result else Op.IAdd
        x = self.convert(value, value_el, w)
        if self.load_bias is not None:
            b = self.convert(self.load_bias(row, col), self.stored_el, w)
            x = s.f.op(add, w, x, b)
        if self.ops.activation is not None:
            x = self._activation(x)
        if self.load_residual is not None:
            r = self.convert(self.load_residual(row, col), self.stored_el, w)
            x = s.f.op(add, w, x, r)
        return self.convert(x, w, result_el)


def epilogue_buffers(s: ShaderContext, ops: EpilogueOps | None, stored_el: int,
                     stored_bytes: int) -> tuple[Buffer | None, Buffer | None]:
    """The bias and residual bindings (abi.BINDING_BIAS, abi.BINDING_RESIDUAL) of the
    fused operations `ops` asks for, elements of D's stored type; None for each it does
    not. Only bias is restrict: a caller may pass D's own memory as the residual."""
    bias = s.storage_buffer(abi.BINDING_BIAS, stored_el, stored_bytes, True, "bias",
                            restrict=True) if ops and ops.bias else None
    residual = s.storage_buffer(abi.BINDING_RESIDUAL, stored_el, stored_bytes, True,
                                "residual") if ops and ops.residual else None
    return bias, residual


def buffer_element_ops(s: ShaderContext, ops: EpilogueOps | None, *, float_result: bool,
                       stored_el: int, bias: Buffer | None, residual: Buffer | None,
                       base_d: int, ldd: int, work_el: int | None = None) -> ElementOps | None:
    """ElementOps reading bias[col] and the residual addressed exactly like D (base_d +
    row * ldd + col) from the buffers of epilogue_buffers; None without fused operations."""
    if ops is None:
        return None

    def load_bias(row: int, col: int) -> int:
        assert bias is not None
        return s.buffer_load(bias, col)

    def load_residual(row: int, col: int) -> int:
        assert residual is not None
        return s.buffer_load(residual, s.add(base_d, s.add(s.mul(row, ldd), col)))

    return ElementOps(s, ops, float_result=float_result, stored_el=stored_el,
                      load_bias=load_bias if bias else None,
                      load_residual=load_residual if residual else None, work_el=work_el)


@dataclass(frozen=True)
class Types:
    """Type ids of one granularity: accumulator and stored (C/D) forms."""

    acc: int
    out: int


class Epilogue:
    def __init__(self, s: ShaderContext, *, float_result: bool, acc_el: int, acc_is_f32: bool,
                 alpha: int, beta: int) -> None:
        self.s = s
        self.float_result = float_result
        if float_result and not acc_is_f32:
            alpha = s.f.op(Op.FConvert, acc_el, alpha)
            beta = s.f.op(Op.FConvert, acc_el, beta)
        self.alpha, self.beta = alpha, beta

    def _convert(self, value: int, src: int, dst: int) -> int:
        if src == dst:
            return value
        return self.s.f.op(Op.FConvert if self.float_result else Op.UConvert, dst, value)

    def _scale(self, types: Types, value: int, factor: int, matrix: bool) -> int:
        if matrix:
            return self.s.scale_matrix(types.acc, value, factor, self.float_result)
        mul = Op.FMul if self.float_result else Op.IMul
        return self.s.f.op(mul, types.acc, value, factor)

    def apply(self, types: Types, acc: int, load_c: Callable[[int], int] | None, *,
              matrix: bool) -> int:
        """alpha * acc (+ beta * C) in the accumulator type, returned in D's type.

        `load_c(out_type)` emits the load of C (matrix or element, as `matrix` says) in
        D's type; None where the kernel has no C."""
        return self._convert(self.combine(types, acc, load_c, matrix=matrix), types.acc,
                             types.out)

    def element(self, types: Types, acc: int, load_c: Callable[[int], int] | None,
                element_ops: ElementOps | None, row: int, col: int) -> int:
        """One element of D in D's type: apply's, or with fused operations
        element_ops.apply on combine's value at (row, col)."""
        if element_ops is None:
            return self.apply(types, acc, load_c, matrix=False)
        return element_ops.apply(self.combine(types, acc, load_c, matrix=False), types.acc,
                                 row, col, types.out)

    def combine(self, types: Types, acc: int, load_c: Callable[[int], int] | None, *,
                matrix: bool) -> int:
        """alpha * acc (+ beta * C), left in the accumulator type (for ElementOps)."""
        value = self._scale(types, acc, self.alpha, matrix)
        if load_c is not None:
            c = self._convert(load_c(types.out), types.out, types.acc)
            add = Op.FAdd if self.float_result else Op.IAdd
            value = self.s.f.op(add, types.acc, value, self._scale(types, c, self.beta, matrix))
        return value
