"""coopmat.matmul against numpy, on the device scripts/test runs on.

Tolerances (documented in README):
- integer results are exact;
- float16 operands drawn from small integers (|x| <= 3) multiply and add exactly in both
  f16 and f32 while |sums| <= 2048, so those results must equal numpy's exactly: any wrong
  index, missing K step or stray write shows;
- for general float data, the error bound is the classic worst-case for a K-term dot
  product, |err| <= K * u_acc * (|A| @ |B|) + u_out * |ref|, with u = 2**-11 for an f16
  accumulator or output, 2**-24 for f32 (and 2**-8 for a bfloat16 input rounding).
"""

from __future__ import annotations

import numpy as np
import pytest
from matmul_oracle import BFLOAT16, RNG, float_tolerance, reference, require, small_ints
from sampling import pairwise

import coopmat
import coopmat.api.matmul
from coopmat.codegen import KhrTraits
from coopmat.common.enums import ComponentType


@pytest.fixture(scope="module")
def pairs(live_device_info):
    return coopmat.supported_dtypes()


def operands(dtype, M, N, K, batch=()):
    dt = np.dtype(dtype)
    if dt == np.int8:
        a = RNG.integers(-128, 128, size=(*batch, M, K), dtype=np.int8)
        b = RNG.integers(-128, 128, size=(*batch, K, N), dtype=np.int8)
    elif dt == np.uint8:
        a = RNG.integers(0, 256, size=(*batch, M, K), dtype=np.uint8)
        b = RNG.integers(0, 256, size=(*batch, K, N), dtype=np.uint8)
    else:
        a = small_ints((*batch, M, K), dt)
        b = small_ints((*batch, K, N), dt)
    return a, b


DTYPE_CASES = [
    ("float16", None, np.float16),
    ("float16", np.float32, np.float32),
    ("int8", None, np.int32),
    ("uint8", None, np.uint32),
    (BFLOAT16, None, np.float32),
]


SIZES = [(1, 1, 1), (8, 8, 8), (37, 29, 53), (64, 48, 40), (65, 33, 17), (3, 130, 5),
         (129, 7, 70)]


TRANSPOSES = [(False, False), (True, False), (False, True), (True, True)]
# Every dtype case, size and transposition, and every pair of them (tests/support/sampling.py)
EXACT_CASES = [(*d, *size, *t) for d, size, t in pairwise(DTYPE_CASES, SIZES, TRANSPOSES)]


@pytest.mark.parametrize("dtype,out_dtype,result,M,N,K,ta,tb", EXACT_CASES,
                         ids=lambda x: str(x))
def test_matches_numpy_exactly(pairs, dtype, out_dtype, result, M, N, K, ta, tb):
    require(pairs, dtype, result)
    a, b = operands(dtype, M, N, K)
    if ta:  # a transposed view: the kernel reads it column-major, no copy
        a = np.ascontiguousarray(a.T).T
    if tb:
        b = np.ascontiguousarray(b.T).T
    d = coopmat.matmul(a, b, out_dtype=out_dtype)
    assert d.dtype == np.dtype(result)
    assert d.shape == (M, N)
    np.testing.assert_array_equal(d, reference(a, b, result).astype(result))


@pytest.mark.parametrize("dtype,out_dtype,result", DTYPE_CASES[:2])
def test_float_accumulation_error_within_bound(pairs, dtype, out_dtype, result):
    require(pairs, dtype, result)
    M, N, K = 24, 40, 1500
    a = RNG.standard_normal((M, K)).astype(np.float16)
    b = RNG.standard_normal((K, N)).astype(np.float16)
    d = coopmat.matmul(a, b, out_dtype=out_dtype).astype(np.float64)
    ref = reference(a, b, np.float64)
    # float16 results accumulate in float32 by default (numpy's accuracy).
    tol = float_tolerance(a, b, np.float32, result)
    assert np.all(np.abs(d - ref) <= tol), np.max(np.abs(d - ref) / tol)
    # The error is real accumulation error, not garbage: far below the data's scale.
    assert np.max(np.abs(d - ref)) < 0.05 * np.max(np.abs(ref))


