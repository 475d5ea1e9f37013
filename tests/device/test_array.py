"""Device arrays: round trips, views, matmul on Arrays and mixes, asynchronous chains,
errors, memory reuse, threads, and both transfer paths. Oracle: numpy (float64 for
products). Runs on whatever device scripts/run finds (lavapipe in CI)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from device_paths import discrete

pytestmark = pytest.mark.live

coopmat = pytest.importorskip("coopmat")


def _dtypes() -> list[np.dtype]:
    out = [np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int8, np.uint8,
                                 np.int32, np.uint32, np.int64, np.bool_)]
    try:
        import ml_dtypes
        out += [np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn)]
    except ImportError:
        pass
    return out


def _random(shape, dtype, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -100), min(info.max, 100), shape, dtype=dtype)
    return rng.standard_normal(shape).astype(dtype)


def _ref(a, b) -> np.ndarray:
    return a.astype(np.float64) @ b.astype(np.float64)


def _tol(k: int) -> float:
    return 2e-3 * np.sqrt(k) * 4 + 1e-2


def _path(rt, path: str):
    """native: the device's own way (on lavapipe, unified memory); lanes: a discrete
    GPU's staging lanes; mapped: a discrete GPU's device memory written through its
    mapping (a resizable BAR)."""
    return _nothing() if path == "native" else discrete(rt, mapped=path == "mapped")


PATHS = ["native", "lanes", "mapped"]


@pytest.mark.parametrize("dtype", _dtypes(), ids=str)
@pytest.mark.parametrize("path", PATHS)
def test_round_trip_every_dtype(rt, dtype, path):
    x = _random((37, 53), dtype)
    with _path(rt, path):
        arr = coopmat.asarray(x)
        assert (arr.shape, arr.dtype, arr.ndim, arr.size, arr.nbytes) == (
            x.shape, x.dtype, 2, x.size, x.nbytes)
        back = arr.numpy()
    assert back.dtype == x.dtype
    assert np.array_equal(back.view(np.uint8), x.view(np.uint8))


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@pytest.mark.parametrize("path", PATHS)
def test_round_trip_large_and_non_contiguous(rt, path, monkeypatch):
    from coopmat.dispatch import transfer
    # Small chunks, so a few MiB take many chunks over several lanes.
    monkeypatch.setattr(transfer, "CHUNK_BYTES", 64 << 10)
    monkeypatch.setattr(transfer, "PARALLEL_MIN_BYTES", 128 << 10)
    big = _random((700, 1001), np.float32, 1)
    views = [big, big[::3, ::2], big.T, big[5:600, 7:900][::-1], big.reshape(7, 100, 1001)[:, ::7]]
    try:
        with _path(rt, path):
            for v in views:
                arr = coopmat.asarray(v)
                assert (arr.buffer.kind.value == "mapped") is \
                    (rt.pool.direct_kind() is not None and not rt.pool.unified)
                got = arr.numpy()
                assert np.array_equal(got, v), v.strides
    finally:
        rt.transfers.destroy()  # its lanes' staging is CHUNK_BYTES at creation: small


def test_mapped_arrays_are_written_after_queued_work(rt, monkeypatch):
    """A new array in MAPPED memory is written through its mapping at once (the pool
    hands out no buffer that queued work still uses); writing an existing one waits for
    the work queued before, which may still read it. Its contents come back by a device
    copy, never a read of the mapping."""
    x, y = _random((64, 96), np.float32, 50), _random((64, 96), np.float32, 51)
    with discrete(rt, mapped=True):
        waits: list[object] = []
        wait = rt.stream.wait
        monkeypatch.setattr(rt.stream, "wait", lambda *a, **k: (waits.append(a), wait(*a, **k))[1])
        arr = coopmat.asarray(x)
        assert arr.buffer.kind.value == "mapped" and not waits
        rt.transfers.upload(y, arr.buffer)  # not fresh: after the queued work
        assert waits
        monkeypatch.setattr(rt.stream, "wait", wait)
        class NoRead:
            def __getitem__(self, key):
                raise AssertionError("read through the mapping")

        monkeypatch.setattr(arr.buffer, "mapped", NoRead())
        assert np.array_equal(arr.numpy(), y)
        out = np.empty_like(y)
        rt.transfers.download(arr.buffer, 0, out)
        assert np.array_equal(out, y)


def test_import_path(rt):
    """VK_EXT_external_memory_host: the array's own pages, imported. Falls back to the
    lanes where the device lacks the extension (checked too)."""
    x = _random((2048, 2049), np.float16, 2)  # 8 MiB: past PARALLEL_MIN_BYTES
    with discrete(rt):
        if not rt.transfers.can_import:
            pytest.skip("the device does not offer VK_EXT_external_memory_host")
        arr = coopmat.empty(x.shape, x.dtype)
        rt.transfers.upload(x, arr.buffer, 0, mode="import")
        back = np.empty_like(x)
        rt.transfers.download(arr.buffer, 0, back, mode="import")
    assert np.array_equal(back.view(np.uint16), x.view(np.uint16))


def test_numpy_of_large_arrays_lands_in_kept_pinned_blocks(rt):
    """.numpy() of a large array (transfer.PINNED_MIN_BYTES) on a device that imports host
    memory: the first result comes over the lanes into a block coopmat owns, imported in
    the background; once that result is gone the next one is one device copy into the
    same block. A block lent as an array (or any view of it) is never reused under it."""
    import gc

    from coopmat.dispatch import transfer

    x = _random((1536, 2048), np.float32, 3)  # 12 MiB
    with discrete(rt):
        t = rt.transfers
        if not t.can_import:
            pytest.skip("the device does not offer VK_EXT_external_memory_host")
        assert x.nbytes >= transfer.PINNED_MIN_BYTES
        t.destroy()  # no kept blocks from earlier tests
        a, b = coopmat.asarray(x), coopmat.asarray(2 * x)
        first = a.numpy()
        assert np.array_equal(first, x) and first.flags.writeable
        block = first.base.base.obj  # uint8 array -> its memoryview -> the block's mapping
        for f in t._importing:
            f.result()
        del first
        gc.collect()
        second = a.numpy()  # the same, now imported, block: one device copy
        assert second.base.base.obj is block
        assert any(blk.mm is block and blk.imported is not None for blk in t._blocks)
        assert np.array_equal(second, x)
        view = second[5:]
        del second
        gc.collect()  # the view keeps the block lent
        third = b.numpy()
        assert third.base.base.obj is not block
        assert np.array_equal(third, 2 * x) and np.array_equal(view, x[5:])
        view[:] = 0  # the user's memory: writable, and nothing else sees it
        assert np.array_equal(b.numpy(), 2 * x) and np.array_equal(a.numpy(), x)
        t.destroy()  # blocks dropped while lent: their arrays stay valid ...
        assert np.array_equal(third, 2 * x) and not np.any(view)
        del third, view
        gc.collect()  # ... and coming back later, they are forgotten, not reused
        again = a.numpy()
        assert np.array_equal(again, x) and len(t._blocks) == 1 and not t._free


def test_large_numpy_products_return_kept_pinned_blocks(rt):
    """numpy -> numpy matmul with a large result: D comes back as Array.numpy() does
    (Transfers.download_new); results kept by the caller are never overwritten, and
    out= still receives the result in the caller's array."""
    import gc

    rng = np.random.default_rng(7)
    a = rng.integers(-3, 4, (2048, 64)).astype(np.float16)
    b = rng.integers(-3, 4, (64, 1100)).astype(np.float16)
    ref = a.astype(np.float64) @ b  # exact in float32: small integers
    with discrete(rt):
        if not rt.transfers.can_import:
            pytest.skip("the device does not offer VK_EXT_external_memory_host")
        rt.transfers.destroy()  # no kept blocks from earlier tests
        first = coopmat.matmul(a, b, dtype=np.float32)
        block = first.base.base.obj  # a kept block's mapping, lent
        for f in rt.transfers._importing:
            f.result()
        second = coopmat.matmul(2 * a, b, dtype=np.float32)
        assert first.shape == (2048, 1100) and first.dtype == np.float32
        assert np.array_equal(first, ref) and np.array_equal(second, 2 * ref)
        del first
        gc.collect()
        third = coopmat.matmul(3 * a, b, dtype=np.float32)  # into the block `first` gave back
        assert third.base.base.obj is block
        assert np.array_equal(third, 3 * ref) and np.array_equal(second, 2 * ref)
        out = np.empty((2048, 1100), np.float32)
        assert coopmat.matmul(a, b, out=out, dtype=np.float32) is out
        assert np.array_equal(out, ref)


