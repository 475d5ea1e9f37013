"""Kernel families: independent generators behind one `build_gemm` entry point.

A family turns traits of its own GemmTraits subclass (whose `family` names it) into a
Kernel that follows the shared ABI in abi.py, so callers never depend on which family
built a kernel. The KHR subgroup-scope tiled kernel ("khr", KhrTraits) and the
VK_NV_cooperative_matrix2 workgroup-scope kernel ("nv2", Nv2Traits) and the few-rows
kernel that streams B ("rows", RowsTraits) and the few-rows kernel without cooperative
matrices for a column-major B ("gemv", GemvTraits) register themselves here.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from coopmat.codegen import abi
from coopmat.codegen.kernel import Kernel
from coopmat.codegen.plan import plan_kernel
from coopmat.codegen.spv import Capability
from coopmat.codegen.traits import GemmTraits, GemvTraits, KhrTraits, Nv2Traits, RowsTraits
from coopmat.codegen.types import vulkan_features

T = TypeVar("T", bound=GemmTraits)


class KernelFamily(Protocol):
    name: str

    def describe(self, traits: GemmTraits) -> Kernel:
        """The kernel's metadata with empty `spirv` (cheap: no code generation).

        Raise ValueError for traits this family cannot build."""
        ...

    def generate(self, traits: GemmTraits) -> bytes:
        """The SPIR-V module for `traits`."""
        ...


def _own(traits: GemmTraits, cls: type[T]) -> T:
    """`traits` as the family's own class; ValueError for another family's."""
    if not isinstance(traits, cls):
        raise ValueError(f"traits of family {traits.family!r}, not {cls.family!r}")
    return traits


class KhrTiledFamily:
    """VK_KHR_cooperative_matrix, subgroup scope, shared-memory tiling (khr_tiled.py)."""

    name = "khr"

    def describe(self, traits: GemmTraits) -> Kernel:
        from coopmat.codegen.khr_tiled import required_capabilities

        plan = plan_kernel(_own(traits, KhrTraits))
        khr = plan.traits
        return Kernel(
            traits=khr, spirv=b"", local_size=(plan.invocations, 1, 1),
            required_subgroup_size=khr.subgroup_size,
            shared_memory_bytes=plan.shared_bytes,
            push_constant_size=abi.PUSH_CONSTANT_SIZE, bindings=abi.bindings(khr),
            tile_mn=(khr.tile.tile_m, khr.tile.tile_n),
            features=vulkan_features(required_capabilities(plan)))

    def generate(self, traits: GemmTraits) -> bytes:
        from coopmat.codegen.khr_tiled import emit_tiled_gemm

        return emit_tiled_gemm(plan_kernel(_own(traits, KhrTraits)))


class Nv2WorkgroupFamily:
    """VK_NV_cooperative_matrix2 workgroup-scope matrices through tensor layouts
    (nv2_workgroup.py); tile geometry in nv2_tiles.py."""

    name = "nv2"

    def describe(self, traits: GemmTraits) -> Kernel:
        from coopmat.codegen.nv2_workgroup import (
            NV2_FEATURES,
            check_traits,
            required_capabilities,
        )

        nv2 = _own(traits, Nv2Traits)
        check_traits(nv2)
        return Kernel(
            traits=nv2, spirv=b"", local_size=(nv2.invocations, 1, 1),
            required_subgroup_size=None,
            # The module declares no Workgroup variables. The implementation stages
            # workgroup-scope matrices in shared memory of its own: the device's
            # cooperativeMatrixWorkgroupScopeReservedSharedMemory, which it takes out of
            # maxComputeSharedMemorySize, so that a pipeline may use at most
            # maxComputeSharedMemorySize - reserved bytes. This kernel uses 0 of those
            # (nv2_tiles checks that the reservation itself fits).
            shared_memory_bytes=0,
            push_constant_size=abi.PUSH_CONSTANT_SIZE, bindings=abi.bindings(nv2),
            tile_mn=(nv2.tile.tile_m, nv2.tile.tile_n),
            features=tuple(sorted(set(vulkan_features(required_capabilities(nv2)))
                                  | set(NV2_FEATURES))))

    def generate(self, traits: GemmTraits) -> bytes:
        from coopmat.codegen.nv2_workgroup import emit_nv2_gemm

        return emit_nv2_gemm(_own(traits, Nv2Traits))


class RowsFamily:
    """VK_KHR_cooperative_matrix, subgroup scope, few rows: B streamed from global memory
    (rows.py)."""

    name = "rows"

    def describe(self, traits: GemmTraits) -> Kernel:
        from coopmat.codegen.rows import RowsPlan, required_capabilities

        rows = _own(traits, RowsTraits)
        if rows.ops is not None:
            raise ValueError("the rows kernel family has no fused epilogue yet")
        plan = RowsPlan(rows)
        return Kernel(
            traits=rows, spirv=b"", local_size=(rows.invocations, 1, 1),
            required_subgroup_size=rows.subgroup_size,
            shared_memory_bytes=plan.shared_bytes,
            push_constant_size=abi.PUSH_CONSTANT_SIZE, bindings=abi.bindings(rows),
            tile_mn=(rows.tile.tile_m, rows.tile.tile_n),
            features=vulkan_features(required_capabilities(rows)))

    def generate(self, traits: GemmTraits) -> bytes:
        from coopmat.codegen.rows import RowsPlan, emit_rows_gemm

        rows = _own(traits, RowsTraits)
        RowsPlan(rows)  # validates
        return emit_rows_gemm(rows)


class GemvFamily:
    """Few rows against a column-major B without cooperative matrices: 16-byte loads along
    K (whole GGUF blocks of a quantized B), float32 sums reduced across the subgroup
    (gemv.py, gemv_quant.py)."""

    name = "gemv"
    traits_class: type[GemvTraits] = GemvTraits
    extra_capabilities: frozenset[Capability] = frozenset()  # beyond gemv's own

    def describe(self, traits: GemmTraits) -> Kernel:
        from coopmat.codegen.gemv import required_capabilities

        gemv = _own(traits, self.traits_class)
        gemv.check_tile()
        return Kernel(
            traits=gemv, spirv=b"", local_size=(gemv.invocations, 1, 1),
            required_subgroup_size=gemv.subgroup_size, shared_memory_bytes=0,
            push_constant_size=abi.PUSH_CONSTANT_SIZE, bindings=abi.bindings(gemv),
            tile_mn=(gemv.tile.tile_m, gemv.tile.tile_n),
            features=vulkan_features(required_capabilities(gemv) | self.extra_capabilities))

    def generate(self, traits: GemmTraits) -> bytes:
        from coopmat.codegen.gemv import GemvEmitter
        from coopmat.codegen.gemv_quant import QuantGemvEmitter

        gemv = _own(traits, GemvTraits)
        emitter = GemvEmitter if gemv.b_quant is None else QuantGemvEmitter
        return emitter(gemv).build()


_FAMILIES: dict[str, KernelFamily] = {}


def register_family(family: KernelFamily) -> None:
    _FAMILIES[family.name] = family


def family_for(traits: GemmTraits) -> KernelFamily:
    try:
        return _FAMILIES[traits.family]
    except KeyError:
        raise ValueError(f"no kernel family named {traits.family!r}; "
                         f"known: {sorted(_FAMILIES)}") from None


register_family(KhrTiledFamily())
register_family(Nv2WorkgroupFamily())
register_family(RowsFamily())
register_family(GemvFamily())
