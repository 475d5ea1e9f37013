"""Quantized weights (GGUF q8_0, q4_0) on the device, dequantized inside the GEMM.

Oracle: gguf.quants (llama.cpp's own quantizer and dequantizer) and numpy in float64.
- Exact cases: integer weights whose blocks quantize with scale d = 1 (each q8_0 block
  holds a +-127, each q4_0 block a -8), times small-integer x: every product and sum is
  exact in float32, so any wrong byte, nibble, block or row shows as an exact mismatch.
- Random cases: the error bound of tests/test_matmul.py plus the rounding of each
  dequantized weight to float16 (2**-11 relative).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.live

gguf = pytest.importorskip("gguf")
coopmat = pytest.importorskip("coopmat")

from gguf import quants  # noqa: E402
from quant_oracle import QTYPE, RNG, exact_weight, oracle  # noqa: E402
from sampling import pairwise  # noqa: E402

from coopmat.api.matmul import last_kernel_traits  # noqa: E402
from coopmat.common.quant_formats import FORMATS  # noqa: E402

U16 = 2.0 ** -11
U = {np.dtype(np.float16): U16, np.dtype(np.float32): 2.0 ** -24}


def host(y: Any) -> np.ndarray:
    """A product's values on the host: a quantized weight's product is a device Array (its
    weight lives there), whatever x is."""
    return y.numpy() if isinstance(y, coopmat.Array) else y


def small_x(shape: tuple[int, ...]) -> np.ndarray:
    return RNG.integers(-3, 4, shape).astype(np.float16)


def traits_used():
    return last_kernel_traits()


# Every format, M, K and N, and every pair of them (tests/support/sampling.py).
@pytest.mark.parametrize("fmt,M,K,N", pairwise(["q8_0", "q4_0"], [1, 5, 64, 100],
                                                [32, 96, 256], [8, 40, 64]))
def test_exact_float32(rt, fmt, M, K, N):
    w = exact_weight(fmt, N, K)
    deq = oracle(fmt, w)
    assert np.array_equal(deq, w), "precondition: the blocks have d = 1"
    q = coopmat.quantize(w, fmt)
    x = small_x((M, K))
    y = coopmat.matmul(x, q.T, dtype=np.float32)  # the weight lives on the device
    assert isinstance(y, coopmat.Array) and y.dtype == np.float32 and y.shape == (M, N)
    np.testing.assert_array_equal(y.numpy(), x.astype(np.float64) @ deq.T)
    assert traits_used().b_quant == fmt


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("S", [2, 4])
@pytest.mark.parametrize("array_x", [False, True])
def test_split_k_exact(rt, monkeypatch, fmt, S, array_x):
    """A split-K of the khr quantized kernel: slice s reads blocks s K / S .. of every
    row of the weight (its batch stride along the rows), the reduction sums the float32
    partials. Exact weights and x: any block read from the wrong slice or row shows."""
    coopmat.set_options(split_k=S, family="khr")
    M, K, N = 5, 512, 72
    w = exact_weight(fmt, N, K)
    q = coopmat.quantize(w, fmt)
    x = small_x((M, K))
    ref = x.astype(np.float64) @ oracle(fmt, w).T
    y = coopmat.matmul(coopmat.asarray(x) if array_x else x, q.T, dtype=np.float32)
    if not array_x:
        assert coopmat.api.matmul._last.result.split_k == S
    np.testing.assert_array_equal(np.asarray(y), ref)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_mid_size_policy_exact(rt, fmt):
    """The policy's own choice for more than SMALL_M rows against a long quantized K (on a
    GPU a split-K of the fused kernel, policy.kernel.mid_split_k; unsplit on a CPU), N
    not a multiple of the general tile's columns: exact weights and x."""
    from coopmat.codegen.variants import is_cpu
    from coopmat.policy import SMALL_M

    M, K, N = SMALL_M + 32, 7168, 200
    w = exact_weight(fmt, N, K)
    q = coopmat.quantize(w, fmt)
    x = small_x((M, K))
    y = coopmat.matmul(x, q.T, dtype=np.float32)
    np.testing.assert_array_equal(host(y), x.astype(np.float64) @ oracle(fmt, w).T)
    result = coopmat.api.matmul._last.result
    assert traits_used().b_quant == fmt
    assert result.split_k == (1 if is_cpu(rt.device.info) else 4)


# -- dequantized first (COOPMAT_DEQUANT=first; codegen/dequant.py) ------------------------
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("M,K,N,S", [(5, 96, 40, 1), (100, 256, 72, 1), (7, 512, 40, 2),
                                     (3, 32, 8, 1)])