def _pins_ready(t) -> None:
    for f in t._importing:
        f.result()


def test_live_arrays_stay_imported_between_transfers(rt, monkeypatch):
    """Mode 'auto': a large array that went through the lanes is imported in the
    background and kept while it lives; later transfers from or into it (or a view of
    most of it) are one device copy that sees its current contents. Collected or evicted
    arrays are forgotten."""
    import gc

    from coopmat.dispatch import transfer

    x = _random((1536, 2048), np.float32, 4)  # 12 MiB
    orig = x.copy()
    with discrete(rt):
        t = rt.transfers
        if not t.can_import:
            pytest.skip("the device does not offer VK_EXT_external_memory_host")
        t.destroy()
        assert t.mode == "auto"
        staged: list[int] = []
        real = t._staged_upload
        monkeypatch.setattr(t, "_staged_upload", lambda jobs, *a, **k: (
            staged.append(len(jobs)), real(jobs, *a, **k))[1])
        a = coopmat.asarray(x)  # through the lanes; x is noted
        _pins_ready(t)
        assert t._pins[id(x)].imported is None
        a = coopmat.asarray(x)  # through the lanes again, then imported
        assert staged == [1, 1]
        _pins_ready(t)
        pin = t._pins[id(x)]
        assert pin.imported is not None
        x *= 2  # the same pages, new contents
        coopmat.synchronize()  # (an upload takes the kept import only on an idle device)
        b = coopmat.asarray(x)  # one device copy from the kept import
        coopmat.synchronize()
        v = coopmat.asarray(x[100:])  # a view: an offset into the same import
        assert staged == [1, 1]
        assert np.array_equal(a.numpy(), orig) and np.array_equal(b.numpy(), 2 * orig)
        assert np.array_equal(v.numpy(), 2 * orig[100:])
        out = np.empty_like(x)
        for _ in range(2):
            t.download(a.buffer, 0, out)  # through the lanes, then out is imported
        _pins_ready(t)
        assert t._pins[id(out)].imported is not None
        t.download(b.buffer, 0, out)  # one device copy into out's own pages
        assert np.array_equal(out, 2 * orig)
        # numpy -> numpy products upload kept arrays the same way.
        p = np.ones((4096, 2048), np.float16)  # 16 MiB
        q = np.random.default_rng(8).integers(-3, 4, (2048, 64)).astype(np.float16)
        staged.clear()
        for _ in range(2):
            assert np.array_equal(coopmat.matmul(p, q, dtype=np.float32),
                                  p.astype(float) @ q)
        _pins_ready(t)
        p[::2] = 2
        coopmat.synchronize()
        assert np.array_equal(coopmat.matmul(p, q, dtype=np.float32), p.astype(float) @ q)
        assert staged == [2, 2, 1]  # A and B through the lanes twice; then B only
        del a, b, v, out
        gc.collect()
        assert len(t._dead) == 1  # out's pin: unpinned at the next transfer
        y = _random((1536, 2048), np.float32, 5)
        assert np.array_equal(coopmat.asarray(y).numpy(), y)
        assert not t._dead and set(t._pins) == {id(x), id(p), id(y)}
        _pins_ready(t)
        with pytest.raises(ValueError, match="cannot resize"):  # as with any weakref
            y.resize((1600, 2048), refcheck=False)
        # Beyond the budget the least recently used go first.
        monkeypatch.setattr(transfer, "HOST_PIN_KEEP_BYTES", 20 << 20)
        z = _random((1536, 2048), np.float32, 6)
        coopmat.asarray(z)
        assert id(z) in t._pins and id(x) in t._pins  # z only noted
        coopmat.asarray(z)
        assert t._pins[id(z)].scheduled and id(x) not in t._pins
        _pins_ready(t)
        # Arrays used in turn, more than the budget holds (a Dask worker's chunks): the
        # first that fit stay imported; the others never evict one that is used again
        # before them.
        t.destroy()
        monkeypatch.setattr(transfer, "HOST_PIN_KEEP_BYTES", 24 << 20)
        chunks = [_random((1024, 2048), np.float32, 10 + i) for i in range(4)]  # 8 MiB
        for _ in range(4):
            before = len(staged)
            for c in chunks:
                coopmat.synchronize()
                assert np.array_equal(coopmat.asarray(c).numpy(), c)
            _pins_ready(t)
        assert [t._pins[id(c)].imported is not None for c in chunks] == [True] * 3 + [False]
        assert len(staged) - before == 1  # the last round: the fourth chunk alone staged
        t.destroy()
        assert not t._pins


