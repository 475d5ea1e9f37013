"""A helper kernel: copy whole 16-byte units from one buffer to another.

A shader writing a small result into host memory behind a GEMM costs the submission
about half of what a vkCmdCopyBuffer on the compute queue does (docs/design.md, Data
path). Executor records such downloads with this kernel (dispatch.executor.shader_copy_fits
says which).

Each invocation copies one unit: dst[dst0 + i] = src[src0 + i] for i < count.

Push constants (u32): count, src0, dst0 (all in 16-byte units).
Bindings: 0 = src, 1 = dst (16-byte vectors).
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

from coopmat.codegen.kernel import HelperKernel
from coopmat.codegen.shader import MAX_GROUPS_X, ShaderContext
from coopmat.codegen.spv import BuiltIn, Capability, Op
from coopmat.codegen.types import vulkan_features

PUSH_FIELDS = ("count", "src0", "dst0")
UNIT = 16  # bytes an invocation copies
GROUP = 256
MAX_BYTES = MAX_GROUPS_X * GROUP * UNIT


@dataclass(frozen=True)
class CopyTraits:
    """The pipeline cache key: one kernel serves every copy."""

    def describe(self) -> str:
        return "copy-16B"


@dataclass(frozen=True)
class CopyKernel(HelperKernel):
    local_size: tuple[int, int, int] = (GROUP, 1, 1)
    push_constant_size: int = 4 * len(PUSH_FIELDS)

    @staticmethod
    def units(nbytes: int) -> int:
        """16-byte units covering nbytes: the copy writes up to 15 bytes past nbytes."""
        return -(-nbytes // UNIT)

    @staticmethod
    def workgroups(nbytes: int) -> tuple[int, int, int]:
        if nbytes > MAX_BYTES:
            raise ValueError(f"a shader copy takes at most {MAX_BYTES} bytes, not {nbytes}")
        return (-(-CopyKernel.units(nbytes) // GROUP), 1, 1)

    @staticmethod
    def push_constants(nbytes: int, src_offset: int, dst_offset: int) -> bytes:
        if src_offset % UNIT or dst_offset % UNIT:
            raise ValueError(f"a shader copy's offsets are multiples of {UNIT} bytes, not "
                             f"{src_offset} and {dst_offset}")
        return struct.pack("<3I", CopyKernel.units(nbytes), src_offset // UNIT,
                           dst_offset // UNIT)


def _emit() -> bytes:
    s = ShaderContext()
    mb, f = s.mb, s.f
    uvec4 = mb.type_vector(s.u32, 4)
    src = s.storage_buffer(0, uvec4, UNIT, True, "src", restrict=True)
    dst = s.storage_buffer(1, uvec4, UNIT, False, "dst", restrict=True)
    s.push_constants(PUSH_FIELDS, [s.u32] * len(PUSH_FIELDS))
    count, src0, dst0 = (s.param(name) for name in PUSH_FIELDS)
    wg = s.builtin(BuiltIn.WorkgroupId, mb.type_vector(s.u32, 3))
    tid = s.builtin(BuiltIn.LocalInvocationIndex, s.u32)
    i = s.add(s.mul(f.op(Op.CompositeExtract, s.u32, wg, 0), s.c(GROUP)), tid)

    def body() -> None:
        s.buffer_store(dst, s.add(dst0, i), s.buffer_load(src, s.add(src0, i)))

    f.if_(s.lt(i, count), body)
    return s.compute_module(GROUP)


@functools.cache
def copy_kernel() -> CopyKernel:
    return CopyKernel(CopyTraits(), _emit(), vulkan_features({Capability.VulkanMemoryModel}))