@pytest.mark.parametrize("array_x", [False, True])
def test_dequantize_first_exact(rt, monkeypatch, fmt, M, K, N, S, array_x):
    """The weight dequantized into a float16 B by its own pass, then the float kernel (and
    its split-K where forced): exact weights and x, so a wrong unit, row or scale shows.
    N * K / 8 units are not whole workgroups of the pass in every case."""
    coopmat.set_options(dequant="first", split_k=S)
    w = exact_weight(fmt, N, K)
    q = coopmat.quantize(w, fmt)
    x = small_x((M, K))
    y = coopmat.matmul(coopmat.asarray(x) if array_x else x, q.T, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(y), x.astype(np.float64) @ oracle(fmt, w).T)
    assert traits_used().b_quant is None  # the float kernel ran
    if not array_x:
        assert coopmat.api.matmul._last.result.split_k == S


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("out", [np.float16, np.float32])
def test_dequantize_first_random_within_bound(rt, monkeypatch, fmt, out):
    """Random weights and scales through the pass: each weight rounded to float16 once,
    as the fused kernel stages it, then the float16 product's bound."""
    coopmat.set_options(dequant="first")
    M, K, N = 37, 256, 40
    w = (RNG.standard_normal((N, K)) * RNG.uniform(0.01, 3, (N, 1))).astype(np.float32)
    x = RNG.uniform(-1, 1, (M, K)).astype(np.float16)
    y = host(coopmat.matmul(x, coopmat.quantize(w, fmt).T, out_dtype=out))
    deq = oracle(fmt, w)
    ref = x.astype(np.float64) @ deq.T
    mag = np.abs(x.astype(np.float64)) @ np.abs(deq).T
    tol = (U16 + K * U[np.dtype(np.float32)] + U[np.dtype(out)]) * mag + 1e-30
    assert np.all(np.abs(y.astype(np.float64) - ref) <= tol)
    assert traits_used().b_quant is None


def test_dequantize_first_with_epilogue(rt, monkeypatch):
    """The fused epilogue on the float kernel behind the pass."""
    coopmat.set_options(dequant="first")
    M, K, N = 19, 96, 40
    w = exact_weight("q4_0", N, K)
    x = small_x((M, K))
    bias = RNG.uniform(-4, 4, N).astype(np.float16)
    residual = RNG.uniform(-4, 4, (M, N)).astype(np.float16)
    y = host(coopmat.linear(x, coopmat.quantize(w, "q4_0"), bias, "relu", residual=residual,
                       dtype=np.float32))
    z = x.astype(np.float64) @ oracle("q4_0", w).T + bias.astype(np.float64)
    want = np.maximum(z, 0) + residual.astype(np.float64)
    assert traits_used().b_quant is None and traits_used().ops is not None
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-3 * np.abs(want).max())


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("family", ["khr", "gemv", "first"])
def test_subnormal_scales_exact(rt, monkeypatch, fmt, family):
    """Scales of 2**-20, a float16 subnormal, and so most dequantized weights subnormal
    float16 values too, each still exact: a kernel or device that flushes float16
    subnormals (the khr kernel dequantizes in packed float16) shows as a mismatch."""
    M, K, N = 3, 256, 40
    w = exact_weight(fmt, N, K) * np.float32(2.0 ** -20)
    deq = oracle(fmt, w)
    assert np.array_equal(deq, w), "precondition: the blocks have d = 2**-20"
    x = small_x((M, K))
    if family == "first":  # the dequantizing pass (COOPMAT_DEQUANT), then the float kernel
        coopmat.set_options(dequant="first")
        y = host(coopmat.matmul(x, coopmat.quantize(w, fmt).T, dtype=np.float32))
        assert traits_used().b_quant is None
    else:
        y = host(coopmat.matmul(x, coopmat.quantize(w, fmt).T, dtype=np.float32, family=family))
        assert traits_used().b_quant == fmt and traits_used().family == family
    np.testing.assert_array_equal(y, x.astype(np.float64) @ deq.T)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("dequant", ["fused", "first"])
