"""`coopmat-bench --attention` runs on the selected device (tiny shapes for a CPU
driver), reports each case's kernel and call times and checks its result; bad options
are the parser's errors before any device work."""

from __future__ import annotations

import json

import pytest


def test_attention_bench_runs_and_reports(live_device_info, tmp_path, monkeypatch) -> None:
    import coopmat
    from coopmat.tools import bench
    coopmat.set_options(attention_splits=3)  # the decode cases' split kernel and its merge
    out = tmp_path / "attention.json"
    assert bench.main(["--attention", "--quick", "--dim", "32", "--prefill", "1x2x33",
                       "--decode", "1x100,5x200", "--heads", "8", "--kv-heads", "2",
                       "--repeat", "2", "--masked", "0.3", "--json", str(out)]) == 0
    rows = {r["case"]: r for r in json.loads(out.read_text())["rows"]}
    masked = rows.pop("fully masked row", None)  # only beside torch with CUDA
    assert masked is None or masked["coopmat"] == "0"
    assert set(rows) == {"prefill B1 H2 L33 E32", "prefill B1 H2 L33 E32 causal",
                         "prefill B1 H2 L33 E32 mask0.3", "prefill B1 H2 L33 E32 causal mask0.3",
                         "decode Lq1 Lk100 H8/2 E32", "decode Lq5 Lk200 H8/2 E32"}
    for name, row in rows.items():
        assert "error" not in row, row
        assert row["kernel_us"] > 0 and row["call_us"] > 0 and row["TFLOPs"] > 0
        err = row.get("max_diff_torch", row.get("max_err_numpy"))
        assert err is not None and err < 2e-2, row
        assert ("mask" in name) == ("-skip" in row["kernel"]), row
        if name.startswith("decode"):
            assert row["kv_TBps"] > 0 and "-split" in row["kernel"] and "slices" in row["kernel"]


@pytest.mark.parametrize("args,match", [
    (["--prefill", "1x2"], "BxHxL"),
    (["--decode", "0x10"], "LqxLk"),
    (["--heads", "6", "--kv-heads", "4"], "multiple of --kv-heads"),
    (["--tiles", "rows=16;banana=2"], "banana"),
])
def test_attention_bench_rejects_bad_options(args, match, capsys) -> None:
    from coopmat.tools import bench
    with pytest.raises(SystemExit):
        bench.main(["--attention", *args])
    assert match in capsys.readouterr().err