def test_float16_accuracy_as_numpy_and_the_half_precision_opt_in(pairs):
    """K = 2000 normal data: the default float16 result is within a rounding of numpy's own
    float16 product; accumulator=np.float16 runs an f16-accumulating kernel, within the
    (much wider) f16 bound."""
    require(pairs, "float16", np.float16)
    M, N, K = 16, 24, 2000
    a = RNG.standard_normal((M, K)).astype(np.float16)
    b = RNG.standard_normal((K, N)).astype(np.float16)
    ref = reference(a, b, np.float64)
    d = coopmat.matmul(a, b)
    assert d.dtype == np.float16
    assert coopmat.api.matmul.last_kernel_traits().result_type == ComponentType.FLOAT32
    err = np.abs(d.astype(np.float64) - ref)
    numpy_err = np.abs(np.matmul(a, b).astype(np.float64) - ref)
    assert err.max() <= numpy_err.max() + 2.0 ** -11 * np.abs(ref).max()
    assert np.all(err <= float_tolerance(a, b, np.float32, np.float16))
    if "float16->float16" not in [p.split(" ")[0] for p in pairs]:
        return
    half = coopmat.matmul(a, b, accumulator=np.float16)
    assert coopmat.api.matmul.last_kernel_traits().result_type == ComponentType.FLOAT16
    half_err = np.abs(half.astype(np.float64) - ref)
    assert np.all(half_err <= float_tolerance(a, b, np.float16, np.float16))
    assert half_err.max() > err.max()  # it is the other kernel: less accurate


@pytest.mark.parametrize("M,N,K,variant", [(128, 96, 64, "exact"), (80, 48, 40, "aligned"),
                                           (37, 45, 19, "general")])
@pytest.mark.parametrize("with_c", [False, True], ids=["noc", "c"])
def test_float16_results_stored_element_by_element(pairs, M, N, K, variant, with_c):
    """The khr kernel as a device without a float16 accumulator matrix gets it (Intel
    Xe-HPG: KhrTraits.out_matrix False): every tile rounds and stores D element by
    element through the scratch, no float16 matrix declared. Forced here on the device at
    hand, each variant, with C and without: products of small integers are exact."""
    require(pairs, "float16", np.float16)
    from dataclasses import replace

    from coopmat.dispatch.gemm import PreparedGemm
    from coopmat.dispatch.runtime import runtime
    from coopmat.policy import Options, TypePair

    rt = runtime()
    pair = TypePair(ComponentType.FLOAT16, ComponentType.FLOAT32, ComponentType.FLOAT16)
    beta = -2.0 if with_c else 0.0

    def chosen(M: int, N: int, K: int) -> tuple:
        a, b = operands("float16", M, N, K)
        c = small_ints((M, N), np.float16) if with_c else None
        g = PreparedGemm(rt, pair, a[None], b[None], None if c is None else c[None], 1,
                         3.0, beta, options=Options(tuning=False))
        g.release()
        return a, b, c, g.traits

    a, b, c, t = chosen(M, N, K)
    if variant == "exact" and t.variant != "exact":
        # The device's tile does not divide these sizes (the H200's is 128 x 128): whole
        # tiles of its own do.
        a, b, c, t = chosen(t.tile.tile_m, t.tile.tile_n, 2 * t.tile.tile_k)
    assert isinstance(t, KhrTraits) and t.variant == variant and t.out_type is not None
    t = replace(t, out_matrix=False)
    g = PreparedGemm(rt, pair, a[None], b[None], None if c is None else c[None], 1, 3.0,
                     beta, traits=t)
    try:
        g.execute()
        out = np.empty((1, a.shape[0], b.shape[1]), np.float16)
        g.read(out)
    finally:
        g.release()
    assert g.traits == t and t.scratch_epilogue
    want = 3.0 * reference(a, b, np.float64)
    if c is not None:
        want = want + beta * c.astype(np.float64)
    np.testing.assert_array_equal(out[0], want.astype(np.float16))


def test_vector_dot_returns_a_scalar_and_dtype_is_out_dtype(pairs):
    require(pairs, "int8", np.int32)
    x = RNG.integers(-9, 9, size=40, dtype=np.int8)
    y = RNG.integers(-9, 9, size=40, dtype=np.int8)
    r = coopmat.matmul(x, y)
    want = np.matmul(x.astype(np.int32), y.astype(np.int32))
    assert type(r) is type(want) and r == want  # a numpy scalar, as numpy returns
    out = np.zeros((), np.int32)
    assert coopmat.matmul(x, y, out=out) is out and out == want
    a, b = operands("float16", 8, 8, 8)
    assert coopmat.matmul(a, b, dtype=np.float32).dtype == np.float32
    assert coopmat.matmul(a, b, out_dtype=np.float32).dtype == np.float32
    with pytest.raises(TypeError, match="disagree"):
        coopmat.matmul(a, b, dtype=np.float32, out_dtype=np.float16)


def test_int8_extremes_exact(pairs):
    require(pairs, "int8", np.int32)
    a = np.full((17, 300), -128, dtype=np.int8)
    b = np.full((300, 9), -128, dtype=np.int8)
    b[::2] = 127
    np.testing.assert_array_equal(coopmat.matmul(a, b), reference(a, b, np.int32))
    ua = np.full((17, 300), 255, dtype=np.uint8)
    ub = np.full((300, 9), 255, dtype=np.uint8)
    if "uint8->uint32" in pairs:
        np.testing.assert_array_equal(coopmat.matmul(ua, ub), reference(ua, ub, np.uint32))


