"""The epilogue every kernel family ends with: D = alpha * acc + beta * C, in D's type.

One emitter for both families and both granularities (a whole cooperative matrix, or one
element on the khr kernel's bounds-checked edge path). The arithmetic runs in the
accumulator's type; C is read in D's type and widened; the result is rounded to D's type
once, at the end (a float16 result of a float32 accumulator is numpy's accuracy).

alpha and beta arrive as push constants: float32 for float results, the result's integer
type otherwise (abi.py); a float16 accumulator takes them converted once, up front.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from coopmat.codegen.shader import ShaderContext
from coopmat.codegen.spv import Op


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
        value = self._scale(types, acc, self.alpha, matrix)
        if load_c is not None:
            c = self._convert(load_c(types.out), types.out, types.acc)
            add = Op.FAdd if self.float_result else Op.IAdd
            value = self.s.f.op(add, types.acc, value, self._scale(types, c, self.beta, matrix))
        return self._convert(value, types.acc, types.out)
