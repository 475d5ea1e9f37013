"""`python -m coopmat.info --properties FILE` for a recorded Intel OpenCL list
(coopmat.device.intel_opencl): each device's matrix extensions, sub-group sizes and the
operand types OpSubgroupMatrixMultiplyAccumulateINTEL takes there, and the intel-family
kernels coopmat would emit for it (coopmat.policy.intel_shapes), which no Intel GPU has run.
"""

from __future__ import annotations

from typing import Any

from coopmat.codegen.intel_traits import INTEL_TYPES
from coopmat.device.intel_opencl import IntelOpenCLDevice
from coopmat.policy.intel_shapes import choose_intel, unusable_reason

# Representative products (M, N, K): large, few rows (16), one row (a decode step).
PROBLEMS = ((4096, 4096, 4096), (16, 4096, 4096), (1, 4096, 4096))
NOT_RUN = "never run on an Intel GPU; checked in coopmat's reference interpreter"


def kernel_choices(device: IntelOpenCLDevice) -> list[dict[str, Any]]:
    """For each operand type of the family and each of PROBLEMS: the kernel
    choose_intel picks and why, or the reason there is none."""
    out: list[dict[str, Any]] = []
    for t in INTEL_TYPES.values():
        for M, N, K in PROBLEMS:
            row: dict[str, Any] = {"operands": f"{t.short} -> {t.result_short}", "M": M,
                                   "N": N, "K": K}
            try:
                choice = choose_intel(device, t.short, M)
            except ValueError as exc:
                out.append({**row, "error": str(exc)})
                continue
            tr = choice.traits
            out.append({**row, "kernel": tr.describe(), "subGroupSize": tr.subgroup_size,
                        "instruction": f"{tr.m}x{tr.n}x{tr.k}",
                        "tile": f"{tr.tile_m}x{tr.tile_n}", "why": choice.why})
    return out


def device_dict(device: IntelOpenCLDevice) -> dict[str, Any]:
    return {**device.to_dict(), "usable": unusable_reason(device) is None,
            "unusableBecause": unusable_reason(device), "kernels": kernel_choices(device),
            "verified": NOT_RUN}


def render(device: IntelOpenCLDevice) -> str:
    d = device
    lines = [f"Device {d.index}: {d.name}  (recorded Intel OpenCL device)",
             f"  product {d.product}, {d.core}",
             "  OpenCL extensions: " + (", ".join(d.opencl_extensions) or "-"),
             "  SPIR-V extensions: " + (", ".join(d.spirv_extensions) or "-"),
             f"  sub-group sizes {', '.join(map(str, d.sub_group_sizes))}; DPAS width (the "
             f"instruction's N) {d.dpas_sub_group_size}; M {', '.join(map(str, d.m_sizes))}"]
    for note in d.notes:
        lines.append(f"  note: {note}")
    lines += ["", "  OpSubgroupMatrixMultiplyAccumulateINTEL operand types:"]
    lines += [f"    {t.describe()}" for t in d.mma]
    lines += ["", f"  kernels coopmat would emit (intel family; {NOT_RUN}):"]
    why = unusable_reason(d)
    if why is not None:
        lines.append(f"    none: {why}")
        return "\n".join(lines)
    kernels = kernel_choices(d)
    for pair in dict.fromkeys(k["operands"] for k in kernels):
        rows = [k for k in kernels if k["operands"] == pair]
        errors = {k.get("error") for k in rows}
        if len(errors) == 1 and None not in errors:  # the same reason for every size
            lines.append(f"    {pair}: none: {errors.pop()}")
            continue
        lines.append(f"    {pair}:")
        for k in rows:
            shape = f"{k['M']}x{k['N']}x{k['K']}"
            text = f"none: {k['error']}" if "error" in k else f"{k['kernel']:<50} {k['why']}"
            lines.append(f"      {shape:<16} {text}")
    return "\n".join(lines)