def test_bfloat16_x_on_khr(rt, monkeypatch, fmt, dequant):
    """bfloat16 x through the khr kernel, or the pass into a bfloat16 B: the weights are
    dequantized in float32 and rounded to bfloat16 (not the packed float16 path)."""
    import ml_dtypes

    if "bfloat16->float32" not in coopmat.supported_dtypes():
        pytest.skip("the device offers no bfloat16 cooperative matrices")
    coopmat.set_options(dequant=dequant)
    M, K, N = 37, 256, 40
    w = exact_weight(fmt, N, K)
    x = small_x((M, K)).astype(ml_dtypes.bfloat16)
    y = host(coopmat.matmul(x, coopmat.quantize(w, fmt).T, dtype=np.float32, family="khr"))
    np.testing.assert_array_equal(y, x.astype(np.float64) @ oracle(fmt, w).T)
    assert traits_used().b_quant == (fmt if dequant == "fused" else None)
    assert traits_used().family == "khr"


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("M,K,N", [(5, 96, 40), (64, 256, 64), (100, 32, 8)])
def test_array_x_float16_result(rt, fmt, M, K, N):
    w = exact_weight(fmt, N, K)
    q = coopmat.quantize(w, fmt)
    x = small_x((M, K))
    y = coopmat.asarray(x) @ q.T  # queued; an Array
    assert isinstance(y, coopmat.Array) and y.dtype == np.float16 and y.shape == (M, N)
    ref = (x.astype(np.float64) @ oracle(fmt, w).T).astype(np.float16)
    np.testing.assert_array_equal(y.numpy(), ref)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("out", [np.float16, np.float32])
def test_random_weights_within_bound(rt, fmt, out):
    M, K, N = 37, 256, 40
    w = (RNG.standard_normal((N, K)) * RNG.uniform(0.01, 3, (N, 1))).astype(np.float32)
    x = RNG.uniform(-1, 1, (M, K)).astype(np.float16)
    q = coopmat.quantize(w, fmt)
    y = host(coopmat.matmul(x, q.T, out_dtype=out))
    assert y.dtype == np.dtype(out)
    deq = oracle(fmt, w)
    ref = x.astype(np.float64) @ deq.T
    mag = np.abs(x.astype(np.float64)) @ np.abs(deq).T
    tol = (U16 + K * U[np.dtype(np.float32)] + U[np.dtype(out)]) * mag + 1e-30
    assert np.all(np.abs(y.astype(np.float64) - ref) <= tol)


def test_one_dimensional_and_batched_x(rt):
    w = exact_weight("q4_0", 24, 64)
    deq = oracle("q4_0", w)
    q = coopmat.quantize(w, "q4_0")
    x1 = small_x((64,))
    y1 = host(coopmat.matmul(x1, q.T, dtype=np.float32))
    assert y1.shape == (24,)
    np.testing.assert_array_equal(y1, x1.astype(np.float64) @ deq.T)
    xb = small_x((2, 3, 5, 64))
    yb = xb @ q.T  # numpy @ defers to the quantized view, device memory as an Array is
    assert isinstance(yb, coopmat.Array) and yb.shape == (2, 3, 5, 24) and yb.dtype == np.float16
    yb = yb.numpy()
    np.testing.assert_array_equal(yb, (xb.astype(np.float64) @ deq.T).astype(np.float16))
    ya = coopmat.asarray(xb) @ q.T
    assert isinstance(ya, coopmat.Array) and ya.shape == (2, 3, 5, 24)
    np.testing.assert_array_equal(ya.numpy(), yb)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_quantize_matches_gguf_bit_for_bit(rt, fmt):
    w = RNG.standard_normal((40, 96)).astype(np.float32)
    q = coopmat.quantize(w, fmt)
    expected = quants.quantize(w, QTYPE[fmt])
    spec = FORMATS[fmt]
    assert q.format == fmt and q.shape == (40, 96) and q.T.shape == (96, 40)
    assert q.nbytes == expected.nbytes == 40 * 3 * spec.block_bytes
    np.testing.assert_array_equal(q.blocks(), expected)
    np.testing.assert_array_equal(q.dequantize(), quants.dequantize(expected, QTYPE[fmt]))
    assert q.T.T is q and f"format='{fmt}'" in repr(q) and repr(q.T).endswith(".T")


