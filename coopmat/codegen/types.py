"""SPIR-V declarations for the component types of cooperative matrices."""

from __future__ import annotations

from coopmat.codegen.builder import ModuleBuilder
from coopmat.codegen.spv import Capability, CooperativeMatrixOperands, FPEncoding
from coopmat.common.dtypes import OPERAND_TYPES, RESULT_TYPES, element
from coopmat.common.enums import ComponentType

__all__ = ["OPERAND_TYPES", "RESULT_TYPES", "scalar_type", "signedness_operands",
           "type_capabilities", "type_extension", "vulkan_features"]


def scalar_type(mb: ModuleBuilder, t: ComponentType) -> int:
    """Declare the scalar type of `t`; integer signedness follows the component type."""
    row = element(t)
    if row.is_float:
        encoding = FPEncoding[row.spirv_encoding] if row.spirv_encoding else None
        return mb.type_float(row.bits, encoding)
    return mb.type_int(row.bits, row.is_signed)


def type_capabilities(t: ComponentType, in_storage_buffer: bool) -> list[Capability]:
    """Capabilities for declaring `t` (and, if asked, keeping it in a storage buffer)."""
    row = element(t)
    caps = [Capability[name] for name in row.spirv_capabilities]
    if in_storage_buffer and row.spirv_storage_capability:
        caps.append(Capability[row.spirv_storage_capability])
    return caps


def type_extension(t: ComponentType) -> str | None:
    """The SPIR-V extension that declaring `t` needs, if any."""
    return element(t).spirv_extension


def vulkan_features(caps: set[Capability]) -> tuple[str, ...]:
    """Vulkan feature names (as in VkPhysicalDevice*Features) that `caps` need."""
    names = {
        Capability.Float16: "shaderFloat16",
        Capability.Int16: "shaderInt16",
        Capability.Int8: "shaderInt8",
        Capability.StorageBuffer16BitAccess: "storageBuffer16BitAccess",
        Capability.StorageBuffer8BitAccess: "storageBuffer8BitAccess",
        Capability.BFloat16TypeKHR: "shaderBFloat16Type",
        Capability.BFloat16CooperativeMatrixKHR: "shaderBFloat16CooperativeMatrix",
        Capability.Float8EXT: "shaderFloat8",
        Capability.Float8CooperativeMatrixEXT: "shaderFloat8CooperativeMatrix",
        Capability.VulkanMemoryModel: "vulkanMemoryModel",
        Capability.CooperativeMatrixKHR: "cooperativeMatrix",
        Capability.DotProduct: "shaderIntegerDotProduct",
        Capability.DotProductInput4x8BitPacked: "shaderIntegerDotProduct",
        Capability.CooperativeMatrixTensorAddressingNV: "cooperativeMatrixTensorAddressing",
        Capability.CooperativeMatrixPerElementOperationsNV:
            "cooperativeMatrixPerElementOperations",
        # TensorAddressingNV (layout/view types) has no feature of its own: Vulkan enables
        # it with cooperativeMatrixTensorAddressing.
        Capability.TensorAddressingNV: "cooperativeMatrixTensorAddressing",
    }
    return tuple(sorted({names[c] for c in caps if c in names}))


def signedness_operands(a: ComponentType, b: ComponentType, c: ComponentType,
                        result: ComponentType) -> int:
    """The Cooperative Matrix Operands of a MulAdd: a Signed bit for each signed integer
    matrix, so i8 is sign-extended and u8 zero-extended as the spec says."""
    flags = CooperativeMatrixOperands.NONE
    for ct, bit in ((a, CooperativeMatrixOperands.MatrixASigned),
                    (b, CooperativeMatrixOperands.MatrixBSigned),
                    (c, CooperativeMatrixOperands.MatrixCSigned),
                    (result, CooperativeMatrixOperands.MatrixResultSigned)):
        if element(ct).is_signed:
            flags |= bit
    return int(flags)