def test_numpy_products_of_kept_arrays_wait_once(rt, monkeypatch):
    """A numpy -> numpy product of kept arrays takes both kept copies (the first one's
    copy must not send the second to the lanes), and its result, once an imported block
    is free, is copied into it within the kernel's submission (Transfers.new_download),
    as is its copy into a kept `out=` array: the call waits once. Sizes are scaled down
    with the thresholds."""
    from coopmat.dispatch import staging, transfer

    monkeypatch.setattr(transfer, "PINNED_MIN_BYTES", 1 << 20)
    monkeypatch.setattr(staging, "BULK_MIN_BYTES", 1 << 20)
    rng = np.random.default_rng(12)
    a = rng.integers(-3, 4, (512, 1024)).astype(np.float16)  # 1 MiB each, as is D
    b = rng.integers(-3, 4, (1024, 512)).astype(np.float16)
    with discrete(rt):
        t = rt.transfers
        if not t.can_import:
            pytest.skip("the device does not offer VK_EXT_external_memory_host")
        t.destroy()
        staged: list[int] = []
        into_kept: list[bool] = []
        real_staged, real_new = t._staged_upload, t.new_download
        monkeypatch.setattr(t, "_staged_upload", lambda jobs, *x, **k: (
            staged.append(len(jobs)), real_staged(jobs, *x, **k))[1])
        monkeypatch.setattr(t, "new_download", lambda n: (
            r := real_new(n), into_kept.append(r is not None))[0])
        for i in range(4):
            if i == 3:
                a[::3] *= -1  # the kept pages' new contents reach the device
            d = coopmat.matmul(a, b, dtype=np.float32)
            assert np.array_equal(d, a.astype(np.float64) @ b)
            del d  # its block returns for the next call
            _pins_ready(t)
        assert staged == [2, 2]  # noted, then imported; then both kept copies
        assert into_kept == [False, True, True, True]  # the first block is imported after
        # out= a kept array: D's copy into it goes right behind the kernel.
        out = np.empty((512, 512), np.float32)
        kept: list[bool] = []
        real_kept = t.kept_download
        monkeypatch.setattr(t, "kept_download", lambda *x: (
            r := real_kept(*x), kept.append(r is not None))[0])
        for _ in range(4):
            out[:] = np.nan
            assert coopmat.matmul(a, b, out=out, dtype=np.float32) is out
            assert np.array_equal(out, a.astype(np.float64) @ b)
            _pins_ready(t)
        assert kept == [False, False, True, True]  # through the lanes twice (noted, imported)
        t.destroy()


def test_views(rt):
    x = _random((6, 8), np.float16)
    arr = coopmat.asarray(x)
    assert np.array_equal(arr.T.numpy(), x.T)
    assert np.array_equal(arr.reshape(4, 12).numpy(), x.reshape(4, 12))
    assert np.array_equal(arr.T.reshape(-1).numpy(), x.T.reshape(-1))  # needs a copy
    assert np.array_equal(np.asarray(arr), x)
    s = _random((3, 4, 5), np.float32)
    sa = coopmat.asarray(s)
    assert np.array_equal(sa.mT.numpy(), s.mT)
    assert np.array_equal(sa.transpose(1, 0, 2).numpy(), s.transpose(1, 0, 2))
    assert sa.strides == s.strides and sa.T.strides == s.T.strides
    with pytest.raises(ValueError, match="cannot reshape"):
        sa.reshape(7, 9)
    assert "coopmat.Array" in repr(arr) and "float16" in repr(arr)
    z = coopmat.zeros((33, 17), np.int32)
    assert np.array_equal(z.numpy(), np.zeros((33, 17), np.int32))
    with discrete(rt):
        z = coopmat.zeros((1000, 3), np.float32)
        assert not z.numpy().any()


@pytest.mark.parametrize("dtype", [np.float16, np.int8])
def test_matmul_on_arrays_and_mixes(rt, dtype):
    a, b = _random((45, 70), dtype, 3), _random((70, 38), dtype, 4)
    want = coopmat.matmul(a, b)  # the numpy path, itself tested against float64
    A, B = coopmat.asarray(a), coopmat.asarray(b)
    for x, y in ((A, B), (A, b), (a, B)):
        got = coopmat.matmul(x, y)
        assert isinstance(got, coopmat.Array) and got.dtype == want.dtype
        assert np.array_equal(got.numpy(), want)
    assert np.array_equal((A @ B).numpy(), want)
    assert np.array_equal((a @ B).numpy(), want)  # numpy defers to Array.__rmatmul__
    assert np.array_equal((B.T @ A.T).numpy(), coopmat.matmul(b.T, a.T))
    if dtype == np.int8:
        assert np.array_equal(want, _ref(a, b).astype(np.int32))
    else:
        assert np.abs(want - _ref(a, b)).max() < _tol(70)


def test_matmul_batched_vectors_and_c(rt):
    a, b = _random((3, 20, 30), np.float16, 5), _random((30, 24), np.float16, 6)
    got = coopmat.matmul(coopmat.asarray(a), coopmat.asarray(b)).numpy()
    assert got.shape == (3, 20, 24)
    assert np.abs(got - _ref(a, b)).max() < _tol(30)
    v = _random(30, np.float16, 7)
    gv = coopmat.matmul(coopmat.asarray(a), coopmat.asarray(v)).numpy()
    assert gv.shape == (3, 20) and np.abs(gv - _ref(a, v)).max() < _tol(30)
    dot = coopmat.asarray(v) @ coopmat.asarray(v)
    assert dot.shape == () and abs(float(dot.numpy()) - float(_ref(v, v))) < 0.5
    c = _random((20, 24), np.float32, 8)
    a2 = a[0]
    got = coopmat.matmul(coopmat.asarray(a2), coopmat.asarray(b), c=coopmat.asarray(c),
                         alpha=0.5, beta=2.0, dtype=np.float32).numpy()
    assert np.abs(got - (0.5 * _ref(a2, b) + 2.0 * c)).max() < _tol(30)
    got = coopmat.matmul(coopmat.asarray(a2), b, c=c, beta=-1.0, dtype=np.float32).numpy()
    assert np.abs(got - (_ref(a2, b) - c)).max() < _tol(30)


def test_out_array(rt):
    a, b = _random((40, 50), np.float16, 9), _random((50, 60), np.float16, 10)
    out = coopmat.empty((40, 60), np.float16)
    got = coopmat.matmul(coopmat.asarray(a), b, out=out)
    assert got is out
    assert np.array_equal(out.numpy(), coopmat.matmul(a, b))
    with pytest.raises(TypeError, match="result dtype float16"):
        coopmat.matmul(coopmat.asarray(a), b, out=coopmat.empty((40, 60), np.float32))
    with pytest.raises(ValueError, match="out has shape"):
        coopmat.matmul(coopmat.asarray(a), b, out=coopmat.empty((40, 61), np.float16))
    with pytest.raises(TypeError, match="coopmat.Array"):
        coopmat.matmul(coopmat.asarray(a), b, out=np.empty((40, 60), np.float16))


