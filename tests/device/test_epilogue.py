"""The fused epilogue: D = act(alpha * A @ B + beta * C + bias) + residual.

Live tests (khr kernels on the device scripts/test runs, lavapipe in CI) compare with a
float64 numpy oracle of that formula (torch's definitions: gelu with approximate="tanh",
silu = x * sigmoid(x)); the tolerance is the K-term dot-product bound of test_matmul plus
the result's rounding and a small allowance for the device's tanh/exp. The nv2 kernel
(no CPU driver runs it) is checked with spirv-val here, on the nv2 emulator in
test_codegen_nv2, and live where a device runs it. Codegen and policy tests need no device.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from epilogue_oracle import act64, check, oracle
from sampling import pairwise
from spirv_checks import assert_valid

import coopmat
import coopmat.api.matmul
from coopmat.api.fused import ops_of
from coopmat.codegen import abi
from coopmat.codegen.epilogue import ElementOps
from coopmat.codegen.family import family_for
from coopmat.codegen.shader import ShaderContext
from coopmat.codegen.spv import Op
from coopmat.codegen.tools import find_tool
from coopmat.codegen.traits import Activation, EpilogueOps, KhrTraits, Nv2Traits
from coopmat.common.enums import ComponentType as CT
from coopmat.common.errors import MissingFeatureError
from coopmat.device.record import load_records
from coopmat.policy import OperandLayout, Options, Problem, TypePair, choose
from coopmat.policy.variants import device_variants

DATA = Path(__file__).parents[1] / "data"
(H200,) = load_records(DATA / "nvidia-h200-khr-coopmat.json")
RNG = np.random.default_rng(77)
ACTS = [None, "relu", "gelu_tanh", "silu"]

needs_spirv_val = pytest.mark.skipif(find_tool("spirv-val") is None,
                                     reason="spirv-val not found")


def f16(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float16)


# -- codegen ----------------------------------------------------------------------------

def _traits(family: type, n: int = 2) -> list:
    return [t for t in device_variants(H200)
            if isinstance(t, family) and t.result_type.is_float][:n]


def test_kernels_without_ops_are_unchanged() -> None:
    """ops=None is the default: no new bindings, no GLSL import, the recorded names; an
    ops-less kernel's SPIR-V does not depend on whether the field was written."""
    for t in _traits(KhrTraits) + _traits(Nv2Traits):
        assert t.ops is None
        assert "epi" not in t.describe()
        assert abi.bindings(t) == (0, 1, 2, 3)[:4 if t.has_c else 3]
        spv = family_for(t).generate(t)
        assert b"GLSL.std.450" not in spv
        assert family_for(replace(t, ops=None)).generate(replace(t, ops=None)) == spv
        with_ops = replace(t, ops=EpilogueOps(bias=True, residual=True))
        assert abi.bindings(with_ops)[-2:] == (abi.BINDING_BIAS, abi.BINDING_RESIDUAL)
        assert with_ops.describe() == t.describe() + "-epi_bias_res"


OPS = [EpilogueOps(bias=True, activation=Activation.GELU_TANH, residual=True),
       EpilogueOps(activation=Activation.SILU),
       EpilogueOps(bias=True, activation=Activation.RELU)]


@needs_spirv_val
@pytest.mark.parametrize("ops", OPS, ids=lambda o: o.describe())
def test_spirv_val_khr(ops: EpilogueOps) -> None:
    for t in _traits(KhrTraits):
        for tt in (replace(t, ops=ops), replace(t, ops=ops, aligned=True, exact=True)):
            assert_valid(family_for(tt).generate(tt))


@needs_spirv_val
@pytest.mark.parametrize("ops", OPS, ids=lambda o: o.describe())
def test_spirv_val_nv2_per_element_op(ops: EpilogueOps) -> None:
    for t in _traits(Nv2Traits):
        tt = replace(t, ops=ops)
        spv = family_for(tt).generate(tt)
        assert_valid(spv)
        words = np.frombuffer(spv, np.uint32)
        assert int(Op.CooperativeMatrixPerElementOpNV) in set((words & 0xFFFF).tolist())
        assert "cooperativeMatrixPerElementOperations" in family_for(tt).describe(tt).features


