"""SPIR-V numbers the generator uses: opcodes and enumerants.

Values are from the SPIR-V 1.6 unified specification, the KHR extension specs
(SPV_KHR_cooperative_matrix, SPV_KHR_bfloat16) and the NV ones (SPV_NV_cooperative_matrix2,
SPV_NV_tensor_addressing; numbers as in SPIRV-Headers' spirv.core.grammar.json). Only
what the kernels need is listed; `spirv-dis` on a generated module is the quickest check
that a number is right.
"""

from __future__ import annotations

import enum

MAGIC = 0x07230203


class Op(enum.IntEnum):
    Name = 5
    MemberName = 6
    Extension = 10
    ExtInstImport = 11
    ExtInst = 12
    MemoryModel = 14
    EntryPoint = 15
    ExecutionMode = 16
    Capability = 17
    TypeVoid = 19
    TypeBool = 20
    TypeInt = 21
    TypeFloat = 22
    TypeVector = 23
    TypeArray = 28
    TypeRuntimeArray = 29
    TypeStruct = 30
    TypePointer = 32
    TypeFunction = 33
    ConstantTrue = 41
    ConstantFalse = 42
    Constant = 43
    ConstantComposite = 44
    ConstantNull = 46
    SpecConstantTrue = 48
    SpecConstantFalse = 49
    SpecConstant = 50
    Function = 54
    FunctionParameter = 55
    FunctionEnd = 56
    Variable = 59
    Load = 61
    Store = 62
    AccessChain = 65
    PtrAccessChain = 67
    Decorate = 71
    MemberDecorate = 72
    VectorShuffle = 79
    CompositeConstruct = 80
    CompositeExtract = 81
    ConvertFToU = 109
    ConvertFToS = 110
    ConvertSToF = 111
    ConvertUToF = 112
    UConvert = 113
    SConvert = 114
    FConvert = 115
    Bitcast = 124
    FNegate = 127
    IAdd = 128
    FAdd = 129
    ISub = 130
    FSub = 131
    IMul = 132
    FMul = 133
    FDiv = 136
    UDiv = 134
    UMod = 137
    VectorTimesScalar = 142
    MatrixTimesScalar = 143
    Dot = 148
    LogicalOr = 166
    LogicalAnd = 167
    LogicalNot = 168
    Select = 169
    IEqual = 170
    INotEqual = 171
    UGreaterThan = 172
    ULessThan = 176
    ULessThanEqual = 178
    FOrdEqual = 180
    FOrdLessThan = 184
    FOrdGreaterThanEqual = 190
    ShiftRightLogical = 194
    ShiftRightArithmetic = 195
    ShiftLeftLogical = 196
    BitwiseOr = 197
    BitwiseXor = 198
    BitwiseAnd = 199
    BitFieldSExtract = 202
    BitFieldUExtract = 203
    ControlBarrier = 224
    AtomicStore = 228
    AtomicIAdd = 234
    LoopMerge = 246
    SelectionMerge = 247
    Label = 248
    Branch = 249
    BranchConditional = 250
    Return = 253
    ReturnValue = 254
    GroupNonUniformShuffle = 345
    GroupNonUniformShuffleXor = 346
    GroupNonUniformFAdd = 350
    GroupNonUniformFMax = 358
    # SPV_KHR_integer_dot_product (core in SPIR-V 1.6)
    SDot = 4450
    UDot = 4451
    SUDot = 4452
    # SPV_KHR_cooperative_matrix
    TypeCooperativeMatrixKHR = 4456
    CooperativeMatrixLoadKHR = 4457
    CooperativeMatrixStoreKHR = 4458
    CooperativeMatrixMulAddKHR = 4459
    CooperativeMatrixLengthKHR = 4460
    # SPV_NV_cooperative_matrix2
    CooperativeMatrixConvertNV = 5293
    CooperativeMatrixReduceNV = 5366
    CooperativeMatrixPerElementOpNV = 5369
    CooperativeMatrixLoadTensorNV = 5367
    CooperativeMatrixStoreTensorNV = 5368
    # SPV_NV_tensor_addressing
    TypeTensorLayoutNV = 5370
    TypeTensorViewNV = 5371
    CreateTensorLayoutNV = 5372
    TensorLayoutSetDimensionNV = 5373
    TensorLayoutSetStrideNV = 5374
    TensorLayoutSliceNV = 5375
    TensorLayoutSetClampValueNV = 5376
    CreateTensorViewNV = 5377
    TensorViewSetDimensionNV = 5378
    TensorViewSetStrideNV = 5379
    TensorViewSetClipNV = 5382
    TensorLayoutSetBlockSizeNV = 5384
    # SPV_INTEL_subgroup_matrix_multiply_accumulate
    SubgroupMatrixMultiplyAccumulateINTEL = 6237