REPACK_SHAPES = [
    ((65, 53), (53, 37)),            # K and N off every vector and tile size (byte reads)
    ((72, 53), (53, 64)),            # word reads, K off the 16-byte output vectors
    ((3, 132, 64), (64, 96)),        # batched A, one B packed once for the batch
    ((2, 100, 40), (2, 40, 300)),    # batched B, packed per batch entry
    ((64, 20), (20, 33)),            # SMALL_M rows: operands read as they are
]


# Every shape with A as it is and as a view, and every pair of shape, A and type: the
# signedness changes the kernel's multiply, not the packing (a kernel each: seconds of
# lavapipe's compile).
@pytest.mark.parametrize("a_shape,b_shape,ta,dtype,result", [
    (*shapes, ta, *types) for shapes, ta, types in pairwise(
        REPACK_SHAPES, [False, True], [("int8", np.int32), ("uint8", np.uint32)])])
def test_8bit_operands_repacked_k_contiguous(pairs, dtype, result, ta, a_shape, b_shape):
    """8-bit operands that are not K-contiguous (a row-major B; a column-major A, here a
    transposed view) are repacked K-contiguous on the device for more than SMALL_M rows,
    since tensor cores take 8-bit fragments that way; the result is exact either way."""
    from coopmat.api.matmul import last_kernel_traits
    from coopmat.codegen import Layout
    from coopmat.policy import SMALL_M

    require(pairs, dtype, result)
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, size=a_shape, endpoint=True).astype(dtype)
    b = RNG.integers(info.min, info.max, size=b_shape, endpoint=True).astype(dtype)
    if ta:
        a = np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
    d = coopmat.matmul(a, b)
    np.testing.assert_array_equal(d, reference(a, b, result))
    packed = a_shape[-2] > SMALL_M
    t = last_kernel_traits()
    assert t.b_layout == (Layout.COLUMN_MAJOR if packed else Layout.ROW_MAJOR)
    assert t.a_layout == (Layout.COLUMN_MAJOR if ta and not packed else Layout.ROW_MAJOR)
    c = RNG.integers(-1000 if dtype == "int8" else 0, 1000, size=d.shape).astype(result)
    d2 = coopmat.matmul(a, b, c=c, alpha=3, beta=2)
    np.testing.assert_array_equal(d2, (3 * reference(a, b, np.int64) + 2 * c.astype(np.int64))
                                  .astype(result))


# uint8 is left out: its kernels differ from int8's in the multiply's signedness only,
# which test_matches_numpy_exactly runs, not in what specialization compiles in; and
# float16 -> float32, whose sizes and strides are float16's and whose D elements are
# 4 bytes as int8 -> int32's are.
@pytest.mark.parametrize("dtype,out_dtype,result",
                         [c for c in DTYPE_CASES if c[0] != "uint8" and c[1] is None],
                         ids=lambda x: str(x))
def test_shape_specialized_kernels(pairs, monkeypatch, dtype, out_dtype, result):
    """COOPMAT_SPECIALIZE=1 compiles sizes and strides into the kernel (large problems get
    that by default): same results, including batches, broadcasts, C and views."""
    from coopmat.api.matmul import last_kernel_traits

    require(pairs, dtype, result)
    coopmat.set_options(specialize="always")
    for M, N, K, batch, tb in [(37, 29, 53, (), False), (64, 48, 40, (3,), False),
                               (129, 7, 70, (2,), True), (96, 64, 32, (), False)]:
        a, b = operands(dtype, M, N, K, batch)
        if tb:
            b = np.ascontiguousarray(np.swapaxes(b, -1, -2)).swapaxes(-1, -2)
        d = coopmat.matmul(a, b[0] if batch and tb else b, out_dtype=out_dtype)
        ref = reference(a, b[0] if batch and tb else b, result).astype(result)
        np.testing.assert_array_equal(d, ref)
        t = last_kernel_traits()
        if isinstance(t, KhrTraits):  # the only family with specialized kernels
            assert len(t.specialized) == 11 and t.specialized[:3] == (M, N, K)
    a, b = operands(dtype, 40, 24, 16)
    c = small_ints((40, 24), result)
    d = coopmat.matmul(a, b, c=c, alpha=2, beta=-1, out_dtype=out_dtype)
    np.testing.assert_array_equal(d, (2 * reference(a, b, result) - c).astype(result))
    coopmat.set_options(specialize="never")
    coopmat.matmul(a, b, out_dtype=out_dtype)
    t = last_kernel_traits()
    assert not isinstance(t, KhrTraits) or t.specialized == ()