@pytest.mark.parametrize("mapped", [True, False], ids=["mapped", "staged"])
def test_small_numpy_operands_go_where_the_kernel_reads_them(rt, monkeypatch, mapped):
    """A small numpy operand of a device product is written for the call into device
    memory the host maps (Kind.MAPPED), with no copy command, where the device has such
    memory; else into upload staging, copied over in the product's submission. Both the
    first call (planned) and the repeats (kept recipe) take that way; c, bias and
    residual from numpy too."""
    from coopmat.dispatch.memory import Kind
    x = _random((16, 96), np.float16, 44)
    w = (_random((96, 80), np.float16, 45) / 8).astype(np.float16)
    bias, res = _random(80, np.float16, 46), _random((16, 80), np.float16, 47)
    want = coopmat.matmul(x, w)
    with discrete(rt, mapped):
        kinds: list[Kind] = []
        acquire = rt.pool.acquire
        monkeypatch.setattr(rt.pool, "acquire", lambda kind, n: (kinds.append(kind),
                                                                 acquire(kind, n))[1])
        W = coopmat.asarray(w)
        for _ in range(3):
            kinds.clear()
            got = coopmat.matmul(x, W)
            assert np.array_equal(got.numpy(), want)
            assert (Kind.MAPPED in kinds) is mapped and (Kind.UPLOAD in kinds) is not mapped
        kinds.clear()
        got = coopmat.matmul(x, W, bias=bias, activation="relu", residual=res, dtype=np.float32)
        assert (Kind.MAPPED in kinds) is mapped and (Kind.UPLOAD in kinds) is not mapped
        ref = np.maximum(_ref(x, w) + bias.astype(np.float64), 0) + res
        assert np.abs(got.numpy() - ref).max() < _tol(96)


