"""The intel family without executing it: the recorded Intel OpenCL devices, the shape each
gets (coopmat.policy.intel_shapes), the kernels' descriptions, and the two commands that
show them (`python -m coopmat.codegen --family intel`, `python -m coopmat.info
--properties` on an Intel list)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coopmat.codegen.intel_kernel import build_intel
from coopmat.codegen.intel_traits import IntelTraits
from coopmat.device.intel_opencl import (
    load_intel_records,
    match_device,
    parse_records,
)
from coopmat.policy.intel_shapes import choose_intel, intel_variants, unusable_reason
from coopmat.tools import codegen as codegen_cli
from coopmat.tools import info as info_cli

RECORD = Path(__file__).parents[1] / "data" / "intel" / "intel-opencl-mma.json"
DEVICES = load_intel_records(RECORD)


def device(name: str):  # type: ignore[no-untyped-def]
    return match_device(DEVICES, name)


def test_recorded_devices() -> None:
    """Xe-HPG (DG2) and Arrow Lake-H run 8-wide DPAS, Xe-HPC and later 16-wide; tf32 only
    where the driver lists cl_intel_subgroup_matrix_multiply_accumulate_tf32."""
    assert [d.product for d in DEVICES] == ["dg2", "arl-h", "pvc", "bmg", "lnl", "ptl"]
    assert {d.product: d.dpas_sub_group_size for d in DEVICES} == {
        "dg2": 8, "arl-h": 8, "pvc": 16, "bmg": 16, "lnl": 16, "ptl": 16}
    for d in DEVICES:
        assert d.dpas_sub_group_size in d.sub_group_sizes and d.m_sizes == (1, 2, 4, 8)
        tf32 = "cl_intel_subgroup_matrix_multiply_accumulate_tf32" in d.opencl_extensions
        assert d.lists("tf32", "tf32", "float32", 8) == tf32
        assert d.lists("float16", "float16", "float32", 16)
        assert d.lists("sint8", "uint8", "int32", 32)
    assert device("dg2").sub_group_sizes == (8, 16, 32)
    assert device("pvc").sub_group_sizes == (16, 32)


def test_arrow_lake_takes_no_spirv_module() -> None:
    """Its OpenCL driver lists the extension but its compiler does not accept the SPIR-V
    one: no kernel, and the reason says so."""
    arl = device("arl-h")
    assert unusable_reason(arl) == "lacks SPV_INTEL_subgroup_matrix_multiply_accumulate"
    assert intel_variants(arl) == []
    with pytest.raises(ValueError, match="SPV_INTEL_subgroup_matrix_multiply_accumulate"):
        choose_intel(arl, "f16", 64)


@pytest.mark.parametrize("M,m,tile_m,tile_n", [(1, 1, 1, 8), (2, 2, 2, 8), (3, 4, 4, 8),
                                                (5, 8, 8, 8), (31, 8, 8, 8), (32, 8, 64, 4),
                                                (4096, 8, 64, 4)])
def test_shape_by_rows(M: int, m: int, tile_m: int, tile_n: int) -> None:
    """Few rows: the smallest M of the instruction covering them; 8 to 31 rows: M = 8;
    from 32 rows the 64-row tile. The sub-group size is the device's DPAS width, and the
    tile's columns (tile_n sub-group widths) follow it."""
    for name, sg in (("dg2", 8), ("bmg", 16)):
        t = choose_intel(device(name), "f16", M).traits
        assert (t.m, t.subgroup_size, t.n) == (m, sg, sg)
        assert (t.tile_m, t.tile_n) == (tile_m, tile_n * sg)


def test_types_per_device() -> None:
    with pytest.raises(ValueError, match="does not list tf32 x tf32 -> float32 at K=8"):
        choose_intel(device("dg2"), "tf32", 64)
    t = choose_intel(device("pvc"), "tf32", 64).traits
    assert (t.k, t.subgroup_size, t.a_packing.spread, t.a_packing.components) == (8, 16, 2, 4)
    with pytest.raises(ValueError, match="no intel operand type 'f8'"):
        choose_intel(device("pvc"), "f8", 64)
    with pytest.raises(ValueError, match="M must be at least 1"):
        choose_intel(device("pvc"), "f16", 0)
    assert {t.operand for t in intel_variants(device("dg2"))} == {"f16", "bf16", "s8", "u8"}
    assert {t.operand for t in intel_variants(device("bmg"))} == {"f16", "bf16", "s8", "u8",
                                                                   "tf32"}
    assert len(intel_variants(device("dg2"))) == 40 and len(intel_variants(device("ptl"))) == 50