class Capability(enum.IntEnum):
    Shader = 1
    Addresses = 4
    Kernel = 6
    Vector16 = 7
    Float16 = 9
    Float64 = 10
    Int64 = 11
    Int16 = 22
    Int8 = 39
    SubgroupDispatch = 58
    GroupNonUniform = 61
    GroupNonUniformArithmetic = 63
    GroupNonUniformShuffle = 65
    StorageBuffer16BitAccess = 4433
    Float8EXT = 4212
    Float8CooperativeMatrixEXT = 4213
    StorageBuffer8BitAccess = 4448
    BFloat16TypeKHR = 5116
    BFloat16CooperativeMatrixKHR = 5118
    VulkanMemoryModel = 5345
    VulkanMemoryModelDeviceScope = 5346
    PhysicalStorageBufferAddresses = 5347
    CooperativeMatrixReductionsNV = 5430
    CooperativeMatrixConversionsNV = 5431
    CooperativeMatrixPerElementOperationsNV = 5432
    CooperativeMatrixTensorAddressingNV = 5433
    CooperativeMatrixBlockLoadsNV = 5434
    TensorAddressingNV = 5439
    DotProductInput4x8BitPacked = 6018
    DotProduct = 6019
    CooperativeMatrixKHR = 6022
    SubgroupMatrixMultiplyAccumulateINTEL = 6236


class GLSLstd450(enum.IntEnum):
    """Instructions of the GLSL.std.450 extended instruction set (its spec's numbers)."""

    Trunc = 3
    FAbs = 4
    FSign = 6
    Tanh = 21
    Exp = 27
    Exp2 = 29
    InverseSqrt = 32
    FMin = 37
    FMax = 40
    FClamp = 43
    Fma = 50


class OpenCLstd(enum.IntEnum):
    """Instructions of the OpenCL.std extended instruction set (its spec's numbers)."""

    u_min = 159


class PackedVectorFormat(enum.IntEnum):
    """How OpSDot/OpUDot/OpSUDot read 32-bit scalar operands (SPV_KHR_integer_dot_product)."""

    PackedVectorFormat4x8Bit = 0


class AddressingModel(enum.IntEnum):
    Logical = 0
    Physical64 = 2
    PhysicalStorageBuffer64 = 5348


class MemoryModel(enum.IntEnum):
    OpenCL = 2
    Vulkan = 3


class ExecutionModel(enum.IntEnum):
    GLCompute = 5
    Kernel = 6


class ExecutionMode(enum.IntEnum):
    LocalSize = 17
    SubgroupSize = 35


class StorageClass(enum.IntEnum):
    Input = 1
    Workgroup = 4
    CrossWorkgroup = 5
    Private = 6
    Function = 7
    PushConstant = 9
    StorageBuffer = 12
    PhysicalStorageBuffer = 5349


class Decoration(enum.IntEnum):
    SpecId = 1
    Block = 2
    ArrayStride = 6
    BuiltIn = 11
    Restrict = 19
    NonWritable = 24
    NonReadable = 25
    Binding = 33
    DescriptorSet = 34
    Offset = 35


class BuiltIn(enum.IntEnum):
    WorkgroupId = 26
    LocalInvocationId = 27
    LocalInvocationIndex = 29
    SubgroupSize = 36
    SubgroupId = 40
    SubgroupLocalInvocationId = 41


class GroupOperation(enum.IntEnum):
    Reduce = 0


class Scope(enum.IntEnum):
    Device = 1
    Workgroup = 2
    Subgroup = 3
    Invocation = 4
    QueueFamily = 5


class MemorySemantics(enum.IntFlag):
    NONE = 0
    AcquireRelease = 0x8
    UniformMemory = 0x40
    WorkgroupMemory = 0x100


class LoopControl(enum.IntFlag):
    NONE = 0x0
    Unroll = 0x1
    DontUnroll = 0x2


class MemoryAccess(enum.IntFlag):
    NONE = 0
    Aligned = 0x2
    MakePointerAvailable = 0x8
    MakePointerVisible = 0x10
    NonPrivatePointer = 0x20


class FPEncoding(enum.IntEnum):
    BFloat16KHR = 0
    Float8E4M3EXT = 4214
    Float8E5M2EXT = 4215


class CooperativeMatrixUse(enum.IntEnum):
    MatrixA = 0
    MatrixB = 1
    MatrixAccumulator = 2


class CooperativeMatrixLayout(enum.IntEnum):
    RowMajor = 0
    ColumnMajor = 1


class CooperativeMatrixOperands(enum.IntFlag):
    NONE = 0
    MatrixASigned = 0x1
    MatrixBSigned = 0x2
    MatrixCSigned = 0x4
    MatrixResultSigned = 0x8
    SaturatingAccumulation = 0x10


class TensorClampMode(enum.IntEnum):
    """SPV_NV_tensor_addressing: what loads/stores do at coordinates outside the tensor."""

    Undefined = 0
    Constant = 1  # loads give the layout's clamp value; stores are discarded
    ClampToEdge = 2
    Repeat = 3
    RepeatMirrored = 4


class CooperativeMatrixReduce(enum.IntFlag):
    """SPV_NV_cooperative_matrix2's Cooperative Matrix Reduce Mode."""

    Row = 0x1
    Column = 0x2
    TwoByTwo = 0x4


class TensorAddressingOperands(enum.IntFlag):
    NONE = 0
    TensorView = 0x1
    DecodeFunc = 0x2