def test_specialized_kernels_are_bounded(pairs, monkeypatch):
    """By default, large problems get shape-specialized kernels, but only up to
    MAX_SPECIALIZED shapes per process (each is a pipeline kept for the process's life);
    shapes already specialized keep theirs."""
    from coopmat.api.matmul import last_kernel_traits
    from coopmat.dispatch import gemm
    from coopmat.policy import kernel as policy_kernel

    require(pairs, "int8", np.int32)
    coopmat.set_options(specialize="auto")
    monkeypatch.setattr(policy_kernel, "SPECIALIZE_MIN_OPS", 0)
    monkeypatch.setattr(gemm, "MAX_SPECIALIZED", 2)
    monkeypatch.setattr(gemm, "_specialized", set())
    monkeypatch.setattr(gemm, "_plans", type(gemm._plans)())
    got = []
    for M, N, K in [(40, 24, 16), (41, 24, 16), (42, 24, 16), (40, 24, 16), (43, 24, 16)]:
        a, b = operands("int8", M, N, K)
        np.testing.assert_array_equal(coopmat.matmul(a, b), reference(a, b, np.int32))
        t = last_kernel_traits()
        if not isinstance(t, KhrTraits):
            pytest.skip("the tuned family for int8 here is not khr")
        got.append(t.specialized[:3])
    assert got == [(40, 24, 16), (41, 24, 16), (), (40, 24, 16), ()]


@pytest.mark.parametrize("a_shape,b_shape", [
    ((3, 20, 12), (12, 9)),          # batched A, shared B
    ((20, 12), (4, 12, 9)),          # shared A, batched B
    ((2, 1, 20, 12), (3, 12, 9)),    # broadcast both ways
    ((2, 3, 5, 7), (2, 3, 7, 4)),    # full batch
    ((12,), (12, 9)),                # 1-D left
    ((20, 12), (12,)),               # 1-D right
    ((5, 20, 12), (12,)),            # batched with 1-D right
    ((12,), (12,)),                  # 1-D @ 1-D
])
def test_shapes_like_numpy(pairs, a_shape, b_shape):
    require(pairs, "int8", np.int32)
    a = RNG.integers(-50, 50, size=a_shape, dtype=np.int8)
    b = RNG.integers(-50, 50, size=b_shape, dtype=np.int8)
    d = coopmat.matmul(a, b)
    ref = np.matmul(a.astype(np.int32), b.astype(np.int32))
    assert np.shape(d) == ref.shape
    np.testing.assert_array_equal(d, ref)


def test_batched_float16(pairs):
    require(pairs, "float16", np.float16)
    a = small_ints((4, 19, 23), np.float16)
    b = small_ints((4, 23, 21), np.float16)
    np.testing.assert_array_equal(coopmat.matmul(a, b), np.matmul(a, b))


def test_c_alpha_beta_float(pairs):
    require(pairs, "float16", np.float32)
    a, b = operands("float16", 33, 18, 27)
    c = small_ints((33, 18), np.float32)
    d = coopmat.matmul(a, b, c=c, alpha=2.0, beta=-0.5, out_dtype=np.float32)
    np.testing.assert_array_equal(d, 2.0 * reference(a, b, np.float32) - 0.5 * c)
    crow = small_ints((18,), np.float32)  # broadcast over rows, like numpy's +
    d = coopmat.matmul(a, b, c=crow, beta=1.0, out_dtype=np.float32)
    np.testing.assert_array_equal(d, reference(a, b, np.float32) + crow)


def test_c_alpha_beta_int(pairs):
    require(pairs, "int8", np.int32)
    a, b = operands("int8", 21, 30, 45)
    c = RNG.integers(-1000, 1000, size=(21, 30)).astype(np.int32)
    d = coopmat.matmul(a, b, c=c, alpha=3, beta=-2)
    np.testing.assert_array_equal(d, 3 * reference(a, b, np.int32) - 2 * c)
    a3, b3 = operands("int8", 10, 11, 12, batch=(3,))
    c3 = RNG.integers(-9, 9, size=(3, 1, 11)).astype(np.int32)
    np.testing.assert_array_equal(coopmat.matmul(a3, b3, c=c3, beta=1),
                                  reference(a3, b3, np.int32) + c3)
    with pytest.raises(TypeError, match="alpha=0.5 must be an integer"):
        coopmat.matmul(a, b, alpha=0.5)


@pytest.mark.parametrize("name, value", [("alpha", "2"), ("beta", 1j), ("alpha", [2.0]),
                                         ("beta", np.ones(2))])
