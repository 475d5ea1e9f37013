"""Which intel-family kernel (coopmat.codegen.intel) a recorded Intel OpenCL device gets
for a product: pure functions of the device record and the problem's size.

- The sub-group size is the device's DPAS width (`dpasSubGroupSize`): the instruction's N
  is the sub-group size, and Intel's compiler lowers it where N is that width (8 on
  Xe-HPG, 16 on Xe-HPC and later).
- An operand type is offered where the device lists it with the family's accumulator and
  K (float16 and bfloat16 -> float32 at K=16, int8 and uint8 -> int32 at K=32, tf32 ->
  float32 at K=8) and the family builds it at that width.
- The shape: few rows (M < 8) take the smallest instruction M of 1, 2, 4, 8 that covers
  them, on a workgroup of 1 x 4 sub-groups each owning 1 x 2 results; 8 to 31 rows take
  M = 8 on the same grid; 32 rows or more a 2 x 2 grid of sub-groups each owning 4 x 2
  results of 8 rows (a 64 x 4N tile).

Unmeasured: no Intel GPU has run these kernels, so the shapes are a first reading of the
instruction's sizes, not tuned.
"""

from __future__ import annotations

from dataclasses import dataclass

from coopmat.codegen.intel_traits import INTEL_TYPES, M_SIZES, IntelTraits, IntelType
from coopmat.device.intel_opencl import IntelOpenCLDevice

LARGE_M = 32  # from here on, the 64-row tile


@dataclass(frozen=True)
class IntelChoice:
    traits: IntelTraits
    why: str


def unusable_reason(device: IntelOpenCLDevice) -> str | None:
    """Why the device takes no intel-family kernel, or None."""
    if not device.has_spirv_mma:
        missing = [e for e, listed in (
            ("cl_intel_subgroup_matrix_multiply_accumulate",
             "cl_intel_subgroup_matrix_multiply_accumulate" in device.opencl_extensions),
            ("SPV_INTEL_subgroup_matrix_multiply_accumulate",
             "SPV_INTEL_subgroup_matrix_multiply_accumulate" in device.spirv_extensions))
            if not listed]
        return "lacks " + " and ".join(missing)
    return None


def offers(device: IntelOpenCLDevice, t: IntelType) -> bool:
    return (device.dpas_sub_group_size in t.subgroup_sizes
            and device.lists(t.element, t.element, t.accumulator, t.k))


def device_types(device: IntelOpenCLDevice) -> list[IntelType]:
    """The family's operand types the device runs (none where it takes no such module)."""
    if unusable_reason(device) is not None:
        return []
    return [t for t in INTEL_TYPES.values() if offers(device, t)]


def shape_for(operand: str, subgroup_size: int, M: int, has_c: bool) -> IntelChoice:
    """The kernel for M rows at a sub-group size (the rules in the module docstring)."""
    if M < 1:
        raise ValueError(f"M must be at least 1, not {M}")
    if M >= LARGE_M:
        t = IntelTraits(operand, 8, subgroup_size, has_c, acc_rows=4, acc_cols=2,
                        subgroups_m=2, subgroups_n=2)
        why = f"{_rows(M)}: 8 rows an instruction, 4 x 2 a sub-group, 2 x 2 sub-groups"
    else:
        m = next(x for x in M_SIZES if x >= min(M, 8))
        t = IntelTraits(operand, m, subgroup_size, has_c, acc_rows=1, acc_cols=2,
                        subgroups_m=1, subgroups_n=4)
        why = f"{_rows(M)}: {_rows(m)} an instruction, 1 x 2 a sub-group, 1 x 4 sub-groups"
    t.check()
    return IntelChoice(t, why)


def _rows(n: int) -> str:
    return f"{n} row{'s' if n != 1 else ''}"


def choose_intel(device: IntelOpenCLDevice, operand: str, M: int,
                 has_c: bool = False) -> IntelChoice:
    """The intel-family kernel for an M-row product of `operand` (f16, bf16, s8, u8, tf32)
    on a recorded device; ValueError saying why where it has none."""
    why = unusable_reason(device)
    if why is not None:
        raise ValueError(f"{device.name} takes no SPIR-V matrix multiply-accumulate: {why}")
    t = INTEL_TYPES.get(operand)
    if t is None:
        raise ValueError(f"no intel operand type {operand!r}; known: {sorted(INTEL_TYPES)}")
    if not offers(device, t):
        raise ValueError(f"{device.name} does not list {t.element} x {t.element} -> "
                         f"{t.accumulator} at K={t.k} for sub-group size "
                         f"{device.dpas_sub_group_size}")
    choice = shape_for(operand, device.dpas_sub_group_size, M, has_c)
    if choice.traits.m not in device.m_sizes:
        raise ValueError(f"{device.name} lists M in {list(device.m_sizes)}, not "
                         f"{choice.traits.m}")
    return choice


# Rows that reach each shape shape_for picks: 1, 2 and 4 rows; 8 rows; the 64-row tile.
SHAPE_ROWS = (1, 2, 4, 8, LARGE_M)


def intel_variants(device: IntelOpenCLDevice | None = None) -> list[IntelTraits]:
    """Every kernel the policy can pick: each operand type at each sub-group size the
    family builds it (a device's: its DPAS width and listed types), each shape, with and
    without C."""
    out: list[IntelTraits] = []
    types = list(INTEL_TYPES.values()) if device is None else device_types(device)
    for t in types:
        sizes = t.subgroup_sizes if device is None else (device.dpas_sub_group_size,)
        for sg in sizes:
            for rows in SHAPE_ROWS:
                for has_c in (False, True):
                    traits = shape_for(t.short, sg, rows, has_c).traits
                    if traits not in out:
                        out.append(traits)
    return out
