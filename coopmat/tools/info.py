"""`python -m coopmat.info`: what each Vulkan device offers for cooperative-matrix GEMM.

Installed, the same command is `coopmat-info`.

Prints, per device, the raw VkCooperativeMatrixPropertiesKHR list (with the reason any
entry is not a WebGPU config), the GPUSubgroupMatrixConfig list, the `subgroup-matrix`
verdict, the relevant features, extensions and limits, and the kernels coopmat would
choose for a few representative problems of each dtype pair (coopmat.policy.choose, with
its reason). `--properties FILE` shows a recorded device list (tests/data) instead of this
machine's devices, without Vulkan; a recorded Intel OpenCL list (tests/data/intel) shows its
matrix extensions and the intel-family OpenCL kernels coopmat would emit (info_intel.py).
`--json` prints the same as JSON; docs/info-json.md documents its keys. Exit status 1,
with one line on stderr, when there is no Vulkan loader, no device, no device with
VK_KHR_cooperative_matrix, or the recorded file cannot be read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from coopmat import device
from coopmat.codegen import KhrTraits, Layout
from coopmat.codegen.variants import khr_subgroup_size
from coopmat.common.errors import CoopmatError
from coopmat.device.model import PhysicalDeviceInfo
from coopmat.device.record import load_records
from coopmat.device.select import ENV_VAR, match
from coopmat.device.webgpu import SubgroupMatrixSupport
from coopmat.tools.cli import prog, write

JSON_SCHEMA_VERSION = 1

# Representative problems (M, N, K) the kernel listing asks the policy about, A and B
# row-major without C: large and whole tiles, medium, sizes that fit no vector width, and
# few rows (an LLM decode step: the few-rows shape class, M <= SMALL_M).
PROBLEMS = ((4096, 4096, 4096), (1024, 1024, 1024), (1000, 1000, 1000), (16, 4096, 4096))


def kernel_choices(info: PhysicalDeviceInfo) -> list[dict[str, Any]]:
    """What coopmat.policy.choose picks on `info` for each dtype pair it computes and each
    of PROBLEMS: family, tile, variant, subgroup size, repacks and the reason; or the error
    the policy raises."""
    from coopmat import policy
    from coopmat.policy import tuning

    if not info.has_cooperative_matrix:
        return []
    tuned = tuning.choices(info)
    out: list[dict[str, Any]] = []
    for pair in policy.result_pairs(info):
        config = policy.config_for(info, pair)
        for M, N, K in PROBLEMS:
            row: dict[str, Any] = {
                "pair": pair.describe_result(), "M": M, "N": N, "K": K,
                "config": f"{config.M}x{config.N}x{config.K}" if config else None}
            problem = policy.Problem(pair, M, N, K,
                                     policy.OperandLayout(Layout.ROW_MAJOR, K),
                                     policy.OperandLayout(Layout.ROW_MAJOR, N))
            try:
                choice = policy.choose(info, problem, policy.Options(), tuned)
            except (CoopmatError, ValueError) as exc:
                out.append({**row, "error": str(exc)})
                continue
            t = choice.traits
            khr = t if isinstance(t, KhrTraits) else None  # nv2: one general kernel
            out.append({
                **row, "family": t.family, "tile": t.tile.describe(),
                "variant": khr.variant if khr else "general",
                "specialized": bool(khr and khr.specialized), "subgroupSize": t.subgroup_size,
                "repacks": ["AB"[p.operand] for p in choice.packs],
                "why": choice.why, "kernel": t.describe()})
    return out


def device_dict(info: PhysicalDeviceInfo, sup: SubgroupMatrixSupport) -> dict[str, Any]:
    return {
        "index": info.index,
        "name": info.name,
        "vendor": info.vendor,
        "vendorID": info.vendor_id,
        "deviceID": info.device_id,
        "deviceType": info.device_type,
        "apiVersion": info.api_version,
        "driverVersion": info.driver_version,
        "driverName": info.driver_name,
        "driverInfo": info.driver_info,
        "deviceUUID": info.device_uuid or None,
        "pciBusID": info.pci_bus_id or None,
        "extensions": dict(info.extensions),
        "features": dict(info.features),
        "limits": info.limits.to_dict(),
        "cooperativeMatrixProperties": [
            {**e.properties.to_dict(), "excludedBecause": list(e.reasons)} for e in sup.entries],
        "flexibleDimensionsProperties": [p.to_dict() for p in info.flexible_dimensions_properties],
        "subgroupMatrixConfigs": [c.to_dict() for c in sup.configs],
        "subgroupMatrix": {"available": sup.available, "unmet": list(sup.unmet)},
        "kernelSubgroupSize": khr_subgroup_size(info.limits),
        "kernels": kernel_choices(info),
        "notes": list(info.notes),
    }


def _yes(b: bool) -> str:
    return "yes" if b else "no"


def render_kernels(info: PhysicalDeviceInfo, kernels: list[dict[str, Any]]) -> list[str]:
    lim = info.limits
    size = khr_subgroup_size(lim)
    lines = ["", f"  kernels coopmat would choose (A and B row-major, no C; M x N x K, family, "
                 f"tile, variant, why); khr kernels require subgroup size {size} (device "
                 f"default {lim.subgroup_size}, range {lim.min_subgroup_size}.."
                 f"{lim.max_subgroup_size}):"]
    pair = None
    for k in kernels:
        if k["pair"] != pair:
            pair = k["pair"]
            lines.append(f"    {pair}" + (f", config {k['config']}" if k["config"] else "") + ":")
        shape = f"{k['M']}x{k['N']}x{k['K']}"
        if "error" in k:
            lines.append(f"      {shape:<16} none: {k['error']}")
            continue
        variant = ", ".join([k["variant"]] + ["specialized"] * k["specialized"]
                            + [f"repack {x}" for x in k["repacks"]])
        lines.append(f"      {shape:<16} {k['family']:<4} {k['tile']:<24} {variant:<32} "
                     f"{k['why']}")
    if not kernels:
        lines.append("    (no dtype pair coopmat computes)")
    return lines


def render(info: PhysicalDeviceInfo, sup: SubgroupMatrixSupport, selected: bool) -> str:
    lines = []
    mark = "  (selected)" if selected else ""
    lines.append(f"Device {info.index}: {info.name}{mark}")
    lines.append(f"  vendor {info.vendor} (0x{info.vendor_id:04x}), {info.device_type}, "
                 f"Vulkan {info.api_version}, driver {info.driver_name} {info.driver_version}"
                 f" ({info.driver_info})")
    lines.append(f"  UUID {info.device_uuid or 'not reported'}, "
                 f"PCI {info.pci_bus_id or 'not reported (no VK_EXT_pci_bus_info)'}")
    lines.append("  extensions: " + ", ".join(
        f"{name} {_yes(ok)}" for name, ok in info.extensions.items()))
    for note in info.notes:
        lines.append(f"  note: {note}")
    if not info.has_cooperative_matrix:
        lines.append("  VK_KHR_cooperative_matrix not offered: no cooperative-matrix kernels here")
        return "\n".join(lines)

    lines.append("")
    lines.append("  VkCooperativeMatrixPropertiesKHR (driver order):")
    rows = [e.properties.to_dict() for e in sup.entries]
    w = max([9] + [len(str(d[k])) + 1 for d in rows  # FLOAT8_E4M3 is wider than FLOAT16
                   for k in ("AType", "BType", "CType", "ResultType")])
    lines.append(f"    {'#':>2}  {'M':>3} {'N':>3} {'K':>3}  {'A':<{w}}{'B':<{w}}{'C':<{w}}"
                 f"{'Result':<{w}}{'sat':<4}{'scope':<10}config / excluded because")
    for i, (e, d) in enumerate(zip(sup.entries, rows, strict=True)):
        verdict = str(e.config) if e.config else "; ".join(e.reasons)
        lines.append(
            f"    {i:>2}  {d['M']:>3} {d['N']:>3} {d['K']:>3}  {d['AType']!s:<{w}}"
            f"{d['BType']!s:<{w}}{d['CType']!s:<{w}}{d['ResultType']!s:<{w}}"
            f"{_yes(d['saturatingAccumulation']):<4}{d['scope']!s:<10}{verdict}")
    if not sup.entries:
        lines.append("    (empty)")

    lines.append("")
    lines.append(f"  GPUSubgroupMatrixConfig ({len(sup.configs)}):")
    for c in sup.configs:
        lines.append(f"    {c.component_type:>3} -> {c.result_component_type:<3}  "
                     f"M={c.M} N={c.N} K={c.K}")
    verdict = "available" if sup.available else "NOT available: lacks " + ", ".join(sup.unmet)
    lines.append(f"  subgroup-matrix feature: {verdict}")

    if info.flexible_dimensions_properties:
        lines.append("")
        lines.append("  VkCooperativeMatrixFlexibleDimensionsPropertiesNV:")
        for f in info.flexible_dimensions_properties:
            d = f.to_dict()
            lines.append(
                f"    gran {d['MGranularity']}x{d['NGranularity']}x{d['KGranularity']}  "
                f"{d['AType']}/{d['BType']}->{d['CType']}/{d['ResultType']}  scope={d['scope']}"
                f"  workgroupInvocations={d['workgroupInvocations']}")

    lines.append("")
    lines.append("  features:")
    names = list(info.features)
    width = max(len(n) for n in names)
    for i in range(0, len(names), 2):
        pair = names[i:i + 2]
        lines.append("    " + "   ".join(f"{n:<{width}} {_yes(info.features[n]):<3}" for n in pair))
    lines.append("  limits:")
    for k, val in info.limits.to_dict().items():
        if isinstance(val, list):
            val = ", ".join(str(x) for x in val) or "-"
        lines.append(f"    {k:<52} {val}")
    lines += render_kernels(info, kernel_choices(info))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog("coopmat.info"), description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    ap.add_argument("--device", help="only this device: index, name substring, UUID (or a "
                    "unique prefix of it) or PCI bus id (0000:41:00.0) "
                    f"(default: ${ENV_VAR} if set, else all devices, the default choice marked)")
    ap.add_argument("--no-shader-f16", action="store_true",
                    help="filter as if the WebGPU shader-f16 feature were not requested")
    ap.add_argument("--properties", metavar="FILE",
                    help="a recorded device list (tests/data/*.json, or --json output) "
                         "instead of this machine's devices; needs no Vulkan")
    args = ap.parse_args(argv)
    if args.properties and _intel_record(args.properties):
        return _intel_report(args)
    selected: int | None
    try:
        if args.properties:
            try:
                infos = load_records(args.properties)
            except ValueError as exc:
                print(f"coopmat.info: {exc}", file=sys.stderr)
                return 1
            shown = [match(infos, args.device)] if args.device else infos
            selected = None  # nothing here computes
        elif args.device or os.environ.get(ENV_VAR):
            infos = device.enumerate_devices()
            # --device, else $COOPMAT_DEVICE: one device, which must offer the extension
            shown = [device.select(infos, args.device or None)]
            selected = shown[0].index
        else:  # all devices; fails when none offers the extension
            infos = device.enumerate_devices()
            shown = infos
            selected = device.select(infos).index
    except CoopmatError as exc:
        print(f"coopmat.info: {exc}", file=sys.stderr)
        return 1

    sups = [device.support(d, shader_f16=not args.no_shader_f16) for d in shown]
    if args.json:
        out = {"schemaVersion": JSON_SCHEMA_VERSION, "selectedDevice": selected,
               "devices": [device_dict(d, s) for d, s in zip(shown, sups, strict=True)]}
        write(json.dumps(out, indent=2))
    else:
        pages = [render(d, s, d.index == selected) for d, s in zip(shown, sups, strict=True)]
        write("\n\n".join(pages))
    return 0


def _intel_record(path: str) -> bool:
    from coopmat.device.intel_opencl import is_intel_record

    try:
        return is_intel_record(json.loads(open(path).read()))
    except (OSError, ValueError):
        return False  # load_records reports it


def _intel_report(args: argparse.Namespace) -> int:
    """A recorded Intel OpenCL list: text pages or JSON (info_intel.py)."""
    from coopmat.device.intel_opencl import load_intel_records, match_device
    from coopmat.tools import info_intel

    try:
        devices = load_intel_records(args.properties)
        if args.device:
            devices = [match_device(devices, args.device)]
    except ValueError as exc:
        print(f"coopmat.info: {exc}", file=sys.stderr)
        return 1
    if args.json:
        write(json.dumps({"schemaVersion": JSON_SCHEMA_VERSION,
                          "kind": "intel-opencl-subgroup-mma",
                          "devices": [info_intel.device_dict(d) for d in devices]}, indent=2))
    else:
        write("\n\n".join(info_intel.render(d) for d in devices))
    return 0


if __name__ == "__main__":
    sys.exit(main())