def test_element_ops_reject_activation_on_integers() -> None:
    s = ShaderContext()
    i32 = s.mb.type_int(32, True)
    with pytest.raises(ValueError, match="relu activation needs a float result"):
        ElementOps(s, EpilogueOps(activation=Activation.RELU), float_result=False,
                   stored_el=i32, load_bias=None, load_residual=None, work_el=i32)


# -- policy -----------------------------------------------------------------------------

def _problem(pair: TypePair, ops: EpilogueOps | None) -> Problem:
    from coopmat.codegen import Layout
    return Problem(pair, 256, 256, 256, OperandLayout(Layout.ROW_MAJOR, 256),
                   OperandLayout(Layout.ROW_MAJOR, 256), ops=ops)


def test_policy_passes_ops_into_traits() -> None:
    pair = TypePair(CT.FLOAT16, CT.FLOAT32, CT.FLOAT16)
    ops = EpilogueOps(bias=True, activation=Activation.SILU)
    assert choose(H200, _problem(pair, ops)).traits.ops == ops
    assert choose(H200, _problem(pair, EpilogueOps())).traits.ops is None
    with pytest.raises(ValueError, match="needs a float result"):
        choose(H200, _problem(TypePair(CT.SINT8, CT.SINT32), ops))
    # The recorded H200 lists no cooperativeMatrixPerElementOperations: forced nv2 says
    # so; a tuned nv2 choice falls back to khr.
    with pytest.raises(MissingFeatureError, match="cooperativeMatrixPerElementOperations"):
        choose(H200, _problem(pair, ops), Options(family="nv2"))
    tuned = {"float16->float32": ("nv2", _traits(Nv2Traits, 1)[0].tile)}
    assert choose(H200, _problem(pair, ops), tuned=tuned).traits.family == "khr"
    # The live H200 (driver 580) does list it: the nv2 choice then keeps its epilogue.
    live = replace(H200, features={**H200.features,
                                   "cooperativeMatrixPerElementOperations": True})
    assert choose(live, _problem(pair, ops), tuned=tuned).traits.family == "nv2"
    assert choose(live, _problem(pair, ops), Options(family="nv2")).traits.ops == ops


# -- live -------------------------------------------------------------------------------

# Every activation with and without bias and residual, and both with each other
# (tests/support/sampling.py); the unfused case is test_matmul's.
@pytest.mark.parametrize("act,bias,residual", pairwise(
    ACTS, [True, False], [True, False], allowed=lambda c: c != (None, False, False)))
def test_combinations_edge_shape(live_device_info, act, bias, residual) -> None:
    M, N, K = 37, 45, 19  # not multiples of any tile
    a, b = f16(M, K), f16(K, N)
    bv = f16(N) if bias else None
    rv = f16(M, N) if residual else None
    d = coopmat.matmul(a, b, bias=bv, activation=act, residual=rv)
    ref, tol, _ = oracle(a, b, bv, act, rv)
    check(d, ref, tol, np.float16)
    assert coopmat.api.matmul.last_kernel_traits().ops == ops_of(bv, act, rv)


NV2_FEATURES = ("cooperativeMatrixWorkgroupScope", "cooperativeMatrixFlexibleDimensions",
                "cooperativeMatrixTensorAddressing", "cooperativeMatrixPerElementOperations")


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype,accumulator", [(np.float16, None), (np.float32, None),
                                               (np.float16, "float16")])
def test_nv2_per_element_epilogue(live_device_info, act, dtype, accumulator) -> None:
    """The nv2 family's fused epilogue (OpCooperativeMatrixPerElementOpNV) where the
    device runs it (no CPU driver does: on the H200 by hand; the emulator of
    test_codegen_nv2 runs it everywhere): edge and whole tiles, every operation with and
    without bias and residual; a float16 accumulator's epilogue still runs in float32."""
    if not all(live_device_info.has(f) for f in NV2_FEATURES):
        pytest.skip("the device lacks VK_NV_cooperative_matrix2's per-element operations")
    for M, N, K in ((37, 45, 19), (256, 256, 128), (300, 520, 72)):
        a, b = f16(M, K), f16(K, N)
        for bias, residual in ((True, True), (True, False), (False, True)):
            bv = f16(N) if bias else None
            rv = f16(M, N) if residual else None
            d = coopmat.matmul(a, b, bias=bv, activation=act, residual=rv, dtype=dtype,
                               accumulator=accumulator, family="nv2")
            t = coopmat.api.matmul.last_kernel_traits()
            assert isinstance(t, Nv2Traits) and t.ops == ops_of(bv, act, rv)
            ref, tol, _ = oracle(a, b, bv, act, rv)
            if accumulator == "float16":  # K products summed in float16
                tol = tol + 1.2 * K * 2.0 ** -11 * (np.abs(a.astype(np.float64))
                                                    @ np.abs(b.astype(np.float64)))
            check(d, ref, tol, dtype)