def test_alpha_beta_not_real(pairs, name, value):
    """A scalar that is not a real number is a TypeError naming it, not a conversion error
    from inside; numpy's real scalars and 0-d arrays are taken."""
    require(pairs, "float16", np.float32)
    a, b = operands("float16", 9, 10, 11)
    with pytest.raises(TypeError, match=f"matmul: {name} must be a real number"):
        coopmat.matmul(a, b, **{name: value}, out_dtype=np.float32)
    d = coopmat.matmul(a, b, alpha=np.float16(2), beta=np.array(0.0), out_dtype=np.float32)
    np.testing.assert_array_equal(d, 2 * reference(a, b, np.float32))


def test_nan_and_inf_propagate(pairs):
    require(pairs, "float16", np.float16)
    for out_dtype in (None, np.float32):
        if out_dtype is np.float32 and "float16->float32" not in pairs:
            continue
        a = small_ints((20, 16), np.float16)
        b = np.abs(small_ints((16, 12), np.float16)) + np.float16(1)
        a[3, 5] = np.nan
        a[7, 0] = np.inf
        a[7, 1:] = np.abs(a[7, 1:])
        d = coopmat.matmul(a, b, out_dtype=out_dtype)
        assert np.all(np.isnan(d[3]))
        assert np.all(np.isposinf(d[7]))
        rest = np.delete(np.arange(20), [3, 7])
        np.testing.assert_array_equal(d[rest], np.matmul(a[rest], b).astype(d.dtype))


def test_out_written_in_place(pairs):
    require(pairs, "int8", np.int32)
    a, b = operands("int8", 13, 14, 15)
    out = np.full((13, 14), 7, dtype=np.int32)
    r = coopmat.matmul(a, b, out=out)
    assert r is out
    np.testing.assert_array_equal(out, reference(a, b, np.int32))
    big = np.zeros((13, 28), dtype=np.int32)
    view = big[:, ::2]  # a non-contiguous out is filled too
    coopmat.matmul(a, b, out=view)
    np.testing.assert_array_equal(big[:, ::2], reference(a, b, np.int32))
    assert np.all(big[:, 1::2] == 0)
    with pytest.raises(ValueError, match="out has shape"):
        coopmat.matmul(a, b, out=np.zeros((14, 13), dtype=np.int32))
    # out= takes what numpy's default casting ("same_kind") accepts, and nothing else.
    wide = np.zeros((13, 14), dtype=np.int64)
    coopmat.matmul(a, b, out=wide)
    np.testing.assert_array_equal(wide, reference(a, b, np.int64))
    as_float = np.zeros((13, 14), dtype=np.float64)
    coopmat.matmul(a, b, out=as_float)
    np.testing.assert_array_equal(as_float, reference(a, b, np.int64))
    f, g = operands("float16", 13, 14, 15)
    with pytest.raises(TypeError, match="cannot cast the result from dtype float16 to "
                                        "out's int32 with casting rule 'same_kind'"):
        coopmat.matmul(f, g, out=np.zeros((13, 14), dtype=np.int32))
    frozen = np.zeros((13, 14), dtype=np.int32)
    frozen.flags.writeable = False  # numpy's own message would not say who wrote
    with pytest.raises(ValueError, match="matmul: out is read-only"):
        coopmat.matmul(a, b, out=frozen)
    assert not frozen.any()


def test_non_contiguous_inputs_copied_once(pairs):
    require(pairs, "int8", np.int32)
    base_a = RNG.integers(-9, 9, size=(40, 60), dtype=np.int8)
    base_b = RNG.integers(-9, 9, size=(90, 30), dtype=np.int8)
    a, b = base_a[::2, 5:50:3], base_b[::6, ::2]
    np.testing.assert_array_equal(coopmat.matmul(a, b), reference(a, b, np.int32))


def test_shape_mismatch_message_matches_numpy(pairs):
    require(pairs, "int8", np.int32)
    a = np.zeros((4, 5), np.int8)
    b = np.zeros((6, 3), np.int8)
    with pytest.raises(ValueError) as ours:
        coopmat.matmul(a, b)
    with pytest.raises(ValueError) as numpys:
        np.matmul(a, b)
    assert str(ours.value) == str(numpys.value)
    with pytest.raises(ValueError) as ours:
        coopmat.matmul(np.int8(3), b)
    with pytest.raises(ValueError) as numpys:
        np.matmul(np.int8(3), b)
    assert str(ours.value) == str(numpys.value)
    with pytest.raises(ValueError, match="could not be broadcast"):
        coopmat.matmul(np.zeros((2, 4, 5), np.int8), np.zeros((3, 5, 3), np.int8))


