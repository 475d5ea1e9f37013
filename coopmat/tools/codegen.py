"""`coopmat-codegen` (`python -m coopmat.tools.codegen`): list, validate or disassemble the
SPIR-V kernel variants coopmat generates for a device or a recorded device list.

    coopmat-codegen --validate-all [--properties FILE] [--family NAME] | --list | --dump VARIANT
"""

from __future__ import annotations

import argparse
import sys

from coopmat.codegen.cache import build_gemm
from coopmat.codegen.tools import disassemble, validate
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
    ap.add_argument("--properties", metavar="FILE",
                    help="recorded property list (JSON) instead of the current device; "
                         "NAME-khr-coopmat.json takes its VK_NV_cooperative_matrix2 "
                         "flexible-dimensions list from NAME-nv-coopmat2-flexible-dims.txt "
                         "beside it")
    ap.add_argument("--family", metavar="NAME",
                    help="only this kernel family's variants (khr, nv2, rows, gemv)")
    args = ap.parse_args(argv)

    variants = _variants(args.properties)
    if args.family:
        variants = [t for t in variants if t.family == args.family]
    if args.list:
        for t in variants:
            print(t.describe())
        return 0
    if args.dump:
        match = [t for t in variants if t.describe() == args.dump]
        if not match:
            print(f"no variant named {args.dump!r}; see --list", file=sys.stderr)
            return 2
        print(disassemble(build_gemm(match[0]).spirv), end="")
        return 0

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


if __name__ == "__main__":
    sys.exit(main())