@pytest.mark.parametrize("M,N,K", [(1, 33, 8), (17, 16, 1), (64, 64, 64), (70, 130, 40)])
@pytest.mark.parametrize("act", ["gelu_tanh", "silu"])
def test_shapes(live_device_info, M, N, K, act) -> None:
    a, b, bv, rv = f16(M, K), f16(K, N), f16(N), f16(M, N)
    d = coopmat.matmul(a, b, bias=bv, activation=act, residual=rv)
    ref, tol, _ = oracle(a, b, bv, act, rv)
    check(d, ref, tol, np.float16)


@pytest.mark.parametrize("act", ACTS)
def test_exact_variant_with_ops(live_device_info, act) -> None:
    """Whole tiles (of every default tile: lavapipe's and the H200's): the exact variant
    runs the fused epilogue without bounds checks, every block of a subgroup with its own
    bias and residual."""
    a, b, bv, rv = f16(512, 128), f16(128, 512), f16(512), f16(512, 512)
    d = coopmat.matmul(a, b, bias=bv, activation=act, residual=rv)
    t = coopmat.api.matmul.last_kernel_traits()
    assert isinstance(t, KhrTraits) and t.exact and t.ops is not None
    ref, tol, _ = oracle(a, b, bv, act, rv)
    check(d, ref, tol, np.float16)


@pytest.mark.parametrize("M", [512, 500])
def test_residual_in_place(live_device_info, M) -> None:
    """out= the residual's own device array: each element is read before it is written
    (whole tiles, and edge tiles too where M is not a tile multiple)."""
    a, b, bv, rv = f16(M, 128), f16(128, 256), f16(256), f16(M, 256)
    R = coopmat.asarray(rv)
    D = coopmat.matmul(coopmat.asarray(a), b, bias=bv, activation="gelu_tanh", residual=R,
                       out=R)
    assert D is R
    ref, tol, _ = oracle(a, b, bv, "gelu_tanh", rv)
    check(R.numpy(), ref, tol, np.float16)


@pytest.mark.parametrize("act", ACTS)
def test_float32_result_with_c(live_device_info, act) -> None:
    M, N, K = 33, 40, 24
    a, b = f16(M, K), f16(K, N)
    c = RNG.standard_normal((M, N)).astype(np.float32)
    bv = RNG.standard_normal(N).astype(np.float32)
    rv = RNG.standard_normal((M, N)).astype(np.float32)
    d = coopmat.matmul(a, b, c=c, alpha=0.5, beta=-2.0, dtype=np.float32, bias=bv,
                       activation=act, residual=rv)
    ref, tol, _ = oracle(a, b, bv, act, rv, c=c, alpha=0.5, beta=-2.0)
    check(d, ref, tol, np.float32)


def test_extremes_are_not_nan(live_device_info) -> None:
    """silu(-100) is about 0 and gelu of large |x| about 0 or x: exp and tanh must not
    overflow into NaN (a bias carries the large values into the epilogue)."""
    a, b = np.zeros((4, 8), np.float16), np.zeros((8, 6), np.float16)
    bias = np.array([-100, 100, -60000, 60000, -9, 0], np.float32)
    for act in ("silu", "gelu_tanh"):
        d = coopmat.matmul(a, b, bias=bias, activation=act, dtype=np.float32)
        assert not np.isnan(d).any()
        ref = act64(np.broadcast_to(bias.astype(np.float64), (4, 6)), act)
        np.testing.assert_allclose(d, ref, rtol=1e-5, atol=1e-6)


def test_batch_and_broadcast(live_device_info) -> None:
    a, b = f16(3, 20, 12), f16(12, 28)  # b shared by the batch
    bv, rv = f16(28), f16(3, 20, 28)
    d = coopmat.matmul(a, b, bias=bv, activation="silu", residual=rv)
    assert d.shape == (3, 20, 28)
    ref, tol, _ = oracle(a, b, bv, "silu", rv)
    check(d, ref, tol, np.float16)


