"""The subgroup size khr kernels run at on a device, and whether a khr tile fits a device.

Subgroup size. A khr kernel is built for one subgroup size and requires it
(VkPipelineShaderStageRequiredSubgroupSizeCreateInfo, with full subgroups), so the choice
is made here, on purpose, rather than inherited from the driver's default:

| device (driver)              | range  | driver default for matrices | chosen |
|------------------------------|--------|-----------------------------|--------|
| NVIDIA                       | 32     | 32                          | 32     |
| lavapipe (256-bit, a CPU)    | 8      | 8                           | 8      |
| AMD RDNA3 / RDNA4 (RADV)     | 32..64 | 64 (wave64)                 | 32     |
| Intel Xe-HPG, Arc A (ANV)    | 8..32  | 32 (SIMD32)                 | 8      |
| Intel Xe2 (ANV)              | 16..32 | 32 (SIMD32)                 | 16     |

Rule: the smallest size a compute pipeline may require (minSubgroupSize); the reported
subgroupSize where the range is one size or the device cannot require a size for compute.
Why the smallest:
- RDNA's SIMDs are 32 lanes wide and issue a wave64 instruction in two passes. On RDNA3
  (GFX11) the matrix instructions want A and B replicated in every 16-lane group, so a
  wave64 holds and loads each fragment four times where a wave32 does twice (RADV's
  radv_nir_lower_cooperative_matrix.c). RADV's own default for a compute shader with
  cooperative matrices is wave64, which is why the size must be required.
- Intel's DPAS runs at an exec size of 8 (Xe-HPG) or 16 (Xe2), the N of every entry ANV
  lists and the minSubgroupSize of each. A subgroup is one hardware thread with a fixed
  register file (Xe-HPG: 128 registers of 32 bytes), so SIMD8 gives each lane four times
  the registers of SIMD32 and issues each DPAS whole. ANV compiles a cooperative-matrix
  shader that requires no size at SIMD32 (anv_shader_compile.c).

Which tile a kernel takes is the policy's (coopmat/policy/tiles.py); this module says
whether a tile fits a device.
"""

from __future__ import annotations

from coopmat.codegen.plan import plan_kernel
from coopmat.codegen.traits import KhrTraits, Layout, Tile
from coopmat.common.enums import ComponentType


def tile_fits(tile: Tile, a_type: ComponentType, result_type: ComponentType, m: int, n: int,
              k: int, subgroup_size: int, max_shared_memory: int,
              max_invocations: int) -> bool:
    """Whether a khr tile fits the device's invocation and shared-memory limits in every
    variant that holds the edge scratch (every layout, aligned or not, with C)."""
    if tile.subgroups * subgroup_size > max_invocations:
        return False
    for a_layout in Layout:
        for b_layout in Layout:
            for aligned in (False, True):
                traits = KhrTraits(a_type=a_type, b_type=a_type, c_type=result_type,
                                   result_type=result_type, a_layout=a_layout,
                                   b_layout=b_layout, has_c=True, tile=tile,
                                   subgroup_size=subgroup_size, m=m, n=n, k=k,
                                   aligned=aligned)
                try:
                    plan = plan_kernel(traits)
                except ValueError:
                    return False
                if plan.shared_bytes > max_shared_memory:
                    return False
    return True


def kernel_subgroup_size(reported: int, smallest: int, largest: int,
                         can_require: bool) -> int:
    """The subgroup size khr kernels are built for and require (module docstring): the
    smallest the device lets a compute pipeline require, else the one it reports."""
    if smallest == largest or not can_require or smallest < 1:
        return reported
    return smallest
