"""An intel-family kernel for users of OpenCL or Level Zero: its SPIR-V, its arguments,
sub-group size and work sizes, and the JSON that `python -m coopmat.codegen --family intel
--emit DIR` writes beside each module.

coopmat itself does not run these kernels (it runs Vulkan); they are for loading with
clCreateProgramWithIL (pyopencl: `cl.Program(ctx, spirv).build()`) or zeModuleCreate with
ZE_MODULE_FORMAT_IL_SPIRV. No Intel GPU has run them: the reference interpreter
(spirv_interp) is their only executor so far.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from coopmat.codegen.intel import EXTENSION, SPIRV_VERSION, emit_intel_gemm
from coopmat.codegen.intel_traits import IntelTraits

# The OpenCL C type that moves an element's bits, per numpy name of the element.
_OPENCL_ELEMENT = {"float16": "ushort", "bfloat16": "ushort", "int8": "char",
                   "uint8": "uchar", "float32": "float", "int32": "int"}
CL_EXTENSION = "cl_intel_subgroup_matrix_multiply_accumulate"
CL_TF32_EXTENSION = "cl_intel_subgroup_matrix_multiply_accumulate_tf32"
VERIFIED = ("reference SPIR-V interpreter (spirv_interp) against float64 numpy; "
            "spirv-val --target-env opencl2.2; never run on an Intel GPU")


@dataclass(frozen=True)
class KernelArgument:
    index: int
    name: str
    kind: str  # "global" (a pointer to global memory) or "scalar"
    opencl_type: str
    element: str  # numpy name of what the bits hold
    meaning: str

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "kind": self.kind,
                "openclType": self.opencl_type, "elementType": self.element,
                "meaning": self.meaning}


@dataclass(frozen=True)
class IntelKernel:
    traits: IntelTraits
    spirv: bytes

    @property
    def local_size(self) -> tuple[int, int, int]:
        return (self.traits.invocations, 1, 1)

    def workgroups(self, M: int, N: int) -> tuple[int, int, int]:
        """Workgroups (x: column tiles of D, y: row tiles) for an M x N result."""
        t = self.traits
        return (-(-N // t.tile_n), -(-M // t.tile_m), 1)

    def global_size(self, M: int, N: int) -> tuple[int, int, int]:
        """clEnqueueNDRangeKernel's global work size: workgroups x local size."""
        gx, gy, gz = self.workgroups(M, N)
        return (gx * self.local_size[0], gy, gz)

    def arguments(self) -> list[KernelArgument]:
        t = self.traits
        ty = t.type
        acc = "float32" if ty.is_float else "int32"
        el, acc_cl = _OPENCL_ELEMENT[ty.storage], _OPENCL_ELEMENT[acc]
        out = [("A", "global", f"global const {el} *", ty.storage,
                "M x K, row-major, leading dimension lda"),
               ("B", "global", f"global const {el} *", ty.storage,
                "K x N, row-major, leading dimension ldb")]
        if t.has_c:
            out.append(("C", "global", f"global const {acc_cl} *", acc,
                        "M x N, row-major, leading dimension ldc"))
        out.append(("D", "global", f"global {acc_cl} *", acc,
                    "M x N result, row-major, leading dimension ldd; "
                    "D = A B" + (" + C" if t.has_c else "")))
        sizes = [("M", "rows of A and D (at least 1)"), ("N", "columns of B and D (at least 1)"),
                 ("K", "columns of A, rows of B"), ("lda", "elements between rows of A"),
                 ("ldb", "elements between rows of B")]
        sizes += [("ldc", "elements between rows of C")] if t.has_c else []
        sizes += [("ldd", "elements between rows of D")]
        out += [(n, "scalar", "uint", "uint32", m) for n, m in sizes]
        return [KernelArgument(i, *a) for i, a in enumerate(out)]

    def argument_values(self, buffers: dict[str, Any], sizes: dict[str, int]) -> list[Any]:
        """The arguments in order, from the buffers by name (A, B, C, D) and the sizes
        (M, N, K, lda, ldb, ldc, ldd); KeyError names a missing one."""
        return [buffers[a.name] if a.kind == "global" else sizes[a.name]
                for a in self.arguments()]

    def description(self, file: str | None = None) -> dict[str, Any]:
        """What a host program needs to run the module (the JSON beside it)."""
        t = self.traits
        ty = t.type
        gx = f"ceil(N / {t.tile_n}) * {self.local_size[0]}"
        extensions = [CL_EXTENSION] + ([CL_TF32_EXTENSION] if ty.short == "tf32" else [])
        return {
            "name": t.describe(),
            "family": "intel",
            **({"file": file} if file else {}),
            "entryPoint": t.entry_point,
            "computes": "D = A B" + (" + C" if t.has_c else "") + " (all row-major)",
            "types": {"A": ty.name, "B": ty.name, "accumulator": ty.result,
                      **({"C": ty.result} if t.has_c else {}), "D": ty.result},
            "instruction": {
                "name": "OpSubgroupMatrixMultiplyAccumulateINTEL",
                "M": t.m, "N": t.n, "K": t.k,
                "operands": ty.operand_names(), "operandsValue": ty.operands},
            "subGroupSize": t.subgroup_size,
            "localWorkSize": list(self.local_size),
            "tile": {"rows": t.tile_m, "columns": t.tile_n,
                     "subGroups": [t.subgroups_m, t.subgroups_n],
                     "perSubGroup": [t.acc_rows, t.acc_cols]},
            "globalWorkSize": [gx, f"ceil(M / {t.tile_m})", "1"],
            "arguments": [a.to_dict() for a in self.arguments()],
            "spirv": {"version": ".".join(map(str, SPIRV_VERSION)),
                      "environment": "opencl2.2", "extensions": [EXTENSION]},
            "requires": {"openclExtensions": extensions,
                         "subGroupSizes": [t.subgroup_size]},
            "verified": VERIFIED,
        }


@functools.lru_cache(maxsize=256)
def build_intel(traits: IntelTraits) -> IntelKernel:
    """The kernel for `traits` (generated once per process)."""
    return IntelKernel(traits, emit_intel_gemm(traits))