def test_packing_follows_the_extension() -> None:
    """A: K/N columns a component where N <= K (two float16 or four int8 in 32 bits at
    N = 8; one float16 or two int8 in 16 bits at N = 16); B: K rows in eight 32-bit words."""
    cases = {("f16", 8): (2, 32), ("f16", 16): (1, 16), ("s8", 8): (4, 32),
             ("s8", 16): (2, 16)}
    for (op, sg), (columns, bits) in cases.items():
        t = IntelTraits(op, 4, sg, False)
        assert (t.a_packing.columns, t.a_packing.component_bits, t.a_packing.components) == \
            (columns, bits, 4)
        assert t.b_components == 8
    with pytest.raises(ValueError, match="sub-group size in \\(16,\\)"):
        IntelTraits("tf32", 8, 8, False).check()
    with pytest.raises(ValueError, match="M must be one of"):
        IntelTraits("f16", 3, 8, False).check()


@pytest.mark.parametrize("data,message", [
    ({"kind": "vulkan"}, "not a recorded Intel OpenCL list"),
    ({"kind": "intel-opencl-subgroup-mma", "devices": []}, "non-empty list"),
    ({"kind": "intel-opencl-subgroup-mma", "devices": [{"name": "x"}]},
     "device 0: no 'openclExtensions'"),
])
def test_bad_records_name_the_problem(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_records(data)
    good = json.loads(RECORD.read_text())
    good["devices"][0]["mma"][0]["a"] = "float7"
    with pytest.raises(ValueError, match="device 0, mma entry 0: unknown element type"):
        parse_records(good)
    good = json.loads(RECORD.read_text())
    good["devices"][0]["dpasSubGroupSize"] = 4
    with pytest.raises(ValueError, match="dpasSubGroupSize 4 is not among subGroupSizes"):
        parse_records(good)


def test_description() -> None:
    """What a host program needs: arguments in order, sub-group and work sizes."""
    t = choose_intel(device("bmg"), "s8", 100, has_c=True).traits
    k = build_intel(t)
    d = k.description("x.spv")
    assert [a["name"] for a in d["arguments"]] == ["A", "B", "C", "D", "M", "N", "K", "lda",
                                                   "ldb", "ldc", "ldd"]
    assert d["arguments"][0]["openclType"] == "global const char *"
    assert d["arguments"][3]["openclType"] == "global int *"
    assert (d["subGroupSize"], d["localWorkSize"]) == (16, [64, 1, 1])
    assert d["instruction"] == {"name": "OpSubgroupMatrixMultiplyAccumulateINTEL", "M": 8,
                                "N": 16, "K": 32,
                                "operands": ["MatrixASignedComponentsINTEL",
                                             "MatrixBSignedComponentsINTEL",
                                             "MatrixAPackedInt8INTEL", "MatrixBPackedInt8INTEL"],
                                "operandsValue": 0x33}
    assert d["globalWorkSize"] == ["ceil(N / 64) * 64", "ceil(M / 64)", "1"]
    assert k.global_size(100, 130) == (3 * 64, 2, 1)
    assert "never run on an Intel GPU" in d["verified"]
    assert k.spirv[:4] == b"\x03\x02\x23\x07"


def test_codegen_emit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert codegen_cli.main(["--family", "intel", "--emit", str(tmp_path), "--properties",
                             str(RECORD)]) == 0
    # DG2's 40 at 8 wide, the 50 of the 16-wide devices (the same list on each)
    assert "wrote 90 kernels" in capsys.readouterr().out
    spv = sorted(tmp_path.glob("*.spv"))
    assert len(spv) == 90 and len(list(tmp_path.glob("*.json"))) == 90
    for path in spv[:3]:
        d = json.loads(path.with_suffix(".json").read_text())
        assert d["file"] == path.name and path.read_bytes()[:4] == b"\x03\x02\x23\x07"
    assert codegen_cli.main(["--family", "intel", "--list"]) == 0
    assert len(capsys.readouterr().out.split()) == 90
    assert codegen_cli.main(["--emit", str(tmp_path)]) == 2
    assert "--family intel" in capsys.readouterr().err


def test_info_shows_the_record(capsys: pytest.CaptureFixture[str]) -> None:
    assert info_cli.main(["--properties", str(RECORD)]) == 0
    out = capsys.readouterr().out
    assert out.count("(recorded Intel OpenCL device)") == 6
    assert "float16 x float16 -> float32, K=16" in out
    assert "none: lacks SPV_INTEL_subgroup_matrix_multiply_accumulate" in out
    assert "intel-tf32tf32-f32-8x16x8-sg16-rr-noc-t64x64s2x2" in out
    assert "tf32 -> f32: none: Intel Arc A770 Graphics (DG2-G10) does not list tf32" in out
    assert info_cli.main(["--properties", str(RECORD), "--device", "pvc", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    (pvc,) = d["devices"]
    assert pvc["product"] == "pvc" and pvc["usable"] and pvc["dpasSubGroupSize"] == 16
    kernels = {(k["operands"], k["M"]): k for k in pvc["kernels"]}
    assert kernels[("f16 -> f32", 1)]["kernel"] == "intel-f16f16-f32-1x16x16-sg16-rr-noc-t1x128s1x4"
    assert info_cli.main(["--properties", str(RECORD), "--device", "nosuch"]) == 1
    assert "no recorded Intel device matches 'nosuch'" in capsys.readouterr().err
