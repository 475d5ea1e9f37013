"""`python -m coopmat.info --properties FILE` on every recorded device list: what such a
device offers, its WebGPU verdict and the kernels coopmat would choose, without Vulkan."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from coopmat.codegen.variants import khr_subgroup_size
from coopmat.common.enums import component_type_name, parse_component_type
from coopmat.device import support
from coopmat.device.record import load_records
from coopmat.tools import info as info_cli

DATA = Path(__file__).parents[1] / "data"
RECORDED = sorted(p.name for p in DATA.glob("*-khr-coopmat.json"))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = info_cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def file_entries(name: str) -> list[list[tuple[int, int, int, str, str, str, str, bool]]]:
    """Each device's configs as the file lists them: M, N, K, type names, saturating."""
    def norm(t: str | int) -> str:
        return component_type_name(parse_component_type(t))

    return [[(c["M"], c["N"], c["K"], norm(c["A"]), norm(c["B"]), norm(c["C"]), norm(c["R"]),
              bool(c["sat"])) for c in d["configs"]]
            for d in json.loads((DATA / name).read_text())]


def test_every_recorded_file_is_covered() -> None:
    assert {"nvidia-h200-khr-coopmat.json", "lavapipe-mesa26-khr-coopmat.json",
            "radv-gfx11-khr-coopmat.json", "radv-gfx12-khr-coopmat.json",
            "anv-xe-hpg-khr-coopmat.json", "anv-xe2-khr-coopmat.json"} <= set(RECORDED)


@pytest.mark.parametrize("name", RECORDED)
def test_text_report(capsys: pytest.CaptureFixture[str], name: str) -> None:
    rc, out, err = run(capsys, "--properties", str(DATA / name))
    assert rc == 0 and err == ""
    entries = file_entries(name)
    infos = load_records(DATA / name)
    pages = out.split("\n\n\nDevice ")  # devices are separated by a blank line
    assert out.count("VkCooperativeMatrixPropertiesKHR (driver order):") == len(entries)
    for info, configs in zip(infos, entries, strict=True):
        assert f"Device {info.index}: {info.name}\n" in out
        assert "(selected)" not in out  # a recorded device is not this machine's
        # The config table: one row per entry of the file, in the file's order.
        rows = re.findall(
            r"^ +(\d+) +(\d+) +(\d+) +(\d+)  (\S+) +(\S+) +(\S+) +(\S+) +(yes|no) +SUBGROUP",
            _page(out, info.name), re.M)
        assert [(int(m), int(n), int(k), a, b, c, r, sat == "yes")
                for _, m, n, k, a, b, c, r, sat in rows] == configs
        sup = support(info)
        verdict = "available" if sup.available else "NOT available"
        assert f"subgroup-matrix feature: {verdict}" in _page(out, info.name)
        assert f"GPUSubgroupMatrixConfig ({len(sup.configs)}):" in _page(out, info.name)
        size = khr_subgroup_size(info.limits)
        assert f"khr kernels require subgroup size {size} " in _page(out, info.name)
    assert pages


def _page(out: str, name: str) -> str:
    """One device's part of the text report."""
    start = out.index(f": {name}\n")
    end = out.find("\nDevice ", start)
    return out[start:end if end >= 0 else None]


@pytest.mark.parametrize("name", RECORDED)
def test_json_report(capsys: pytest.CaptureFixture[str], name: str) -> None:
    rc, out, _ = run(capsys, "--properties", str(DATA / name), "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["schemaVersion"] == 1 and doc["selectedDevice"] is None
    entries = file_entries(name)
    assert len(doc["devices"]) == len(entries)
    for dev, configs, info in zip(doc["devices"], entries, load_records(DATA / name),
                                  strict=True):
        got = [(e["M"], e["N"], e["K"], e["AType"], e["BType"], e["CType"], e["ResultType"],
                e["saturatingAccumulation"]) for e in dev["cooperativeMatrixProperties"]]
        assert got == configs
        assert len(dev["subgroupMatrixConfigs"]) == len(support(info).configs)
        assert dev["kernelSubgroupSize"] == khr_subgroup_size(info.limits)
        kernels = dev["kernels"]
        assert kernels and not [k for k in kernels if "error" in k]
        for k in kernels:
            assert k["family"] == "khr" and k["subgroupSize"] == dev["kernelSubgroupSize"]
            assert k["why"] in ("default", "tuned")
            assert f"-sg{k['subgroupSize']}-" in k["kernel"]
        pairs = {k["pair"] for k in kernels}
        if any(c[3] == "FLOAT16" and c[6] == "FLOAT32" for c in configs):
            assert "float16->float16 (float32 accumulation)" in pairs


def test_the_report_shows_the_policys_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--properties", str(DATA / "anv-xe-hpg-khr-coopmat.json"))
    assert rc == 0
    assert ("khr kernels require subgroup size 8 (device default 32, range 8..32)") in out
    assert re.search(r"4096x4096x4096 +khr +128x128x32 sg4x8 buf2 +exact, specialized +default",
                     out)
    assert re.search(r"4096x4096x4096 +khr +128x128x64 sg4x8 buf2 +exact, specialized, "
                     r"repack B +default", out)  # int8: a row-major B is repacked
    rc, out, _ = run(capsys, "--properties", str(DATA / "radv-gfx11-khr-coopmat.json"))
    assert "khr kernels require subgroup size 32 (device default 64, range 32..64)" in out


def test_one_device_of_a_list(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--properties", str(DATA / "anv-xe2-khr-coopmat.json"),
                     "--device", "140V")
    assert rc == 0 and "Lunar" not in out and "(LNL)" in out and "(BMG)" not in out
    rc, out, err = run(capsys, "--properties", str(DATA / "anv-xe2-khr-coopmat.json"),
                       "--device", "7")
    assert rc == 1 and out == "" and len(err.strip().splitlines()) == 1
    assert "no Vulkan device with index 7" in err


@pytest.mark.parametrize("name", RECORDED)
def test_recorded_device_repr_is_one_line(name: str) -> None:
    for info in load_records(DATA / name):
        text = repr(info)
        assert text == f"<PhysicalDeviceInfo {info.index}: {info.name!r}, driver " \
                       f"{info.driver!r}, {info.device_type}>"
        assert len(text) < 200 and "cooperative" not in text
