"""Kernel choice (coopmat.policy) against recorded devices: no GPU, no Vulkan.

The recorded lists are what real drivers report (tests/data/README.md): the NVIDIA H200
(driver 580) and Mesa 26 lavapipe, queried; RADV on RDNA3 and RDNA4 (float8 matrices) and
ANV on Intel Xe-HPG and Xe2, read from Mesa's source.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from coopmat.codegen import KhrTraits, Layout, Nv2Traits, RowsTraits, Tile
from coopmat.codegen.plan import plan_kernel
from coopmat.codegen.rows import RowsPlan
from coopmat.codegen.tiles import kernel_subgroup_size
from coopmat.codegen.variants import khr_subgroup_size
from coopmat.common.enums import ComponentType as CT
from coopmat.common.errors import MissingFeatureError
from coopmat.device.record import load_records
from coopmat.policy import (
    MEDIUM_MN,
    KernelChoice,
    OperandLayout,
    Options,
    Problem,
    TypePair,
    choose,
    choose_family,
    fills_small,
    resolve,
    shape_class,
)
from coopmat.policy.tiles import default_tile, filling_tile
from coopmat.policy.tuning import SHIPPED

DATA = Path(__file__).parents[1] / "data"
(H200,) = load_records(DATA / "nvidia-h200-khr-coopmat.json")
(LAVAPIPE,) = load_records(DATA / "lavapipe-mesa26-khr-coopmat.json")
(RADV,) = load_records(DATA / "radv-gfx12-khr-coopmat.json")
(RDNA3,) = load_records(DATA / "radv-gfx11-khr-coopmat.json")
(XE_HPG,) = load_records(DATA / "anv-xe-hpg-khr-coopmat.json")
BMG, LNL = load_records(DATA / "anv-xe2-khr-coopmat.json")
RECORDED = {"h200": H200, "lavapipe": LAVAPIPE, "rdna4": RADV, "rdna3": RDNA3,
            "xe-hpg": XE_HPG, "xe2-bmg": BMG, "xe2-lnl": LNL}
F16, F32, I8, I32 = np.float16, np.float32, np.int8, np.int32


def khr(choice: KernelChoice) -> KhrTraits:
    """The chosen traits, which must be the khr family's."""
    assert isinstance(choice.traits, KhrTraits), choice.traits
    return choice.traits


def row_major(M: int, N: int, K: int, pair: TypePair, **kw: object) -> Problem:
    return Problem(pair, M, N, K, OperandLayout(Layout.ROW_MAJOR, K),
                   OperandLayout(Layout.ROW_MAJOR, N), **kw)  # type: ignore[arg-type]


# -- types ---------------------------------------------------------------------------------
def test_float16_defaults_to_float32_accumulation_with_a_float16_result() -> None:
    for info in (H200, LAVAPIPE):
        pair = resolve(info, F16, F16)
        assert (pair.operand, pair.result, pair.out) == (CT.FLOAT16, CT.FLOAT32, CT.FLOAT16)
        assert pair.describe() == "float16->float32"  # the config (and tuning key)
        assert pair.describe_result() == "float16->float16 (float32 accumulation)"
        half = resolve(info, F16, F16, accumulator=F16)
        assert (half.result, half.out) == (CT.FLOAT16, None)
        wide = resolve(info, F16, F16, F32)
        assert (wide.result, wide.stored) == (CT.FLOAT32, CT.FLOAT32)


def test_other_defaults_and_errors() -> None:
    assert resolve(H200, I8, I8) == TypePair(CT.SINT8, CT.SINT32)
    assert resolve(H200, ml_dtypes.bfloat16, ml_dtypes.bfloat16) == \
        TypePair(CT.BFLOAT16, CT.FLOAT32)
    with pytest.raises(TypeError, match="different dtypes float16 and int8"):
        resolve(H200, F16, I8)
    with pytest.raises(TypeError, match="unsupported dtype float64; device 0 .* supports"):
        resolve(H200, np.float64, np.float64)
    with pytest.raises(TypeError, match="unsupported dtype bfloat16"):
        resolve(LAVAPIPE, ml_dtypes.bfloat16, ml_dtypes.bfloat16)  # lavapipe lists none
    with pytest.raises(TypeError, match="int8->int32 with float16 accumulation"):
        resolve(H200, I8, I8, accumulator=F16)


