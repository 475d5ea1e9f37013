"""coopmat.dask on lavapipe: a LocalCluster of two workers (both on the one device, asked
for by listing it twice), results against float64 numpy, the weight kept on each worker's
device, errors and killed workers, and the coopmat-dask-worker path beside a separate
`dask scheduler` process. Everything listens on 127.0.0.1 only."""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import coopmat  # noqa: E402
import coopmat.dask as cd  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(48)
LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def device(live_device_info):
    return live_device_info


@pytest.fixture(scope="module")
def client(device):
    cluster = cd.LocalCluster(devices=[device.index, device.index], host=LOOPBACK,
                              dashboard_address=f"{LOOPBACK}:0", silence_logs=logging.ERROR)
    c = distributed.Client(cluster)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


def fresh_cache(client) -> None:
    client.run(cd.clear_cache)
    cd.clear_cache()


def on_cluster(y):
    """y computed by the cluster, after once in this process: the workers share Mesa's
    shader cache, but two of them meeting a new kernel at once would each compile it
    (seconds of lavapipe's CPU); this way the workers find it compiled."""
    y.compute(scheduler="sync")
    return y.compute()


def gelu_tanh(v: np.ndarray) -> np.ndarray:
    return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))


def close_to(got: np.ndarray, want: np.ndarray, k: int, rel: float = 1e-2) -> None:
    """float16-rounded products: within a few half-precision ulps of the result scale."""
    scale = max(1.0, float(np.abs(want).max()))
    assert np.abs(got.astype(np.float64) - want).max() <= rel * scale + 1e-3 * np.sqrt(k)


def test_workers_report_their_device_pinned_by_uuid(client, device):
    held = cd.worker_devices(client)
    assert len(held) == 2
    for description in held.values():
        assert device.name in description
        if device.device_uuid:
            assert f"UUID {device.device_uuid}" in description
    pins = client.run(lambda: os.environ["COOPMAT_DEVICE"])
    assert set(pins.values()) == {device.device_uuid or str(device.index)}
    # Copy queues opened (where the GPU has them): a kept chunk's product overlaps.
    queues = client.run(lambda: os.environ.get("COOPMAT_COPY_QUEUES"))
    assert set(queues.values()) == {os.environ.get("COOPMAT_COPY_QUEUES") or "1"}
    resources = {w["resources"].get("GPU") for w in client.scheduler_info()["workers"].values()}
    assert resources == {1}
    # two threads a worker: the next task waits there while the device is busy
    assert {w["nthreads"] for w in client.scheduler_info()["workers"].values()} == {2}


def test_float16_ragged_rows_and_chunked_k(client):
    a = RNG.standard_normal((50, 96)).astype(np.float16)
    w = RNG.standard_normal((96, 24)).astype(np.float16)
    x = da.from_array(a, chunks=(16, 32))  # ragged last row chunk (2 rows), K in 3 chunks
    y = cd.matmul(x, w)
    assert y.dtype == np.float16 and y.shape == (50, 24)
    assert y.chunks == ((16, 16, 16, 2), (24,))
    got = on_cluster(y)
    assert type(got) is np.ndarray and got.dtype == np.float16
    close_to(got, a.astype(np.float64) @ w.astype(np.float64), 96)


def test_int8_and_uint8_exact(client):
    for dt, acc in ((np.int8, np.int32), (np.uint8, np.uint32)):
        lo, hi = (-8, 8) if dt == np.int8 else (0, 16)
        a = RNG.integers(lo, hi, (37, 64)).astype(dt)
        w = RNG.integers(lo, hi, (64, 16)).astype(dt)
        y = cd.matmul(da.from_array(a, chunks=(10, 64)), w)
        assert y.dtype == acc
        got = on_cluster(y)
        assert got.dtype == acc
        np.testing.assert_array_equal(got, a.astype(np.int64) @ w.astype(np.int64))


