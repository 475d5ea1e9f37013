"""SPIR-V declarations for the component types of cooperative matrices."""

from __future__ import annotations

from coopmat.codegen.builder import ModuleBuilder
from coopmat.codegen.spv import Capability, CooperativeMatrixOperands, FPEncoding
from coopmat.device.enums import ComponentType

# The element types a GEMM operand (A, B) and a result (C, D) may have here.
OPERAND_TYPES = frozenset({
    ComponentType.FLOAT16, ComponentType.BFLOAT16, ComponentType.FLOAT32,
    ComponentType.SINT8, ComponentType.UINT8, ComponentType.SINT16, ComponentType.UINT16,
    ComponentType.SINT32, ComponentType.UINT32,
})
RESULT_TYPES = frozenset({
    ComponentType.FLOAT16, ComponentType.FLOAT32, ComponentType.SINT32, ComponentType.UINT32,
})


def scalar_type(mb: ModuleBuilder, t: ComponentType) -> int:
    """Declare the scalar type of `t`; integer signedness follows the component type."""
    if t == ComponentType.BFLOAT16:
        return mb.type_float(16, FPEncoding.BFloat16KHR)
    if t.is_float:
        return mb.type_float(t.bits)
    return mb.type_int(t.bits, t.is_signed)


def type_capabilities(t: ComponentType, in_storage_buffer: bool) -> list[Capability]:
    """Capabilities for declaring `t` (and, if asked, keeping it in a storage buffer)."""
    caps: list[Capability] = []
    if t == ComponentType.BFLOAT16:
        caps += [Capability.BFloat16TypeKHR, Capability.BFloat16CooperativeMatrixKHR]
    elif t == ComponentType.FLOAT16:
        caps.append(Capability.Float16)
    elif t.bits == 16:
        caps.append(Capability.Int16)
    elif t.bits == 8:
        caps.append(Capability.Int8)
    if in_storage_buffer and t.bits == 16:
        caps.append(Capability.StorageBuffer16BitAccess)
    if in_storage_buffer and t.bits == 8:
        caps.append(Capability.StorageBuffer8BitAccess)
    return caps


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
        Capability.VulkanMemoryModel: "vulkanMemoryModel",
        Capability.CooperativeMatrixKHR: "cooperativeMatrix",
        Capability.CooperativeMatrixTensorAddressingNV: "cooperativeMatrixTensorAddressing",
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
        if not ct.is_float and ct.is_signed:
            flags |= bit
    return int(flags)
