"""The portable lab probes run on the suite's device (small problems): a probe that stopped
running would otherwise sit in lab/ unnoticed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_probe(*args: str) -> str:
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r.stdout


def test_profile_small_runs(live_device_info):
    out = run_probe("lab/profile_small.py", "--calls", "3", "--top", "3", "--k", "64",
                    "--breakdown")
    for section in ("== 64^3 pieces", "== 64^3 f16 numpy -> numpy: median",
                    "== decode step 16x64 @ resident W: median",
                    "== 10 queued 16x256 @ 256^2 Array products"):
        assert section in out, out


def test_attention_merge_runs_and_checks(live_device_info):
    """Each slice count and workgroup size prints its time and its error against numpy."""
    out = run_probe("lab/attention_merge.py", "--splits", "3", "--invocations", "256",
                    "--kv", "2", "--value-dim", "40", "--reps", "1")
    line = next(x for x in out.splitlines() if "invocations   256" in x)
    assert float(line.split("relative error ")[1].rstrip(")")) < 1e-5, out


def test_attention_passes_runs_and_checks(live_device_info):
    """Each tile and slice count prints both passes' times and its error against numpy."""
    out = run_probe("lab/attention_passes.py", "--lk", "300", "--heads", "4", "--kv", "2",
                    "--dim", "64", "--tiles", "family=gemv", "--splits", "3", "--reps", "1",
                    "--rounds", "1", "--warm", "1")
    line = next(x for x in out.splitlines() if "gemv" in x and "first_us=" in x)
    assert "splits=   3" in line and float(line.split("max_err=")[1].split()[0]) < 2e-3, out


def test_epilogue_cost_runs_and_checks(live_device_info):
    """Each case prints its kernel (with the epilogue it asked for) and, for relu, the
    largest error against numpy's float64 product."""
    out = run_probe("lab/epilogue_cost.py", "16", "--cases=plain,bias+relu")
    lines = [x for x in out.splitlines() if x.startswith(("plain", "bias+relu"))]
    assert [x.split()[0] for x in lines] == ["plain", "bias+relu"], out
    assert lines[1].endswith("epi_bias_relu")
    err = float(lines[1].split("err ")[1].split()[0])
    assert err < 0.05, lines[1]


def test_vk_sass_names_the_kernel_it_ran(live_device_info):
    """The child half of vk_sass.py (what runs under NVIDIA's driver cache) names the
    product's kernel through the public seam; its disassembly needs NVIDIA's driver."""
    out = run_probe("lab/vk_sass.py", "--child", "--m", "16", "--k", "64", "--n", "48",
                    "--bias")
    assert out.strip().startswith(("khr-", "rows-", "gemv-", "nv2-")), out
    assert out.strip().endswith("epi_bias"), out


def test_split_tiles_runs_and_checks(live_device_info):
    """The policy's line, then one line per slice count and tile, each checked."""
    out = run_probe("lab/split_tiles.py", "--rows", "64", "--n", "64", "--k", "256",
                    "--splits", "2", "--repeat", "2", "--max-tiles", "2", "--serial", "2")
    lines = [x for x in out.splitlines() if x.strip().startswith("64 ")]
    assert " policy " in lines[0] and len(lines) == 3, out
    assert all("ok=True" in x for x in lines), out
    assert all("split2" in x for x in lines[1:]), out


def test_nv2_slices_runs_and_checks(live_device_info):
    """The policy's line first (nv2 tiles follow where the device has them), each checked."""
    out = run_probe("lab/nv2_slices.py", "--shapes", "64x64x256", "--repeat", "2",
                    "--max-tiles", "2")
    lines = [x for x in out.splitlines() if x.startswith("64x64x256 ")]
    assert lines and all("ok=True" in x for x in lines), out
    assert all(" nv2-" in x for x in lines[1:]), out
    # khr tiles unsplit beside it, timed back to back
    out = run_probe("lab/nv2_slices.py", "--shapes", "64x64x256", "--repeat", "2",
                    "--max-tiles", "0", "--khr-tiles", "64x64x32", "--serial", "2")
    lines = [x for x in out.splitlines() if x.startswith("64x64x256 ")]
    assert len(lines) == 2 and all("ok=True" in x for x in lines), out
    assert "t64x64x32s2x2b2" in lines[1] and "split" not in lines[1], out


def test_attention_prefill_runs_and_checks(live_device_info):
    """One line per key count and tile, each checked against float64 numpy; with
    --no-softmax the nv2 kernel against its own formula (P V over the steps)."""
    out = run_probe("lab/attention_prefill.py", "--lq", "40", "--lks", "33,70", "--heads",
                    "2", "--kv", "1", "--dim", "32", "--reps", "1")
    lines = [x for x in out.splitlines() if x.startswith("lk=")]
    assert len(lines) == 2 and all(float(x.split("rel_err=")[1].split()[0]) < 5e-3
                                   for x in lines), out
    from coopmat.policy.attention import nv2_offered
    if nv2_offered(live_device_info):
        out = run_probe("lab/attention_prefill.py", "--lq", "40", "--lks", "70", "--heads",
                        "2", "--kv", "1", "--dim", "32", "--reps", "1", "--tiles",
                        "family=nv2", "--no-softmax")
        line = next(x for x in out.splitlines() if x.startswith("lk="))
        assert "no-softmax" in line and float(line.split("rel_err=")[1].split()[0]) < 5e-3


def test_gemv_k_splits_runs_and_checks(live_device_info):
    """Each path prints the policy's kernel and each tile with its difference from the
    policy's result (the same sums in another order)."""
    out = run_probe("lab/gemv_k_splits.py", "--shapes", "40x512", "--rows", "1",
                    "--formats", "q4_0", "--cols", "2", "--unroll", "1", "--groups", "2x2",
                    "--repeat", "1")
    tiles = [x for x in out.splitlines() if "C=2 U=1 S=2 Q=2" in x and "diff" in x]
    assert [x.split()[0] for x in tiles] == ["float", "q8_1"], out
    assert all(float(x.split("diff ")[1]) < 1e-3 for x in tiles), out


def test_attention_host_runs_and_checks(live_device_info):
    """Queued, waited and growing loops each print their host time and steps, the first
    call of each checked against float64 numpy."""
    out = run_probe("lab/attention_host.py", "--lk", "40", "--calls", "3", "--heads", "4",
                    "--kv", "2", "--dim", "64")
    lines = [x for x in out.splitlines() if x.startswith("lk=40")]
    assert [x.split()[1] for x in lines] == ["queued", "waited", "growing"], out
    assert all(float(x.split("max_err=")[1].split()[0]) < 2e-3 for x in lines), out
    assert "attention_dispatches" in lines[2], out  # a new key count builds its run