def test_bfloat16_where_offered(client):
    import ml_dtypes
    if not any(s.startswith("bfloat16") for s in coopmat.supported_dtypes()):
        pytest.skip("the device offers no bfloat16 cooperative matrices")
    a = RNG.standard_normal((33, 64)).astype(ml_dtypes.bfloat16)
    w = RNG.standard_normal((64, 16)).astype(ml_dtypes.bfloat16)
    y = cd.matmul(da.from_array(a, chunks=(8, 64)), w)
    assert y.dtype == np.float32
    want = a.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_allclose(on_cluster(y), want, rtol=1e-3, atol=1e-3)


def test_dtype_and_accumulator_pass_through(client):
    a = RNG.standard_normal((20, 64)).astype(np.float16)
    w = RNG.standard_normal((64, 8)).astype(np.float16)
    x = da.from_array(a, chunks=(8, 64))
    y32 = cd.matmul(x, w, dtype=np.float32)
    assert y32.dtype == np.float32
    got = on_cluster(y32)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, a.astype(np.float64) @ w.astype(np.float64),
                               rtol=1e-4, atol=1e-3)
    half = on_cluster(cd.matmul(x, w, accumulator=np.float16))
    assert half.dtype == np.float16
    close_to(half, a.astype(np.float64) @ w.astype(np.float64), 64, rel=3e-2)


def test_linear_bias_activation_residual(client):
    a = RNG.standard_normal((45, 64)).astype(np.float16)
    w = RNG.standard_normal((24, 64)).astype(np.float16)  # (out_features, in_features)
    bias = RNG.standard_normal(24).astype(np.float16)
    res = RNG.standard_normal((45, 24)).astype(np.float16)
    x = da.from_array(a, chunks=(12, 64))
    y = cd.linear(x, w, bias, "gelu_tanh", da.from_array(res, chunks=(20, 24)))
    assert y.dtype == np.float16
    want = gelu_tanh(a.astype(np.float64) @ w.T.astype(np.float64) + bias) + res
    close_to(on_cluster(y), want, 64)


def test_quantized_weight_made_on_each_worker(client):
    from gguf import GGMLQuantizationType, quants
    a = RNG.standard_normal((40, 64)).astype(np.float16)
    wf = RNG.standard_normal((16, 64)).astype(np.float32)
    deq = quants.dequantize(quants.quantize(wf, GGMLQuantizationType.Q4_0),
                            GGMLQuantizationType.Q4_0).astype(np.float64)
    q = cd.quantized(wf, "q4_0")
    assert q.shape == (16, 64) and q.T.shape == (64, 16)
    x = da.from_array(a, chunks=(16, 64))
    want = a.astype(np.float64) @ deq.T
    close_to(on_cluster(cd.linear(x, q)), want, 64)
    close_to(cd.matmul(x, q.T).compute(), want, 64)
    with pytest.raises(ValueError, match=r"\.T"):
        cd.matmul(x, q)


def test_gguf_tensor_weight(client, tmp_path):
    gguf = pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType, quants
    wf = RNG.standard_normal((8, 64)).astype(np.float32)
    blocks = quants.quantize(wf, GGMLQuantizationType.Q8_0)
    path = tmp_path / "w.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("w", blocks, raw_shape=blocks.shape, raw_dtype=GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensor = gguf.GGUFReader(str(path)).tensors[0]
    weight = cd.from_gguf(tensor)
    assert weight.format == "q8_0" and weight.shape == (8, 64)
    a = RNG.standard_normal((20, 64)).astype(np.float16)
    deq = quants.dequantize(blocks, GGMLQuantizationType.Q8_0).astype(np.float64)
    x = da.from_array(a, chunks=(7, 64))
    close_to(on_cluster(cd.linear(x, weight)), a.astype(np.float64) @ deq.T, 64)
    on_disk = cd.from_gguf(path, "w")  # each worker reads the file itself
    assert on_disk.format == "q8_0" and on_disk.shape == (8, 64)
    assert pickle.dumps(on_disk).__len__() < blocks.nbytes
    close_to(on_cluster(cd.matmul(x, on_disk.T)), a.astype(np.float64) @ deq.T, 64)
    with pytest.raises(ValueError, match="no tensor 'v'"):
        cd.from_gguf(path, "v")


