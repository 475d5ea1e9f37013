"""Recorded Intel OpenCL devices: which list cl_intel_subgroup_matrix_multiply_accumulate,
accept SPIR-V modules using SPV_INTEL_subgroup_matrix_multiply_accumulate, at which
sub-group sizes, and which operand types the instruction takes there.

coopmat reaches no Intel OpenCL driver (it runs Vulkan), so these records are read from
files, as tests/data/intel/intel-opencl-mma.json (its README says which sources of Intel's
compute runtime and graphics compiler they were read from):

    {"kind": "intel-opencl-subgroup-mma", "source": "...", "devices": [
      {"name": ..., "product": "dg2", "core": "Xe-HPG",
       "openclExtensions": [...], "spirvExtensions": [...],
       "subGroupSizes": [8, 16, 32], "dpasSubGroupSize": 8, "mSizes": [1, 2, 4, 8],
       "mma": [{"a": "float16", "b": "float16", "accumulator": "float32", "k": 16}, ...],
       "notes": [...]}]}

`dpasSubGroupSize` is the instruction's N: the sub-group size whose invocations each pass
one column of B (the DPAS execution size: 8 on Xe-HPG, 16 on Xe-HPC and later).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KIND = "intel-opencl-subgroup-mma"
CL_EXTENSION = "cl_intel_subgroup_matrix_multiply_accumulate"
CL_TF32_EXTENSION = "cl_intel_subgroup_matrix_multiply_accumulate_tf32"
SPIRV_EXTENSION = "SPV_INTEL_subgroup_matrix_multiply_accumulate"
ELEMENTS = frozenset({"float16", "bfloat16", "tf32", "float32", "sint8", "uint8", "sint4",
                      "uint4", "int32"})


@dataclass(frozen=True)
class MmaType:
    """One operand-type combination the device's compiler lowers to DPAS."""

    a: str
    b: str
    accumulator: str  # C and the result
    k: int

    def describe(self) -> str:
        return f"{self.a} x {self.b} -> {self.accumulator}, K={self.k}"


@dataclass(frozen=True)
class IntelOpenCLDevice:
    index: int
    name: str
    product: str
    core: str
    opencl_extensions: tuple[str, ...]
    spirv_extensions: tuple[str, ...]
    sub_group_sizes: tuple[int, ...]
    dpas_sub_group_size: int
    m_sizes: tuple[int, ...]
    mma: tuple[MmaType, ...]
    notes: tuple[str, ...] = ()
    source: str = ""

    @property
    def has_spirv_mma(self) -> bool:
        """Whether the device takes SPIR-V modules using the instruction: its OpenCL
        driver lists the extension and its compiler accepts the SPIR-V extension."""
        return CL_EXTENSION in self.opencl_extensions and \
            SPIRV_EXTENSION in self.spirv_extensions

    def lists(self, a: str, b: str, accumulator: str, k: int) -> bool:
        return MmaType(a, b, accumulator, k) in self.mma

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "product": self.product,
                "core": self.core, "openclExtensions": list(self.opencl_extensions),
                "spirvExtensions": list(self.spirv_extensions),
                "subGroupSizes": list(self.sub_group_sizes),
                "dpasSubGroupSize": self.dpas_sub_group_size, "mSizes": list(self.m_sizes),
                "mma": [{"a": t.a, "b": t.b, "accumulator": t.accumulator, "k": t.k}
                        for t in self.mma],
                "notes": list(self.notes)}


def is_intel_record(data: Any) -> bool:
    """Whether parsed JSON is a recorded Intel OpenCL list (not a Vulkan one)."""
    return isinstance(data, dict) and data.get("kind") == KIND


def _field(d: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in d:
        raise ValueError(f"{where}: no {key!r}")
    value = d[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ValueError(f"{where}: {key!r} must be a {kind.__name__}, not {value!r}")
    return value


def _ints(d: dict[str, Any], key: str, where: str) -> tuple[int, ...]:
    values = _field(d, key, list, where)
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                             for v in values):
        raise ValueError(f"{where}: {key!r} must list positive integers, not {values!r}")
    return tuple(values)


def _mma(entry: Any, where: str) -> MmaType:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: an mma entry must be an object, not {entry!r}")
    names = [_field(entry, k, str, where) for k in ("a", "b", "accumulator")]
    for n in names:
        if n not in ELEMENTS:
            raise ValueError(f"{where}: unknown element type {n!r}; known: {sorted(ELEMENTS)}")
    k = _field(entry, "k", int, where)
    return MmaType(names[0], names[1], names[2], k)


def from_record(d: Any, index: int, source: str = "", where: str = "") -> IntelOpenCLDevice:
    where = where or f"device {index}"
    if not isinstance(d, dict):
        raise ValueError(f"{where}: a device must be an object")
    strings = {k: tuple(_field(d, k, list, where)) for k in ("openclExtensions",
                                                             "spirvExtensions")}
    dpas = _field(d, "dpasSubGroupSize", int, where)
    sizes = _ints(d, "subGroupSizes", where)
    if dpas not in sizes:
        raise ValueError(f"{where}: dpasSubGroupSize {dpas} is not among subGroupSizes "
                         f"{list(sizes)}")
    mma = tuple(_mma(e, f"{where}, mma entry {i}")
                for i, e in enumerate(_field(d, "mma", list, where)))
    return IntelOpenCLDevice(
        index=index, name=_field(d, "name", str, where),
        product=_field(d, "product", str, where), core=_field(d, "core", str, where),
        opencl_extensions=strings["openclExtensions"],
        spirv_extensions=strings["spirvExtensions"], sub_group_sizes=sizes,
        dpas_sub_group_size=dpas, m_sizes=_ints(d, "mSizes", where), mma=mma,
        notes=tuple(d.get("notes", ())), source=source)


def parse_records(data: Any, origin: str = "the record") -> list[IntelOpenCLDevice]:
    if not is_intel_record(data):
        raise ValueError(f"{origin}: not a recorded Intel OpenCL list (its \"kind\" must be "
                         f"{KIND!r})")
    devices = data.get("devices")
    if not isinstance(devices, list) or not devices:
        raise ValueError(f"{origin}: \"devices\" must be a non-empty list")
    source = str(data.get("source", ""))
    return [from_record(d, i, source, f"{origin}, device {i}") for i, d in enumerate(devices)]


def load_intel_records(path: str | Path) -> list[IntelOpenCLDevice]:
    """The devices of a recorded Intel OpenCL list; ValueError naming the problem."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    return parse_records(data, str(path))


def match_device(devices: list[IntelOpenCLDevice], which: str) -> IntelOpenCLDevice:
    """A device by index, product (dg2, bmg) or a substring of its name."""
    if which.isdigit() and int(which) < len(devices):
        return devices[int(which)]
    found = [d for d in devices if which.lower() in (d.product.lower(), d.name.lower())
             or which.lower() in d.name.lower()]
    if len(found) != 1:
        known = ", ".join(f"{d.index}: {d.product}" for d in devices)
        raise ValueError(f"{'no' if not found else 'more than one'} recorded Intel device "
                         f"matches {which!r} ({known})")
    return found[0]
