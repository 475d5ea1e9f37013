"""`python -m coopmat.info`: what each Vulkan device offers for cooperative-matrix GEMM.

Installed, the same command is `coopmat-info`.

Prints, per device, the raw VkCooperativeMatrixPropertiesKHR list (with the reason any
entry is not a WebGPU config), the GPUSubgroupMatrixConfig list, the `subgroup-matrix`
verdict, the relevant features, extensions and limits. `--json` prints the same as JSON;
README.md documents its keys. Exit status 1, with one line on stderr, when there is no
Vulkan loader, no device, or no device with VK_KHR_cooperative_matrix.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from coopmat import device
from coopmat._cli import prog, write
from coopmat.device.model import PhysicalDeviceInfo
from coopmat.device.select import ENV_VAR
from coopmat.device.webgpu import SubgroupMatrixSupport
from coopmat.errors import CoopmatError

JSON_SCHEMA_VERSION = 1


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
        "extensions": dict(info.extensions),
        "features": dict(info.features),
        "limits": info.limits.to_dict(),
        "cooperativeMatrixProperties": [
            {**e.properties.to_dict(), "excludedBecause": list(e.reasons)} for e in sup.entries],
        "flexibleDimensionsProperties": [p.to_dict() for p in info.flexible_dimensions_properties],
        "subgroupMatrixConfigs": [c.to_dict() for c in sup.configs],
        "subgroupMatrix": {"available": sup.available, "unmet": list(sup.unmet)},
        "notes": list(info.notes),
    }


def _yes(b: bool) -> str:
    return "yes" if b else "no"


def render(info: PhysicalDeviceInfo, sup: SubgroupMatrixSupport, selected: bool) -> str:
    lines = []
    mark = "  (selected)" if selected else ""
    lines.append(f"Device {info.index}: {info.name}{mark}")
    lines.append(f"  vendor {info.vendor} (0x{info.vendor_id:04x}), {info.device_type}, "
                 f"Vulkan {info.api_version}, driver {info.driver_name} {info.driver_version}"
                 f" ({info.driver_info})")
    lines.append("  extensions: " + ", ".join(
        f"{name} {_yes(ok)}" for name, ok in info.extensions.items()))
    for note in info.notes:
        lines.append(f"  note: {note}")
    if not info.has_cooperative_matrix:
        lines.append("  VK_KHR_cooperative_matrix not offered: no cooperative-matrix kernels here")
        return "\n".join(lines)

    lines.append("")
    lines.append("  VkCooperativeMatrixPropertiesKHR (driver order):")
    lines.append(f"    {'#':>2}  {'M':>3} {'N':>3} {'K':>3}  {'A':<9}{'B':<9}{'C':<9}"
                 f"{'Result':<9}{'sat':<4}{'scope':<10}config / excluded because")
    for i, e in enumerate(sup.entries):
        d = e.properties.to_dict()
        verdict = str(e.config) if e.config else "; ".join(e.reasons)
        lines.append(
            f"    {i:>2}  {d['M']:>3} {d['N']:>3} {d['K']:>3}  {d['AType']!s:<9}{d['BType']!s:<9}"
            f"{d['CType']!s:<9}{d['ResultType']!s:<9}{_yes(d['saturatingAccumulation']):<4}"
            f"{d['scope']!s:<10}{verdict}")
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
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog("coopmat.info"), description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    ap.add_argument("--device", help="only this device: index or name substring "
                    f"(default: ${ENV_VAR} if set, else all devices, the default choice marked)")
    ap.add_argument("--no-shader-f16", action="store_true",
                    help="filter as if the WebGPU shader-f16 feature were not requested")
    args = ap.parse_args(argv)
    try:
        infos = device.enumerate_devices()
        if args.device or os.environ.get(ENV_VAR):
            # --device, else $COOPMAT_DEVICE: one device, which must offer the extension
            shown = [device.select(infos, args.device or None)]
            selected = shown[0].index
        else:  # all devices; fails when none offers the extension
            shown = infos
            selected = device.select(infos).index
    except CoopmatError as exc:
        print(f"coopmat.info: {exc}", file=sys.stderr)
        return 1

    sups = [device.support(d, shader_f16=not args.no_shader_f16) for d in shown]
    if args.json:
        out = {"schemaVersion": JSON_SCHEMA_VERSION, "selectedDevice": selected,
               "devices": [device_dict(d, s) for d, s in zip(shown, sups, strict=False)]}
        write(json.dumps(out, indent=2))
    else:
        pages = [render(d, s, d.index == selected) for d, s in zip(shown, sups, strict=True)]
        write("\n\n".join(pages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