@pytest.mark.parametrize("dtype", ["float32", "float64", "int16", "int32", "complex64"])
def test_unsupported_dtype_lists_what_device_supports(pairs, dtype):
    a = np.zeros((4, 4), dtype)
    with pytest.raises(TypeError) as e:
        coopmat.matmul(a, a)
    assert f"unsupported dtype {dtype}" in str(e.value)
    for p in pairs:
        assert p in str(e.value)


def test_mixed_dtypes_rejected(pairs):
    with pytest.raises(TypeError, match="different dtypes int8 and uint8"):
        coopmat.matmul(np.zeros((4, 4), np.int8), np.zeros((4, 4), np.uint8))


def test_empty_dimensions_like_numpy(pairs):
    require(pairs, "int8", np.int32)
    for a_shape, b_shape in [((0, 5), (5, 3)), ((4, 5), (5, 0)), ((0, 4, 5), (5, 3))]:
        d = coopmat.matmul(np.ones(a_shape, np.int8), np.ones(b_shape, np.int8))
        assert d.shape == np.matmul(np.ones(a_shape), np.ones(b_shape)).shape
        assert d.dtype == np.int32
    d = coopmat.matmul(np.ones((4, 0), np.int8), np.ones((0, 3), np.int8))
    np.testing.assert_array_equal(d, np.zeros((4, 3), np.int32))
    c = np.arange(12, dtype=np.int32).reshape(4, 3)
    d = coopmat.matmul(np.ones((4, 0), np.int8), np.ones((0, 3), np.int8), c=c, beta=2)
    np.testing.assert_array_equal(d, 2 * c)


def test_problem_larger_than_device_memory(pairs):
    require(pairs, "int8", np.int32)
    # Broadcast views: 40 GB of operands that occupy no host memory.
    a = np.broadcast_to(np.int8(1), (200_000, 200_000))
    with pytest.raises(coopmat.OutOfDeviceMemoryError):
        coopmat.matmul(a, a)
    # The device is still usable afterwards.
    x, y = operands("int8", 5, 6, 7)
    np.testing.assert_array_equal(coopmat.matmul(x, y), reference(x, y, np.int32))


@pytest.mark.parametrize("discrete", [False, True], ids=["native", "discrete"])
def test_repeated_products_reuse_their_recording(pairs, monkeypatch, discrete):
    """numpy -> numpy products too large to keep prepared (past DIRECT_MAX_BYTES) plan
    and stage anew each call, but the same shapes get the same pooled buffers back, so
    the second call submits the first one's recorded commands (recording cost ~300 us
    on the H200). New data still gives the new result."""
    require(pairs, "float16", np.float32)
    from coopmat.dispatch.runtime import runtime
    rt = runtime()
    if discrete:
        monkeypatch.setattr(rt.pool, "unified", False)
    recorded = []
    real = rt.executor._new_recording
    monkeypatch.setattr(rt.executor, "_new_recording",
                        lambda *a, **k: (recorded.append(1), real(*a, **k))[1])
    # 276 KiB in and out as float16; a shape per case (recordings outlive a test)
    M, N, K = 200 + discrete, 300, 256
    for i in range(3):
        a, b = operands("float16", M, N, K)
        got = coopmat.matmul(a, b, dtype=np.float32)  # small integers: exact in float32
        np.testing.assert_array_equal(got, reference(a, b, np.float32))
        if i == 0:
            assert recorded, "the first call records its commands"
            recorded.clear()
    assert not recorded, "later calls reuse the first call's recording"


@pytest.mark.parametrize("direct", ["staged", "host", "mapped"])
def test_discrete_gpu_paths(pairs, monkeypatch, direct):
    """Discrete GPUs stage through host-visible buffers and copy on the device, except for
    small problems, whose kernel reads A and B where the host wrote them (device memory
    the host maps, else the host-visible upload buffers) and writes D into a host-visible
    buffer; a CPU driver needs none of it, so force those paths here to test them
    everywhere."""
    require(pairs, "int8", np.int32)
    from coopmat.dispatch import staging
    from coopmat.dispatch.runtime import runtime
    monkeypatch.setattr(staging, "DIRECT_MAX_BYTES", 0 if direct == "staged" else 1 << 30)
    rt = runtime()
    monkeypatch.setattr(rt.pool, "unified", False)
    monkeypatch.setattr(rt.pool, "device_mapped", direct == "mapped")
    copies = []
    run = rt.executor.run

    def counting_run(uploads, dispatches, downloads, **kw):
        copies.append(len(uploads) + len(downloads))
        return run(uploads, dispatches, downloads, **kw)

    monkeypatch.setattr(rt.executor, "run", counting_run)
    kinds = []
    acquire = rt.pool.acquire
    monkeypatch.setattr(rt.pool, "acquire", lambda kind, n: (kinds.append(kind.value),
                                                             acquire(kind, n))[1])
    for M, N, K in [(37, 29, 53), (64, 64, 64), (1, 5, 3), (300, 200, 256)]:
        a, b = operands("int8", M, N, K)
        c = RNG.integers(-100, 100, size=(M, N)).astype(np.int32)
        d = coopmat.matmul(a, b, c=c, beta=1)
        np.testing.assert_array_equal(d, reference(a, b, np.int32) + c)
        assert copies[-1] == (4 if direct == "staged" else 0)  # A, B, C in and D out
        assert ("mapped" in kinds) is (direct == "mapped")
        if "float16->float32" in pairs:
            x, y = operands("float16", M, N, K)
            np.testing.assert_array_equal(coopmat.matmul(x, y, out_dtype=np.float32),
                                          reference(x, y, np.float32))