def test_linear_matches_torch_convention(live_device_info) -> None:
    x, w, bv, rv = f16(2, 5, 24), f16(36, 24), f16(36), f16(2, 5, 36)  # w: out x in
    y = coopmat.linear(x, w, bv, "gelu_tanh", rv)
    ref, tol, _ = oracle(x, w.T, bv, "gelu_tanh", rv)
    check(y, ref, tol, np.float16)
    out = np.empty((2, 5, 36), np.float32)
    assert coopmat.linear(x, w, bias=bv, activation="relu", out=out) is out
    ref, tol, _ = oracle(x, w.T, bv, "relu")
    np.testing.assert_allclose(out, ref, atol=float(np.max(tol + 2 ** -11 * np.abs(ref))))


def test_device_arrays(live_device_info) -> None:
    M, N, K = 29, 34, 16
    a, b, bv, rv = f16(M, K), f16(K, N), f16(N), f16(M, N)
    A, B = coopmat.asarray(a), coopmat.asarray(b)
    ref, tol, _ = oracle(a, b, bv, "silu", rv)
    for bias, residual in ((coopmat.asarray(bv), coopmat.asarray(rv)), (bv, rv)):
        D = coopmat.matmul(A, B, bias=bias, activation="silu", residual=residual)
        assert isinstance(D, coopmat.Array)
        check(D.numpy(), ref, tol, np.float16)
    W = coopmat.asarray(np.ascontiguousarray(b.T))  # linear's weight: out x in
    Y = coopmat.linear(A, W, coopmat.asarray(bv), "silu", coopmat.asarray(rv))
    check(Y.numpy(), ref, tol, np.float16)


def test_integer_results_take_bias_and_residual(live_device_info) -> None:
    if "int8->int32" not in coopmat.supported_dtypes():
        pytest.skip("no int8 matrices")
    a = RNG.integers(-100, 100, (13, 24), dtype=np.int8)
    b = RNG.integers(-100, 100, (24, 18), dtype=np.int8)
    bv = RNG.integers(-1000, 1000, 18).astype(np.int32)
    rv = RNG.integers(-1000, 1000, (13, 18)).astype(np.int32)
    d = coopmat.matmul(a, b, bias=bv, residual=rv)
    np.testing.assert_array_equal(d, a.astype(np.int64) @ b.astype(np.int64) + bv + rv)


def test_k_zero_follows_the_formula(live_device_info) -> None:
    a, b = np.zeros((3, 0), np.float16), np.zeros((0, 4), np.float16)
    bv = np.array([-1, 2, -3, 4], np.float16)
    rv = np.ones((3, 4), np.float16)
    d = coopmat.matmul(a, b, bias=bv, activation="relu", residual=rv)
    np.testing.assert_array_equal(d, np.maximum(bv, 0) + rv)


def test_errors(live_device_info) -> None:
    a, b = f16(8, 4), f16(4, 6)
    with pytest.raises(ValueError, match="'relu', 'gelu_tanh', 'silu'"):
        coopmat.matmul(a, b, activation="gelu")
    with pytest.raises(ValueError, match=r"bias must have shape \(6,\)"):
        coopmat.matmul(a, b, bias=f16(8))
    with pytest.raises(ValueError, match=r"residual must have the result's shape \(8, 6\)"):
        coopmat.matmul(a, b, residual=f16(6))
    with pytest.raises(TypeError, match="bias has dtype complex128"):
        coopmat.matmul(a, b, bias=np.zeros(6, complex))
    with pytest.raises(ValueError, match="w must be 2-D"):
        coopmat.linear(a, f16(2, 6, 4))
    with pytest.raises(ValueError, match=r"bias must have shape \(6,\)"):
        coopmat.matmul(coopmat.asarray(a), b, bias=f16(5))
    if "int8->int32" in coopmat.supported_dtypes():
        i8 = np.ones((4, 4), np.int8)
        with pytest.raises(TypeError, match="'silu' activation needs a float result"):
            coopmat.matmul(i8, i8, activation="silu")
        with pytest.raises(TypeError, match="bias has dtype float64"):
            coopmat.matmul(i8, i8, bias=np.zeros(4))
