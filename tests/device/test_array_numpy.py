"""coopmat.Array among numpy users: numpy.matmul and @ on the device, every other numpy
function refused (not silently run on the host), basic indexing as views, copy(),
astype(), pickling and repr. Oracles: numpy's own indexing and astype of the same data,
float64 numpy products. Runs on whatever device scripts/run finds (lavapipe in CI)."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import device_paths
import numpy as np
import pytest

pytestmark = pytest.mark.live

coopmat = pytest.importorskip("coopmat")


def _random(shape, dtype, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-100, 100, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _ref(a, b) -> np.ndarray:
    return np.asarray(a).astype(np.float64) @ np.asarray(b).astype(np.float64)


def _close(got: Any, want: np.ndarray, k: int) -> bool:
    """float16 operands, float32 accumulation, one rounding to float16 per element."""
    got = np.asarray(got, dtype=np.float64)
    return got.shape == want.shape and bool(
        np.all(np.abs(got - want) <= 2e-3 * np.abs(want) + 1e-3 * np.sqrt(k)))


@contextmanager
def _no_download(monkeypatch) -> Iterator[None]:
    """Fail if anything copies an Array to the host (as numpy's own matmul would), and
    count the calls of coopmat's matmul front."""
    import coopmat.api.matmul as front_module
    from coopmat.api.array import Array

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("an Array was copied to the host")

    front = front_module.matmul
    calls = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return front(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(Array, "numpy", refuse)
        m.setattr(Array, "__array__", refuse)
        m.setattr(front_module, "matmul", counted)
        yield calls


# -- numpy.matmul and @ --------------------------------------------------------------------
def test_numpy_matmul_runs_on_the_device(rt, monkeypatch):
    a, b = _random((24, 40), np.float16, 1), _random((40, 16), np.float16, 2)
    A, B = coopmat.asarray(a), coopmat.asarray(b)
    want = _ref(a, b)
    with _no_download(monkeypatch) as calls:
        results = [np.matmul(A, b), np.matmul(a, B), np.matmul(A, B), A @ b, a @ B]
    assert len(calls) == len(results)
    for got in results:
        assert isinstance(got, coopmat.Array) and got.dtype == np.float16
        assert _close(got.numpy(), want, 40)
    # numpy's keywords: dtype as matmul's result dtype.
    got = np.matmul(A, b, dtype=np.float32)
    assert isinstance(got, coopmat.Array) and got.dtype == np.float32
    assert _close(got.numpy(), want, 40)
    # Batched and vector operands follow numpy's shapes.
    s, v = _random((3, 24, 40), np.float16, 3), _random(40, np.float16, 4)
    got = np.matmul(coopmat.asarray(s), v)
    assert got.shape == (3, 24) and _close(got.numpy(), _ref(s, v), 40)


def test_numpy_matmul_out(rt, monkeypatch):
    a, b = _random((24, 40), np.float16, 5), _random((40, 16), np.float16, 6)
    A = coopmat.asarray(a)
    want = _ref(a, b)
    # out an Array: written in place on the device, numpy operands included.
    D = coopmat.empty((24, 16), np.float16)
    with _no_download(monkeypatch):
        assert np.matmul(A, b, out=D) is D
        assert np.matmul(a, b, out=D) is D  # numpy operands, device out: numpy asks D
    assert _close(D.numpy(), want, 40)
    # out an ndarray: the device's result lands there, cast as numpy's matmul would.
    for dtype in (np.float16, np.float32, np.float64):
        out = np.full((24, 16), np.nan, dtype)
        assert np.matmul(A, b, out=out) is out
        assert _close(out, want, 40)
        out2 = np.full((24, 16), np.nan, dtype)
        assert np.matmul(a, coopmat.asarray(b), out=(out2,)) is out2
        assert np.array_equal(out, out2)
    with pytest.raises(TypeError, match="same_kind"):
        np.matmul(A, b, out=np.empty((24, 16), np.int32))
    out = np.zeros((24, 16), np.int32)
    np.matmul(A, b, out=out, casting="unsafe")
    assert np.array_equal(out, coopmat.matmul(a, b).astype(np.int32))
    with pytest.raises(ValueError, match="out has shape"):
        np.matmul(A, b, out=np.empty((24, 17), np.float32))
    ro = np.empty((24, 16), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        np.matmul(A, b, out=ro)
    with pytest.raises(TypeError, match="axes"):
        np.matmul(A, b, axes=[(0, 1), (0, 1), (0, 1)])
    with pytest.raises(ValueError, match="order"):
        np.matmul(A, b, order="F")
    # x @= w with an ndarray x, as numpy allows for square w.
    w = _random((40, 40), np.float16, 7)
    x = a.copy()
    x @= coopmat.asarray(w)
    assert _close(x, _ref(a, w), 40)


CALLS = {
    "np.add(arr, 1)": lambda A, x: np.add(A, 1),
    "ndarray + arr": lambda A, x: x + A,
    "np.exp": lambda A, x: np.exp(A),
    "np.add.reduce": lambda A, x: np.add.reduce(A),
    "np.sum": lambda A, x: np.sum(A),
    "np.mean": lambda A, x: np.mean(A),
    "np.concatenate": lambda A, x: np.concatenate([A, A]),
    "np.concatenate mixed": lambda A, x: np.concatenate([x, A]),
    "np.array_equal": lambda A, x: np.array_equal(A, x),
    "np.dot": lambda A, x: np.dot(A, x.T),
    "np.linalg.norm": lambda A, x: np.linalg.norm(A),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_other_numpy_functions_refuse_arrays(rt, monkeypatch, name):
    x = _random((4, 6), np.float16, 8)
    A = coopmat.asarray(x)
    with _no_download(monkeypatch), pytest.raises(TypeError, match=r"\.numpy\(\) .*first"):
        CALLS[name](A, x)


def test_explicit_conversion_and_shape_queries_still_work(rt):
    x = _random((4, 6), np.float16, 9)
    A = coopmat.asarray(x)
    assert np.array_equal(np.asarray(A), x) and np.array_equal(np.array(A), x)
    assert np.asarray(A, dtype=np.float32).dtype == np.float32
    assert np.array_equal(A.get(), x)
    with pytest.raises(ValueError, match="always a copy"):
        np.asarray(A, copy=False)
    assert np.shape(A) == (4, 6) and np.ndim(A) == 2 and np.size(A) == 24
    assert np.size(A, 1) == 6


# -- basic indexing ------------------------------------------------------------------------
KEYS = [
    2, -1, np.int64(3), np.array(1), (1, 2), (1, 2, 3), (-1, -2, -3), slice(1, 3),
    slice(None, None, 2), slice(None, None, -1), slice(None, None, -2), slice(5, 0, -2),
    (slice(None), slice(1, None, 2)), (slice(None), slice(None), slice(None, None, -3)),
    (slice(None, None, -2), Ellipsis, slice(None, None, -3)), (Ellipsis, 1),
    (Ellipsis, slice(2, 4)), (1, Ellipsis), (Ellipsis,), (), None, (None, 1),
    (1, None, Ellipsis, None), (slice(None), None, slice(2, 5)), (Ellipsis, None),
    (None, Ellipsis, None, 0), slice(10, 20), slice(3, 1), (slice(None), slice(4, 4)),
    (slice(1, 4), 2, slice(None, None, 4)), (0, slice(-100, 100)),
]


@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_basic_indexing_matches_numpy(rt, key):
    x = np.arange(5 * 6 * 7, dtype=np.float32).reshape(5, 6, 7)
    A = coopmat.asarray(x)
    view = A[key]
    want = x[key]
    assert isinstance(view, coopmat.Array)
    assert view.shape == np.shape(want) and view.dtype == x.dtype
    assert view._storage is A._storage  # a view: the same memory
    assert np.array_equal(view.numpy(), want)
    if view.ndim:  # where numpy's strides are defined the same way
        live = [(s, n) for s, n in zip(view.strides, view.shape, strict=True) if n > 1]
        assert live == [(s, n) for s, n in zip(want.strides, want.shape, strict=True)
                        if n > 1]


def test_views_of_views_and_iteration(rt):
    x = np.arange(8 * 9, dtype=np.int32).reshape(8, 9)
    A = coopmat.asarray(x)
    assert np.array_equal(A[1:][::2][:, ::-3].numpy(), x[1:][::2][:, ::-3])
    assert np.array_equal(A.T[2:5, ::2].numpy(), x.T[2:5, ::2])
    assert np.array_equal(A[::-1].reshape(-1).numpy(), x[::-1].reshape(-1))
    assert np.array_equal(A[3].T.numpy(), x[3].T)
    rows = list(A[:3])
    assert len(rows) == 3 and all(np.array_equal(r.numpy(), x[i]) for i, r in enumerate(rows))
    with pytest.raises(TypeError, match="0-d"):
        iter(A[0, 0])
    assert np.array_equal(A[2, 3].numpy(), x[2, 3]) and A[2, 3].shape == ()


def test_a_view_shares_memory_with_its_base(rt):
    a, b = _random((8, 16), np.float16, 10), _random((16, 12), np.float16, 11)
    base = coopmat.zeros((3, 8, 12), np.float16)
    middle = base[1]
    assert middle.is_c_contiguous
    coopmat.matmul(a, b, out=middle)  # written into the base's memory
    whole = base.numpy()
    assert not whole[0].any() and not whole[2].any()
    assert np.array_equal(whole[1], coopmat.matmul(a, b))


@pytest.mark.parametrize("key", [
    -6, 5, (0, 6), (0, 0, 7), (0, -7), (1, 2, 3, 4), (Ellipsis, Ellipsis), (None, 1, 2, 3, 4),
    1.5, "a", (slice(None), 2.0),
], ids=repr)
def test_index_errors_are_numpys(rt, key):
    x = np.zeros((5, 6, 7), np.float32)
    A = coopmat.asarray(x)
    with pytest.raises(IndexError) as want:
        x[key]
    with pytest.raises(IndexError) as got:
        A[key]
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("key", [
    [0, 1], np.array([0, 1]), np.array([True, False, True, False, True]), True,
    np.bool_(False), (slice(None), [1, 2]), np.array(True), "arr",
], ids=repr)
def test_advanced_indexing_is_refused(rt, key):
    x = np.zeros((5, 6), np.float32)
    A = coopmat.asarray(x)
    if isinstance(key, str):
        key = A
    with pytest.raises(TypeError, match="basic indices only"):
        A[key]


def test_slice_step_zero(rt):
    A = coopmat.zeros((4,), np.float32)
    with pytest.raises(ValueError, match="zero"):
        A[::0]


def test_views_as_matmul_operands(rt):
    a, b = _random((64, 48), np.float16, 12), _random((80, 40), np.float16, 13)
    A, B = coopmat.asarray(a), coopmat.asarray(b)
    cases = [
        (A[8:40:2, 4:36], B[:32, 8:], a[8:40:2, 4:36], b[:32, 8:]),  # row-major, ld > cols
        (A[1], B[:48, 3], a[1], b[:48, 3]),  # vectors, the second strided
        (A[5:21].T[:, 3:9], B[1:13:2, :7], a[5:21].T[:, 3:9], b[1:13:2, :7]),  # column-major
        (A[None, 10:20, :40], B[None, ::2, 5:19], a[None, 10:20, :40], b[None, ::2, 5:19]),
    ]
    for x, y, xh, yh in cases:
        got = x @ y
        assert isinstance(got, coopmat.Array)
        assert _close(got.numpy(), _ref(xh, yh), xh.shape[-1])
        assert _close(np.matmul(x, yh).numpy(), _ref(xh, yh), xh.shape[-1])
    # Views no kernel binds as they are (reversed, or starting off the device's binding
    # alignment, as A[8:40:2, 4:36] does) go through a copy: the same product.
    for x, y, xh, yh in [(A[::-1, :40], B[:40, :8], a[::-1, :40], b[:40, :8]),
                         (A[:, 1:41], B[1:41, ::-1], a[:, 1:41], b[1:41, ::-1])]:
        assert _close((x @ y).numpy(), _ref(xh, yh), 40)
        assert _close((x @ y).numpy(), _ref(xh, yh), 40)  # the repeat path too


# -- copy and astype -----------------------------------------------------------------------
@pytest.mark.parametrize("discrete", [False, True], ids=["native", "lanes"])
def test_copy(rt, discrete):
    x = _random((30, 20), np.float16, 14)
    with device_paths.discrete(rt) if discrete else nullcontext():
        A = coopmat.asarray(x)
        for view, want in ((A, x), (A[7:19], x[7:19]), (A[3], x[3]), (A[:, ::3], x[:, ::3]),
                           (A.T, x.T), (A[5:5], x[5:5])):
            c = view.copy()
            assert c._storage is not A._storage and c.is_c_contiguous
            assert c.shape == want.shape and c.dtype == want.dtype
            assert np.array_equal(c.numpy(), want)
        # The copy is queued behind the work writing its source, and is independent.
        w = _random((20, 20), np.float16, 15)
        Y = A @ w
        Z = Y.copy()
        np.matmul(A, np.zeros_like(w), out=Y)  # Y overwritten with zeros
        assert np.array_equal(Z.numpy(), coopmat.matmul(x, w)) and not Y.numpy().any()
        assert np.array_equal(copy.copy(A).numpy(), x)
        assert np.array_equal(copy.deepcopy(A[::2]).numpy(), x[::2])


def _dtype(name: str) -> np.dtype:
    if name in ("bfloat16", "float8_e4m3fn"):
        ml_dtypes = pytest.importorskip("ml_dtypes")
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


@pytest.mark.parametrize("src,dst", [
    ("float16", "float32"), ("float32", "float16"), ("float16", "int8"), ("int8", "int32"),
    ("int32", "float16"), ("float32", "bfloat16"), ("bfloat16", "float32"),
    ("float16", "float8_e4m3fn"), ("uint8", "float16"), ("float32", "float64"),
    ("int32", "bool"), ("float16", "uint8"), ("int8", "int8"),
])
def test_astype_matches_numpy(rt, src, dst):
    s, d = _dtype(src), _dtype(dst)
    # values every target holds: numpy leaves out-of-range float -> int conversions open
    x = (np.arange(-40, 40).reshape(8, 10) * (0.75 if s.kind not in "iu" else 1)).astype(s)
    if d.kind == "u":
        x = np.abs(x.astype(np.float32)).astype(s)
    A = coopmat.asarray(x)
    for view, host in ((A, x), (A[1::3, ::-2], x[1::3, ::-2])):
        got = view.astype(d)
        assert isinstance(got, coopmat.Array) and got.dtype == d and got.shape == host.shape
        assert got._storage is not A._storage
        want = host.astype(d)
        assert np.array_equal(got.numpy().view(np.uint8), want.view(np.uint8))
    assert A.astype(s, copy=False) is A
    assert A.astype(s)._storage is not A._storage


@pytest.mark.parametrize("dtype", ["U3", object, "datetime64[s]", [("a", "f4")]], ids=str)
def test_astype_refuses_what_arrays_cannot_hold(rt, dtype):
    A = coopmat.zeros((4,), np.float32)
    with pytest.raises(TypeError, match="hold numbers, not") as exc:
        A.astype(dtype)
    assert str(np.dtype(dtype)) in str(exc.value)


# -- pickling and repr ---------------------------------------------------------------------
def test_pickle_in_process(rt):
    x = _random((12, 10), np.float16, 16)
    A = coopmat.asarray(x)
    cases = [(A, x), (A[::2, 3:], x[::2, 3:]), (A.T, x.T), (A[4, 5], x[4, 5]),
             (A[3:3], x[3:3]), (coopmat.asarray(_random((5, 3), np.int8, 17)), None)]
    for arr, want in cases:
        want = arr.numpy() if want is None else want
        back = pickle.loads(pickle.dumps(arr))
        assert isinstance(back, coopmat.Array) and back._storage is not arr._storage
        assert back.shape == want.shape and back.dtype == want.dtype
        assert back.is_c_contiguous and np.array_equal(back.numpy(), want)
        assert back.device is rt.device


def test_pickle_across_processes(rt):
    x = _random((9, 7), np.float16, 18)
    A = coopmat.asarray(x)
    child = (
        "import pickle, sys, numpy as np, coopmat\n"
        "arr = pickle.loads(sys.stdin.buffer.read())\n"
        "assert isinstance(arr, coopmat.Array), type(arr)\n"
        "y = coopmat.asarray(np.eye(7, dtype=np.float16))\n"
        "sys.stdout.buffer.write(pickle.dumps((arr.device.info.name, arr.numpy(), arr @ y)))\n"
    )
    done = subprocess.run([sys.executable, "-c", child], input=pickle.dumps(A[1:]),
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    name, host, product = pickle.loads(done.stdout)
    assert name == rt.device.info.name
    assert np.array_equal(host, x[1:])
    assert isinstance(product, coopmat.Array) and np.array_equal(product.numpy(), x[1:])


def test_repr(rt):
    big = coopmat.zeros((100, 200), np.float16)
    text = repr(big)
    assert text.startswith(f"coopmat.Array(shape=(100, 200), dtype=float16, "
                           f"device={rt.device.info.index}")
    assert rt.device.info.name in text and len(text) < 200
    small = coopmat.asarray(np.arange(6, dtype=np.int32).reshape(2, 3))
    assert "[3, 4, 5]" in repr(small) and "int32" in repr(small)