def test_descriptors_bind_at_most_the_storage_buffer_range(pairs):
    """Pooled buffers are rounded up to a size class that may pass maxStorageBufferRange;
    descriptors bind at most the limit, which still covers every byte a kernel touches.
    Lower the limit to D's exact size (below its buffer's size class) and check the result."""
    require(pairs, "int8", np.int32)
    from coopmat.dispatch.memory import size_class
    from coopmat.dispatch.runtime import runtime
    M, N, K = 300, 200, 500
    d_bytes = M * N * 4
    assert size_class(d_bytes) > d_bytes  # the clamp is exercised
    ex = runtime().executor
    limit = ex._max_range
    ex._forget(len(ex._recorded))  # recordings hold their descriptors' ranges
    ex._max_range = d_bytes
    try:
        a, b = operands("int8", M, N, K)
        np.testing.assert_array_equal(coopmat.matmul(a, b), reference(a, b, np.int32))
    finally:
        ex._max_range = limit
        ex._forget(len(ex._recorded))


def test_independent_dispatches_each_write_their_own_d(pairs):
    """The bench's --stream mode: copies of a GEMM dispatch recorded without barriers, each
    into its own D. Every D starts as a sentinel and must end as the exact product."""
    require(pairs, "int8", np.int32)
    from coopmat.dispatch.executor import Copy
    from coopmat.dispatch.gemm import PreparedGemm
    from coopmat.dispatch.runtime import runtime
    from coopmat.policy import resolve
    rt = runtime()
    pair = resolve(rt.device.info, np.int8, np.int8)
    M, N, K = 96, 80, 112
    a, b = operands("int8", M, N, K)
    g = PreparedGemm(rt, pair, a[None], b[None], None, 1, 1, 0)
    try:
        g.execute()
        copies = g.independent_copies(4)
        d_bufs = [d.buffers[2] for d in copies]
        assert len({buf.addr for buf in d_bufs}) == 4
        host = g.d_host.view(np.int32, M * N)

        def through_host(buf, fill=None):  # device-local buffers pass through d_host
            if buf.mapped is not None:
                view = buf.view(np.int32, M * N)
                if fill is not None:
                    view[:] = fill
                return view.copy()
            if fill is not None:
                host[:] = fill
                rt.executor.run([Copy(g.d_host, buf, g.d_bytes)], [], [])
                return None
            rt.executor.run([], [], [Copy(buf, g.d_host, g.d_bytes)])
            return host.copy()

        for buf in d_bufs:
            through_host(buf, fill=-12345)
        runs = rt.executor.run_independent(copies, 2)
        assert len(runs) == 2 and all(wall > 0 for _, wall in runs)
        want = reference(a, b, np.int32).reshape(-1)
        for buf in d_bufs:
            np.testing.assert_array_equal(through_host(buf), want)
    finally:
        g.release()


def test_serial_dispatches_run_in_order(pairs):
    """run_serial's barriers order the dispatches: D = A @ B + C with C bound to D itself,
    run 5 times back to back after one plain run, must give 6 x A @ B exactly (int8 ->
    int32), and serial_seconds reports a time per dispatch where there are timestamps."""
    require(pairs, "int8", np.int32)
    from dataclasses import replace

    from coopmat.codegen import abi
    from coopmat.dispatch.gemm import PreparedGemm
    from coopmat.dispatch.runtime import runtime
    from coopmat.policy import resolve
    rt = runtime()
    pair = resolve(rt.device.info, np.int8, np.int8)
    M, N, K = 64, 48, 96
    a, b = operands("int8", M, N, K)
    zero = np.zeros((1, M, N), np.int32)
    g = PreparedGemm(rt, pair, a[None], b[None], zero, 1, 1, 1)
    try:
        g.execute()
        gemm = g.dispatches[-1]
        d = gemm.buffers[abi.BINDING_D]
        accumulate = replace(gemm, buffers={**gemm.buffers, abi.BINDING_C: d})
        runs = rt.executor.run_serial([accumulate] * 5, 1)
        assert len(runs) == 1
        got = np.empty((1, M, N), np.int32)
        if g.downloads:
            rt.executor.run([], [], g.downloads)
        g.read(got)
        np.testing.assert_array_equal(got[0], 6 * reference(a, b, np.int32))
        if rt.executor.timestamps:
            per = g.serial_seconds(3, submits=1)
            assert per is not None and per > 0
    finally:
        g.release()


