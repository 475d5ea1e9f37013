"""`coopmat-codegen` (`python -m coopmat.codegen`): list, validate or disassemble the
SPIR-V kernel variants coopmat generates for a device or a recorded device list.

    coopmat-codegen --validate-all [--properties FILE] [--family NAME] | --list | --dump VARIANT
    coopmat-codegen --family intel --emit DIR [--properties FILE]

The intel family (OpenCL kernels using SPV_INTEL_subgroup_matrix_multiply_accumulate) is
not for Vulkan: `--family intel` lists, validates (for OpenCL 2.2) or writes its kernels,
every variant or, with `--properties` naming a recorded Intel OpenCL list, those its
devices take; `--emit DIR` writes each as NAME.spv with NAME.json describing it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from coopmat.codegen.cache import build_gemm
from coopmat.codegen.tools import OPENCL_TARGET_ENV, disassemble, validate
from coopmat.codegen.traits import GemmTraits
from coopmat.device.model import PhysicalDeviceInfo
from coopmat.device.record import load_records
from coopmat.policy.variants import current_device, device_variants
from coopmat.tools.cli import prog


def _variants(properties: str | None) -> list[GemmTraits]:
    """khr variants of the configs, and nv2 ones where the device offers workgroup-scope
    matrices (for a recorded JSON: its flexible-dimensions list, or the .txt beside it)."""
    records: list[PhysicalDeviceInfo] = (load_records(properties) if properties
                                         else [current_device()])
    out: list[GemmTraits] = []
    for r in records:
        out += [t for t in device_variants(r) if t not in out]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog("coopmat.tools.codegen"),
                                 description=__doc__.split("\n\n")[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--validate-all", action="store_true",
                      help="generate every variant and run spirv-val on each")
    what.add_argument("--list", action="store_true", help="print the variant names")
    what.add_argument("--dump", metavar="VARIANT", help="print one variant's disassembly")
    what.add_argument("--emit", metavar="DIR",
                      help="write each intel-family kernel to DIR as NAME.spv with NAME.json "
                           "(arguments, sub-group size, work sizes); needs --family intel")
    ap.add_argument("--properties", metavar="FILE",
                    help="recorded property list (JSON) instead of the current device; "
                         "NAME-khr-coopmat.json takes its VK_NV_cooperative_matrix2 "
                         "flexible-dimensions list from NAME-nv-coopmat2-flexible-dims.txt "
                         "beside it")
    ap.add_argument("--family", metavar="NAME",
                    help="only this kernel family's variants (khr, nv2, rows, gemv, intel)")
    args = ap.parse_args(argv)
    if args.family == "intel" or (args.properties and _intel_record(args.properties)):
        return intel_main(args)
    if args.emit:
        print("--emit writes the intel family's OpenCL kernels: add --family intel",
              file=sys.stderr)
        return 2

    variants = _variants(args.properties)
    if args.family:
        variants = [t for t in variants if t.family == args.family]
    if args.list or args.dump:
        return _list_or_dump(args, variants, lambda t: build_gemm(t).spirv)

    passed = failed = 0
    for t in variants:
        try:
            result = validate(build_gemm(t).spirv)
            ok, msg = result.ok, result.message
        except ValueError as e:
            ok, msg = False, f"generation failed: {e}"
        passed += ok
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {t.describe()}")
        if not ok:
            print("    " + msg.replace("\n", "\n    "))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def _list_or_dump(args: argparse.Namespace, variants: Sequence[Any],
                  spirv: Callable[[Any], bytes]) -> int:
    """--list (every variant's name) or --dump VARIANT (its disassembly)."""
    if args.list:
        for t in variants:
            print(t.describe())
        return 0
    match = [t for t in variants if t.describe() == args.dump]
    if not match:
        print(f"no variant named {args.dump!r}; see --list", file=sys.stderr)
        return 2
    print(disassemble(spirv(match[0])), end="")
    return 0


def _intel_record(path: str) -> bool:
    from coopmat.device.intel_opencl import is_intel_record

    try:
        return is_intel_record(json.loads(Path(path).read_text()))
    except (OSError, ValueError):
        return False  # load_records reports it


def intel_main(args: argparse.Namespace) -> int:
    """--list, --dump, --validate-all and --emit for the intel family."""
    from coopmat.codegen.intel_kernel import build_intel
    from coopmat.device.intel_opencl import load_intel_records
    from coopmat.policy.intel_shapes import intel_variants

    if args.family not in (None, "intel"):
        print(f"{args.properties} is a recorded Intel OpenCL list: its kernels are the intel "
              f"family's, not {args.family!r}", file=sys.stderr)
        return 2
    if args.properties:
        try:
            devices = load_intel_records(args.properties)
        except ValueError as exc:
            print(f"coopmat-codegen: {exc}", file=sys.stderr)
            return 2
        variants = []
        for d in devices:
            variants += [t for t in intel_variants(d) if t not in variants]
    else:
        variants = intel_variants()
    if args.list or args.dump:
        return _list_or_dump(args, variants, lambda t: build_intel(t).spirv)
    if args.emit:
        out = Path(args.emit)
        out.mkdir(parents=True, exist_ok=True)
        for t in variants:
            kernel = build_intel(t)
            name = t.describe()
            (out / f"{name}.spv").write_bytes(kernel.spirv)
            (out / f"{name}.json").write_text(
                json.dumps(kernel.description(f"{name}.spv"), indent=2) + "\n")
        print(f"wrote {len(variants)} kernels (.spv and .json) to {out}")
        return 0
    failed = 0
    for t in variants:
        result = validate(build_intel(t).spirv, OPENCL_TARGET_ENV)
        failed += not result.ok
        print(f"{'PASS' if result.ok else 'FAIL'} {t.describe()}")
        if not result.ok:
            print("    " + result.message.replace("\n", "\n    "))
    print(f"{len(variants) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
