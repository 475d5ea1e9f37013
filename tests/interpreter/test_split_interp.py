"""Split-K kernels of every recorded device, executed by the reference interpreter.

A split runs S slices of K as workgroups of one dispatch; the last workgroup of each tile
to arrive at its counter (OpAtomicIAdd) sums the float32 partials and finishes D, and sets
the counter back to zero (OpAtomicStore). The interpreter runs the workgroups one after
another, so the counters' order is the dispatch's; what it checks is the rest: addresses,
bounds, the partials' layout, the finish's arithmetic and D's four-element stores (a
vec4 view of D's binding, aliasing it), at each device's subgroup size and matrix shapes,
against float64 numpy.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from epilogue_oracle import act64
from test_interpreter import DEVICES, matrix_configs

from coopmat.codegen import KhrTraits, Layout, abi, build_gemm
from coopmat.codegen.traits import Activation, EpilogueOps
from coopmat.device.model import PhysicalDeviceInfo
from coopmat.policy import Options, resolve
from coopmat.policy.kernel import (
    KernelChoice,
    OperandLayout,
    Problem,
    choose,
    general_variant,
    slice_problem,
    split_choice,
)
from spirv_interp import Interpreter

F16, F32 = np.float16, np.float32
S = 4


def _problem(info: PhysicalDeviceInfo, M: int, N: int, K: int, out: type,
             ops: EpilogueOps | None = None) -> Problem:
    return Problem(resolve(info, F16, F16, out), M, N, K, OperandLayout(Layout.ROW_MAJOR, K),
                   OperandLayout(Layout.COLUMN_MAJOR, K), has_c=ops is None, alpha=0.5,
                   beta=-2.0 if ops is None else 0, ops=ops)


def _forced_or_none(info: PhysicalDeviceInfo, p: Problem) -> KernelChoice | None:
    """The policy's split of S for p (forced), or None where it runs unsplit."""
    choice = choose(info, p, Options(split_k=S, family="khr"))
    return choice if choice.split_k == S else None


def _forced(info: PhysicalDeviceInfo, p: Problem) -> KernelChoice:
    """The policy's split of S for p (forced), or a skip where the device's list allows none."""
    choice = _forced_or_none(info, p)
    if choice is None:
        pytest.skip(f"no split of {S} for {p.M} x {p.N} x {p.K} here")
    return choice


def _run(info: PhysicalDeviceInfo, p: Problem, choice: KernelChoice, seed: int = 0) -> None:
    """The split `choice` of p on the interpreter: D against float64, the counters back
    at 0."""
    t = choice.traits
    assert isinstance(t, KhrTraits) and t.split_k == S
    rng = np.random.default_rng(seed)
    M, N, K = p.M, p.N, p.K
    out = np.dtype(F16 if p.pair.stored.bits == 16 else F32)
    a = rng.standard_normal((M, K)).astype(F16)
    w = rng.standard_normal((N, K)).astype(F16)
    c = rng.standard_normal((M, N)).astype(out)
    bias, res = rng.standard_normal(N).astype(out), rng.standard_normal((M, N)).astype(out)
    tiles, _, stride_p = abi.split_layout(t, M, N)
    junk = np.full(abi.overread_elems(t, K, "a") + 64, np.nan, F16)
    buffers = {abi.BINDING_A: np.concatenate([a.ravel(), junk]),
               abi.BINDING_B: np.concatenate([w.ravel(), junk]),
               abi.BINDING_D: np.full(M * N, 77, out),
               abi.BINDING_PARTIALS: np.full(S * stride_p, np.nan, F32),
               abi.BINDING_COUNTERS: np.zeros(tiles, np.uint32)}
    if p.has_c:
        buffers[abi.BINDING_C] = c.ravel().copy()
    if p.ops is not None:
        buffers[abi.BINDING_BIAS] = bias.copy()
        buffers[abi.BINDING_RESIDUAL] = res.ravel().copy()
    kernel = build_gemm(t)
    Interpreter(kernel.spirv, subgroup_size=t.subgroup_size,
                matrix_configs=matrix_configs(info)).dispatch(
        kernel.workgroups(M, N, S), buffers, kernel.push_constants(choice.params))
    x = a.astype(np.float64) @ w.T.astype(np.float64)
    extra: np.ndarray | float = 0.0
    mag = 0.5 * np.abs(a).astype(np.float64) @ np.abs(w.T).astype(np.float64)
    if p.ops is None:
        ref = 0.5 * x - 2.0 * c.astype(np.float64)
        mag = mag + 2.0 * np.abs(c.astype(np.float64))
    else:
        act = p.ops.activation.value if p.ops.activation else None
        pre = 0.5 * x + bias.astype(np.float64)
        ref = act64(pre, act) + res.astype(np.float64)
        # the activations' slopes are at most 1.13
        mag = 1.2 * (mag + np.abs(bias.astype(np.float64))) + np.abs(res.astype(np.float64))
        if act is not None:  # their float32 exp2 and divisions
            extra = 1e-6 * (1 + np.abs(pre))
    # K roundings of the float32 sums and a few in the epilogue, two roundings to D
    u_out = 2.0 ** -11 if out == F16 else 2.0 ** -24
    tol = (K + 4) * 2.0 ** -24 * mag + 2 * u_out * np.abs(ref) + 1e-6 + extra
    err = np.abs(buffers[abi.BINDING_D].reshape(M, N).astype(np.float64) - ref)
    assert np.all(err <= tol), (t.describe(), float(err.max()),
                                np.unravel_index(int(err.argmax()), err.shape))
    np.testing.assert_array_equal(buffers[abi.BINDING_COUNTERS], 0)


# Whole tiles and tiles past both edges, C, alpha and beta; float16 and float32 D.
@pytest.mark.parametrize("name,info", DEVICES, ids=[n for n, _ in DEVICES])
@pytest.mark.parametrize("out", [F16, F32])
def test_split_matches_numpy(name: str, info: PhysicalDeviceInfo, out: type) -> None:
    p = _problem(info, 70, 72, 256, out)
    _run(info, p, _forced(info, p))


@pytest.mark.parametrize("name,info", DEVICES, ids=[n for n, _ in DEVICES])
@pytest.mark.parametrize("act", [None, *Activation], ids=["none", *(a.value for a in Activation)])
def test_split_with_epilogue(name: str, info: PhysicalDeviceInfo, act: Activation | None) -> None:
    """The bias, each activation and the residual, applied by the finishing workgroup."""
    p = _problem(info, 70, 72, 256, F16, EpilogueOps(bias=True, activation=act, residual=True))
    _run(info, p, _forced(info, p))


def test_general_variant_of_an_unaligned_d() -> None:
    """The general variant's split of a float16 D whose rows (68 elements, 136 bytes) do
    not start on 16 bytes, with the H200's matrices: right here, wrong on the H200 itself
    (docs/design.md, Split-K), so the policy runs such products unsplit."""
    (info,) = [i for n, i in DEVICES if n.startswith("nvidia-h200")][:1]
    p = _problem(info, 70, 68, 256, F16)
    assert _forced_or_none(info, p) is None
    choice = split_choice(p, choose(info, slice_problem(p, S), Options(family="khr")), S)
    assert isinstance(choice.traits, KhrTraits)
    _run(info, p, replace(choice, traits=general_variant(choice.traits)))