def test_weight_is_one_graph_key_uploaded_once_per_worker(client):
    fresh_cache(client)
    before = client.run(cd.cache_info)
    a = RNG.standard_normal((160, 64)).astype(np.float16)
    w = RNG.standard_normal((64, 256)).astype(np.float16)  # 32 KiB
    x = client.persist(da.from_array(a, chunks=(10, 64)))  # 16 chunks on both workers
    distributed.wait(x)
    y = cd.matmul(x, w)
    graph = dict(y.__dask_graph__())
    assert sum(str(k).startswith("coopmat-weight-") for k in graph) == 1
    assert len(pickle.dumps(graph)) < 2 * w.nbytes  # not a copy per task
    want = a.astype(np.float64) @ w.astype(np.float64)
    for _ in range(2):
        close_to(y.compute(), want, 64)
    after = client.run(cd.cache_info)
    uploads = {addr: after[addr]["uploads"] - before[addr]["uploads"] for addr in after}
    ran = {addr: uploads[addr] + after[addr]["hits"] - before[addr]["hits"] for addr in after}
    assert sum(ran.values()) == 2 * 16
    assert all(uploads[addr] == (1 if ran[addr] else 0) for addr in after), (uploads, ran)


def test_results_are_numpy_chunks(client):
    a = RNG.standard_normal((30, 32)).astype(np.float16)
    y = cd.matmul(da.from_array(a, chunks=(10, 32)), np.eye(32, dtype=np.float16))
    assert isinstance(y._meta, np.ndarray)
    futures = client.compute(list(y.to_delayed().ravel()))
    blocks = client.gather(futures)
    assert [type(b) for b in blocks] == [np.ndarray] * 3
    kinds = client.gather(client.compute(list(y.map_blocks(
        lambda b: np.array([type(b).__module__ + "." + type(b).__name__]),
        dtype=object, chunks=(1,), drop_axis=1).to_delayed().ravel())))
    assert {str(k[0]) for k in kinds} == {"numpy.ndarray"}


def test_task_error_reaches_the_client_promptly(client):
    bad = da.ones((40, 32), chunks=(10, 32))  # float64: coopmat refuses it
    y = cd.matmul(bad, np.ones((32, 8), np.float16))
    t0 = time.monotonic()
    with pytest.raises(TypeError, match="different dtypes float64 and float16"):
        client.compute(y).result(timeout=30)
    assert time.monotonic() - t0 < 15


def test_device_memory_error_reaches_the_client_as_coopmats(client, device):
    limit = device.limits.max_storage_buffer_range
    if limit > 256 << 20:
        pytest.skip("a chunk past this device's maxStorageBufferRange is too large to make")
    k = 8192
    rows = limit // (2 * k) + 8  # one chunk just past the range, made on the worker
    y = cd.matmul(da.zeros((rows, k), dtype=np.float16, chunks=(rows, k)),
                  np.zeros((k, 8), np.float16))
    t0 = time.monotonic()
    with pytest.raises(coopmat.OutOfDeviceMemoryError, match="maxStorageBufferRange"):
        client.compute(y).result(timeout=60)
    assert time.monotonic() - t0 < 30


def test_every_coopmat_error_survives_the_trip_to_the_client():
    """distributed pickles a task's error through tblib; each arrives as its own class."""
    import tblib.pickling_support
    from distributed.protocol import pickle as dask_pickle

    from coopmat.dask.linalg import _transportable
    for error in (coopmat.OutOfDeviceMemoryError("too big"),
                  coopmat.VulkanError("vkQueueSubmit", -4),
                  coopmat.DeviceLostError("vkQueueSubmit", -4),
                  coopmat.DeviceMismatchError("two devices"),
                  coopmat.MissingFeatureError("no bfloat16")):
        sent = _transportable(error)
        tblib.pickling_support.install(sent)
        back = dask_pickle.loads(dask_pickle.dumps(sent))
        assert isinstance(back, type(error)) and str(back) == str(error)


