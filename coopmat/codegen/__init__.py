"""SPIR-V generation for cooperative-matrix GEMM kernels.

    traits = khr_traits(cfg, info, Layout.ROW_MAJOR, Layout.COLUMN_MAJOR, False, tile)
    kernel = build_gemm(traits)            # cached in memory and on disk
    kernel.spirv, kernel.local_size, kernel.push_constants(GemmParams(...)), ...

Traits (traits.py): GemmTraits, the base every family shares, with one subclass per
family: KhrTraits, Nv2Traits, RowsTraits and GemvTraits. The traits carry every choice
(family, tile, variant, split, staging); coopmat.policy makes them, codegen emits them.

Modules: builder/spv (SPIR-V writing), shader (shader-level helpers), plan (tile
arithmetic), khr_tiled (the KHR subgroup-scope kernel), rows and rows_tiles (the few-rows
kernel that streams B, and its tile geometry), gemv (few rows against a column-major
B without cooperative matrices), quant and gemv_quant (a quantized B: GGUF
blocks read by the khr and gemv kernels), nv2_workgroup (the
VK_NV_cooperative_matrix2 workgroup-scope kernel), family (kernel families),
abi (bindings and push constants), kernel (Kernel), tiles (the subgroup size, whether a
tile fits) and nv2_tiles (workgroup-scope tiles), variants (what a device's capabilities
imply for traits), epilogue (D = alpha acc + beta C), intel, intel_traits and intel_kernel
(OpenCL kernels of SPV_INTEL_subgroup_matrix_multiply_accumulate, outside the Vulkan ABI),
cache,
tools (spirv-val/spirv-dis), __main__ (CLI).
"""

from coopmat.codegen.abi import aligned_ok, exact_ok, overread_elems
from coopmat.codegen.cache import build_gemm
from coopmat.codegen.family import KernelFamily, register_family
from coopmat.codegen.kernel import Kernel
from coopmat.codegen.nv2_tiles import nv2_traits
from coopmat.codegen.traits import (
    GemmParams,
    GemmTraits,
    GemvTraits,
    KhrTraits,
    Layout,
    Nv2Traits,
    RowsTraits,
    Tile,
    gemv_tile,
    rows_tile,
)
from coopmat.codegen.variants import khr_traits

__all__ = [
    "GemmParams", "GemmTraits", "GemvTraits", "Kernel", "KernelFamily",
    "KhrTraits", "Layout", "Nv2Traits", "RowsTraits", "Tile",
    "aligned_ok", "build_gemm", "exact_ok", "overread_elems",
    "gemv_tile", "khr_traits", "nv2_traits", "register_family",
    "rows_tile",
]
