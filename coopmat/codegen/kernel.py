"""A built kernel: its SPIR-V and what a dispatcher needs to run it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coopmat.codegen import abi
from coopmat.codegen.traits import GemmParams, GemmTraits, GemvTraits, KhrTraits, RowsTraits


@dataclass(frozen=True)
class Kernel:
    traits: GemmTraits
    spirv: bytes
    local_size: tuple[int, int, int]
    required_subgroup_size: int | None
    shared_memory_bytes: int
    push_constant_size: int
    bindings: tuple[int, ...]
    # The workgroup tile (rows, columns of D) one workgroup computes.
    tile_mn: tuple[int, int] = (0, 0)
    # Vulkan feature names (VkPhysicalDevice*Features members) the module needs.
    features: tuple[str, ...] = ()

    def workgroups(self, M: int, N: int, batch: int = 1) -> tuple[int, int, int]:
        tm, tn = self.tile_mn
        return (-(-N // tn), -(-M // tm), batch)

    def aligned_ok(self, p: GemmParams) -> bool:
        """Whether `p` may run on this kernel's aligned variant (see abi.aligned_ok)."""
        return abi.aligned_ok(self.traits, p)

    def push_constants(self, p: GemmParams) -> bytes:
        t = self.traits
        if isinstance(t, KhrTraits):  # the family with variants
            if t.aligned and not abi.aligned_ok(t, p):
                raise ValueError("these sizes/strides break the aligned variant's "
                                 "preconditions; use the general variant")
            if t.exact and not abi.clamped_ok(t, p):
                raise ValueError("these sizes are not whole workgroup tiles; the exact "
                                 "variant needs M, N, K multiples of its tile (M and N "
                                 "not where clamped)")
        if isinstance(t, RowsTraits):
            why = abi.rows_violation(t, p)
            if why is not None:
                raise ValueError(f"the rows kernel cannot run this problem: {why}")
        if isinstance(t, GemvTraits):
            why = abi.gemv_violation(t, p)
            if why is not None:
                raise ValueError(f"the gemv kernel cannot run this problem: {why}")
        return abi.push_constants(t, p)


@dataclass(frozen=True)
class HelperKernel:
    """A one-pass kernel beside the GEMMs (pack.py, dequant.py, copy.py): what
    PipelineCache needs of it. Source at binding 0, destination at 1; no shared memory,
    any subgroup size. Each subclass sets its workgroup and push-constant size and adds
    its grid and push constants."""

    traits: Any  # the pipeline cache key
    spirv: bytes
    features: tuple[str, ...]  # Vulkan feature names (VkPhysicalDevice*Features members)
    local_size: tuple[int, int, int]
    push_constant_size: int
    required_subgroup_size: int | None = None
    shared_memory_bytes: int = 0
    bindings: tuple[int, ...] = (0, 1)