def test_default_scheduler_runs_on_this_process():
    cd.clear_cache()
    before = cd.cache_info()
    a = RNG.standard_normal((30, 64)).astype(np.float16)
    w = RNG.standard_normal((64, 16)).astype(np.float16)
    y = cd.matmul(da.from_array(a, chunks=(8, 64)), w)
    want = a.astype(np.float64) @ w.astype(np.float64)
    for _ in range(2):
        close_to(y.compute(scheduler="threads"), want, 64)
    info = cd.cache_info()
    assert info["uploads"] - before["uploads"] == 1 and info["hits"] - before["hits"] == 7


def test_tasks_take_the_chunks_themselves(monkeypatch):
    """Each task multiplies the chunk Dask holds, not a copy of it: a copy costs a chunk's
    worth of new memory a task, and only the chunk itself stays imported across computes
    (dispatch/transfer.py's kept imports)."""
    from coopmat.dask import linalg
    a = RNG.standard_normal((30, 64)).astype(np.float16)
    w = RNG.standard_normal((64, 16)).astype(np.float16)
    seen: list[np.ndarray] = []
    real = linalg.matmul_to_host
    monkeypatch.setattr(linalg, "matmul_to_host", lambda x, *r, **k: (
        seen.append(x), real(x, *r, **k))[1])
    x = da.from_array(a, chunks=(8, 64)).persist(scheduler="sync")
    chunks = dask.compute(*x.to_delayed().ravel(), scheduler="sync")
    y = cd.matmul(x, w).compute(scheduler="sync")
    close_to(y, a.astype(np.float64) @ w.astype(np.float64), 64)
    assert len(seen) == 4
    assert all(any(np.shares_memory(s, c) for c in chunks) for s in seen)


def test_cache_is_bounded_and_evicts_least_recent():
    cd.clear_cache()
    a = da.from_array(RNG.standard_normal((8, 64)).astype(np.float16), chunks=(8, 64))
    ws = [RNG.standard_normal((64, 64)).astype(np.float16) for _ in range(3)]  # 8 KiB each
    before = cd.cache_info()
    try:
        cd.set_cache_limit(2 * ws[0].nbytes)
        for w in ws + ws[-1:]:
            cd.matmul(a, w).compute(scheduler="sync")
        info = cd.cache_info()
        assert info["entries"] == 2 and info["bytes"] == 2 * ws[0].nbytes
        assert info["evictions"] - before["evictions"] == 1
        assert info["uploads"] - before["uploads"] == 3  # the last weight: a hit
        cd.set_cache_limit("4 KiB")
        assert cd.cache_info()["entries"] == 0
    finally:
        cd.set_cache_limit(before["limit"])
        cd.clear_cache()


def test_bad_arguments_fail_at_graph_time():
    x = da.ones((8, 32), chunks=4, dtype=np.float16)
    with pytest.raises(ValueError, match="K=32"):
        cd.matmul(x, np.ones((16, 8), np.float16))
    with pytest.raises(TypeError, match="each worker uses its own device"):
        cd.matmul(x, np.ones((32, 8), np.float16), device=0)
    with pytest.raises(ValueError, match="result's is"):
        cd.linear(x, np.ones((8, 32), np.float16), residual=np.ones((8, 9), np.float16))
    with pytest.raises(TypeError, match="cannot travel"):
        cd.matmul(x, coopmat.asarray(np.ones((32, 8), np.float16)))
    with pytest.raises(ValueError, match="multiple of 32"):
        cd.quantized(np.ones((8, 40), np.float32), "q8_0")
    with pytest.raises(coopmat.DeviceNotFoundError):
        cd.LocalCluster(devices=["no-such-device-here"])


def test_killed_worker_has_its_tasks_rerun(client):
    a = RNG.standard_normal((80, 32)).astype(np.float16)
    w = RNG.standard_normal((32, 8)).astype(np.float16)

    def slow(block: np.ndarray) -> np.ndarray:
        time.sleep(0.3)
        return block

    x = da.from_array(a, chunks=(10, 32)).map_blocks(slow, dtype=a.dtype)
    future = client.compute(cd.matmul(x, w))
    deadline = time.monotonic() + 20
    while not all(client.processing().values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    victim = sorted(client.scheduler_info()["workers"])[0]
    pid = client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGKILL)
    got = future.result(timeout=90)
    close_to(got, a.astype(np.float64) @ w.astype(np.float64), 32)
    assert victim not in client.scheduler_info()["workers"]  # it did die mid-compute
    client.wait_for_workers(2, timeout=START_TIMEOUT_S)  # the nanny restarts it