def test_kernel_time_reported(pairs):
    require(pairs, "int8", np.int32)
    a, b = operands("int8", 32, 32, 32)
    coopmat.matmul(a, b)
    t = coopmat.last_kernel_time()
    assert t is not None and 0 < t < 10


def test_kernel_time_is_the_kernels_on_a_first_run(pairs):
    """A CPU driver compiles a kernel at its first dispatch, inside the timed span: the
    first call of a pipeline reports the kernel's time all the same (Executor.run runs
    it once untimed first), within reach of a repeat's, not the compile's seconds."""
    from coopmat.dispatch.runtime import runtime
    require(pairs, "int8", np.int32)
    rt = runtime()
    a, b = operands("int8", 48, 40, 56)
    rt.executor._warm.clear()  # every pipeline counts as new: a first run again
    submitted = []
    submit = rt.stream.submit
    rt.stream.submit = lambda *args, **kw: submitted.append(1) or submit(*args, **kw)
    try:
        coopmat.matmul(a, b, dtype=np.int32, out=np.empty((48, 40), np.int32))
        first = coopmat.last_kernel_time()
    finally:
        del rt.stream.submit
    coopmat.matmul(a, b, dtype=np.int32, out=np.empty((48, 40), np.int32))
    again = coopmat.last_kernel_time()
    assert first is not None and again is not None
    if rt.device.info.device_type == "CPU":
        assert len(submitted) == 2  # the untimed run, then the timed one
    assert first < 20 * again + 0.05, (first, again)


def test_configs_and_devices_match_info(live_device_info):
    from coopmat import device
    assert coopmat.devices() == device.enumerate_devices()
    assert coopmat.configs() == list(device.support(live_device_info).configs)


def test_pipeline_statistics(pairs, monkeypatch):
    """COOPMAT_PIPELINE_STATS=1 captures the driver's compiler statistics where the device
    offers VK_KHR_pipeline_executable_properties (on the H200: register count, ...)."""
    from coopmat.api.matmul import last_kernel_traits
    from coopmat.codegen import build_gemm
    from coopmat.dispatch.pipelines import PipelineCache
    from coopmat.dispatch.runtime import runtime

    a, b = operands("int8" if "int8->int32" in pairs else "float16", 40, 24, 16)
    coopmat.matmul(a, b)
    rt = runtime()
    monkeypatch.setenv("COOPMAT_PIPELINE_STATS", "1")
    monkeypatch.setenv("COOPMAT_CACHE_DIR", "")
    cache = PipelineCache(rt.device)
    stats = cache.statistics(cache.get(build_gemm(last_kernel_traits())))
    if rt.device.has("pipelineExecutableInfo"):
        assert stats and all(isinstance(v, (int, float, bool)) for v in stats.values())
    else:
        assert stats == {}


def test_vkresult_without_binding_exception_becomes_vulkan_error(live_device_info):
    """The 1.3.275 binding has no exception class for some VkResults (it raises KeyError);
    those still reach the caller as VulkanError naming the call and the result."""
    from coopmat.dispatch.vkcall import call

    def vkAllocateDescriptorSets() -> None:
        raise KeyError(-1000069000)

    with pytest.raises(coopmat.VulkanError, match="vkAllocateDescriptorSets.*OUT_OF_POOL"):
        call(vkAllocateDescriptorSets)


def test_pool_reuses_and_trims_buffers(pairs, monkeypatch):
    """A size class whose last cached buffer is taken again leaves no empty entry behind
    for a later trim (which frees the least recently used first) to stumble on."""
    require(pairs, "int8", np.int32)
    from coopmat.dispatch.runtime import runtime
    pool = runtime().pool
    kind = pool.kinds()[0]
    small = pool.acquire(kind, 5000)
    pool.release(small)
    again = pool.acquire(kind, 5000)
    assert again is small  # reused from the cache
    big = pool.acquire(kind, 3 << 20)
    before = pool.allocated_bytes
    monkeypatch.setattr(pool, "max_cached_bytes", 0)
    pool.release(big)  # trims the cache to nothing: frees `big` and anything cached before
    assert pool.cached_bytes == 0
    assert pool.allocated_bytes <= before - big.size
    after = pool.allocated_bytes
    pool.release(again)
    assert pool.allocated_bytes == after - again.size
    assert pool.cached_bytes == 0