def test_small_results_of_numpy_operands_come_back_with_the_product(rt):
    """A small result of a product that took a numpy operand is copied to host-visible
    memory in the product's own submission; .numpy() reads that copy, and any later
    write into the array (out=, on either path) drops it."""
    from coopmat.dispatch.staging import HOST_COPY_MAX_BYTES
    x, x2 = _random((16, 96), np.float16, 40), _random((16, 96), np.float16, 41)
    w = (_random((96, 80), np.float16, 42) / 8).astype(np.float16)
    with discrete(rt):
        W = coopmat.asarray(w)
        for _ in range(2):  # the first call plans, the second takes the kept recipe
            Y = coopmat.matmul(x, W)
            assert Y._storage.host is not None
            assert np.array_equal(Y.numpy(), coopmat.matmul(x, w))
            assert np.array_equal(Y.T.numpy(), coopmat.matmul(x, w).T)
        assert (Y @ W.T)._storage.host is None  # no numpy operand: stays on the device
        assert np.array_equal((Y @ W.T).numpy(), coopmat.matmul(coopmat.matmul(x, w), w.T))
        coopmat.matmul(x2, W, out=Y)  # rewritten with a fresh host copy
        assert np.array_equal(Y.numpy(), coopmat.matmul(x2, w))
        coopmat.matmul(coopmat.asarray(x), W, out=Y)  # rewritten on the device alone
        assert Y._storage.host is None
        assert np.array_equal(Y.numpy(), coopmat.matmul(x, w))
        big = _random((HOST_COPY_MAX_BYTES // 160 + 1, 96), np.float16, 43)
        for _ in range(2):  # an operand too large to stage in the call: its own Array
            got = coopmat.matmul(big, W)
            assert got._storage.host is None
            assert np.array_equal(got.numpy(), coopmat.matmul(big, w))


def test_small_results_are_handed_to_numpy_as_they_came(rt):
    """Where the device imports host memory, a small result of a numpy operand comes back
    into a kept pinned block, which .numpy() returns as it is: each such array is the
    caller's alone (a later read of the same Array is a copy), blocks lent out are never
    written again while their arrays live (more kept at once than SMALL_BLOCKS come back
    the other way), and views of the Array read the block in place."""
    from coopmat.dispatch.transfer import SMALL_BLOCKS, NewDownload
    if not rt.transfers.import_alignment:
        pytest.skip("the device cannot import host memory")
    w = (_random((96, 80), np.float16, 48) / 8).astype(np.float16)
    xs = [_random((16, 96), np.float16, 60 + i) for i in range(2 * SMALL_BLOCKS + 2)]
    with discrete(rt, mapped=True):
        W = coopmat.asarray(w)
        ways = []
        for x in xs[:4]:  # the loop of a decode: each result dropped before the next
            Y = coopmat.matmul(x, W)
            ways.append(type(Y._storage.host[0]))
            got = Y.numpy()
            assert np.array_equal(got, coopmat.matmul(x, w))
            got[...] = 0  # the caller's own: the Array's next read is unchanged
            assert np.array_equal(Y.numpy(), coopmat.matmul(x, w))
            for f in rt.transfers._importing:  # a new block's import, for the next call
                f.result()
        assert NewDownload in ways
        Y = coopmat.matmul(xs[0], W)
        assert type(Y._storage.host[0]) is NewDownload
        assert np.array_equal(Y.T.numpy(), coopmat.matmul(xs[0], w).T)
        assert np.array_equal(Y.numpy(), coopmat.matmul(xs[0], w))
        Y, want = coopmat.matmul(xs[1], W), coopmat.matmul(xs[1], w)
        outs: list[np.ndarray] = []
        readers = [threading.Thread(target=lambda: outs.append(Y.numpy())) for _ in range(8)]
        for t in readers:
            t.start()
        for t in readers:
            t.join()
        outs[0][...] = 0  # one thread took the block; the others' arrays are their own
        assert all(np.array_equal(o, want) for o in outs[1:]) and len(outs) == 8
        kept = []
        for x in xs:  # every result kept: no block goes out twice
            kept.append(coopmat.matmul(x, W).numpy())
            for f in rt.transfers._importing:
                f.result()
        for x, got in zip(xs, kept, strict=True):
            assert np.array_equal(got, coopmat.matmul(x, w))
        assert max(rt.transfers._small_all.values()) <= SMALL_BLOCKS
        for x in xs:  # Arrays dropped unread give their blocks back
            coopmat.matmul(x, W)
        assert max(rt.transfers._small_all.values()) <= SMALL_BLOCKS


def test_errors(rt):
    A = coopmat.asarray(_random((4, 5), np.float16))
    with pytest.raises(ValueError, match="core dimension"):
        A @ A
    with pytest.raises(TypeError, match="different dtypes"):
        A @ coopmat.asarray(_random((5, 4), np.int8))
    with pytest.raises(TypeError, match="numbers"):
        coopmat.asarray(np.array([object()]))
    with pytest.raises(ValueError, match="negative"):
        coopmat.empty((-1, 3))
    with pytest.raises(coopmat.OutOfDeviceMemoryError):
        coopmat.empty((1 << 40,), np.float32)
    s = coopmat.asarray(_random((4, 6, 5), np.float16))
    with pytest.raises(ValueError, match="neither row- nor column-major"):
        coopmat.matmul(s.transpose(2, 0, 1), _random((6, 3), np.float16))
    # The device still works after each error.
    assert np.array_equal((A @ A.T).numpy(), coopmat.matmul(A.numpy(), A.numpy().T))


def test_two_devices_mismatch(rt):
    """Operands on two logical devices: a clear error, not a crash."""
    from coopmat.device.logical import create_device
    from coopmat.dispatch import runtime as rt_mod
    dev = create_device(rt.device.info, rt.device.physical)
    other = rt_mod.Runtime.create(dev)
    try:
        from coopmat.api.array import Array, _allocate
        x = _random((8, 8), np.float16)
        B = Array(_allocate(other, (8, 8), np.dtype(np.float16)), (8, 8), np.dtype(np.float16))
        other.transfers.upload(x, B.buffer)
        assert np.array_equal(B.numpy(), x)
        with pytest.raises(coopmat.DeviceMismatchError, match="different devices"):
            coopmat.asarray(x) @ B
        with pytest.raises(coopmat.DeviceMismatchError, match="asarray"):
            B[0] = coopmat.asarray(x[0])
        # The second device computes on its own (and its pipelines are torn down cleanly).
        want = x.astype(np.float64) @ x.astype(np.float64)
        np.testing.assert_allclose((B @ B).numpy(), want, rtol=2e-3, atol=2e-3)
        del B
    finally:
        other.destroy()


def test_chain_is_asynchronous_and_right(rt):
    x = _random((16, 64), np.float16, 11)
    w = (_random((64, 64), np.float16, 12) / 8).astype(np.float16)
    X, W = coopmat.asarray(x), coopmat.asarray(w)
    want = x
    for _ in range(30):
        X = X @ W
        want = coopmat.matmul(want, w)  # the numpy path rounds the same way each step
    assert np.array_equal(X.numpy(), want)


def test_memory_is_reused(rt):
    """2,000 create/free cycles leave the device's allocation flat."""
    x = _random((64, 64), np.float16)
    for _ in range(50):
        coopmat.asarray(x) @ coopmat.asarray(x)
    coopmat.synchronize()
    before = rt.pool.allocated_bytes
    for _ in range(2000):
        coopmat.asarray(x)
    coopmat.synchronize()
    assert rt.pool.allocated_bytes <= before + (1 << 20)


def test_out_of_memory_then_usable(rt):
    too_big = rt.pool.device_heap_bytes // 2 + (1 << 20)
    held = []
    with pytest.raises(coopmat.OutOfDeviceMemoryError):
        for _ in range(4):
            held.append(coopmat.empty((too_big,), np.uint8))
    held.clear()
    x = _random((16, 16), np.float16)
    assert np.array_equal(coopmat.asarray(x).numpy(), x)


def test_failure_surfaces_at_the_next_wait(rt):
    """A failure noted by the stream (as a lost device would be) is raised by the next
    wait, once, and the stream goes on."""
    arr = coopmat.asarray(_random((8, 8), np.float16))
    rt.stream._error = coopmat.DeviceLostError("waiting for a GEMM", "VK_ERROR_DEVICE_LOST")
    with pytest.raises(coopmat.DeviceLostError, match="DEVICE_LOST"):
        coopmat.synchronize()
    assert arr.numpy().shape == (8, 8)


def test_threads_submit_chains_concurrently(rt):
    w = (_random((48, 48), np.float16, 13) / 8).astype(np.float16)
    W = coopmat.asarray(w)
    results: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            x = _random((16, 48), np.float16, 100 + i)
            X, want = coopmat.asarray(x), x
            for _ in range(15):
                X = X @ W
                want = coopmat.matmul(want, w)
            results[i] = (X.numpy(), want)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for got, want in results.values():
        assert np.array_equal(got, want)


@pytest.mark.parametrize("mapped", [False, True], ids=["lanes", "mapped"])
def test_numpy_to_numpy_bulk_path(rt, monkeypatch, mapped):
    """Large numpy -> numpy products (bulk path) upload over the lanes, or write their
    inputs through the mapping of device memory the host maps where the device has it,
    strided views included; D comes back over the lanes."""
    from coopmat.dispatch import staging, transfer
    monkeypatch.setattr(staging, "BULK_MIN_BYTES", 64 << 10)
    monkeypatch.setattr(transfer, "CHUNK_BYTES", 16 << 10)
    monkeypatch.setattr(transfer, "PARALLEL_MIN_BYTES", 32 << 10)
    a, b = _random((130, 200), np.float16, 14), _random((200, 150), np.float16, 15)
    with discrete(rt, mapped):
        staged: list[int] = []
        real = rt.transfers._staged_upload
        monkeypatch.setattr(rt.transfers, "_staged_upload", lambda jobs, *x, **k: (
            staged.append(len(jobs)), real(jobs, *x, **k))[1])
        got = coopmat.matmul(a, b)
        got_t = coopmat.matmul(b.T, a.T)
        assert staged == ([] if mapped else [2, 2])
    assert np.abs(got - _ref(a, b)).max() < _tol(200)
    assert np.array_equal(got_t, got.T) or np.abs(got_t - got.T).max() < _tol(200)


def test_empty_sum_on_arrays(rt):
    """K == 0: zeros, plus beta * c, into a new Array or into out=."""
    a, b = np.zeros((3, 0), np.float16), np.zeros((0, 4), np.float16)
    assert np.array_equal(coopmat.matmul(coopmat.asarray(a), b).numpy(),
                          np.zeros((3, 4), np.float16))
    c = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = coopmat.empty((3, 4), np.float32)
    got = coopmat.matmul(coopmat.asarray(a), b, c=c, beta=2.0, dtype=np.float32, out=out)
    assert got is out and np.array_equal(out.numpy(), 2 * c)


@pytest.mark.parametrize("dtype", [np.float16, np.int8])
def test_numpy_to_numpy_pipelined(rt, monkeypatch, dtype):
    """Large numpy -> numpy products run as a pipeline of row blocks (uploads, kernels and
    downloads overlapping where the device has copy queues), including a short last block;
    int8 (whose row-major B is repacked first) and column-major A fall back to one
    product."""
    from coopmat.dispatch import pipeline
    _small_pipeline(monkeypatch)
    coopmat.set_options(pipeline="copy-queues")
    calls = []
    real = pipeline.run_pipelined
    monkeypatch.setattr(pipeline, "run_pipelined",
                        lambda *a, **k: calls.append(a[2].shape) or real(*a, **k))
    a, b = _random((150, 96), dtype, 16), _random((96, 130), dtype, 17)
    assert len(pipeline.row_blocks(150, 96 * 2 + 130 * 2)) > 2
    with discrete(rt):
        got = coopmat.matmul(a, b)
        again = coopmat.matmul(a, b, alpha=0.5 if dtype == np.float16 else 3)
        got_t = coopmat.matmul(b.T, a.T)  # A column-major: not pipelined
    assert calls == [(1, 150, 96), (1, 150, 96)]
    if dtype == np.int8:
        want = a.astype(np.int64) @ b.astype(np.int64)
        assert np.array_equal(got, want) and np.array_equal(got_t, want.T)
        assert np.array_equal(again, 3 * want)
        return
    assert np.abs(got - _ref(a, b)).max() < _tol(96)
    np.testing.assert_allclose(again.astype(np.float64), 0.5 * got.astype(np.float64),
                               rtol=2e-3, atol=_tol(96))
    assert np.abs(got_t - got.T).max() < _tol(96)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_numpy_to_numpy_pipelined_mapped(rt, monkeypatch, dtype):
    # dtype: the result's (float16 operands)
    """On a device with memory the host maps, a large numpy -> numpy product writes B and
    then each block of A through the mapping and runs each block's kernel as soon as its
    rows are there: results against float64 for a new result (over the lanes at first,
    then copied block by block into a kept pinned block), a kept B (one device copy),
    alpha, a short last block and out=."""
    from coopmat.dispatch import pipeline, transfer
    _small_pipeline(monkeypatch)
    monkeypatch.setattr(transfer, "PINNED_MIN_BYTES", 16 << 10)
    ran = []
    real = pipeline._run_mapped
    monkeypatch.setattr(pipeline, "_run_mapped",
                        lambda *a, **k: ran.append(k.get("out", a[4]) is None) or real(*a, **k))
    seen: dict[str, list[bool]] = {"target": [], "kept": [], "out": []}
    t = rt.transfers
    new_download, pinned_copy, kept_destination = \
        t.new_download, t._pinned_copy, t.kept_destination
    monkeypatch.setattr(t, "new_download", lambda n: (
        lambda got: seen["target"].append(got is not None) or got)(new_download(n)))
    monkeypatch.setattr(t, "_pinned_copy", lambda *a, **k: (
        lambda got: seen["kept"].append(got is not None) or got)(pinned_copy(*a, **k)))

    @contextmanager
    def spy(host):
        with kept_destination(host) as dest:
            if host.shape[-1] == 1000:  # D's (the kept way looks up A's import too)
                seen["out"].append(dest is not None)
            yield dest
    monkeypatch.setattr(t, "kept_destination", spy)
    # Results of 1.2 and 2.3 MiB: pinned blocks are whole 2 MiB and fit up to twice that.
    a, b = _random((600, 96), np.float16, 16), _random((96, 1000), np.float16, 17)
    want = _ref(a, b)
    tol = _tol(96) if dtype == np.float16 else 1e-3
    blocks = pipeline.row_blocks(600, 96 * 2 + 1000 * np.dtype(dtype).itemsize)
    assert len(blocks) > 2 and blocks[-1][1] - blocks[-1][0] < blocks[0][1] - blocks[0][0]
    with discrete(rt, mapped=True):
        first = None
        for i in range(6):
            scale = 0.5 if i == 4 else 1.0
            got = coopmat.matmul(a.copy(), b, alpha=scale, dtype=dtype)  # a new A each time
            assert got.shape == (600, 1000) and got.dtype == dtype
            assert np.abs(got.astype(np.float64) - scale * want).max() < tol, i
            if first is None:
                first, kept = got, got.copy()
            del got  # its block comes back for a later result
            for f in rt.transfers._importing:  # the result's block, B: imported by now
                f.result()
        out = np.full((600, 1000), np.nan, dtype)
        for i in range(3):  # the third call copies each block into out's kept import
            out[...] = np.nan
            assert coopmat.matmul(a.copy(), b, out=out, dtype=dtype) is out
            assert np.abs(out.astype(np.float64) - want).max() < tol, i
            for f in rt.transfers._importing:
                f.result()
        wide = np.zeros((600, 128), np.float16)
        wide[:, :96] = a
        strided = coopmat.matmul(wide[:, :96], b, dtype=dtype)  # rows 256 bytes apart
        for _ in range(3):  # the same A again: kept imported after its second time
            again = coopmat.matmul(a, b, dtype=dtype)
            for f in rt.transfers._importing:
                f.result()
        int8 = _random((150, 96), np.int8, 18), _random((96, 130), np.int8, 19)
        got8 = coopmat.matmul(*int8)  # pipelined, or whole where B is repacked first
    # The third product of the same A is one product: its A goes up in one device copy.
    assert ran[:12] == [True] * 6 + [False] * 3 + [True] * 3, ran
    assert ran[12:] in ([], [True])  # int8
    assert np.abs(strided.astype(np.float64) - want).max() < tol
    assert np.abs(again.astype(np.float64) - want).max() < tol
    assert any(seen["target"]), "later results came into a kept pinned block"
    assert any(seen["kept"]), "B, kept imported, went up in one device copy"
    assert seen["out"] == [False, False, True], "then into out's kept import"
    # Each result is the caller's own: the first is unchanged by the later calls.
    assert np.array_equal(first, kept)
    assert np.array_equal(got8, int8[0].astype(np.int64) @ int8[1].astype(np.int64))


@pytest.mark.parametrize("way", ["mapped", "copy-queues"])
def test_numpy_chunk_against_a_resident_weight_is_pipelined(rt, monkeypatch, way):
    """matmul_to_host (coopmat.dask's task): a large numpy x against an Array weight runs
    the row-block pipeline with the weight left where it is (only x's blocks cross), in
    both ways, with bias and activation fused, w as a transposed view (linear's w.T) and a
    short last block; anything else (a column-major x, a residual) is matmul + .numpy()."""
    from coopmat.api.matmul import matmul_to_host
    from coopmat.dispatch import pipeline, transfer
    _small_pipeline(monkeypatch)
    monkeypatch.setattr(transfer, "PINNED_MIN_BYTES", 16 << 10)
    # 'auto' leaves this product unpipelined on memory the host maps (measured slower)
    coopmat.set_options(pipeline="copy-queues" if way == "copy-queues" else "always")
    ran: list[bool] = []
    real = pipeline.run_pipelined
    monkeypatch.setattr(pipeline, "run_pipelined", lambda *a, **k: ran.append(
        isinstance(a[3], pipeline.DeviceOperand)) or real(*a, **k))
    M, K, N = 600, 96, 200
    x, w, bias, want, gelu = _linear_case(M, K, N, 21)
    assert len(pipeline.row_blocks(M, K * 2 + N * 2)) > 2
    with discrete(rt, mapped=way == "mapped"):
        w_dev = coopmat.asarray(w)
        got = [matmul_to_host(x.copy(), w_dev.T) for _ in range(3)]  # a new x each time
        fused = matmul_to_host(x, w_dev.T, bias=bias, activation="gelu_tanh",
                               dtype=np.float32)
        col = matmul_to_host(np.asfortranarray(x), w_dev.T)
        res = matmul_to_host(x, w_dev.T, residual=np.ones((M, N), np.float16))
    assert ran == [True] * 4, ran
    for y in got + [col]:
        assert type(y) is np.ndarray and y.shape == (M, N) and y.dtype == np.float16
        assert np.abs(y.astype(np.float64) - want).max() < _tol(K)
    assert fused.dtype == np.float32 and np.abs(fused - gelu).max() < _tol(K)
    assert np.abs(res.astype(np.float64) - (want + 1)).max() < _tol(K)
    assert not np.shares_memory(got[0], got[1])  # each result the caller's own


@pytest.mark.parametrize("mapped", [True, False])
def test_kept_chunk_is_pipelined_from_its_import(rt, monkeypatch, mapped):
    """A numpy chunk kept imported (a persisted Dask chunk from its third product on)
    takes the kept way: each block of A copied from its import, its kernel, its D block
    copied into a kept pinned block (or into out='s kept import). Copy queues would run
    the three beside each other; 'copy-queues' makes lavapipe's one queue run them in
    order. Results against float64 with bias and activation fused, a short last block, a
    numpy B (which goes up first) and out=."""
    from coopmat.api.matmul import matmul_to_host
    from coopmat.dispatch import pipeline, transfer
    _small_pipeline(monkeypatch)
    monkeypatch.setattr(transfer, "PINNED_MIN_BYTES", 16 << 10)
    coopmat.set_options(pipeline="copy-queues")
    kept: list[bool] = []
    real = pipeline._run_kept
    monkeypatch.setattr(pipeline, "_run_kept", lambda *a, **k: (
        lambda got: kept.append(got is not None) or got)(real(*a, **k)))
    M, K, N = 600, 96, 200
    x, w, bias, want, gelu = _linear_case(M, K, N, 31)
    blocks = pipeline.row_blocks(M, K * 2 + N * 2)
    assert len(blocks) > 2 and blocks[-1][1] - blocks[-1][0] < blocks[0][1] - blocks[0][0]

    def settle() -> None:  # the background imports done
        for f in rt.transfers._importing:
            f.result()
    with discrete(rt, mapped=mapped):
        w_dev = coopmat.asarray(w)
        got = []
        for _ in range(4):  # noted, imported, then kept
            got.append(matmul_to_host(x, w_dev.T))
            settle()
        assert rt.transfers.kept(x)
        fused = matmul_to_host(x, w_dev.T, bias=bias, activation="gelu_tanh",
                               dtype=np.float32)
        w_t = np.ascontiguousarray(w.T)
        out = np.full((M, N), np.nan, np.float16)
        outs = []
        for _ in range(3):  # out= kept imported from its second time
            out[...] = np.nan
            assert coopmat.matmul(x, w_t, out=out) is out
            outs.append(out.copy())
            settle()
    assert kept == [True] * 6, kept
    for y in got + outs:
        assert y.shape == (M, N) and y.dtype == np.float16
        assert np.abs(y.astype(np.float64) - want).max() < _tol(K)
    assert fused.dtype == np.float32 and np.abs(fused - gelu).max() < _tol(K)
    assert not np.shares_memory(got[2], got[3])  # each result the caller's own


def _linear_case(M: int, K: int, N: int, seed: int) -> tuple[np.ndarray, ...]:
    """x (M, K), w (N, K) as torch stores a weight, bias (N,), all float16 from seeds
    seed..seed + 2; x @ w.T and gelu_tanh(x @ w.T + bias) in float64."""
    x, w = _random((M, K), np.float16, seed), _random((N, K), np.float16, seed + 1)
    bias = _random((N,), np.float16, seed + 2)
    want = _ref(x, w.T)
    gelu = want + bias.astype(np.float64)
    gelu = 0.5 * gelu * (1 + np.tanh(np.sqrt(2 / np.pi) * (gelu + 0.044715 * gelu ** 3)))
    return x, w, bias, want, gelu


def _small_pipeline(monkeypatch) -> None:
    from coopmat.dispatch import pipeline, staging, transfer
    monkeypatch.setattr(staging, "BULK_MIN_BYTES", 64 << 10)
    monkeypatch.setattr(staging, "PIPELINE_MIN_BYTES", 64 << 10)
    monkeypatch.setattr(pipeline, "BLOCK_BYTES", 24 << 10)
    monkeypatch.setattr(pipeline, "BLOCK_ROWS", 16)
    monkeypatch.setattr(pipeline, "WRITE_CHUNK_BYTES", 4 << 10)
    monkeypatch.setattr(transfer, "CHUNK_BYTES", 8 << 10)
    monkeypatch.setattr(transfer, "PARALLEL_MIN_BYTES", 16 << 10)


def test_pipelined_threads_and_failures(rt, monkeypatch):
    """Four threads running mapped-pipeline products at once each get their own right
    result; a failure inside the pipeline (a block's submission) reaches the caller as
    itself, and the device keeps working."""
    from coopmat.dispatch import pipeline
    _small_pipeline(monkeypatch)
    a = [_random((300, 64), np.float16, 30 + i) for i in range(4)]
    b = _random((64, 200), np.float16, 40)
    got: dict[int, np.ndarray] = {}
    with discrete(rt, mapped=True):
        def work(i: int) -> None:
            for _ in range(3):
                got[i] = coopmat.matmul(a[i].copy(), b)
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        real = pipeline.enqueue_plan
        calls = []

        def failing(*args, **kwargs):
            calls.append(1)
            if len(calls) == 3:
                raise coopmat.VulkanError("vkQueueSubmit", "VK_ERROR_DEVICE_LOST")
            return real(*args, **kwargs)
        monkeypatch.setattr(pipeline, "enqueue_plan", failing)
        with pytest.raises(coopmat.VulkanError, match="DEVICE_LOST"):
            coopmat.matmul(a[0].copy(), b)
        submitted = len(calls)
        time.sleep(0.05)  # no lane may still submit on the buffers the call gave back
        assert len(calls) == submitted
        monkeypatch.setattr(pipeline, "enqueue_plan", real)
        after = coopmat.matmul(a[1].copy(), b)
    assert len(calls) >= 3
    for i in range(4):
        assert np.abs(got[i] - _ref(a[i], b)).max() < _tol(64), i
    assert np.abs(after - _ref(a[1], b)).max() < _tol(64)


def test_lanes_made_with_small_chunks_carry_large_ones(rt, monkeypatch):
    """Lanes live as long as the device: one made while CHUNK_BYTES was small (as tests
    set it) keeps staging buffers big enough for the chunks of later transfers (the
    device once copied a 4 MiB chunk into such a lane's 8 KiB buffer)."""
    from coopmat.dispatch import transfer
    x = _random((1024, 1024), np.float16, 5)  # 2 MiB: one chunk, one lane
    with discrete(rt):
        with monkeypatch.context() as m:
            m.setattr(transfer, "CHUNK_BYTES", 8 << 10)
            m.setattr(transfer, "PARALLEL_MIN_BYTES", 16 << 10)
            small = coopmat.asarray(x[:64])
            assert np.array_equal(small.numpy(), x[:64])  # the lanes are made here
        back = coopmat.asarray(x).numpy()
    assert np.array_equal(back, x)


def test_pipeline_way():
    from coopmat.dispatch import pipeline
    assert pipeline.way(mapped=True, copy_engines=False, a_kept=False) == "mapped"
    assert pipeline.way(mapped=True, copy_engines=False, a_kept=True) is None
    assert pipeline.way(mapped=True, copy_engines=True, a_kept=True) == "kept"
    assert pipeline.way(mapped=True, copy_engines=True, a_kept=False) == "mapped"
    assert pipeline.way(mapped=False, copy_engines=True, a_kept=True) == "kept"
    assert pipeline.way(mapped=False, copy_engines=True, a_kept=False) == "copy-queues"
    assert pipeline.way(mapped=False, copy_engines=False, a_kept=True) is None
    assert pipeline.way(mapped=False, copy_engines=False, a_kept=True, force=True) == "kept"
    assert pipeline.way(mapped=False, copy_engines=False, a_kept=False) is None


def test_copy_queues_env(monkeypatch):
    from coopmat.device import logical
    monkeypatch.setenv("COOPMAT_COPY_QUEUES", "yes")
    with pytest.raises(ValueError, match="COOPMAT_COPY_QUEUES='yes'"):
        logical._copy_queue_family(None)
    for value in ("0", ""):  # the default: no copy queues
        monkeypatch.setenv("COOPMAT_COPY_QUEUES", value)
        assert logical._copy_queue_family(None) == (None, 0)


def test_row_blocks():
    from coopmat.dispatch import pipeline
    # 8192 rows of 32 KiB (A and D): 256 MiB in blocks of about BLOCK_BYTES (32 MiB)
    blocks = pipeline.row_blocks(8192, 8192 * 4)
    assert len(blocks) == 8 and all(r1 - r0 == 1024 for r0, r1 in blocks)
    # contiguous cover, a short last block
    blocks = pipeline.row_blocks(1000, 1 << 20)
    assert blocks[0][0] == 0 and blocks[-1][1] == 1000
    assert all(b0[1] == b1[0] for b0, b1 in zip(blocks, blocks[1:], strict=False))
    assert len(blocks) >= 2


def test_setitem(rt):
    """Assignment through basic indexing, written on the device: from numpy values and
    device Arrays, broadcast, reversed and strided selections, overlapping source and
    destination, each against numpy doing the same to a host copy."""
    host = _random((2, 8, 40, 16), np.float16)
    arr = coopmat.asarray(host)
    k = _random((2, 8, 16), np.float16)
    steps = [
        ((slice(None), slice(None), 5), k),  # a KV cache's new row, from numpy
        ((slice(None), slice(None), slice(7, 9)), coopmat.asarray(_random((2, 8, 2, 16),
                                                                          np.float16))),
        ((1,), 3.5),  # a scalar, broadcast
        ((Ellipsis, 0), coopmat.asarray(_random((40,), np.float16))),  # a broadcast Array
        ((slice(None, None, -1), slice(None), slice(None, None, 3)),
         _random((2, 8, 14, 16), np.float32)),  # reversed and strided; float32 converted
        ((0, 2, slice(10, 20)), coopmat.asarray(_random((10, 16), np.float16)).T.T),
    ]
    for key, value in steps:
        arr[key] = value
        host[key] = value.numpy() if isinstance(value, coopmat.Array) else value
        assert np.array_equal(arr.numpy(), host), key
    arr[:, :, 1:] = arr[:, :, :-1]  # overlapping: as numpy, every value read first
    host[:, :, 1:] = host[:, :, :-1].copy()
    assert np.array_equal(arr.numpy(), host)
    view = arr[1, :, ::2]  # a view's assignment lands in its base
    view[0] = 1.0
    host[1, 0, ::2] = 1.0
    assert np.array_equal(arr.numpy(), host)
    arr[:0] = 7.0  # nothing selected, nothing written
    assert np.array_equal(arr.numpy(), host)


def test_setitem_in_stream_order(rt):
    """A write between two queued products lands after the first wrote the array and
    before the second reads it; a small result's host copy is not read stale after it."""
    a, w = _random((16, 32), np.float16), _random((32, 32), np.float16)
    da, dw = coopmat.asarray(a), coopmat.asarray(w)
    y = da @ dw  # queued
    row = _random((32,), np.float16)
    y[3] = row
    z = (y @ dw).numpy()
    y_host = (a.astype(np.float64) @ w.astype(np.float64)).astype(np.float16)
    y_host[3] = row
    np.testing.assert_allclose(z, y_host.astype(np.float64) @ w.astype(np.float64),
                               rtol=2e-2, atol=5e-2)
    # A numpy operand: on a discrete GPU the small result's host copy rides with the
    # product; the write must not leave .numpy() handing that copy over.
    r = coopmat.matmul(coopmat.asarray(a[:2]), w)
    r[0, :4] = 0.0
    got = r.numpy()
    assert not got[0, :4].any() and got[0, 4:].any()


def test_setitem_errors(rt):
    arr = coopmat.zeros((4, 5), np.float16)
    with pytest.raises(TypeError, match=r"float32 Array into a float16 one.*astype"):
        arr[0] = coopmat.zeros((5,), np.float32)
    with pytest.raises(ValueError, match=r"could not broadcast input array from shape "
                                         r"\(3,\) into shape \(5,\)"):
        arr[0] = coopmat.zeros((3,), np.float16)
    with pytest.raises(ValueError, match="could not broadcast"):
        arr[0] = np.zeros(3)
    with pytest.raises(TypeError):
        arr[[0, 1]] = 1.0
    with pytest.raises(IndexError, match="out of bounds"):
        arr[4] = 1.0
    assert not arr.numpy().any()
