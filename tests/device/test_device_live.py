"""The device layer on the real driver scripts/test runs on (lavapipe here, or a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import is_lavapipe, load_record

from coopmat import device
from coopmat.device.model import CooperativeMatrixProperties
from coopmat.device.webgpu import GPUSubgroupMatrixConfig as Cfg

ROOT = Path(__file__).resolve().parents[2]


def run_info(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "coopmat.info", *args], capture_output=True,
                          text=True, env=full_env, cwd=ROOT, timeout=120)


def test_lavapipe_reports_exactly_the_four_configs(live_device_info):
    if not is_lavapipe(live_device_info):
        pytest.skip("this test pins lavapipe's list; the device is " + live_device_info.name)
    s = device.support(live_device_info)
    assert list(s.configs) == [Cfg("f16", "f16", 8, 8, 8), Cfg("f16", "f32", 8, 8, 8),
                               Cfg("u8", "u32", 8, 8, 8), Cfg("i8", "i32", 8, 8, 8)]
    assert s.available and s.unmet == ()
    limits = live_device_info.limits
    assert limits.min_subgroup_size == limits.max_subgroup_size == 8
    # The raw list matches what was recorded from Mesa 26 lavapipe, in driver order.
    recorded = [CooperativeMatrixProperties.from_record(d)
                for d in load_record("lavapipe-mesa26-khr-coopmat.json")["configs"]]
    assert list(live_device_info.cooperative_matrix_properties) == recorded
    assert live_device_info.extensions["VK_NV_cooperative_matrix2"] is True


def test_selected_device_has_the_subgroup_matrix_feature(live_device_info):
    s = device.support(live_device_info)
    assert s.available, s.unmet
    f = live_device_info.features
    for name in ("cooperativeMatrix", "vulkanMemoryModel", "subgroupSizeControl",
                 "computeFullSubgroups"):
        assert f[name] is True
    assert live_device_info.limits.cooperative_matrix_supported_stages & 0x20


def test_open_device_enables_what_kernels_need(live_device_info):
    dev = device.open_device()
    assert dev.info == live_device_info
    for name in ("cooperativeMatrix", "vulkanMemoryModel", "subgroupSizeControl",
                 "computeFullSubgroups"):
        assert dev.has(name)
    # Optional features are enabled exactly where the device offers them.
    for name in ("shaderFloat16", "shaderInt8", "storageBuffer16BitAccess",
                 "storageBuffer8BitAccess"):
        assert dev.has(name) == live_device_info.features[name]
    assert "VK_KHR_cooperative_matrix" in dev.enabled_extensions
    assert device.open_device() is dev  # one logical device per physical device


def test_select_by_index_and_name(live_device_info):
    infos = device.enumerate_devices()
    assert device.select(infos, live_device_info.index) == live_device_info
    assert device.select(infos, live_device_info.name[:5].upper()) == live_device_info


def test_info_json_parses_and_matches(live_device_info):
    r = run_info("--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schemaVersion"] == 1
    assert doc["selectedDevice"] == live_device_info.index
    d = next(x for x in doc["devices"] if x["index"] == live_device_info.index)
    assert d["name"] == live_device_info.name
    assert d["subgroupMatrix"] == {"available": True, "unmet": []}
    expected = [c.to_dict() for c in device.support(live_device_info).configs]
    assert d["subgroupMatrixConfigs"] == expected
    assert len(d["cooperativeMatrixProperties"]) == len(
        live_device_info.cooperative_matrix_properties)
    assert d["limits"]["subgroupSize"] == live_device_info.limits.subgroup_size
    if is_lavapipe(live_device_info):
        assert [c["componentType"] + "->" + c["resultComponentType"]
                for c in d["subgroupMatrixConfigs"]] == ["f16->f16", "f16->f32", "u8->u32",
                                                         "i8->i32"]


def test_info_table_names_configs(live_device_info):
    r = run_info()
    assert r.returncode == 0, r.stderr
    assert live_device_info.name in r.stdout
    assert "subgroup-matrix feature: available" in r.stdout
    for c in device.support(live_device_info).configs:
        assert f"M={c.M} N={c.N} K={c.K}" in r.stdout


def test_bad_coopmat_device_is_one_line_and_nonzero(live_device_info):
    r = run_info(env={"COOPMAT_DEVICE": "no-such-gpu-xyz"})
    assert r.returncode == 1
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1
    # The variable is named: the user may not remember it is set.
    assert "COOPMAT_DEVICE='no-such-gpu-xyz' matches no Vulkan device" in lines[0]
    assert live_device_info.name in lines[0]  # the devices there are
    r = run_info("--device", "no-such-gpu-xyz")
    assert r.returncode == 1
    assert "no Vulkan device whose name contains 'no-such-gpu-xyz'" in r.stderr
    assert "COOPMAT_DEVICE" not in r.stderr
    r = run_info("--device", "97")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "no Vulkan device with index 97" in r.stderr


def test_no_driver_is_one_line_and_nonzero(live_device_info):
    # The loader finds no ICD: vkCreateInstance fails and no device exists.
    r = run_info(env={"VK_DRIVER_FILES": "/nonexistent/icd.json",
                      "VK_ICD_FILENAMES": "/nonexistent/icd.json"})
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("coopmat.info: ")
    assert "Vulkan" in r.stderr


def test_bench_without_driver_is_one_line_and_nonzero(live_device_info):
    env = {**os.environ, "VK_DRIVER_FILES": "/nonexistent/icd.json",
           "VK_ICD_FILENAMES": "/nonexistent/icd.json"}
    r = subprocess.run([sys.executable, "-m", "coopmat.bench", "--sizes", "16", "--no-peers"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("coopmat.bench: no usable Vulkan driver"), lines[0]
    assert "VK_KHR_cooperative_matrix" in lines[0]  # the advice: which drivers have it


def test_no_loader_is_one_line_and_nonzero():
    # A stand-in binding that fails as the real one does when libvulkan.so.1 is missing.
    fake = str(ROOT / "tests" / "support" / "fake_no_loader")
    rest = os.environ.get("PYTHONPATH", "")  # keep where cffi and numpy come from
    r = run_info(env={"PYTHONPATH": os.pathsep.join(p for p in (fake, str(ROOT), rest) if p)})
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "no Vulkan loader found (libvulkan.so.1)" in lines[0]


def test_pipeline_robustness_enabled_with_its_extension() -> None:
    """The pipelineRobustness feature counts as enabled only with its extension: a
    pipeline that asks for no storage checks needs both (a validation error otherwise)."""
    from coopmat.dispatch.runtime import runtime
    dev = runtime().device
    assert dev.has("pipelineRobustness") == (
        "VK_EXT_pipeline_robustness" in dev.enabled_extensions)
    assert dev.has("pipelineRobustness") == bool(
        dev.info.features.get("pipelineRobustness")
        and dev.info.extensions.get("VK_EXT_pipeline_robustness"))


def test_device_reprs_are_one_short_line(live_device_info):
    """`coopmat.devices()` and `Array.device` print the index, name, driver and type in one
    line, not the cffi handles and capability tables behind them."""
    import numpy as np

    import coopmat
    info = live_device_info
    listed = repr(coopmat.devices())
    dev_repr = repr(coopmat.asarray(np.ones((2, 2), np.float16)).device)
    for text in (repr(info), dev_repr):
        assert "\n" not in text and len(text) < 200, text
        assert "cdata" not in text and "limits" not in text, text
        assert f"{info.index}: {info.name!r}" in text
        assert info.driver_name in text and info.device_type in text
    assert repr(info) in listed and len(listed) < 200 * len(coopmat.devices())
    assert dev_repr.startswith("<Device ") and repr(info).startswith("<PhysicalDeviceInfo ")
    if is_lavapipe(info):
        assert "llvmpipe" in dev_repr and "CPU" in dev_repr and "Mesa" in dev_repr


def test_negative_device_is_refused_by_matmul(live_device_info, monkeypatch):
    """`device=-1` and COOPMAT_DEVICE=-1 are index errors, not name searches."""
    import numpy as np

    import coopmat
    a = np.ones((8, 8), np.float16)
    with pytest.raises(coopmat.DeviceNotFoundError, match="device index -1 is negative"):
        coopmat.matmul(a, a, device=-1)
    r = run_info(env={"COOPMAT_DEVICE": "-1"})
    assert r.returncode == 1
    assert "COOPMAT_DEVICE='-1': device index -1 is negative" in r.stderr, r.stderr


def test_device_uuid_is_read_and_selects(live_device_info, monkeypatch):
    """The driver's deviceUUID (lavapipe reports one too) is shown by `coopmat.info` and
    selects the device, whole or as a prefix, through device= and COOPMAT_DEVICE; the PCI
    address where the driver offers VK_EXT_pci_bus_info (lavapipe does not)."""
    import re

    import numpy as np

    import coopmat
    info = live_device_info
    assert re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", info.device_uuid)
    infos = device.enumerate_devices()
    for sel in (info.device_uuid, info.device_uuid.upper(), info.device_uuid[:13]):
        assert device.select(infos, sel) == info
    if info.pci_bus_id:
        assert re.fullmatch(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", info.pci_bus_id)
        assert device.select(infos, info.pci_bus_id) == info
    elif is_lavapipe(info):
        assert info.pci_bus_id == ""
    a = np.eye(8, dtype=np.float16)
    np.testing.assert_array_equal(coopmat.matmul(a, a, device=info.device_uuid), a)
    r = run_info("--json", env={"COOPMAT_DEVICE": info.device_uuid[:13]})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["selectedDevice"] == info.index
    (d,) = doc["devices"]
    assert d["deviceUUID"] == info.device_uuid
    assert d["pciBusID"] == (info.pci_bus_id or None)
    r = run_info()
    assert f"UUID {info.device_uuid}, PCI " in r.stdout
