"""Smoke test of `python -m coopmat.bench` on whatever device the suite runs on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_bench_runs_and_writes_json(live_device_info, tmp_path):
    out = tmp_path / "bench.json"
    png = tmp_path / "bench.png"
    # One float and one integer type: each further type is only more kernels to compile.
    args = [sys.executable, "-m", "coopmat.bench", "--sizes", "16,40x24x56", "--layouts", "nn,tn",
            "--dtypes", "float16,int8", "--repeat", "3", "--budget", "0.5", "--stream", "3",
            "--json", str(out)]
    try:
        import matplotlib  # noqa: F401
        args += ["--plot", str(png)]
    except ImportError:
        png = None
    r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    rows = doc["results"]
    assert rows, "no benchmark rows"
    assert {(x["M"], x["N"], x["K"]) for x in rows} == {(16, 16, 16), (40, 24, 56)}
    for row in rows:
        assert row["error"] == "", row
        assert row["kernel_time"]["median"] > 0
        # (e2e and kernel medians come from different runs: no order between them holds)
        assert row["e2e_time"]["median"] > 0
        assert row["kernel_tops"] > 0
        assert "numpy" in row["peers"]
        assert row["stream_dispatches"] == 3
        assert row["stream_wall"]["median"] > 0 and row["stream_wall_tops"] > 0
        if row["kernel_time"] is not None:  # timestamps: so does the stream
            assert row["stream_time"]["median"] > 0 and row["stream_tops"] > 0
    assert doc["overhead_64_f16"]["median_s"] > 0
    assert "TOPS" in r.stdout or "T*OP/s" in r.stdout
    assert "stream T*OP/s" in r.stdout
    if png is not None:
        assert png.stat().st_size > 1000


def test_stream_inputs_cycle_through_copies_of_the_operands(live_device_info, monkeypatch, capsys):
    """--stream 4 --stream-inputs 2: dispatch i reads copy i % 2 of A and B, each copy in
    its own buffers, and every dispatch writes its own D."""
    import coopmat
    from coopmat.codegen import abi
    from coopmat.dispatch.executor import Executor
    from coopmat.tools import bench

    seen: list[list] = []
    original = Executor.run_independent

    def spy(self, dispatches, submits):
        seen.append(list(dispatches))
        return original(self, dispatches, submits)

    monkeypatch.setattr(Executor, "run_independent", spy)
    dtype = sorted(coopmat.supported_dtypes())[0]
    argv = ["--sizes", "24x16x40", "--layouts", "nn", "--repeat", "3", "--budget", "0.2",
            "--no-peers", "--stream", "4", "--stream-inputs", "2", "--dtypes", dtype]
    assert bench.main(argv) == 0
    assert seen, "no streamed submission"
    for dispatches in seen:
        assert len(dispatches) == 4
        a = [d.buffers[abi.BINDING_A].addr for d in dispatches]
        b = [d.buffers[abi.BINDING_B].addr for d in dispatches]
        assert a[0] == a[2] and a[1] == a[3] and a[0] != a[1]
        assert b[0] == b[2] and b[1] == b[3] and b[0] != b[1]
        assert len({d.buffers[abi.BINDING_D].addr for d in dispatches}) == 4
    assert "x4/2in" in capsys.readouterr().out


def test_stream_inputs_needs_stream():
    from coopmat.tools import bench
    with pytest.raises(SystemExit) as exc:
        bench.main(["--stream-inputs", "2"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        bench.main(["--stream", "2", "--stream-inputs", "3"])


def test_data_path_bench_runs_and_checks(live_device_info, tmp_path):
    """`bench --data-path`: every section runs and reports (small sizes for a CPU)."""
    from coopmat.tools import bench
    out = tmp_path / "data.json"
    assert bench.main(["--data-path", "--repeat", "1", "--sizes", "96", "--transfer-mib", "2",
                       "--decode", "8x128", "--chain", "5", "--small", "32",
                       "--calls", "3", "--rounds", "2", "--spin", "0",
                       "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    cases = [r["case"] for r in rows]
    assert any(c.startswith("coopmat staging") for c in cases)
    assert "numpy->numpy f16 96^3" in cases
    e2e = next(r for r in rows if r["case"] == "numpy->numpy f16 96^3")
    assert e2e["coopmat_ms"] > 0 and e2e["max_err_first_rows"] < 0.1
    assert any("5 chained" in c for c in cases)


def test_inference_bench_runs_and_reports(live_device_info, tmp_path):
    """`bench --inference`: decode, quantized and fused rows, each with its kernel time
    (small sizes for a CPU). The quantized rows time the quantized kernels themselves."""
    from coopmat.tools import bench
    out = tmp_path / "inference.json"
    assert bench.main(["--inference", "--rows", "1,16", "--shapes", "64x48",
                       "--quant-rows", "1,16", "--quant-shape", "64x48", "--fused", "32",
                       "--json", str(out)]) == 0
    rows = {r["case"]: r for r in json.loads(out.read_text())["rows"]}
    for M in (1, 16):
        for layout in ("KxN", "NxK^T"):
            row = rows[f"decode {M}x64 @ 64x48 ({layout})"]
            assert row["policy_us"] > 0 and row["khr_us"] > 0
        row = rows[f"quantized {M}x64 @ (48x64)^T"]
        for name in ("f16", "q8_0", "q4_0"):
            assert row[f"{name}_kernel_us"] > 0 and row[f"{name}_call_us"] > 0, row
            assert row[f"{name}_TBps"] > 0
        assert "bq8_0" in row["q8_0_kernel"] and "bq4_0" in row["q4_0_kernel"]
        assert "bq" not in row["f16_kernel"]
    plain = rows["fused 32^3 khr plain"]
    assert plain["ms"] > 0
    assert rows["fused 32^3 khr bias+gelu_tanh+residual"]["kernel"].endswith(
        "epi_bias_gelu_tanh_res")


def test_inference_bench_rejects_bad_shapes(capsys):
    """A malformed KxN, or a quantized K that is not whole GGUF blocks, is the parser's
    error naming the option, before any device work."""
    from coopmat.tools import bench
    for args, words in ((["--shapes", "64"], "--shapes"),
                        (["--quant-shape", "40x48"], "multiple of the 32-weight")):
        with pytest.raises(SystemExit) as exc:
            bench.main(["--inference", *args])
        assert exc.value.code == 2
        assert words in capsys.readouterr().err


def test_vs_ggml_without_the_binary_is_one_line_before_device_work(tmp_path, monkeypatch,
                                                                   capsys):
    """--vs-ggml with no ggml binary to be found (or a --ggml path holding none) ends at
    once with a one-line usage error saying where it looked and what to pass."""
    from coopmat.tools import bench, bench_infer, ggml_peer
    monkeypatch.setattr(ggml_peer, "UNPACKED", tmp_path / "unpacked")
    monkeypatch.setattr(bench_infer, "_CHECKOUT", tmp_path)
    monkeypatch.chdir(tmp_path)
    for extra, words in (([], "--ggml PATH"), (["--ggml", str(tmp_path / "none")], "none")):
        with pytest.raises(SystemExit) as exc:
            bench.main(["--inference", "--vs-ggml", *extra])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "--vs-ggml" in err and words in err, err


def test_vs_ggml_runs_ggml_beside_coopmat(live_device_info, tmp_path, capsys):
    """`--inference --vs-ggml` on a tiny q4_0 product: ggml's test-backend-ops (a
    subprocess on the same device) and coopmat's kernel timed on one case table; both
    columns present, positive, consistent with the case's FLOPs and with each other; with
    --activation-quant, coopmat's integer path in a third; with --ggml-f32acc, ggml again
    accumulating in float32."""
    from coopmat.tools import bench, ggml_peer
    try:
        ggml_peer.find_binary(None, [ROOT])
    except ggml_peer.PeerError as exc:
        pytest.skip(f"ggml peer absent: {exc}")
    out = tmp_path / "vs.json"
    assert bench.main(["--inference", "--vs-ggml", "--skip", "decode,fused",
                       "--quant-rows", "1", "--quant-shape", "64x48", "--quant-formats", "q4_0",
                       "--activation-quant", "q8_1", "--ggml-f32acc", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["ggml"]["device"] == data["device"] == live_device_info.name
    row = {r["case"]: r for r in data["rows"]}["vs-ggml q4_0 1x64 @ (48x64)^T"]
    flops = 2 * 1 * 48 * 64
    for who in ("coopmat", "ggml"):
        assert 0 < row[f"{who}_us"] < 1e6, row
        assert row[f"{who}_TFLOPs"] * 1e12 * row[f"{who}_us"] * 1e-6 == pytest.approx(flops)
    assert row["speedup"] == pytest.approx(row["ggml_us"] / row["coopmat_us"])
    assert row["ggml_case"] == "test-file" and row["ggml_runs"] > 0
    quant = {r["case"]: r for r in data["rows"]}["quantized 1x64 @ (48x64)^T"]
    assert row["coopmat_us"] == quant["q4_0_kernel_us"]
    assert row["coopmat_q8_1_us"] == quant["q4_0_q8_1_kernel_us"] > 0
    assert "gemv_q8_1" in quant["q4_0_q8_1_kernel"]
    assert row["speedup_q8_1"] == pytest.approx(row["ggml_us"] / row["coopmat_q8_1_us"])
    assert row["ggml_f32acc_us"] > 0 and data["ggml"]["f32acc_env"]
    assert row["speedup_f32acc"] == pytest.approx(row["ggml_f32acc_us"] / row["coopmat_us"])
    assert "vs ggml: " + live_device_info.name in capsys.readouterr().out


def test_accumulator_rows_are_labelled_apart(live_device_info, tmp_path, capsys):
    """`--dtypes f16:f16:f16,f16:f16`: the float16-accumulated row and the default one
    (float32 accumulation) each carry their accumulator, asked and measured, in the table
    and the JSON, and both results match numpy."""
    import coopmat
    from coopmat.tools import bench
    if "float16->float16" not in coopmat.supported_dtypes():
        pytest.skip("no float16 -> float16 on this device")
    out = tmp_path / "acc.json"
    assert bench.main(["--dtypes", "f16:f16:f16,f16:f16", "--sizes", "16", "--layouts", "nn",
                       "--repeat", "3", "--budget", "0.2", "--no-peers",
                       "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    got = {(r["accumulator_asked"], r["accumulator"]): r for r in rows}
    assert set(got) == {("float16", "float16"), ("", "float32")}, list(got)
    assert all(r["error"] == "" and r["dtype"] == "float16->float16" for r in rows)
    table = capsys.readouterr().out
    assert "float16->float16 (f16)" in table and "float16->float16 (f32)" in table
