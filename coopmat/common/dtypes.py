"""Everything coopmat knows about an element type, in one table.

One row per VkComponentTypeKHR: its size and kind, the numpy dtype that holds it, how
SPIR-V declares it (float encoding, capabilities, extension), what Vulkan must enable for
a kernel to use it (features, extension), its WebGPU name, and, for GEMM operands, the
default result and accumulator types. Other modules read this table; none keeps a list of
its own. Adding a type is one row here plus what is truly type-specific (e.g. the value
conversion numpy needs).

ComponentType (VkComponentTypeKHR) is defined here, beside its rows, so that its size and
kind are read from the table; coopmat.common.enums re-exports it with the other Vulkan enums.
SPIR-V facts are kept as enum member names (of coopmat.codegen.spv's Capability and
FPEncoding), so this leaf module imports nothing of the layers above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from coopmat.common.vkenum import VkEnum


class ComponentType(VkEnum):
    """VkComponentTypeKHR."""

    FLOAT16 = 0
    FLOAT32 = 1
    FLOAT64 = 2
    SINT8 = 3
    SINT16 = 4
    SINT32 = 5
    SINT64 = 6
    UINT8 = 7
    UINT16 = 8
    UINT32 = 9
    UINT64 = 10
    BFLOAT16 = 1000141000  # VK_KHR_shader_bfloat16
    SINT8_PACKED_NV = 1000491000  # VK_NV_cooperative_vector
    UINT8_PACKED_NV = 1000491001  # VK_NV_cooperative_vector
    FLOAT8_E4M3 = 1000491002  # VK_EXT_shader_float8
    FLOAT8_E5M2 = 1000491003  # VK_EXT_shader_float8

    @property
    def known(self) -> bool:
        return self.name in type(self).__members__

    # Size and kind from the type's row of the table below (KeyError for a type it lacks).
    @property
    def bits(self) -> int:
        return ELEMENT_TYPES[self].bits

    @property
    def is_float(self) -> bool:
        return ELEMENT_TYPES[self].is_float

    @property
    def is_signed(self) -> bool:
        return ELEMENT_TYPES[self].is_signed


CT = ComponentType


@dataclass(frozen=True)
class ElementType:
    component: CT
    name: str  # numpy-style name, as users write it ("float16", "bfloat16")
    short: str  # the codegen's short name ("f16"), used in kernel names
    bits: int
    kind: str  # "float", "sint" or "uint"
    numpy: np.dtype[Any] | None = None
    webgpu: str | None = None  # GPUSubgroupMatrixComponentType
    # SPIR-V: OpTypeFloat's encoding operand (None: IEEE), capabilities that declaring the
    # type needs, the one for keeping it in a storage buffer, and the module extension.
    spirv_encoding: str | None = None
    spirv_capabilities: tuple[str, ...] = ()
    spirv_storage_capability: str | None = None
    spirv_extension: str | None = None
    # Vulkan: features (VkPhysicalDevice*Features member names) a kernel with this type
    # in cooperative matrices and storage buffers needs, and the device extension.
    features: tuple[str, ...] = ()
    vk_extension: str | None = None
    # As a GEMM operand (A and B): the result type matmul returns by default, and the
    # accumulator (the config's Result type) it computes in. None: not an operand type.
    default_result: CT | None = None
    default_accumulator: CT | None = None

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_signed(self) -> bool:
        return self.kind == "sint"

    @property
    def itemsize(self) -> int:
        return self.bits // 8


_F16_FEATURES = ("shaderFloat16", "storageBuffer16BitAccess")
_I8_FEATURES = ("shaderInt8", "storageBuffer8BitAccess")
_F8_FEATURES = ("shaderFloat8", "shaderFloat8CooperativeMatrix", "storageBuffer8BitAccess")


def _float8(component: CT, name: str, short: str, dtype: Any, encoding: str) -> ElementType:
    return ElementType(
        component, name, short, 8, "float", np.dtype(dtype),
        spirv_encoding=encoding,
        spirv_capabilities=("Float8EXT", "Float8CooperativeMatrixEXT"),
        spirv_storage_capability="StorageBuffer8BitAccess",
        spirv_extension="SPV_EXT_float8", features=_F8_FEATURES,
        vk_extension="VK_EXT_shader_float8",
        default_result=CT.FLOAT32, default_accumulator=CT.FLOAT32)


_ROWS = (
    # float16 @ float16 -> float16 as numpy: accumulated in float32, rounded once at the end
    # (numpy and torch do the same; an f16 accumulator loses ~4 bits at K = 2000).
    ElementType(CT.FLOAT16, "float16", "f16", 16, "float", np.dtype(np.float16), "f16",
                spirv_capabilities=("Float16",),
                spirv_storage_capability="StorageBuffer16BitAccess", features=_F16_FEATURES,
                default_result=CT.FLOAT16, default_accumulator=CT.FLOAT32),
    ElementType(CT.FLOAT32, "float32", "f32", 32, "float", np.dtype(np.float32), "f32",
                default_result=CT.FLOAT32, default_accumulator=CT.FLOAT32),
    ElementType(CT.FLOAT64, "float64", "f64", 64, "float", np.dtype(np.float64),
                spirv_capabilities=("Float64",), features=("shaderFloat64",)),
    # bfloat16 arrays come from ml_dtypes (the dtype JAX and TensorFlow use).
    ElementType(CT.BFLOAT16, "bfloat16", "bf16", 16, "float", np.dtype(ml_dtypes.bfloat16),
                spirv_encoding="BFloat16KHR",
                spirv_capabilities=("BFloat16TypeKHR", "BFloat16CooperativeMatrixKHR"),
                spirv_storage_capability="StorageBuffer16BitAccess",
                spirv_extension="SPV_KHR_bfloat16",
                features=("shaderBFloat16Type", "shaderBFloat16CooperativeMatrix",
                          "storageBuffer16BitAccess"),
                vk_extension="VK_KHR_shader_bfloat16",
                default_result=CT.FLOAT32, default_accumulator=CT.FLOAT32),
    # 8-bit integers widen to 32 bits, where numpy would wrap around in 8 bits.
    ElementType(CT.SINT8, "int8", "s8", 8, "sint", np.dtype(np.int8), "i8",
                spirv_capabilities=("Int8",),
                spirv_storage_capability="StorageBuffer8BitAccess", features=_I8_FEATURES,
                default_result=CT.SINT32, default_accumulator=CT.SINT32),
    ElementType(CT.UINT8, "uint8", "u8", 8, "uint", np.dtype(np.uint8), "u8",
                spirv_capabilities=("Int8",),
                spirv_storage_capability="StorageBuffer8BitAccess", features=_I8_FEATURES,
                default_result=CT.UINT32, default_accumulator=CT.UINT32),
    ElementType(CT.SINT16, "int16", "s16", 16, "sint", np.dtype(np.int16),
                spirv_capabilities=("Int16",),
                spirv_storage_capability="StorageBuffer16BitAccess",
                features=("shaderInt16", "storageBuffer16BitAccess")),
    ElementType(CT.UINT16, "uint16", "u16", 16, "uint", np.dtype(np.uint16),
                spirv_capabilities=("Int16",),
                spirv_storage_capability="StorageBuffer16BitAccess",
                features=("shaderInt16", "storageBuffer16BitAccess")),
    ElementType(CT.SINT32, "int32", "s32", 32, "sint", np.dtype(np.int32), "i32",
                default_result=CT.SINT32, default_accumulator=CT.SINT32),
    ElementType(CT.UINT32, "uint32", "u32", 32, "uint", np.dtype(np.uint32), "u32",
                default_result=CT.UINT32, default_accumulator=CT.UINT32),
    ElementType(CT.SINT64, "int64", "s64", 64, "sint", np.dtype(np.int64),
                spirv_capabilities=("Int64",), features=("shaderInt64",)),
    ElementType(CT.UINT64, "uint64", "u64", 64, "uint", np.dtype(np.uint64),
                spirv_capabilities=("Int64",), features=("shaderInt64",)),
    # VK_NV_cooperative_vector's packed types: four 8-bit lanes in 32 bits; no GEMM use.
    ElementType(CT.SINT8_PACKED_NV, "int8x4", "s8x4", 32, "sint"),
    ElementType(CT.UINT8_PACKED_NV, "uint8x4", "u8x4", 32, "uint"),
    # VK_EXT_shader_float8: OCP FP8. E4M3 has no infinities (max 448), which is
    # ml_dtypes' float8_e4m3fn; E5M2 is IEEE-like, ml_dtypes' float8_e5m2.
    _float8(CT.FLOAT8_E4M3, "float8_e4m3fn", "e4m3", ml_dtypes.float8_e4m3fn,
            "Float8E4M3EXT"),
    _float8(CT.FLOAT8_E5M2, "float8_e5m2", "e5m2", ml_dtypes.float8_e5m2, "Float8E5M2EXT"),
)

ELEMENT_TYPES: dict[CT, ElementType] = {row.component: row for row in _ROWS}
_BY_DTYPE: dict[np.dtype[Any], ElementType] = {
    row.numpy: row for row in _ROWS if row.numpy is not None}
_BY_NAME: dict[str, ElementType] = {row.name: row for row in _ROWS}
_BY_NAME.update({row.short: row for row in _ROWS})
_BY_NAME.update({row.webgpu: row for row in _ROWS if row.webgpu})  # i8, i32, ...
_BY_NAME.setdefault("float8_e4m3", ELEMENT_TYPES[CT.FLOAT8_E4M3])

# Types a GEMM's A and B may have, and the accumulator / result types of those GEMMs.
OPERAND_TYPES = frozenset(r.component for r in _ROWS if r.default_result is not None)
RESULT_TYPES = frozenset(r.default_accumulator for r in _ROWS
                         if r.default_accumulator is not None) | {CT.FLOAT16}


def element(t: int) -> ElementType:
    """The row of a component type (KeyError for a value this table does not know)."""
    return ELEMENT_TYPES[CT(t)]


def known(t: int) -> bool:
    try:
        return CT(t) in ELEMENT_TYPES
    except ValueError:
        return False


def of_dtype(dtype: Any) -> ElementType | None:
    """The row of a numpy dtype (or anything np.dtype accepts), None if none."""
    try:
        return _BY_DTYPE.get(np.dtype(dtype))
    except TypeError:
        return None


def by_name(name: str) -> ElementType | None:
    """The row of a name: numpy-style ("float16") or short ("f16")."""
    return _BY_NAME.get(name.strip().lower())


def numpy_dtype(t: int) -> np.dtype[Any]:
    d = element(t).numpy
    if d is None:
        raise KeyError(f"no numpy dtype holds {CT(t).name}")
    return d


def dtype_name(d: Any) -> str:
    """numpy's name of a dtype, with ml_dtypes' types by their own names."""
    row = of_dtype(d)
    return row.name if row is not None else np.dtype(d).name
