"""Command-line and setup mistakes end in one line that says what to do, not a traceback.
None of these needs a Vulkan device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from coopmat.common.errors import DeviceNotFoundError, NoCooperativeMatrixDeviceError
from coopmat.device.select import select
from coopmat.tools import bench
from coopmat.tools import info as info_cli

ROOT = Path(__file__).resolve().parents[2]
FAKE_NO_LOADER = str(ROOT / "tests" / "support" / "fake_no_loader")


def usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        bench.main(list(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_dtype_spellings():
    def pairs(value: str) -> list[str]:
        return [dt for dt, acc in bench.parse_dtypes(value)]

    assert pairs("float16:float32,f16:f16,bf16:f32,i8:i32,u8:u32") == [
        "float16->float32", "float16->float16", "bfloat16->float32", "int8->int32",
        "uint8->uint32"]
    assert pairs("float16->float32") == ["float16->float32"]
    # A bare operand takes matmul's default result.
    assert pairs("float16,bfloat16,int8,uint8") == [
        "float16->float16", "bfloat16->float32", "int8->int32", "uint8->uint32"]
    assert pairs("F16:F32, f16:f32") == ["float16->float32"]
    # A third field names the accumulator; float8 operands by their short names.
    assert bench.parse_dtypes("f16:f16:f16,f16:f16") == [("float16->float16", "float16"),
                                                         ("float16->float16", "")]
    assert pairs("e4m3") == ["float8_e4m3fn->float32"]


@pytest.mark.parametrize("value", ["float16-", "float16>", "float16-float32", "float17:float32",
                                   "float16:", "f16:f32:f32:f32", "f16,,f32", ""])
def test_bad_dtypes_are_usage_errors(capsys, value):
    err = usage_error(capsys, "--dtypes", value)
    assert "--dtypes" in err


def test_shell_eaten_arrow_gets_the_safe_spelling(capsys):
    # `--dtypes float16->float32` unquoted: the shell passes "float16-" and redirects.
    err = usage_error(capsys, "--dtypes", "float16-")
    assert "float16:float32" in err and "redirection" in err


def test_sizes_layouts_families(capsys):
    assert bench.parse_sizes("16, 40x24x56,8X8X8") == [(16, 16, 16), (40, 24, 56), (8, 8, 8)]
    for value in ("12x", "0", "-4", "4x4", "ax2x2", "1.5"):
        assert "--sizes" in usage_error(capsys, "--sizes", value)
    assert "--layouts" in usage_error(capsys, "--layouts", "nn,xx")
    assert "'foo'" in usage_error(capsys, "--families", "auto,foo")


def test_output_paths_are_checked_before_the_run(capsys, tmp_path):
    assert "is a directory" in usage_error(capsys, "--json", str(tmp_path))
    assert "does not exist" in usage_error(capsys, "--json", str(tmp_path / "no" / "x.json"))
    assert "--plot" in usage_error(capsys, "--plot", str(tmp_path))


def info(index, name, coopmat=True):
    return SimpleNamespace(index=index, name=name, has_cooperative_matrix=coopmat,
                           device_type="CPU")


def test_coopmat_device_errors_name_the_variable(monkeypatch):
    devices = [info(0, "llvmpipe (LLVM 19)"), info(1, "Old GPU", coopmat=False)]
    monkeypatch.setenv("COOPMAT_DEVICE", "foo")
    with pytest.raises(DeviceNotFoundError,
                       match=r"^COOPMAT_DEVICE='foo' matches no Vulkan device \(devices: "
                             r"0: llvmpipe \(LLVM 19\), 1: Old GPU\)"):
        select(devices)
    monkeypatch.setenv("COOPMAT_DEVICE", "1")
    with pytest.raises(NoCooperativeMatrixDeviceError, match=r"^COOPMAT_DEVICE='1' selects"):
        select(devices)
    # An explicit selector is the caller's own: no variable to name.
    with pytest.raises(DeviceNotFoundError, match=r"^no Vulkan device whose name contains"):
        select(devices, "foo")
    monkeypatch.delenv("COOPMAT_DEVICE")
    with pytest.raises(NoCooperativeMatrixDeviceError, match="Mesa"):  # the advice
        select([info(0, "llvmpipe (LLVM 15)", coopmat=False)])


@pytest.mark.parametrize("selector", [-1, "-1", " -2 "])
def test_negative_device_index_is_an_index_error(monkeypatch, selector):
    """device=-1 is no name to search for and counts from no end: the error says the index
    is negative and which indices there are."""
    monkeypatch.delenv("COOPMAT_DEVICE", raising=False)
    devices = [info(0, "llvmpipe (LLVM 19)"), info(1, "GPU -1 edition")]
    n = int(str(selector))
    with pytest.raises(DeviceNotFoundError,
                       match=rf"^device index {n} is negative; indices run from 0 to 1 "
                             r"\(devices: 0: llvmpipe \(LLVM 19\), 1: GPU -1 edition\)$"):
        select(devices, selector)
    monkeypatch.setenv("COOPMAT_DEVICE", str(selector))
    with pytest.raises(DeviceNotFoundError,
                       match=rf"^COOPMAT_DEVICE='{selector}': device index {n} is negative; "
                             "the only index is 0"):
        select(devices[:1])


def test_missing_device_index_names_the_valid_ones(monkeypatch):
    monkeypatch.delenv("COOPMAT_DEVICE", raising=False)
    with pytest.raises(DeviceNotFoundError,
                       match=r"^no Vulkan device with index 2; indices run from 0 to 1 "):
        select([info(0, "a"), info(1, "b")], 2)


def run_without_loader(*args: str) -> subprocess.CompletedProcess[str]:
    rest = os.environ.get("PYTHONPATH", "")  # keep where cffi and numpy come from
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(p for p in (FAKE_NO_LOADER, str(ROOT), rest) if p)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


def test_bench_without_loader_is_one_line():
    r = run_without_loader("-m", "coopmat.bench", "--sizes", "16", "--no-peers")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("coopmat.bench: no Vulkan loader found (libvulkan.so.1")
    assert "VK_KHR_cooperative_matrix" in lines[0]


def test_matmul_without_loader_raises_coopmats_error_alone():
    r = run_without_loader("-c", "import numpy as np, coopmat\n"
                                 "a = np.ones((4, 4), np.float16)\n"
                                 "coopmat.matmul(a, a)")
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("coopmat.common.errors.VulkanUnavailableError: no Vulkan loader found")
    # Not chained to the binding's own OSError: one traceback, ours.
    assert "OSError" not in r.stderr
    assert r.stderr.count("Traceback") == 1


@pytest.mark.parametrize("content, says", [
    (None, "No such file"),
    ("{not json", "Expecting property name"),
    ('[{"name": "x", "configs": [{"M": 16}]}]', "is not a recorded device list"),
    ('"a string"', "is not a recorded device list"),
])
def test_info_properties_errors_are_one_line_naming_the_file(capsys, tmp_path, content, says):
    path = tmp_path / "device.json"
    if content is not None:
        path.write_text(content)
    assert info_cli.main(["--properties", str(path)]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    assert lines[0].startswith("coopmat.info: ") and str(path) in lines[0] and says in lines[0]


def test_info_properties_needs_no_vulkan():
    r = run_without_loader("-m", "coopmat.info", "--properties",
                           str(ROOT / "tests" / "data" / "anv-xe2-khr-coopmat.json"), "--json")
    assert r.returncode == 0, r.stderr
    assert "Intel(R) Arc(tm) B580 Graphics (BMG)" in r.stdout
    r = run_without_loader("-m", "coopmat.info", "--properties", "no-such-file.json")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "no-such-file.json" in r.stderr and "Traceback" not in r.stderr


def test_bench_help_lists_every_mode(capsys):
    """`coopmat-bench --help` names the modes that have parsers of their own, one line of
    what each measures, and each mode's --help lists its options under its own name."""
    with pytest.raises(SystemExit) as exc:
        bench.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for mode, words in (("--data-path", "transfers"), ("--inference", "q4_0"),
                        ("--stream", "dispatches"), ("--tune", "candidate kernels")):
        line = next((x for x in out.splitlines() if x.strip().startswith(mode)), None)
        assert line is not None, f"{mode} missing from --help"
        assert words in out[out.index(line):], mode
    for mode, option in (("--data-path", "--transfer-mib"), ("--inference", "--quant-shape")):
        with pytest.raises(SystemExit) as exc:
            bench.main([mode, "--help"])
        assert exc.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: ") and f" {mode} " in out.splitlines()[0], out[:200]
        assert option in out
