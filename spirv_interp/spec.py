"""Numbers of the SPIR-V binary form that the interpreter reads.

Written from the SPIR-V 1.6 unified specification and the extension specifications
(SPV_KHR_cooperative_matrix, SPV_KHR_bfloat16, SPV_EXT_float8,
SPV_INTEL_subgroup_matrix_multiply_accumulate) and the OpenCL.std extended instruction set,
whose machine-readable form is SPIRV-Headers' spirv.core.grammar.json;
tests/interpreter/test_interpreter.py and test_intel.py check the opcode names against
spirv-dis. Deliberately not imported from coopmat.codegen.spv: the
interpreter must not share the generator's reading of the specification.
"""

from __future__ import annotations

import enum

MAGIC = 0x07230203


class Op(enum.IntEnum):
    Nop = 0
    Undef = 1
    SourceContinued = 2
    Source = 3
    SourceExtension = 4
    Name = 5
    MemberName = 6
    String = 7
    Line = 8
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
    SpecConstantComposite = 51
    SpecConstantOp = 52
    Function = 54
    FunctionParameter = 55
    FunctionEnd = 56
    FunctionCall = 57
    Variable = 59
    Load = 61
    Store = 62
    AccessChain = 65
    InBoundsAccessChain = 66
    PtrAccessChain = 67
    InBoundsPtrAccessChain = 70
    Decorate = 71
    MemberDecorate = 72
    VectorShuffle = 79
    CompositeConstruct = 80
    CompositeExtract = 81
    CompositeInsert = 82
    CopyObject = 83
    ConvertFToU = 109
    ConvertFToS = 110
    ConvertSToF = 111
    ConvertUToF = 112
    UConvert = 113
    SConvert = 114
    FConvert = 115
    Bitcast = 124
    SNegate = 126
    FNegate = 127
    IAdd = 128
    FAdd = 129
    ISub = 130
    FSub = 131
    IMul = 132
    FMul = 133
    UDiv = 134
    SDiv = 135
    FDiv = 136
    UMod = 137
    VectorTimesScalar = 142
    MatrixTimesScalar = 143
    Dot = 148
    LogicalEqual = 164
    LogicalNotEqual = 165
    LogicalOr = 166
    LogicalAnd = 167
    LogicalNot = 168
    Select = 169
    IEqual = 170
    INotEqual = 171
    UGreaterThan = 172
    SGreaterThan = 173
    UGreaterThanEqual = 174
    SGreaterThanEqual = 175
    ULessThan = 176
    SLessThan = 177
    ULessThanEqual = 178
    SLessThanEqual = 179
    FOrdEqual = 180
    FUnordEqual = 181
    FOrdNotEqual = 182
    FUnordNotEqual = 183
    FOrdLessThan = 184
    FUnordLessThan = 185
    FOrdGreaterThan = 186
    FUnordGreaterThan = 187
    FOrdLessThanEqual = 188
    FUnordLessThanEqual = 189
    FOrdGreaterThanEqual = 190
    FUnordGreaterThanEqual = 191
    ShiftRightLogical = 194
    ShiftRightArithmetic = 195
    ShiftLeftLogical = 196
    BitwiseOr = 197
    BitwiseXor = 198
    BitwiseAnd = 199
    Not = 200
    ControlBarrier = 224
    MemoryBarrier = 225
    AtomicLoad = 227
    AtomicStore = 228
    AtomicIAdd = 234
    Phi = 245
    LoopMerge = 246
    SelectionMerge = 247
    Label = 248
    Branch = 249
    BranchConditional = 250
    Switch = 251
    Kill = 252
    Return = 253
    ReturnValue = 254
    Unreachable = 255
    ModuleProcessed = 330
    ExecutionModeId = 331
    GroupNonUniformShuffle = 345
    GroupNonUniformShuffleXor = 346
    GroupNonUniformIAdd = 349
    GroupNonUniformFAdd = 350
    GroupNonUniformIMul = 351
    GroupNonUniformFMul = 352
    GroupNonUniformSMin = 353
    GroupNonUniformUMin = 354
    GroupNonUniformFMin = 355
    GroupNonUniformSMax = 356
    GroupNonUniformUMax = 357
    GroupNonUniformFMax = 358
    SDot = 4450
    UDot = 4451
    SUDot = 4452
    TypeCooperativeMatrixKHR = 4456
    CooperativeMatrixLoadKHR = 4457
    CooperativeMatrixStoreKHR = 4458
    CooperativeMatrixMulAddKHR = 4459
    CooperativeMatrixLengthKHR = 4460
    SubgroupMatrixMultiplyAccumulateINTEL = 6237


class Capability(enum.IntEnum):
    """The capabilities whose semantics the interpreter implements; any other one in a
    module is refused (the module might rely on behaviour it does not model)."""

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
    Float8EXT = 4212
    Float8CooperativeMatrixEXT = 4213
    StorageBuffer16BitAccess = 4433
    StorageBuffer8BitAccess = 4448
    BFloat16TypeKHR = 5116
    BFloat16CooperativeMatrixKHR = 5118
    VulkanMemoryModel = 5345
    VulkanMemoryModelDeviceScope = 5346
    DotProductInputAll = 6016
    DotProductInput4x8Bit = 6017
    DotProductInput4x8BitPacked = 6018
    DotProduct = 6019
    CooperativeMatrixKHR = 6022
    SubgroupMatrixMultiplyAccumulateINTEL = 6236