def test_float8_where_the_driver_lists_it() -> None:
    for dt, ct in ((ml_dtypes.float8_e4m3fn, CT.FLOAT8_E4M3),
                   (ml_dtypes.float8_e5m2, CT.FLOAT8_E5M2)):
        pair = resolve(RADV, dt, dt)
        assert pair == TypePair(ct, CT.FLOAT32)
        t = khr(choose(RADV, row_major(256, 256, 256, pair)))
        assert (t.a_type, t.b_type, t.result_type) == (ct, ct, CT.FLOAT32)
        assert t.subgroup_size == 32 and (t.m, t.n, t.k) == (16, 16, 16)
        with pytest.raises(TypeError, match="unsupported dtype"):
            resolve(H200, dt, dt)  # driver 580 lists no float8 matrix


# -- kernels -------------------------------------------------------------------------------
def shipped_h200() -> dict[str, tuple[str, Tile]]:
    import json
    table = json.loads((SHIPPED / "10de-2335.json").read_text())
    return {k: (v["family"], Tile(*v["tile"])) for k, v in table.items()}


def test_large_float16_takes_the_tuned_tile_exact_and_specialized() -> None:
    pair = resolve(H200, F16, F16)
    tuned = shipped_h200()
    choice = choose(H200, row_major(8192, 8192, 8192, pair), Options(), tuned)
    t = khr(choice)
    assert t.exact and t.specialized and choice.why == "tuned"
    assert t.tile == tuned["float16->float32"][1] and t.out_type == CT.FLOAT16
    assert choice.margins[0] > 0  # the exact look-ahead reads past A: its buffer grows
    off = choose(H200, row_major(8192, 8192, 8192, pair), Options(specialize="never"), tuned)
    assert not khr(off).specialized
    untuned = choose(H200, row_major(8192, 8192, 8192, pair), Options(tuning=False), tuned)
    assert untuned.why == "default" and untuned.traits.tile != t.tile


def test_shape_classes_and_their_fallback() -> None:
    pair = TypePair(CT.SINT8, CT.SINT32)
    side = int(MEDIUM_MN ** 0.5)
    assert shape_class(pair, side, side) == "int8->int32@medium"
    assert shape_class(pair, side, side + 1) == "int8->int32"
    assert shape_class(pair, 64, 10 ** 6) == "int8->int32@small-m"
    big, mid = Tile(64, 64, 32, 2, 2, 2), Tile(32, 32, 32, 2, 2, 1)
    opts = Options(family="khr")
    tuned = {"int8->int32": ("khr", big)}
    assert choose_family(H200, pair, opts, tuned, side, side) == ("khr", big)  # fallback
    tuned["int8->int32@medium"] = ("khr", mid)
    assert choose_family(H200, pair, opts, tuned, side, side) == ("khr", mid)
    assert choose_family(H200, pair, opts, tuned, side, side + 1) == ("khr", big)
    # A tuned nv2 choice applies only where the device can run nv2.
    nv2 = {"int8->int32": ("nv2", big)}
    assert choose_family(H200, pair, Options(), nv2) == ("nv2", big)
    assert choose_family(LAVAPIPE, pair, Options(), nv2) == ("khr", None)


def test_few_rows_get_their_own_tile_and_no_repack() -> None:
    pair = resolve(H200, I8, I8)
    few = choose(H200, row_major(16, 4096, 4096, pair))
    many = choose(H200, row_major(4096, 4096, 4096, pair))
    assert few.traits.tile != many.traits.tile
    assert not few.packs  # with few rows B is read about once: no repack
    (pack,) = many.packs  # a row-major 8-bit B is repacked K-contiguous first
    assert pack.operand == 1 and pack.packed.layout is Layout.COLUMN_MAJOR
    assert many.traits.b_layout is Layout.COLUMN_MAJOR
    assert many.params.ldb == pack.packed.ld


def test_variants_follow_sizes_and_strides() -> None:
    pair = resolve(LAVAPIPE, F16, F16)
    exact = khr(choose(LAVAPIPE, row_major(64, 64, 64, pair)))
    clamped = khr(choose(LAVAPIPE, row_major(60, 64, 64, pair)))  # M ends inside a tile
    aligned = khr(choose(LAVAPIPE, row_major(60, 64, 40, pair)))  # and K too
    general = khr(choose(LAVAPIPE, row_major(61, 63, 63, pair)))
    assert (exact.exact, exact.clamp_rows, exact.aligned) == (True, False, True)
    assert (clamped.exact, clamped.clamp_rows, clamped.aligned) == (True, True, True)
    cols = khr(choose(LAVAPIPE, row_major(64, 56, 64, pair)))  # N ends inside a tile
    assert (cols.exact, cols.clamp_rows, cols.clamp_cols) == (True, False, True)
    assert (aligned.exact, aligned.aligned) == (False, True)
    assert (general.exact, general.aligned) == (False, False)


