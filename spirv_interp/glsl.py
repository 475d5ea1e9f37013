"""The GLSL.std.450 extended instructions coopmat's shaders use, written from the
"GLSL.std.450 Extended Instructions" specification (version 1.00, revision 9) and the
Vulkan precision rules for them:

- Trunc (3), FAbs (4), FSign (6): exact.
- Exp2 (29): 2^x, computed here in float64 and rounded once to the type (Vulkan allows
  3 + 2|x| ulp; an oracle gives the closest value).
- FMin (37), FMax (40): the smaller / larger operand; where one operand is a NaN the
  specification leaves the result undefined, and here it is the other operand.
- Fma (50): a * b + c formed in float64 and rounded once to the type (Vulkan lets Fma be
  an OpFMul followed by an OpFAdd, so either rounding is allowed).

Operands and results are floating-point scalars or vectors of one type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .machine import EXT_SETS, Mask, Run, Wave, _float_type, _rtype, _setter
from .module import Ins, Module, Type, UndefinedBehavior, lane_ndim, np_dtype

GLSL_STD_450 = "GLSL.std.450"


def _elementwise(fn: Callable[..., Any], arity: int) -> Callable[[Ins, Module, list[int]], Run]:
    def factory(ins: Ins, mod: Module, operands: list[int]) -> Run:
        t = _rtype(ins)
        dt = _float_dtype(t, ins)
        if len(operands) != arity:
            raise UndefinedBehavior(f"{ins}: {arity} operands expected")
        for o in operands:
            ot = mod.value_types.get(o)
            if ot is None or _float_dtype(ot, ins) != dt or lane_ndim(ot) != lane_ndim(t):
                raise UndefinedBehavior(f"{ins}: operand %{o} does not have the result's type")
        put = _setter(ins)

        def run(w: Wave, mask: Mask) -> None:
            args = [np.asarray(w.values[o]).astype(np.float64) for o in operands]
            with np.errstate(over="ignore", invalid="ignore"):
                put(w, np.asarray(fn(*args)).astype(dt), mask)
        return run
    return factory


def _float_dtype(t: Type, ins: Ins) -> np.dtype:
    return np_dtype(_float_type(t, ins))


EXT_SETS[GLSL_STD_450] = {
    3: _elementwise(np.trunc, 1),
    4: _elementwise(np.abs, 1),
    6: _elementwise(np.sign, 1),
    29: _elementwise(np.exp2, 1),
    37: _elementwise(np.fmin, 2),
    40: _elementwise(np.fmax, 2),
    50: _elementwise(lambda a, b, c: a * b + c, 3),
}