# Extensions whose instructions and rules the interpreter implements.
KNOWN_EXTENSIONS = frozenset({
    "SPV_KHR_cooperative_matrix", "SPV_KHR_bfloat16", "SPV_EXT_float8",
    "SPV_KHR_vulkan_memory_model", "SPV_KHR_storage_buffer_storage_class",
    "SPV_KHR_8bit_storage", "SPV_KHR_16bit_storage",
    "SPV_INTEL_subgroup_matrix_multiply_accumulate",
})


class AddressingModel(enum.IntEnum):
    Logical = 0
    Physical32 = 1
    Physical64 = 2


class MemoryModel(enum.IntEnum):
    GLSL450 = 1
    OpenCL = 2
    Vulkan = 3


class ExecutionModel(enum.IntEnum):
    GLCompute = 5
    Kernel = 6


class ExecutionMode(enum.IntEnum):
    LocalSize = 17
    SubgroupSize = 35
    LocalSizeId = 38


class StorageClass(enum.IntEnum):
    UniformConstant = 0
    Input = 1
    Uniform = 2
    Output = 3
    Workgroup = 4
    CrossWorkgroup = 5
    Private = 6
    Function = 7
    PushConstant = 9
    StorageBuffer = 12
    PhysicalStorageBuffer = 5349


class Decoration(enum.IntEnum):
    RelaxedPrecision = 0
    SpecId = 1
    Block = 2
    BufferBlock = 3
    ArrayStride = 6
    BuiltIn = 11
    Restrict = 19
    Aliased = 20
    Volatile = 21
    Coherent = 23
    NonWritable = 24
    NonReadable = 25
    Binding = 33
    DescriptorSet = 34
    Offset = 35
    FPRoundingMode = 39
    NoContraction = 42


class BuiltIn(enum.IntEnum):
    NumWorkgroups = 24
    WorkgroupSize = 25
    WorkgroupId = 26
    LocalInvocationId = 27
    GlobalInvocationId = 28
    LocalInvocationIndex = 29
    SubgroupSize = 36
    NumSubgroups = 38
    SubgroupId = 40
    SubgroupLocalInvocationId = 41


class Scope(enum.IntEnum):
    CrossDevice = 0
    Device = 1
    Workgroup = 2
    Subgroup = 3
    Invocation = 4
    QueueFamily = 5


# Scopes that include every invocation of a workgroup (Scope's numbering is not ordered).
WORKGROUP_OR_WIDER = frozenset({Scope.CrossDevice, Scope.Device, Scope.Workgroup,
                                Scope.QueueFamily})


class GroupOperation(enum.IntEnum):
    Reduce = 0
    InclusiveScan = 1
    ExclusiveScan = 2


class PackedVectorFormat(enum.IntEnum):
    PackedVectorFormat4x8Bit = 0


class MemorySemantics(enum.IntFlag):
    Relaxed = 0
    Acquire = 0x2
    Release = 0x4
    AcquireRelease = 0x8
    SequentiallyConsistent = 0x10
    UniformMemory = 0x40
    SubgroupMemory = 0x80
    WorkgroupMemory = 0x100
    CrossWorkgroupMemory = 0x200
    AtomicCounterMemory = 0x400
    ImageMemory = 0x800
    OutputMemory = 0x1000
    MakeAvailable = 0x2000
    MakeVisible = 0x4000
    Volatile = 0x8000


class MemoryAccess(enum.IntFlag):
    NONE = 0
    Volatile = 0x1
    Aligned = 0x2
    Nontemporal = 0x4
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


class MatrixMultiplyAccumulateOperands(enum.IntFlag):
    """SPV_INTEL_subgroup_matrix_multiply_accumulate's Matrix Multiply Accumulate Operands."""

    NONE = 0
    MatrixASignedComponentsINTEL = 0x1
    MatrixBSignedComponentsINTEL = 0x2
    MatrixCBFloat16INTEL = 0x4
    MatrixResultBFloat16INTEL = 0x8
    MatrixAPackedInt8INTEL = 0x10
    MatrixBPackedInt8INTEL = 0x20
    MatrixAPackedInt4INTEL = 0x40
    MatrixBPackedInt4INTEL = 0x80
    MatrixATF32INTEL = 0x100
    MatrixBTF32INTEL = 0x200
    MatrixAPackedFloat16INTEL = 0x400
    MatrixBPackedFloat16INTEL = 0x800
    MatrixAPackedBFloat16INTEL = 0x1000
    MatrixBPackedBFloat16INTEL = 0x2000


class OpenCLstd(enum.IntEnum):
    """Instructions of the OpenCL.std extended instruction set that the interpreter runs."""

    u_min = 159
