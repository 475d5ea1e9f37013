"""The fused epilogue's arguments (bias, activation, residual): named, prepared for
matmul's numpy path (their checks: coopmat.api.rules), and computed on the host where no
kernel runs (K == 0).

    result = act(alpha * a @ b + beta * c + bias) + residual

bias has one element per column of the result (shape (N,)); residual has the result's
shape. Both are cast to the result dtype under numpy's "same_kind" rule (as c is), so a
float bias of an integer result is a TypeError. Activations run on float results only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from coopmat.api.rules import check_bias_shape, check_into_result, check_residual_shape
from coopmat.codegen.traits import Activation, EpilogueOps

ACTIVATIONS = tuple(a.value for a in Activation)


def activation_of(activation: Any) -> Activation | None:
    """An Activation from its name (or itself); None passes through."""
    if activation is None or isinstance(activation, Activation):
        return activation
    try:
        return Activation(activation)
    except ValueError:
        raise ValueError(f"matmul: unknown activation {activation!r}; valid names are "
                         f"{', '.join(map(repr, ACTIVATIONS))} (or None)") from None


def ops_of(bias: Any, activation: Any, residual: Any) -> EpilogueOps | None:
    """The EpilogueOps a call asks for; None where it fuses nothing."""
    ops = EpilogueOps(bias=bias is not None, activation=activation_of(activation),
                      residual=residual is not None)
    return ops if ops.fused else None


def host_bias(bias: Any, N: int, result_dtype: np.dtype) -> np.ndarray:
    """bias checked and as a contiguous (N,) array of the result dtype."""
    b = np.asarray(bias)
    check_bias_shape(b.shape, N)
    check_into_result("bias", b.dtype, result_dtype)
    return np.ascontiguousarray(b, dtype=result_dtype)


def host_residual(residual: Any, shape: tuple[int, ...], result_dtype: np.dtype) -> np.ndarray:
    """residual checked and as a C-contiguous array of the result's shape and dtype."""
    r = np.asarray(residual)
    check_residual_shape(r.shape, shape)
    check_into_result("residual", r.dtype, result_dtype)
    return np.ascontiguousarray(r, dtype=result_dtype)


def activate(x: np.ndarray, activation: Activation | None) -> np.ndarray:
    """The activation on float32 values, with the kernel's formulas."""
    if activation is None:
        return x
    with np.errstate(over="ignore", invalid="ignore"):
        if activation is Activation.RELU:
            return np.where(x < 0, np.float32(0), x)
        if activation is Activation.GELU_TANH:
            u = np.float32(math.sqrt(2 / math.pi)) * (x + np.float32(0.044715) * x * x * x)
            return np.float32(0.5) * x * (1 + np.tanh(np.clip(u, -10, 10)))
        return x / (1 + np.exp(-x))


def host_epilogue(value: np.ndarray, ops: EpilogueOps | None, bias: np.ndarray | None,
                  residual: np.ndarray | None) -> np.ndarray:
    """act(value + bias) + residual in float32 (or value's integer type): where no kernel
    runs (K == 0), so that every shape follows one definition."""
    x = value.astype(np.float32 if value.dtype.kind == "f" else value.dtype)
    if ops is None:
        return x
    if bias is not None:
        x = x + bias.astype(x.dtype)
    x = activate(x, ops.activation)
    if residual is not None:
        x = x + residual.astype(x.dtype)
    return x
