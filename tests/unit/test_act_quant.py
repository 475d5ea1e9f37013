"""The q8_1 activation quantization without a device: the numpy oracle against gguf.quants
and the format's definition, the two kernels' modules (spirv-val), their traits, and the
policy's refusals on recorded devices."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest
from conftest import DATA

gguf = pytest.importorskip("gguf")

from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import quants  # noqa: E402
from q8_1_oracle import dequantize_q8_1, error_bound, quantize_q8_1, roundf  # noqa: E402

from coopmat.codegen import build_gemm, tools  # noqa: E402
from coopmat.codegen.gemv_q8_1 import GemvQ8_1Traits, q8_1_traits  # noqa: E402
from coopmat.codegen.quant_q8_1 import (  # noqa: E402
    QuantizeQ8_1Kernel,
    quantize_q8_1_kernel,
    quantized_bytes,
    quantized_lda,
)
from coopmat.common.enums import ComponentType as CT  # noqa: E402
from coopmat.device.record import load_records  # noqa: E402
from coopmat.policy.act_quant import (  # noqa: E402
    FUSED_MAX_ROWS,
    check_name,
    q8_1_kernel,
    q8_1_violation,
)
from coopmat.policy.gemv_tiles import default_gemv_tile, gemv_traits  # noqa: E402
from coopmat.policy.types import resolve  # noqa: E402

RNG = np.random.default_rng(81)


def test_roundf_sends_halves_away_from_zero():
    t = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, -0.49999997, 126.5],
                 np.float32)
    assert roundf(t).tolist() == [-3, -2, -1, 1, 2, 3, 0, 0, 127]


@pytest.mark.parametrize("scale", [1.0, 1e-3, 300.0])
def test_q8_1_qs_and_d_are_ggml_q8_0s(scale):
    """q8_1 quantizes as q8_0 (gguf's Q8_0 is bit-exact with ggml's reference): the same
    int8 qs and, rounded to float16 as ggml stores it, the same d (coopmat keeps the
    float32 d: at scale 1e-3 the float16 one is subnormal); s = d * sum(qs); a zero block
    gives zeros."""
    x = (RNG.standard_normal((6, 256)) * scale).astype(np.float32)
    x[2, 32:64] = 0
    x[3, :32] = RNG.integers(-3, 4, 32) * np.float32(0.5)  # halves after scaling
    qs, d, s = quantize_q8_1(x)
    ref = quants.quantize(x, QT.Q8_0).reshape(6, 8, 34)
    np.testing.assert_array_equal(qs.view(np.uint8), ref[..., 2:])
    d16 = ref[..., :2].copy().view(np.float16)[..., 0]
    np.testing.assert_array_equal(d.astype(np.float16), d16)
    np.testing.assert_array_equal(s, (qs.sum(-1).astype(np.float32) * d).astype(np.float32))
    assert np.all(qs[2, 1] == 0) and d[2, 1] == 0 and s[2, 1] == 0


def test_error_bound_holds_and_is_not_vacuous():
    """The bound covers the oracle's own product and is within a small factor of the
    largest error on Gaussian data."""
    x = RNG.standard_normal((8, 512)).astype(np.float16)
    w = RNG.standard_normal((64, 512))
    qs, d, _ = quantize_q8_1(x)
    err = np.abs(dequantize_q8_1(qs, d) @ w.T - x.astype(np.float64) @ w.T)
    bound = error_bound(x, w)
    assert np.all(err <= bound) and (err / bound).max() > 0.01


def test_kernels_validate():
    if shutil.which("spirv-val") is None:
        pytest.skip("spirv-val not installed")
    assert tools.validate(quantize_q8_1_kernel().spirv).ok
    lavapipe = load_records(DATA / "lavapipe-mesa26-khr-coopmat.json")[0]
    for fmt in ("q4_0", "q8_0"):
        for M, fused in ((1, False), (8, False), (1, True), (3, True), (8, True)):
            t = q8_1_traits(gemv_traits(CT.FLOAT16, CT.FLOAT32, lavapipe.limits, False, M,
                                        out_type=CT.FLOAT16, b_quant=fmt, K=256, N=64),
                            fused)
            k = build_gemm(t)
            assert tools.validate(k.spirv).ok, t.describe()
            assert "shaderIntegerDotProduct" in k.features


@pytest.mark.parametrize("fmt,M", [("q4_0", 1), ("q8_0", 3)])
def test_fused_kernel_quantizes_each_block_once_for_all_columns(fmt, M):
    """The fused kernel's module holds the quantization (one 1 / d, OpFDiv) once per row
    and block a lane loads, in the main loop and the remainder: rows x unroll + rows
    divisions by d, and as many by 127; the integer dot products are those of the pass's
    kernel, each quantized block used for all C columns."""
    from coopmat.codegen.spv import Op
    lavapipe = load_records(DATA / "lavapipe-mesa26-khr-coopmat.json")[0]
    g = gemv_traits(CT.FLOAT16, CT.FLOAT32, lavapipe.limits, False, M, out_type=CT.FLOAT16,
                    b_quant=fmt, K=4096, N=4096)

    def count(spirv: bytes, op: int) -> int:
        words = np.frombuffer(spirv, np.uint32)[5:]
        n, i = 0, 0
        while i < len(words):
            n += int(words[i] & 0xFFFF) == op
            i += int(words[i] >> 16)
        return n

    fused, passed = (build_gemm(q8_1_traits(g, f)).spirv for f in (True, False))
    blocks = M * (g.unroll + 1)  # a lane's blocks: unroll in a full step, 1 in the remainder
    assert count(fused, Op.FDiv) == 2 * blocks and count(passed, Op.FDiv) == 0
    dots = Op.SUDot if fmt == "q4_0" else Op.SDot
    assert count(fused, dots) == count(passed, dots) == 8 * blocks * g.cols


def test_traits_name_and_refuse():
    lavapipe = load_records(DATA / "lavapipe-mesa26-khr-coopmat.json")[0]
    base = gemv_traits(CT.FLOAT16, CT.FLOAT32, lavapipe.limits, False, 1, b_quant="q4_0",
                       K=256, N=64)
    t = q8_1_traits(base)
    assert isinstance(t, GemvQ8_1Traits) and t.family == "gemv_q8_1"
    assert t.describe() == base.describe().replace("gemv", "gemv_q8_1", 1) + "-aq8_1"
    assert t != base  # its own kernel, never the float one's cache entry
    fused = q8_1_traits(base, fused_quant=True)
    assert fused.describe() == t.describe() + "f" and fused != t
    with pytest.raises(ValueError, match="q4_0 or q8_0"):
        q8_1_traits(replace(base, b_quant=None, tile=gemv_traits(
            CT.FLOAT16, CT.FLOAT32, lavapipe.limits, False, 1).tile)).check_tile()


def test_layout_sizes_and_push_constants():
    assert quantized_lda(4096) == 4096 and quantized_bytes(3, 4096) == 3 * 4096 * 2
    assert QuantizeQ8_1Kernel.workgroups(16, 14336) == (-(-16 * 448 // 128), 1, 1)
    with pytest.raises(ValueError, match="multiple of 32"):
        QuantizeQ8_1Kernel.push_constants(1, 48, 48)


def test_policy_refusals():
    h200 = load_records(DATA / "nvidia-h200-khr-coopmat.json")[0]
    h200 = replace(h200, features={**h200.features, "shaderIntegerDotProduct": True})
    pair = resolve(h200, "float16", "float16")
    assert q8_1_violation(h200, pair, "q4_0", 4096) is None
    assert "float B" in q8_1_violation(h200, pair, None, 4096)
    assert "not whole 32" in q8_1_violation(h200, pair, "q8_0", 4016)
    bf16 = resolve(h200, "bfloat16", "bfloat16")
    assert "float16 activations" in q8_1_violation(h200, bf16, "q4_0", 4096)
    lacking = replace(h200, features={**h200.features, "shaderIntegerDotProduct": False})
    assert "shaderIntegerDotProduct" in q8_1_violation(lacking, pair, "q4_0", 4096)
    with pytest.raises(ValueError, match="'q8_1'"):
        check_name("q4_0")
    t = q8_1_kernel(h200, pair, 1, 4096, 14336, "q4_0")
    assert t.b_quant == "q4_0" and t.rows == 1 and t.out_type == CT.FLOAT16
    # Its own tiles (gemv_tiles.INTEGER_TILES): two subgroups sharing K against few
    # columns, 8 columns a subgroup against many; the float kernel's default on lavapipe.
    assert (t.cols, t.unroll, t.splits, t.k_splits) == (4, 2, 2, 2)
    wide = q8_1_kernel(h200, pair, 3, 14336, 4096, "q8_0")
    assert (wide.rows, wide.cols, wide.unroll, wide.splits, wide.k_splits) == (3, 8, 2, 4, 1)
    lavapipe = load_records(DATA / "lavapipe-mesa26-khr-coopmat.json")[0]
    lavapipe = replace(lavapipe, features={**lavapipe.features,
                                           "shaderIntegerDotProduct": True})
    deep = q8_1_kernel(h200, pair, 8, 4096, 14336, "q4_0")
    assert deep.tile == default_gemv_tile(8, deep.subgroup_size, "q4_0", 4096)
    cpu = q8_1_kernel(lavapipe, resolve(lavapipe, "float16", "float16"), 3, 4096, 4096,
                      "q8_0")
    assert cpu.tile == default_gemv_tile(3, cpu.subgroup_size, "q8_0", cpu=True)
    # x quantized by the pass unless asked (or within FUSED_MAX_ROWS); either on request.
    assert t.fused_quant == (1 <= FUSED_MAX_ROWS)
    assert not q8_1_kernel(h200, pair, FUSED_MAX_ROWS + 1, 4096, 14336, "q4_0").fused_quant
    assert q8_1_kernel(h200, pair, 1, 4096, 14336, "q8_0", fused=True).fused_quant
    assert not q8_1_kernel(h200, pair, 1, 4096, 14336, "q4_0", fused=False).fused_quant