def test_from_gguf_file(rt, tmp_path):
    """A GGUF file written by gguf.GGUFWriter, read by gguf.GGUFReader: the tensors go to
    the device as stored and multiply as gguf dequantizes them."""
    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    weights = {"q8": ("q8_0", exact_weight("q8_0", 40, 96)),
               "q4": ("q4_0", exact_weight("q4_0", 64, 256))}
    for name, (fmt, w) in weights.items():
        blocks = quants.quantize(w, QTYPE[fmt])
        writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=QTYPE[fmt])
    f16 = RNG.standard_normal((8, 32)).astype(np.float16)
    writer.add_tensor("f16", f16)
    norm = RNG.standard_normal(32).astype(np.float32)
    writer.add_tensor("norm", norm)
    writer.add_tensor("f32", RNG.standard_normal((8, 32)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    for name, (fmt, w) in weights.items():
        t = tensors[name]
        q = coopmat.from_gguf(t)
        assert isinstance(q, coopmat.QuantizedArray) and q.format == fmt
        deq = quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        assert q.shape == deq.shape == w.shape
        np.testing.assert_array_equal(q.blocks(), np.asarray(t.data))
        x = small_x((5, w.shape[1]))
        np.testing.assert_array_equal(host(coopmat.matmul(x, q.T, dtype=np.float32)),
                                      x.astype(np.float64) @ deq.T)
    plain = coopmat.from_gguf(tensors["f16"])
    assert isinstance(plain, coopmat.Array)
    np.testing.assert_array_equal(plain.numpy(), f16)
    x = small_x((3, 32))  # a float16 weight as matmul takes it
    np.testing.assert_array_equal((x @ plain.T).numpy(),
                                  (x.astype(np.float64) @ f16.T).astype(np.float16))
    vector = coopmat.from_gguf(tensors["norm"])  # float32 vectors: norms, biases
    assert isinstance(vector, coopmat.Array) and vector.dtype == np.float32
    np.testing.assert_array_equal(vector.numpy(), norm)
    with pytest.raises(TypeError, match="F32 matrix.*no float32 operands"):
        coopmat.from_gguf(tensors["f32"])  # refused where it is made, not by matmul


# -- every kernel variant, through the kernel itself --------------------------------------
# (fmt, buffering, variant, unit, tile_k, held_magic). Each kernel costs lavapipe 5 to 45 s
# of CPU to compile on a cold cache, so these cases hold every value of every factor and
# the pairs that meet in the quantized staging's own code (codegen/quant.py and
# khr_tiled's _prefetch/_stage_quant), not the full product:
# - every format with every unit size: the decode of part of a block (4, 8) and of whole
#   blocks (32, plan.BLOCK_UNIT), q8_0's bytes and q4_0's nibbles;
# - whole blocks with each way the raw words wait: loaded when staged (buffering 1), one
#   register set (2; 4 is 2's loop with the streamed multiply), two shared stages (3), two
#   register sets one K step further ahead (5);
# - each variant: general and aligned read B through `inside`, exact without it, with
#   part units and whole blocks;
# - tile_k 32 (one block per K step, so consecutive steps' blocks start 34 or 18 bytes
#   apart, at bit 0 and 16 of their words in turn) with the bufferings whose registers
#   hold the next step (3, 5), both formats; 64 (two blocks a step) with 1, 2 and 4;
# - the magic as a literal (the policy's form for tiles of more than SMALL_M rows) with
#   both formats and both unit kinds; held in a register elsewhere (quant.held_constant).
# The bufferings' loops themselves are the float kernels' (test_codegen_live.py).
VARIANT_CASES = [("q8_0", 1, "general", 4, 64, True), ("q4_0", 2, "exact", 32, 64, True),
                 ("q8_0", 3, "aligned", 32, 32, True), ("q4_0", 4, "general", 8, 64, True),
                 ("q8_0", 5, "exact", 32, 32, True), ("q4_0", 5, "general", 4, 32, True),
                 ("q8_0", 2, "aligned", 8, 32, False), ("q4_0", 1, "aligned", 32, 64, False),
                 ("q4_0", 3, "exact", 8, 32, True)]


@pytest.mark.parametrize("fmt,buffering,variant,unit,tile_k,held_magic", VARIANT_CASES)
def test_kernel_variants(rt, fmt, buffering, variant, unit, tile_k, held_magic):
    """Buffering modes, variants and unit sizes the policy does not pick on this device,
    with a tile 64 deep (two blocks per K step) or 32 (one), the magic held or a literal;
    edge tiles for the checked variants."""
    from coopmat.codegen import GemmParams, Layout, build_gemm
    from coopmat.dispatch.executor import Dispatch
    from coopmat.policy import choose
    from coopmat.policy.kernel import OperandLayout, Problem
    from coopmat.policy.types import resolve

    info = rt.device.info
    pair = resolve(info, np.float16, np.float16, np.float32)
    M, N, K = (64, 64, 128) if variant == "exact" else (37, 40, 96)
    problem = Problem(pair, M, N, K, OperandLayout(Layout.ROW_MAJOR, K),
                      OperandLayout(Layout.COLUMN_MAJOR, K), b_quant=fmt)
    base = choose(info, problem).traits
    tile = replace(base.tile, tile_k=tile_k, buffering=buffering)
    # Enough units of B for every invocation: a 64-column tile one block deep has only 64
    # whole-block units, fewer than a GPU's 128 invocations.
    invocations = tile.subgroups_m * tile.subgroups_n * base.subgroup_size
    if (tile.tile_n * tile_k // unit) % invocations:
        tile = replace(tile, tile_n=invocations * unit // tile_k)
        if variant == "exact" and N % tile.tile_n:  # whole tiles, as the exact variant needs
            N = -(-N // tile.tile_n) * tile.tile_n
            problem = replace(problem, N=N)
    traits = replace(base, tile=tile, b_quant_unit=unit, aligned=variant != "general",
                     exact=variant == "exact", specialized=(), b_quant_held_magic=held_magic)
    choice = choose(info, problem, traits=traits)
    w = exact_weight(fmt, N, K)
    x = small_x((M, K))
    blocks = quants.quantize(w, QTYPE[fmt])
    a = coopmat.asarray(np.concatenate([x.reshape(-1), np.zeros(choice.margins[0] // 2 + 8,
                                                                np.float16)]))
    b = coopmat.asarray(np.concatenate([blocks.reshape(-1),
                                        np.zeros(choice.margins[1] + 8, np.uint8)]))
    d = coopmat.zeros((M, N), np.float32)
    kernel = build_gemm(traits)
    params = GemmParams(M=M, N=N, K=K, lda=K, ldb=K, ldc=N, ldd=N)
    pipeline = rt.pipelines.get(kernel)
    rt.stream.wait()
    rt.executor.run([], [Dispatch(pipeline, {0: a.buffer, 1: b.buffer, 2: d.buffer},
                                  kernel.push_constants(params), kernel.workgroups(M, N, 1))],
                    [])
    np.testing.assert_array_equal(d.numpy(), x.astype(np.float64) @ oracle(fmt, w).T)


# -- errors -------------------------------------------------------------------------------
def test_errors(rt):
    w = RNG.standard_normal((8, 64)).astype(np.float32)
    q = coopmat.quantize(w, "q8_0")
    x = small_x((4, 64))
    with pytest.raises(ValueError, match="multiple of its 32-weight block"):
        coopmat.quantize(RNG.standard_normal((8, 48)).astype(np.float32), "q4_0")
    with pytest.raises(ValueError, match="2-D"):
        coopmat.quantize(RNG.standard_normal((2, 8, 64)).astype(np.float32), "q8_0")
    with pytest.raises(ValueError, match="unknown quantized format"):
        coopmat.quantize(w, "q5_1")
    with pytest.raises(TypeError, match="float16"):
        coopmat.matmul(x.astype(np.float32), q.T)
    with pytest.raises(TypeError, match=r"x @ w\.T"):
        coopmat.matmul(q.T, x.T)
    with pytest.raises(TypeError, match=r"x @ w\.T"):
        q @ x.T
    with pytest.raises(ValueError, match=r"x @ w\.T"):
        coopmat.matmul(x, q)
    with pytest.raises(ValueError, match="last axis"):
        coopmat.matmul(small_x((4, 32)), q.T)
    with pytest.raises(ValueError, match="khr"):
        coopmat.matmul(x, q.T, family="nv2")
    with pytest.raises(TypeError, match="dequantize"):
        np.asarray(q)


def test_imports_without_gguf():
    """coopmat (quantized arrays included) imports without gguf; using it says how to
    install it."""
    code = ("import sys; sys.modules['gguf'] = None\n"
            "import coopmat, coopmat.api.quantized\n"
            "try:\n    coopmat.from_gguf(object())\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "pip install gguf" in out


# Each activation once, and every format with x on the host and on the device: the
# epilogue's code does not read B's format (test_epilogue.py runs every activation on
# the float kernels), while the dequantizing kernel's epilogue and its device-array
# path are what this checks.
@pytest.mark.parametrize("fmt,activation,array_x", [
    ("q8_0", None, False), ("q4_0", "relu", True), ("q8_0", "gelu_tanh", True),
    ("q4_0", "silu", False)])
def test_linear_with_fused_epilogue(rt, fmt, activation, array_x):
    """coopmat.linear on a quantized weight: act(x @ w.T + bias) + residual, fused into the
    dequantizing kernel, against gguf's dequantization in float64."""
    M, K, N = 19, 96, 40
    w = exact_weight(fmt, N, K)
    q = coopmat.quantize(w, fmt)
    x = small_x((M, K))
    bias = RNG.uniform(-4, 4, N).astype(np.float16)
    residual = RNG.uniform(-4, 4, (M, N)).astype(np.float16)
    y = coopmat.linear(coopmat.asarray(x) if array_x else x, q, bias, activation,
                       residual=residual, dtype=np.float32)
    y = host(y)
    z = x.astype(np.float64) @ oracle(fmt, w).T + bias.astype(np.float64)
    act = {None: lambda v: v, "relu": lambda v: np.maximum(v, 0),
           "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi)
                                                         * (v + 0.044715 * v ** 3))),
           "silu": lambda v: v / (1 + np.exp(-v))}[activation]
    with np.errstate(over="ignore"):  # silu's exp(-v) of a large negative v: the limit -0
        want = act(z) + residual.astype(np.float64)
    assert traits_used().b_quant == fmt and traits_used().ops is not None
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-3 * np.abs(want).max())


# -- the gemv family (forced: family="gemv"; gemv_quant.py) --------------------------------
# lavapipe's subgroup is 8 lanes, so the default quantized tile's step is 8 blocks (256
# elements of K): K = 32 and 96 run the remainder loop only, 4096 whole steps only, 4192
# both. N = 37 is not whole workgroups of columns (8 a workgroup).
GEMV_K = [32, 96, 4096, 4192]


def gemv_traits_used(fmt: str, M: int):
    from coopmat.codegen import GemvTraits
    t = traits_used()
    assert isinstance(t, GemvTraits) and t.b_quant == fmt and t.rows == min(M, 8), t
    return t


@pytest.mark.parametrize("fmt,M,K", pairwise(["q8_0", "q4_0"], [1, 3, 8], GEMV_K))
def test_gemv_exact(rt, fmt, M, K):
    """Weights that quantize with d = 1 times small integers: exact in float32, so every
    byte, nibble, block and column must be where the kernel reads it."""
    N = 37
    w = exact_weight(fmt, N, K)
    deq = oracle(fmt, w)
    assert np.array_equal(deq, w), "precondition: the blocks have d = 1"
    q = coopmat.quantize(w, fmt)
    x = small_x((M, K))
    ref = x.astype(np.float64) @ deq.T
    y = host(coopmat.matmul(x, q.T, dtype=np.float32, family="gemv"))
    gemv_traits_used(fmt, M)
    assert y.dtype == np.float32 and y.shape == (M, N)
    np.testing.assert_array_equal(y, ref)
    y16 = host(coopmat.matmul(x, q.T, family="gemv"))  # float16, rounded once
    gemv_traits_used(fmt, M)
    np.testing.assert_array_equal(y16, ref.astype(np.float16))


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("out", [np.float16, np.float32])
def test_gemv_random_weights_within_bound(rt, fmt, out):
    """General weights (scales of every size) and x, against gguf's dequantization in
    float64: float32 sums of exact products, one multiply by each block's scale."""
    M, K, N = 5, 4192, 45
    w = (RNG.standard_normal((N, K)) * RNG.uniform(0.01, 3, (N, 1))).astype(np.float32)
    x = RNG.uniform(-1, 1, (M, K)).astype(np.float16)
    q = coopmat.quantize(w, fmt)
    y = host(coopmat.matmul(x, q.T, dtype=out, family="gemv"))
    gemv_traits_used(fmt, M)
    deq = oracle(fmt, w)
    ref = x.astype(np.float64) @ deq.T
    mag = np.abs(x.astype(np.float64)) @ np.abs(deq).T
    tol = (K * U[np.dtype(np.float32)] + U[np.dtype(out)]) * mag + 1e-30
    assert np.all(np.abs(y.astype(np.float64) - ref) <= tol)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("out", [np.float16, np.float32])
@pytest.mark.parametrize("fused", ["bias+gelu_tanh", "residual"])
def test_gemv_fused_epilogue(rt, fmt, out, fused):
    """act(x @ w.T + bias) + residual in the gemv kernel, as test_epilogue checks the
    float kernels (its oracle: float64, the accumulator's K-term bound)."""
    from epilogue_oracle import check
    from epilogue_oracle import oracle as epilogue_oracle

    M, K, N = 3, 4192, 29
    w = (RNG.standard_normal((N, K)) / 8).astype(np.float32)
    x = RNG.standard_normal((M, K)).astype(np.float16)
    q = coopmat.quantize(w, fmt)
    deq = oracle(fmt, w)
    if fused == "residual":
        r = RNG.standard_normal((M, N)).astype(out)
        y = host(coopmat.matmul(x, q.T, dtype=out, residual=r, family="gemv"))
        ref, tol, _ = epilogue_oracle(x, deq.T, residual=r)
    else:
        bias = RNG.standard_normal(N).astype(out)
        y = host(coopmat.linear(x, q, bias, "gelu_tanh", dtype=out, family="gemv"))
        ref, tol, _ = epilogue_oracle(x, deq.T, bias, "gelu_tanh")
    assert gemv_traits_used(fmt, M).ops is not None
    check(y, ref, tol, np.dtype(out))


def test_gemv_array_x_and_environment(rt, monkeypatch):
    """COOPMAT_FAMILY=gemv forces the family too; device arrays queue as for khr; x's
    leading axes are rows."""
    coopmat.set_options(family="gemv")
    w = exact_weight("q4_0", 21, 160)
    deq = oracle("q4_0", w)
    q = coopmat.quantize(w, "q4_0")
    x = small_x((2, 3, 160))
    y = coopmat.asarray(x) @ q.T
    assert isinstance(y, coopmat.Array) and y.shape == (2, 3, 21)
    np.testing.assert_array_equal(y.numpy(), (x.astype(np.float64) @ deq.T).astype(np.float16))
    gemv_traits_used("q4_0", 6)
    x1 = small_x((160,))
    np.testing.assert_array_equal(host(coopmat.matmul(x1, q.T, dtype=np.float32)),
                                  x1.astype(np.float64) @ deq.T)
    gemv_traits_used("q4_0", 1)


def run_gemv(rt, traits, pair, x: np.ndarray, q, out_dtype) -> np.ndarray:
    """Explicit gemv traits on a quantized weight (as benchmarks/decode_sweep.py times
    them), through the device-array dispatch path."""
    from coopmat.codegen import Layout
    from coopmat.dispatch.gemm import enqueue_gemm
    from coopmat.dispatch.staging import DeviceOperand, Staged
    from coopmat.policy import Options

    M, K = x.shape
    N = q.shape[0]
    xa = coopmat.asarray(x)
    d = coopmat.empty((M, N), out_dtype)
    a_op = DeviceOperand(xa.buffer, xa.offset_bytes, Staged(Layout.ROW_MAJOR, K, 0, x.nbytes))
    b_op = DeviceOperand(q.buffer, 0, Staged(Layout.COLUMN_MAJOR, K, 0, q.nbytes,
                                             quant=q.format))
    d_op = DeviceOperand(d.buffer, d.offset_bytes,
                         Staged(Layout.ROW_MAJOR, N, 0, M * N * np.dtype(out_dtype).itemsize))
    _, plan = enqueue_gemm(rt, pair, a_op, b_op, None, d_op, (1, M, N, K), 1.0, 0,
                           Options(), traits=traits)
    assert plan.traits == traits
    return d.numpy()


# (fmt, C columns a subgroup, S subgroups, U blocks a lane and step, prefetch, whole
# steps): each swept C and S once, U of 1 and 2 (C, S and U are loop counts of the one
# kernel body; U = 4, which one q4_0 row's default tile runs, is more of the same
# unrolled code: 15 to 25 s of lavapipe's compile here), and every pair of format,
# prefetch and whole steps, so the prefetch runs with and without steps to load ahead
# for both formats' decode.
GEMV_SWEPT = [("q8_0", 4, 8, 2, False, 2), ("q8_0", 1, 8, 2, True, 0),
              ("q4_0", 2, 4, 2, False, 0), ("q4_0", 4, 2, 1, True, 2)]


@pytest.mark.parametrize("fmt,cols,splits,unroll,prefetch,steps", GEMV_SWEPT)
def test_gemv_swept_tiles(rt, fmt, cols, splits, unroll, prefetch, steps):
    """Tiles of the sweep (gemv_tiles.gemv_sweep) other than the default: U blocks per
    lane and step, C columns per subgroup, S subgroups; no or two whole steps and a
    remainder, with and without the prefetch."""
    from coopmat.codegen.variants import khr_subgroup_size
    from coopmat.common.enums import ComponentType as CT
    from coopmat.policy.gemv_tiles import gemv_sweep, gemv_traits
    from coopmat.policy.types import TypePair

    info = rt.device.info
    sg = khr_subgroup_size(info.limits)
    M = 7
    tile = next(t for t in gemv_sweep(M, sg, info.limits.max_compute_work_group_invocations,
                                      b_quant=fmt)
                if (t.tile_n // t.subgroups_m, t.subgroups_m, t.buffering)
                == (cols, splits, unroll))
    traits = replace(gemv_traits(CT.FLOAT16, CT.FLOAT32, info.limits, False, M, tile=tile,
                                 b_quant=fmt), prefetch=prefetch)
    N, K = 3 * tile.tile_n + 5, steps * tile.tile_k + 96
    w = exact_weight(fmt, N, K)
    x = small_x((M, K))
    y = run_gemv(rt, traits, TypePair(CT.FLOAT16, CT.FLOAT32), x, coopmat.quantize(w, fmt),
                 np.float32)
    np.testing.assert_array_equal(y, x.astype(np.float64) @ oracle(fmt, w).T)


# (fmt, M, C, S, U, Q k_splits, prefetch, whole steps) with K split between subgroups.
GEMV_K_SPLITS = [("q4_0", 1, 2, 2, 2, 4, False, 1), ("q8_0", 2, 1, 1, 1, 2, True, 2),
                 ("q4_0", 3, 4, 1, 1, 3, False, 0)]


@pytest.mark.parametrize("fmt,M,cols,splits,unroll,k_splits,prefetch,steps", GEMV_K_SPLITS)
def test_gemv_k_splits(rt, fmt, M, cols, splits, unroll, k_splits, prefetch, steps):
    """Q subgroups sharing columns, each on every Q-th stretch of K, their sums added
    through shared memory: whole steps and a remainder shorter than a stretch."""
    from coopmat.codegen.traits import gemv_tile
    from coopmat.codegen.variants import khr_subgroup_size
    from coopmat.common.enums import ComponentType as CT
    from coopmat.policy.gemv_tiles import gemv_traits
    from coopmat.policy.types import TypePair

    info = rt.device.info
    sg = khr_subgroup_size(info.limits)
    tile = gemv_tile(rows=M, cols=cols, splits=splits, unroll=unroll, subgroup_size=sg,
                     b_quant=fmt, k_splits=k_splits)
    traits = replace(gemv_traits(CT.FLOAT16, CT.FLOAT32, info.limits, False, M, tile=tile,
                                 b_quant=fmt), prefetch=prefetch)
    assert traits.k_splits == k_splits
    N, K = 3 * tile.tile_n + 5, steps * tile.tile_k + 96
    w = exact_weight(fmt, N, K)
    x = small_x((M, K))
    y = run_gemv(rt, traits, TypePair(CT.FLOAT16, CT.FLOAT32), x, coopmat.quantize(w, fmt),
                 np.float32)
    np.testing.assert_array_equal(y, x.astype(np.float64) @ oracle(fmt, w).T)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_gemv_bfloat16(rt, fmt):
    """bfloat16 x: A widened with integer operations, the weights decoded in the same
    (even, odd) order; explicit traits where matmul offers no bfloat16 (lavapipe)."""
    import ml_dtypes

    from coopmat.common.enums import ComponentType as CT
    from coopmat.policy.gemv_tiles import gemv_traits
    from coopmat.policy.types import TypePair

    M, N, K = 4, 37, 4192
    w = exact_weight(fmt, N, K)
    x = small_x((M, K)).astype(ml_dtypes.bfloat16)
    q = coopmat.quantize(w, fmt)
    ref = x.astype(np.float64) @ oracle(fmt, w).T
    traits = gemv_traits(CT.BFLOAT16, CT.FLOAT32, rt.device.info.limits, False, M,
                         b_quant=fmt)
    y = run_gemv(rt, traits, TypePair(CT.BFLOAT16, CT.FLOAT32), x, q, np.float32)
    np.testing.assert_array_equal(y, ref)
    if "bfloat16->float32" in coopmat.supported_dtypes():
        np.testing.assert_array_equal(host(coopmat.matmul(x, q.T, family="gemv")), ref)
        gemv_traits_used(fmt, M)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_repeated_array_calls_use_their_own_operands(rt, fmt):
    """Device-array x @ w.T keeps a recipe per signature (coopmat/api/matmul.py): every
    repeat must still multiply its own x, and a new weight of the same shape (which may
    reuse the old one's id) its own blocks."""
    M, K, N = 3, 96, 40
    for _ in range(2):
        w = exact_weight(fmt, N, K)
        q = coopmat.quantize(w, fmt)
        deq = oracle(fmt, w)
        for _ in range(3):
            x = small_x((M, K))
            y = coopmat.asarray(x) @ q.T
            ref = (x.astype(np.float64) @ deq.T).astype(np.float16)
            np.testing.assert_array_equal(y.numpy(), ref)
        del q  # the next weight may take its id
