"""A reference interpreter for the SPIR-V compute modules coopmat emits.

Written from the SPIR-V 1.6 specification, SPV_KHR_cooperative_matrix (with
SPV_KHR_bfloat16 and SPV_EXT_float8) and the Vulkan rules for them (memory model,
cooperative-matrix runtime rules), not from coopmat's generator: it shares neither its
opcode tables nor its code, and it also runs the GLSL form of the kernel as glslang
compiles it. No pip-installable SPIR-V interpreter with cooperative matrices exists; the
nearest, mmoult/SPIRV-Interpreter (C++20, built with CMake and Ninja, cooperative matrices
since August 2025), expects valid input and leaves checking it out of scope, while the
point here is to check the kernels.

    interp = Interpreter(spirv, subgroup_size=32, matrix_configs=[...])
    interp.dispatch((gx, gy, gz), {0: a, 1: b, 2: d}, push_constants)

It also runs OpenCL kernels (Kernel modules: Physical64 addressing, the OpenCL memory
model, global-pointer and scalar arguments, OpPtrAccessChain, OpenCL.std's u_min, a
required sub-group size) with SPV_INTEL_subgroup_matrix_multiply_accumulate's
OpSubgroupMatrixMultiplyAccumulateINTEL, written from that extension's text
(intel_mma.py; `mma_configs` checks each instruction against a device's supported list):

    interp = Interpreter(spirv, subgroup_size=16, mma_configs=[MmaConfig(...), ...])
    interp.dispatch_kernel((gx, gy, gz), [a, b, d, M, N, K, lda, ldb, ldd])

Executed: one workgroup at a time, its invocations in lockstep and vectorised with numpy
(machine.py); barriers are synchronisation points, and with lockstep="subgroup" each
subgroup runs as a generator that meets the others only there. Structured control flow
(OpSelectionMerge, OpLoopMerge, OpBranchConditional, OpPhi, OpFunctionCall). Storage
buffers, push constants, Workgroup memory, Function/Private variables (arrays of
matrices included), specialization constants (OpSpecConstant*, OpSpecConstantOp).

Instructions: integer and float arithmetic, bit operations, shifts, integer and float
comparisons, logical operations, OpSelect, conversions (U/S/FConvert, ConvertUToF...,
Bitcast), composites (OpVectorShuffle too), OpVectorTimesScalar, OpDot, OpLoad/OpStore/
OpAccessChain with memory operands, OpControlBarrier, atomics (OpAtomicIAdd, Load, Store:
in dispatch order), subgroup reductions (OpGroupNonUniform IAdd, FAdd, IMul, FMul, S/U/F
Min and Max, Reduce only) and shuffles (Shuffle, ShuffleXor) (subgroup.py), 8-bit packed
integer dot products (OpSDot, OpUDot, OpSUDot), the GLSL.std.450 instructions coopmat uses
(glsl.py), and the cooperative matrix ones: OpCooperativeMatrixLoadKHR/StoreKHR
(row/column-major, stride in units of the pointee type), OpCooperativeMatrixMulAddKHR
(sign or zero extension as its operands say), OpCooperativeMatrixLengthKHR, per-element
access, OpMatrixTimesScalar. Anything else (an opcode, capability, extension, decoration,
execution mode) is refused when the module is loaded.

Reported as undefined behavior: data races, workgroup-memory communication without
availability and visibility, tangled instructions in non-uniform control flow, operands
that must be subgroup-uniform and are not, misaligned cooperative-matrix pointers and
strides (VUID-...-08986), accesses outside a buffer or array, matrix types and
multiply-adds that match no entry of the device's list, division by zero, out-of-range
shifts. Not modelled: images, scans and other subgroup operations, saturating
accumulation; the nv2 family (workgroup scope, tensor addressing)
keeps its own interpreter in tests/nv2_emulator.py.
"""

from . import glsl, opencl, subgroup  # noqa: F401  (they register their instructions)
from .intel_mma import MmaConfig
from .machine import Interpreter, MatrixConfig, component_name
from .memory import DataRace
from .module import InterpreterError, Module, UndefinedBehavior, Unsupported

__all__ = ["DataRace", "Interpreter", "InterpreterError", "MatrixConfig", "MmaConfig", "Module",
           "UndefinedBehavior", "Unsupported", "component_name"]