def _python(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    out, _ = proc.communicate(timeout=15)
    return out or ""


@pytest.fixture
def scheduler(device, tmp_path):
    """A `dask scheduler` process on 127.0.0.1 (any free port); its address."""
    file = tmp_path / "scheduler.json"
    proc = _python("-m", "distributed.cli.dask_scheduler", "--host", LOOPBACK, "--port", "0",
                   "--no-dashboard", "--scheduler-file", str(file))
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not file.exists() or not file.read_text().strip():
            assert proc.poll() is None and time.monotonic() < deadline, _stop(proc)
            time.sleep(0.1)
        yield json.loads(file.read_text())["address"]
    finally:
        _stop(proc)


def test_coopmat_dask_worker_beside_a_scheduler(scheduler, device, tmp_path):
    workers = _python("-m", "coopmat.dask.worker", scheduler,
                      "--devices", f"{device.index},{device.index}", "--host", LOOPBACK,
                      "--no-dashboard", "--local-directory", str(tmp_path),
                      "--name-prefix", "lavapipe")
    try:
        with distributed.Client(scheduler, timeout=START_TIMEOUT_S) as c:
            c.wait_for_workers(2, timeout=START_TIMEOUT_S)
            info = c.scheduler_info()["workers"].values()
            assert sorted(w["name"] for w in info) == ["lavapipe-0", "lavapipe-1"]
            assert all(w["resources"] == {"GPU": 1} and w["nthreads"] == 2 for w in info)
            held = cd.worker_devices(c)
            assert len(held) == 2 and all(device.name in d for d in held.values())
            queues = c.run(lambda: os.environ.get("COOPMAT_COPY_QUEUES"))
            assert set(queues.values()) == {os.environ.get("COOPMAT_COPY_QUEUES") or "1"}
            a = RNG.standard_normal((24, 32)).astype(np.float16)
            w = RNG.standard_normal((32, 8)).astype(np.float16)
            y = cd.matmul(da.from_array(a, chunks=(6, 32)), w)
            close_to(c.compute(y).result(timeout=60), a.astype(np.float64) @ w, 32)
    finally:
        out = _stop(workers)
    assert "worker lavapipe-0 on" in out


def test_worker_without_its_device_fails_its_start(scheduler, tmp_path):
    env = {**os.environ, "COOPMAT_DEVICE": "no-such-device-here"}
    r = subprocess.run([sys.executable, "-m", "coopmat.dask.worker", scheduler], env=env,
                       cwd=ROOT, capture_output=True, text=True, timeout=START_TIMEOUT_S)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no worker started" in lines[0] and "no-such-device-here" \
        in lines[0], r.stderr
    # A plain `dask worker` with the preload: the worker itself refuses to start.
    proc = _python("-m", "distributed.cli.dask_worker", scheduler, "--host", LOOPBACK,
                   "--no-dashboard", "--local-directory", str(tmp_path), "--preload",
                   "coopmat.dask.preload", env=env)
    try:
        proc.wait(START_TIMEOUT_S)
    finally:
        out = _stop(proc)
    assert proc.returncode != 0
    assert "coopmat.dask: worker" in out and "has no device" in out and \
        "no-such-device-here" in out, out


CLOCK_MS = 10.0


def test_bench_dask_on_two_workers(device, tmp_path):
    out = tmp_path / "dask.json"
    r = subprocess.run(
        [sys.executable, "-m", "coopmat.bench", "--dask", "--rows", "96", "--k", "64", "--n",
         "32", "--chunk", "16", "--workers", "1,2", "--devices",
         f"{device.index},{device.index}", "--repeat", "1", "--linear", "q4_0",
         "--from-client", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert doc["config"]["rows"] == 96 and doc["config"]["chunk"] == 16
    rows = [x for x in doc["results"] if x["engine"] == "coopmat"]
    assert [x["workers"] for x in rows] == [1, 2]
    for x in rows:
        assert x["seconds"] > 0 and x["max_error"] < 1e-2
        assert x["ms_per_chunk_per_worker"] == pytest.approx(1e3 * x["seconds"] * x["workers"]
                                                             / 6)
        split = x["bare_product"]
        assert min(split["whole_ms"], split["upload_ms"], split["kernel_ms"],
                   split["download_ms"]) > 0
        assert x["task_compute_ms"] > 0 and x["host_copy_gbps"] > 0
        # the sleeps' graph: each worker's six / workers sleeps of the bare product, in turn
        assert x["dask_floor_seconds"] >= 6 * split["whole_ms"] / 1e3 / x["workers"]
        assert x["floor_speedup"] > 0
        assert x["bare_speedup"] == pytest.approx(
            x["workers"] * rows[0]["bare_product"]["whole_ms"] / split["whole_ms"])
        # the workers' time: each task's compute plus the rest, never less than computing
        assert x["overhead_ms_per_task"] >= 0 and x["imbalance"] >= 1
        # A worker shifts its task times by its estimate of its clock's offset to the
        # scheduler's; the bench takes off its latest estimate, which may differ from the
        # one the times were sent with (a heartbeat between): CLOCK_MS of slack.
        assert x["host_transfer_gbps"] > 0 and x["start_ms"] > -CLOCK_MS
        assert x["tail_ms"] >= -CLOCK_MS
        # each worker's first compute starts after submission, its last ends before wait
        for run in x["runs"]:
            assert all(-CLOCK_MS < first <= last <= 1e3 * run["seconds"] + CLOCK_MS
                       for first, last, _, _ in run["per_worker"])
            assert sum(tasks for _, _, tasks, _ in run["per_worker"]) == 6
    assert doc["config"]["host"]["memory_gbps"] > 0
    linear = [x for x in doc["results"] if x["engine"].startswith("coopmat linear q4_0")]
    assert [x["workers"] for x in linear] == [1, 2]
    assert all(x["seconds"] > 0 and x["max_error"] < 1e-2 for x in linear)
    sent = [x for x in doc["results"] if x["engine"] == "coopmat, X from the client"]
    assert [x["workers"] for x in sent] == [1, 2]
    assert all(x["seconds"] > 0 and x["max_error"] < 1e-2 for x in sent)
    assert "coopmat" in r.stdout and "upload" in r.stdout


def test_import_coopmat_leaves_dask_alone():
    code = ("import sys, numpy as np, coopmat; coopmat.matmul; coopmat.Array; "
            "assert not any(m == 'dask' or m.startswith(('dask.', 'distributed')) "
            "for m in sys.modules), sorted(m for m in sys.modules if 'dask' in m)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr


def test_bench_cupy_peer_graph_with_numpy_standing_in(monkeypatch):
    """The CuPy peer's cluster (a worker per CUDA device) and graph, run with numpy's
    asarray standing in for cupy's, so that a GPU run does not find its first bug."""
    from types import SimpleNamespace

    from coopmat.tools import bench_dask
    fake = SimpleNamespace(asarray=np.asarray, asnumpy=np.asarray, cuda=SimpleNamespace(
        runtime=SimpleNamespace(getDeviceCount=lambda: 2)))
    monkeypatch.setattr(bench_dask, "cupy_module", lambda: fake)
    args = bench_dask._parser().parse_args(["--rows", "64", "--k", "32", "--n", "16",
                                            "--chunk", "16", "--repeat", "1"])
    rows: list = []
    bench_dask.run_cupy(args, [1, 2, 4], rows, lambda: None)  # 4: more than the devices
    assert [(r["engine"], r["workers"]) for r in rows] == [("dask + cupy", 1),
                                                           ("dask + cupy", 2)]
    assert all(r["seconds"] > 0 for r in rows)