def test_few_row_margin_is_one_step_of_a_row() -> None:
    """Where K is contiguous (A row-major, B column-major) the exact variant's look-ahead
    reads past the last row only: a decode step's 16-row x as a device Array (whose
    allocation keeps MARGIN_PER_LINE a line, at most a MARGIN_SHARE-th of its size) has
    room for it, so it runs unchecked; K x ld elements would not fit."""
    from coopmat.api.array import MARGIN_PER_LINE, MARGIN_SHARE

    pair = resolve(H200, F16, F16)
    M, N, K = 16, 4096, 4096
    weight_t = Problem(pair, M, N, K, OperandLayout(Layout.ROW_MAJOR, K),
                       OperandLayout(Layout.COLUMN_MAJOR, K))
    for problem in (weight_t, row_major(M, N, K, pair)):
        choice = choose(H200, problem, Options(split_k=1), shipped_h200())
        t = khr(choice)
        steps = 2 if t.tile.buffering == 3 else 1
        assert t.exact and choice.margins[0] == steps * t.tile.tile_k * 2
        assert choice.margins[0] <= min(MARGIN_PER_LINE * K, M * K * 2 // MARGIN_SHARE)
        b_lines = problem.b.layout == Layout.ROW_MAJOR  # K along B's lines: tile_k rows
        assert choice.margins[1] == steps * t.tile.tile_k * 2 * (N if b_lines else 1)


def test_no_room_for_the_exact_margin_falls_back() -> None:
    pair = resolve(H200, F16, F16)
    small = replace(H200, limits=replace(H200.limits, max_storage_buffer_range=4096 * 4096 * 2))
    choice = choose(small, row_major(4096, 4096, 4096, pair))
    assert not khr(choice).exact and choice.margins == (0, 0)


def test_forced_family_and_missing_features() -> None:
    pair = resolve(H200, F16, F16)
    nv2 = choose(H200, row_major(1024, 1024, 1024, pair), Options(family="nv2"))
    assert isinstance(nv2.traits, Nv2Traits) and nv2.traits.family == "nv2"
    assert nv2.traits.out_type == CT.FLOAT16
    assert nv2.why == "forced"
    with pytest.raises(MissingFeatureError, match="nv2 kernel family needs"):
        choose(LAVAPIPE, row_major(64, 64, 64, resolve(LAVAPIPE, F16, F16)),
               Options(family="nv2"))


def test_options_from_the_environment_name_the_variable() -> None:
    assert Options.from_env({}) == Options()
    assert Options.from_env({"COOPMAT_FAMILY": "nv2", "COOPMAT_SPECIALIZE": "0",
                             "COOPMAT_NO_TUNING": "1"}) == Options("nv2", "never", False)
    with pytest.raises(ValueError, match="COOPMAT_FAMILY='cuda'"):
        Options.from_env({"COOPMAT_FAMILY": "cuda"})
    with pytest.raises(ValueError, match="COOPMAT_SPECIALIZE='yes'"):
        Options.from_env({"COOPMAT_SPECIALIZE": "yes"})
    with pytest.raises(ValueError, match="unknown kernel family 'xyz'"):
        Options().with_family("xyz")


def test_options_are_read_once_and_changed_through_the_api(monkeypatch) -> None:
    """The COOPMAT_* variables are read at the first product and again only on
    reload_environment(); set_options changes the process's defaults, options() a block
    of this thread only, and a bad value still names itself."""
    import threading

    import coopmat
    from coopmat.policy import options as opts

    for name in ("COOPMAT_FAMILY", "COOPMAT_SPLIT_K", "COOPMAT_NO_TUNING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(opts, "_process", None)
    assert coopmat.get_options() == Options()
    monkeypatch.setenv("COOPMAT_FAMILY", "gemv")
    monkeypatch.setenv("COOPMAT_SPLIT_K", "4")
    assert coopmat.get_options() == Options()  # read once
    assert coopmat.reload_environment() == Options(family="gemv", split_k=4)
    assert coopmat.get_options() == Options(family="gemv", split_k=4)
    assert coopmat.set_options(tuning=False, family="auto") == Options(split_k=4, tuning=False)
    seen: list[Options] = []
    with coopmat.options(family="khr", split_k=1) as inside:
        assert inside == coopmat.get_options() == Options("khr", split_k=1, tuning=False)
        thread = threading.Thread(target=lambda: seen.append(coopmat.get_options()))
        thread.start()
        thread.join()
    assert seen == [Options(split_k=4, tuning=False)]  # another thread: the defaults
    assert coopmat.get_options() == Options(split_k=4, tuning=False)
    with pytest.raises(ValueError, match="unknown kernel family 'cuda'"):
        coopmat.set_options(family="cuda")
    with pytest.raises(ValueError, match="specialize='yes'"):
        coopmat.options(specialize="yes").__enter__()
    monkeypatch.setenv("COOPMAT_FAMILY", "cuda")
    with pytest.raises(ValueError, match="COOPMAT_FAMILY='cuda'"):
        coopmat.reload_environment()


# -- recorded devices: subgroup size and tiles (policy/tiles.py's tables) ------------------
def test_subgroup_size_is_chosen_not_inherited() -> None:
    # (device, reported subgroupSize, range, chosen): the smallest size a compute pipeline
    # may require, where the device lets it choose.
    expected = {"h200": (32, 32, 32, 32), "lavapipe": (8, 8, 8, 8),
                "rdna4": (64, 32, 64, 32), "rdna3": (64, 32, 64, 32),
                "xe-hpg": (32, 8, 32, 8), "xe2-bmg": (32, 16, 32, 16),
                "xe2-lnl": (32, 16, 32, 16)}
    for name, info in RECORDED.items():
        lim = info.limits
        got = (lim.subgroup_size, lim.min_subgroup_size, lim.max_subgroup_size,
               khr_subgroup_size(lim))
        assert got == expected[name], name
    assert kernel_subgroup_size(64, 32, 64, can_require=True) == 32
    assert kernel_subgroup_size(64, 32, 64, can_require=False) == 64  # cannot require one
    assert kernel_subgroup_size(16, 16, 16, can_require=True) == 16


def test_recorded_devices_get_the_tile_of_their_width() -> None:
    # 256 invocations and a 128 x 128 block of D on every GPU; the block per subgroup
    # scales with the width (64 accumulator elements per lane); the CPU keeps 32 x 32.
    f16 = {name: khr(choose(info, row_major(4096, 4096, 4096, resolve(info, F16, F16))))
           for name, info in RECORDED.items()}
    tiles = {name: (t.subgroup_size, t.tile, t.accumulators) for name, t in f16.items()}
    assert tiles == {
        "h200": (32, Tile(128, 128, 32, 2, 4, 2), (4, 2)),
        "rdna4": (32, Tile(128, 128, 32, 2, 4, 2), (4, 2)),
        "rdna3": (32, Tile(128, 128, 32, 2, 4, 2), (4, 2)),
        "xe-hpg": (8, Tile(128, 128, 32, 4, 8, 2), (4, 2)),  # 8x8 matrices
        "xe2-bmg": (16, Tile(128, 128, 32, 4, 4, 2), (4, 2)),  # 8x16 matrices
        "xe2-lnl": (16, Tile(128, 128, 32, 4, 4, 2), (4, 2)),
        "lavapipe": (8, Tile(32, 32, 16, 2, 2, 2), (2, 2)),
    }
    for name, t in f16.items():
        if name != "lavapipe":
            assert t.tile.subgroups * t.subgroup_size == 256, name
            rows, cols = t.accumulators
            assert rows * cols * t.m * t.n // t.subgroup_size == 64, name


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_every_choice_fits_the_device(name: str) -> None:
    """For every dtype pair the device computes and problems of each shape class: a kernel
    at a subgroup size the device can require, within its shared memory and invocations."""
    from coopmat.policy import result_pairs

    info = RECORDED[name]
    lim = info.limits
    pairs = result_pairs(info)
    assert pairs
    for pair in pairs:
        for M, N, K in ((4096, 4096, 4096), (1024, 1024, 1024), (1000, 1000, 1000),
                        (16, 4096, 4096)):
            choice = choose(info, row_major(M, N, K, pair), Options(tuning=False))
            t = choice.traits
            # khr by default: the rows family runs only when forced or tuned (measured
            # slower on the H200, lab/notebook/kernels.md).
            assert t.family == "khr" and choice.why == "default"
            assert lim.min_subgroup_size <= t.subgroup_size <= lim.max_subgroup_size
            plan = RowsPlan(t) if isinstance(t, RowsTraits) else plan_kernel(t)
            assert plan.shared_bytes <= lim.max_compute_shared_memory_size, (pair, M)
            assert t.invocations <= lim.max_compute_work_group_invocations, (pair, M)


def test_intel_matrices_and_types() -> None:
    # Xe-HPG lists no float16 accumulation and no float8; Xe2 adds float16 and bfloat16
    # results; both list bfloat16 operands accumulating in float32.
    for info in (XE_HPG, BMG):
        assert resolve(info, ml_dtypes.bfloat16, ml_dtypes.bfloat16) == \
            TypePair(CT.BFLOAT16, CT.FLOAT32)
        with pytest.raises(TypeError, match="unsupported dtype float8_e4m3fn"):
            resolve(info, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fn)
    with pytest.raises(TypeError, match="with float16 accumulation is not supported"):
        resolve(XE_HPG, F16, F16, accumulator=F16)
    assert resolve(BMG, F16, F16, accumulator=F16) == TypePair(CT.FLOAT16, CT.FLOAT16)
    assert {(c.M, c.N) for c in XE_HPG.cooperative_matrix_properties} == {(8, 8)}
    assert {(c.M, c.N) for c in BMG.cooperative_matrix_properties} == {(8, 16)}
    # int8 runs K = 32 matrices, two K steps of them per 64-byte tile_k.
    t = khr(choose(XE_HPG, row_major(4096, 4096, 4096, resolve(XE_HPG, I8, I8))))
    assert (t.m, t.n, t.k, t.tile.tile_k) == (8, 8, 32, 64)
    # ANV reports 48 KiB of shared memory: the default tiles use about 28.
    assert XE_HPG.limits.max_compute_shared_memory_size == 48 * 1024
    assert plan_kernel(t).shared_bytes <= 28 * 1024


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_float16_results_store_through_a_listed_matrix_only(name: str) -> None:
    """matmul's default float16 result (float32 accumulation) is stored as a float16
    accumulator matrix only where the device lists one (KhrTraits.out_matrix): everywhere
    but Xe-HPG, which lists no float16 accumulation. There every tile goes through the
    scratch, and the exact variant's scratch still fits the device's shared memory."""
    info = RECORDED[name]
    for M in (4096, 16):
        t = khr(choose(info, row_major(M, 4096, 4096, resolve(info, F16, F16)),
                       Options(tuning=False, split_k=1)))  # a split GEMM's D is float32
        assert (t.out_type, t.result_type) == (CT.FLOAT16, CT.FLOAT32)
        assert t.out_matrix == (name != "xe-hpg")
        plan = plan_kernel(t)
        if t.exact:  # with clamped rows the last row block stores through the scratch
            assert plan.scratch_elems == (0 if t.out_matrix and not t.clamp_rows
                                          else t.m * t.n)
        assert plan.shared_bytes <= info.limits.max_compute_shared_memory_size, M


def test_rdna3_lists_no_bfloat16_or_float8() -> None:
    for dt in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn):
        with pytest.raises(TypeError, match="unsupported dtype"):
            resolve(RDNA3, dt, dt)
    assert resolve(RDNA3, F16, F16, accumulator=F16) == TypePair(CT.FLOAT16, CT.FLOAT16)
    assert not RDNA3.extensions["VK_KHR_shader_bfloat16"]
    assert RDNA3.limits.max_compute_shared_memory_size == 64 * 1024


def test_an_8_wide_gpu_is_not_a_cpu() -> None:
    # Xe-HPG and lavapipe both run 8-wide subgroups; the device type, not the width, picks
    # the CPU's small tile.
    a = choose(XE_HPG, row_major(256, 256, 256, resolve(XE_HPG, F16, F16))).traits
    b = choose(LAVAPIPE, row_major(256, 256, 256, resolve(LAVAPIPE, F16, F16))).traits
    assert a.subgroup_size == b.subgroup_size == 8
    assert a.tile.subgroups == 32 and b.tile.subgroups == 4


@pytest.mark.parametrize("width", [8, 16, 32, 64])
def test_tiles_per_width_and_their_shrinking(width: int) -> None:
    m, n = (16, 16) if width >= 32 else (8, width)
    tile = default_tile(CT.FLOAT16, CT.FLOAT32, m, n, 16, width, 48 * 1024, 1024)
    assert tile.tile_m == tile.tile_n == 128 and tile.subgroups * width == 256

    def traits(t: Tile, a_layout: Layout = Layout.ROW_MAJOR,
               b_layout: Layout = Layout.ROW_MAJOR) -> KhrTraits:
        return KhrTraits(a_type=CT.FLOAT16, b_type=CT.FLOAT16, c_type=CT.FLOAT32,
                         result_type=CT.FLOAT32, a_layout=a_layout, b_layout=b_layout,
                         has_c=True, tile=t, subgroup_size=width, m=m, n=n, k=16)

    rows, cols = traits(tile).accumulators
    assert rows * m * cols * n == 64 * width
    # Vulkan's minimum (16 KiB, 128 invocations): the tile shrinks until it fits.
    small = default_tile(CT.FLOAT16, CT.FLOAT32, m, n, 16, width, 16 * 1024, 128)
    assert small.subgroups * width <= 128
    for a_layout in Layout:
        for b_layout in Layout:
            plan = plan_kernel(traits(small, a_layout, b_layout))
            assert plan.shared_bytes <= 16 * 1024


def test_filling_tile_grows_the_grid_to_fill_groups() -> None:
    ladder = (Tile(64, 64, 64, 2, 2, 2), Tile(32, 64, 64, 1, 2, 2), Tile(16, 32, 64, 1, 2, 1))
    big = Tile(128, 128, 64, 2, 2, 2)
    assert filling_tile(big, ladder, 2048, 2048, 1) == big  # 256 workgroups already
    assert filling_tile(big, ladder, 1024, 1024, 1) == ladder[0]  # 64 -> 256
    assert filling_tile(big, ladder, 128, 4096, 1) == ladder[1]  # 32 -> 128 -> 256
    assert filling_tile(big, ladder, 64, 64, 1) == ladder[2]  # none fills: the smallest
    assert filling_tile(big, ladder, 1024, 1024, 4) == big  # a batch counts its workgroups
    few = Tile(16, 64, 128, 1, 4, 2)  # only smaller tiles than the one given
    assert filling_tile(few, ladder, 16, 256, 1) == ladder[2]
    assert filling_tile(big, (), 64, 64, 1) == big  # no ladder (narrow subgroups)


def test_small_products_fill_the_h200() -> None:
    tuned = shipped_h200()
    pair = resolve(H200, F16, F16)

    def tile(M: int, N: int, K: int, p: TypePair = pair) -> Tile:
        return khr(choose(H200, row_major(M, N, K, p), Options(), tuned)).tile

    one_matrix = Tile(16, 32, 64, 1, 2, 1)
    assert tile(64, 64, 64) == tile(128, 128, 128) == tile(256, 256, 2048) == one_matrix
    assert tile(1024, 1024, 1024) == tile(512, 4096, 1024) == Tile(64, 64, 64, 2, 2, 2)
    # With K long enough, split K keeps the general tile instead (policy.mid_split_k).
    split = choose(H200, row_major(512, 4096, 4096, pair), Options(), tuned)
    assert split.split_k == 2 and khr(split).tile == tile(2048, 2048, 2048)
    assert tile(128, 4096, 4096) == Tile(32, 64, 64, 1, 2, 2)
    assert tile(64, 64, 64, resolve(H200, I8, I8)) == Tile(16, 32, 128, 1, 2, 1)
    assert tile(2048, 2048, 2048) == tuned["float16->float32@medium"][1]
    assert tile(8192, 8192, 8192) == tuned["float16->float32"][1]
    # A few-row product on a large B keeps the tiles and split measured for it.
    for M, N, K in ((16, 4096, 4096), (64, 4096, 4096), (32, 1024, 1024)):
        assert not fills_small(row_major(M, N, K, pair))
    assert fills_small(row_major(64, 512, 512, pair))
    # Narrow subgroups (Intel) and CPUs keep their tiles.
    for info in (XE_HPG, LAVAPIPE):
        p = resolve(info, F16, F16)
        assert khr(choose(info, row_major(1024, 1024, 1024, p))).tile == \
            khr(choose(info, row_major(4096, 4096, 4096, p))).tile


# -- the rows family (few rows, B streamed from global memory) ----------------------------
F16_OUT = TypePair(CT.FLOAT16, CT.FLOAT32, CT.FLOAT16)


def col_major_b(M: int, N: int, K: int, pair: TypePair, **kw: object) -> Problem:
    """x @ w.T with w an N x K row-major weight (linear-layer / GGUF layout)."""
    return Problem(pair, M, N, K, OperandLayout(Layout.ROW_MAJOR, K),
                   OperandLayout(Layout.COLUMN_MAJOR, K), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("make", [row_major, col_major_b], ids=["x@W", "x@w.T"])
@pytest.mark.parametrize("M", [1, 8, 16, 17, 64])
@pytest.mark.parametrize("N,K", [(4096, 4096), (14336, 4096), (4096, 14336)])
def test_h200_decode_shapes_rows_tiles(make, M: int, N: int, K: int) -> None:
    # Unforced: gemv for a few rows against x @ w.T (policy.kernel.GEMV_DEFAULT_MAX_M),
    # else khr.
    unforced = choose(H200, make(M, N, K, F16_OUT), Options(tuning=False)).traits
    assert unforced.family == ("gemv" if make is col_major_b and M <= 4 else "khr")
    choice = choose(H200, make(M, N, K, F16_OUT), Options(tuning=False, family="rows"))
    t = choice.traits
    assert isinstance(t, RowsTraits) and choice.why == "forced"
    assert t.aligned and t.out_type == CT.FLOAT16 and t.result_type == CT.FLOAT32
    assert (t.m, t.n, t.k, t.subgroup_size) == (16, 16, 16, 32)
    assert t.tile.tile_m == -(-M // 16) * 16  # every row in one row block
    assert N % t.tile.tile_n == 0 and t.kc % (t.k * t.splits * t.unroll) == 0
    assert RowsPlan(t).shared_bytes <= H200.limits.max_compute_shared_memory_size
    assert choice.margins == (0, 0) and not choice.packs


def test_rows_only_where_it_applies() -> None:
    # Forced, the rows kernel refuses N off the column strip and a B leading dimension
    # that is not 16-byte aligned (a clear error); anything else runs.
    forced = Options(family="rows")
    assert isinstance(choose(H200, row_major(65, 4096, 4096, F16_OUT), forced).traits,
                      RowsTraits)
    with pytest.raises(ValueError, match="N=4100 is not a multiple"):
        choose(H200, row_major(16, 4100, 4096, F16_OUT), forced)
    odd_ldb = Problem(F16_OUT, 16, 4096, 4096, OperandLayout(Layout.ROW_MAJOR, 4096),
                      OperandLayout(Layout.ROW_MAJOR, 4104))
    assert isinstance(choose(H200, odd_ldb, forced).traits, RowsTraits)
    with pytest.raises(ValueError, match="leading dimension"):
        choose(H200, replace(odd_ldb, b=OperandLayout(Layout.ROW_MAJOR, 4100)), forced)
    # A column-major A runs the general variant (element loads of A).
    a_view = replace(row_major(16, 4096, 4096, F16_OUT), a=OperandLayout(Layout.COLUMN_MAJOR, 16))
    t = choose(H200, a_view, forced).traits
    assert isinstance(t, RowsTraits) and not t.aligned
    # A's rows 4100 elements apart (not whole 16-byte vectors): the general variant.
    padded_a = replace(row_major(16, 4096, 4096, F16_OUT), a=OperandLayout(Layout.ROW_MAJOR, 4100))
    t = choose(H200, padded_a, forced).traits
    assert isinstance(t, RowsTraits) and not t.aligned


def test_forcing_rows() -> None:
    forced = Options(family="rows")
    t = choose(LAVAPIPE, row_major(16, 32, 64, F16_OUT), forced).traits
    assert isinstance(t, RowsTraits) and t.subgroup_size == 8
    # More rows than the default reaches: row blocks of 64 (WorkgroupId.y).
    t = choose(LAVAPIPE, row_major(200, 32, 64, F16_OUT), forced).traits
    assert isinstance(t, RowsTraits) and t.tile.tile_m == 64
    with pytest.raises(ValueError, match="N=20 is not a multiple"):
        choose(LAVAPIPE, row_major(16, 20, 64, F16_OUT), forced)
    with pytest.raises(ValueError, match="K=60 is not a multiple"):
        choose(LAVAPIPE, row_major(16, 32, 60, F16_OUT), forced)
    assert Options.from_env({"COOPMAT_FAMILY": "rows"}).family == "rows"
    assert Options().with_family("rows").family == "rows"


def test_tuned_rows_tile_is_used() -> None:
    from coopmat.codegen import rows_tile

    tile = rows_tile(16, 16, row_frags=1, nf=4, splits=4, unroll=2, kc=128)
    key = shape_class(F16_OUT, 16, 4096)
    choice = choose(H200, row_major(16, 4096, 4096, F16_OUT), tuned={key: ("rows", tile)})
    assert choice.traits.tile == tile and choice.why == "tuned"
    # For 40 rows the tuned tile gets three row fragments.
    t = choose(H200, row_major(40, 4096, 4096, F16_OUT), tuned={key: ("rows", tile)}).traits
    assert t.tile == replace(tile, tile_m=48)
    # A tuned khr tile is a khr kernel (rows runs only where tuning chose it).
    khr_tile = Tile(16, 64, 128, 1, 4, 2)
    t = khr(choose(H200, row_major(16, 4096, 4096, F16_OUT), tuned={key: ("khr", khr_tile)}))
    assert t.tile == khr_tile


def test_few_rows_take_one_row_block() -> None:
    """Few-row products read B once per row block: on a GPU, a few-row tile with fewer
    rows than M (32 or 64 of them) is widened to hold them all; 17-31 rows keep it
    (measured slower on partial tiles), and so do CPU drivers and M past SMALL_M."""
    from coopmat.codegen.traits import Tile
    from coopmat.policy.tiles import covering_rows_tile
    f16, f32 = CT.FLOAT16, CT.FLOAT32
    small = Tile(16, 64, 128, 1, 4, 2)

    def cover(M: int, smem: int = 48 * 1024) -> Tile:
        return covering_rows_tile(small, M, f16, f32, 16, 16, 16, 32, smem, 1024)

    assert cover(16) == small and cover(24) == small and cover(65) == small
    assert cover(32) == Tile(32, 64, 128, 2, 2, 5)  # two register sets: loads further ahead
    assert cover(33) == cover(64) == Tile(64, 64, 128, 2, 2, 5)
    assert cover(64, smem=4 * 1024) == small  # does not fit: kept
    for M in (32, 64):
        t = khr(choose(H200, col_major_b(M, 14336, 4096, F16_OUT)))
        assert t.tile.tile_m == M
    cpu = [khr(choose(LAVAPIPE, col_major_b(M, 256, 256, F16_OUT))).tile for M in (1, 64)]
    assert cpu[0] == cpu[1]  # a CPU driver: not widened


@pytest.mark.parametrize("info", [H200, LAVAPIPE, RDNA3], ids=["h200", "lavapipe", "rdna3"])
def test_tuner_candidates(info) -> None:
    """The tuner's (family, tile) list: the default khr tile first, every khr candidate
    that fits the device, the nv2 tiles where the device runs nv2 (general classes only),
    and the rows sweep for few rows on a GPU only."""
    from coopmat.codegen.tiles import tile_fits
    from coopmat.codegen.variants import khr_subgroup_size
    from coopmat.device.record import nv2_usable
    from coopmat.policy import config_for
    from coopmat.policy.tiles import khr_tile
    from coopmat.policy.tuning import candidates

    pair = TypePair(CT.FLOAT16, CT.FLOAT32)
    cfg = config_for(info, pair)
    assert cfg is not None
    cpu = info.device_type == "CPU"
    lim = info.limits
    for small_m in (False, True):
        found = candidates(info, pair, cfg, small_m)
        families = [f for f, _ in found]
        assert found[0] == ("khr", khr_tile(cfg, lim, small_m, cpu=cpu))
        assert families == sorted(families, key=["khr", "nv2", "rows"].index)  # grouped
        khr = [t for f, t in found if f == "khr"]
        assert len(set(khr)) == len(khr) and all(
            tile_fits(t, cfg.a_type, cfg.result_type, cfg.M, cfg.N, cfg.K,
                      khr_subgroup_size(lim), lim.max_compute_shared_memory_size,
                      lim.max_compute_work_group_invocations) for t in khr)
        assert ("nv2" in families) == (not small_m and nv2_usable(info))
        assert ("rows" in families) == (small_m and not cpu)
