"""What a device's capabilities imply for codegen: which configs the khr family builds,
the subgroup size its kernels require, whether D's type is a listed matrix, and khr traits
for a config on a device with a given tile.

The device is a PhysicalDeviceInfo, from a live device or a recorded list
(coopmat.device.record). Which tile and variant a product runs is the policy's
(coopmat/policy/tiles.py, kernel.py); every variant a device implies: policy/variants.py.
"""

from __future__ import annotations

from coopmat.codegen.tiles import kernel_subgroup_size
from coopmat.codegen.traits import KhrTraits, Layout, Tile
from coopmat.common.dtypes import OPERAND_TYPES, RESULT_TYPES
from coopmat.common.enums import ComponentType, Scope
from coopmat.device.model import (
    SHADER_STAGE_COMPUTE,
    CooperativeMatrixProperties,
    DeviceLimits,
    PhysicalDeviceInfo,
)


def buildable(cfg: CooperativeMatrixProperties) -> bool:
    """Configs the khr family can use: subgroup scope, non-saturating, C = Result, types
    it knows."""
    return (cfg.scope == Scope.SUBGROUP and not cfg.saturating_accumulation
            and cfg.a_type in OPERAND_TYPES and cfg.b_type in OPERAND_TYPES
            and cfg.result_type in RESULT_TYPES and cfg.c_type == cfg.result_type)


def khr_subgroup_size(limits: DeviceLimits) -> int:
    """The subgroup size khr kernels are built for and require on a device (tiles.py says
    why): the smallest it lets a compute pipeline require, else its subgroupSize."""
    return kernel_subgroup_size(
        limits.subgroup_size, limits.min_subgroup_size, limits.max_subgroup_size,
        bool(limits.required_subgroup_size_stages & SHADER_STAGE_COMPUTE))


def is_cpu(info: PhysicalDeviceInfo) -> bool:
    """Whether the device is a CPU driver (lavapipe), which gets small tiles."""
    return info.device_type == "CPU"


def lists_out_matrix(info: PhysicalDeviceInfo, cfg: CooperativeMatrixProperties,
                     out_type: ComponentType | None) -> bool:
    """Whether a khr kernel of `cfg` may hold D's type `out_type` as an accumulator matrix
    (KhrTraits.out_matrix): the device lists a subgroup-scope entry of the config's
    MSize x NSize with that CType or ResultType (a cooperative-matrix type that matches
    no entry is undefined behaviour, SPV_KHR_cooperative_matrix's validity rules). Always
    where D holds the accumulator's own type (out_type None). Not so on Intel Xe-HPG,
    which lists float32 accumulation only, for a float16 D."""
    if out_type is None or out_type == cfg.result_type:
        return True
    return any(c.scope == Scope.SUBGROUP and (c.M, c.N) == (cfg.M, cfg.N)
               and out_type in (c.c_type, c.result_type)
               for c in info.cooperative_matrix_properties)


def khr_traits(cfg: CooperativeMatrixProperties, info: PhysicalDeviceInfo, a_layout: Layout,
               b_layout: Layout, has_c: bool, tile: Tile, *, aligned: bool = False,
               exact: bool = False, out_type: ComponentType | None = None) -> KhrTraits:
    """khr traits for a config on a device (variant flags as given), at the subgroup size
    khr_subgroup_size chooses, storing D as a matrix of out_type only where the device
    lists one (lists_out_matrix)."""
    return KhrTraits(a_type=cfg.a_type, b_type=cfg.b_type, c_type=cfg.c_type,
                     result_type=cfg.result_type, a_layout=a_layout, b_layout=b_layout,
                     has_c=has_c, tile=tile, subgroup_size=khr_subgroup_size(info.limits),
                     out_type=out_type, m=cfg.M, n=cfg.N, k=cfg.K, aligned=aligned,
                     exact=exact, out_matrix=lists_out_matrix(info, cfg, out_type))


# Operand types the gemv kernel reads (as 32-bit words; gemv.py).
GEMV_OPERANDS = (ComponentType.FLOAT16, ComponentType.BFLOAT16)
