"""Devices named by identity, not enumeration order: VkPhysicalDeviceIDProperties'
deviceUUID and VK_EXT_pci_bus_info's PCI address, as recorded devices carry them (the
`coopmat.info --json` keys deviceUUID and pciBusID). No Vulkan needed."""

from __future__ import annotations

import json

import pytest

from coopmat.common.errors import DeviceNotFoundError
from coopmat.device.model import format_pci_bus_id, format_uuid
from coopmat.device.record import from_record, load_records
from coopmat.device.select import match, select
from coopmat.tools import info as info_cli

UUIDS = ("9f3c0a11-2b4d-4e6f-8a90-112233445566", "9f3c0a11-77aa-4bcc-9dde-ffeeddccbbaa",
         "0123abcd-0000-4000-8000-000000000001")
PCI = ("0000:41:00.0", "0000:c1:00.0", "")


def devices():
    """Three recorded GPUs: two share their UUID's first 8 hex digits, one has no PCI
    address (no VK_EXT_pci_bus_info)."""
    base = {"configs": [{"M": 16, "N": 16, "K": 16, "A": 0, "B": 0, "C": 0, "R": 0,
                         "sat": 0, "scope": 3}], "subgroup": [32, 32]}
    return [from_record({**base, "name": f"GPU {i}", "deviceUUID": u, "pciBusID": p}, i)
            for i, (u, p) in enumerate(zip(UUIDS, PCI, strict=True))]


def test_formats():
    assert format_uuid(bytes(range(16))) == "00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert format_pci_bus_id(0, 0x41, 0, 0) == "0000:41:00.0"
    assert format_pci_bus_id(0x10000, 0xc1, 0x1f, 7) == "10000:c1:1f.7"


@pytest.mark.parametrize("selector, index", [
    (UUIDS[0], 0), (UUIDS[1].upper(), 1), ("9f3c0a11-2b", 0), ("9f3c0a112b4d", 0),
    ("GPU-" + UUIDS[1], 1), ("gpu-9f3c0a11-77", 1), ("0123abcd", 2),
    ("0000:41:00.0", 0), ("00000000:C1:00.0", 1), ("c1:00.0", 1),
    ("2", 2), ("gpu 1", 1),  # an index and a name as before
])
def test_select_by_uuid_or_pci_bus_id(monkeypatch, selector, index):
    monkeypatch.delenv("COOPMAT_DEVICE", raising=False)
    assert select(devices(), selector).index == index
    monkeypatch.setenv("COOPMAT_DEVICE", selector)
    assert select(devices()).index == index


def test_ambiguous_uuid_prefix_names_the_devices():
    with pytest.raises(DeviceNotFoundError,
                       match=r"^UUID '9f3c0a11' matches devices 0, 1; give more of it "
                             r"\(devices: 0: GPU 0 \[9f3c0a11-2b4d-4e6f-8a90-112233445566, "
                             r"0000:41:00.0\], 1: GPU 1 \[9f3c"):
        match(devices(), "9f3c0a11")


def test_unknown_identity_is_a_clear_error(monkeypatch):
    with pytest.raises(DeviceNotFoundError,
                       match=r"^no Vulkan device with UUID 'deadbeef' or a name containing it "
                             r"\(devices: 0: GPU 0 \[9f3c0a11"):
        match(devices(), "deadbeef")
    with pytest.raises(DeviceNotFoundError,
                       match=r"^COOPMAT_DEVICE='0000:42:00.0': no Vulkan device with PCI bus "
                             r"id '0000:42:00.0'"):
        match(devices(), "0000:42:00.0", "COOPMAT_DEVICE")
    # digits alone are an index, never a UUID prefix; with a dash or GPU-, a UUID's start
    with pytest.raises(DeviceNotFoundError, match=r"^no Vulkan device with index 1234"):
        match(devices(), "1234")
    infos = devices()
    infos[1] = from_record({"name": "GPU 1", "configs": [], "subgroup": [32, 32],
                            "deviceUUID": "12345678-0000-4000-8000-000000000000"}, 1)
    assert match(infos, "12345678-00").index == 1
    assert match(infos, "GPU-1234").index == 1


def test_uuid_prefix_that_is_also_a_name_is_refused():
    """'a100' could start a UUID or be part of a GPU's name: neither reading is silently
    taken when they name different devices."""
    infos = devices()
    infos[2] = from_record({"name": "NVIDIA A100", "configs": [], "subgroup": [32, 32],
                            "deviceUUID": "0123abcd-0000-4000-8000-000000000001"}, 2)
    infos[0] = from_record({"name": "GPU 0", "configs": [], "subgroup": [32, 32],
                            "deviceUUID": "a1000000-0000-4000-8000-000000000000"}, 0)
    with pytest.raises(DeviceNotFoundError,
                       match=r"^'a100' starts the UUID of device 0 and is part of the name of "
                             r"device 2; give the index or more of the UUID"):
        match(infos, "a100")
    assert match(infos, "a1000000").index == 0
    assert match(infos, "A10").index == 2  # too short for a UUID: a name


def test_info_json_carries_identity_and_reads_it_back(tmp_path, capsys):
    """`coopmat.info --json` prints deviceUUID and pciBusID (null where unknown), and a
    saved --json selects by them again with --properties."""
    path = tmp_path / "gpus.json"
    sups = [info_cli.device.support(d) for d in devices()]
    doc = {"schemaVersion": 1, "devices": [info_cli.device_dict(d, s)
                                           for d, s in zip(devices(), sups, strict=True)]}
    assert [d["deviceUUID"] for d in doc["devices"]] == list(UUIDS)
    assert [d["pciBusID"] for d in doc["devices"]] == ["0000:41:00.0", "0000:c1:00.0", None]
    path.write_text(json.dumps(doc))
    back = load_records(path)
    assert [(d.device_uuid, d.pci_bus_id) for d in back] == list(zip(UUIDS, PCI, strict=True))
    assert info_cli.main(["--properties", str(path), "--device", "0000:c1:00.0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Device 1: GPU 1")
    assert f"UUID {UUIDS[1]}, PCI 0000:c1:00.0" in out
    assert info_cli.main(["--properties", str(path), "--device", "0123ab", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["devices"]
    assert [(d["index"], d["pciBusID"]) for d in shown] == [(2, None)]


def test_recorded_lists_without_identity_say_so(capsys):
    from pathlib import Path
    data = Path(__file__).parents[1] / "data" / "radv-gfx11-khr-coopmat.json"
    info = load_records(data)[0]
    assert info.device_uuid == "" and info.pci_bus_id == ""
    assert info_cli.main(["--properties", str(data)]) == 0
    assert "UUID not reported, PCI not reported" in capsys.readouterr().out
