"""The first pass of masked attention with block skipping (traits.skip_blocks): one 32-bit
word per (workgroup z, row block, key step) of the attention kernel that follows, nonzero
where any score of that block survives the mask, so that the kernel skips the steps whose
every score the mask hides.

Word w = (z x row_blocks + row block) x steps + step, z counting kv heads of every batch
entry (outer x kv_heads + kv head), or 0 where the mask is the same for all of them (the
caller passes zs 1 and the kernel's FLAG_SHARED_BLOCKS). A block covers rows R in
[row block x block_rows, + block_rows) of groups x Lq (R = g Lq + i: query i of q head
kv head x groups + g, as the attention kernel walks them) and keys [step x keys, + keys);
rows past groups x Lq and keys past Lk count as hidden. The mask is addressed as the
attention kernel addresses it (m_base + outer m_outer + q head m_head + i m_row + j m_col,
strides of 0 where broadcast).

The mask is read as 32-bit words and its elements (1 or 2 bytes: elem_shift 0 or 1) taken
out of them, so that one kernel serves booleans, float16 and bfloat16 without 8- or 16-bit
storage: an element hides its score where its bits equal `hidden` (0 for a boolean, -inf's
bits for an additive mask; a NaN counts as visible, as it reaches the scores). Pooled
buffers are whole words long, so the word holding the last element is inside the binding.

One workgroup (LANES invocations) a word: invocation t tests elements t, t + LANES, ... of
the block (adjacent invocations adjacent keys) until it sees a visible one; the flags meet
in shared memory and invocation 0 writes the word.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from coopmat.codegen.shader import ShaderContext, folded_grid, folded_push_constants
from coopmat.codegen.spv import BuiltIn, Capability, LoopControl, Op, Scope
from coopmat.codegen.types import vulkan_features

PUSH_FIELDS = ("count", "groups_x", "Lq", "Lk", "groups", "kv_heads", "block_rows", "keys",
               "row_blocks", "steps", "m_base", "m_row", "m_col", "m_outer", "m_head",
               "elem_shift", "hidden")
LANES = 128  # a multiple of every device's maxSubgroupSize: no subgroup size is required
BINDING_MASK, BINDING_WORDS = 0, 1
# The bits of a masked-out element: a boolean's false, an additive mask's -inf.
HIDDEN_BOOL, HIDDEN_F16, HIDDEN_BF16 = 0x0000, 0xFC00, 0xFF80


@dataclass(frozen=True)
class BlockTraits:
    """The pass's pipeline key (one kernel for every mask and tile)."""

    invocations: int = LANES

    def describe(self) -> str:
        return f"attn-blocks-i{self.invocations}"

    @property
    def storage_checks(self) -> bool:
        return True


@dataclass(frozen=True)
class BlockKernel:
    traits: BlockTraits
    spirv: bytes
    features: tuple[str, ...]
    push_constant_size: int = 4 * len(PUSH_FIELDS)
    required_subgroup_size: int | None = None
    shared_memory_bytes: int = 4 * LANES
    local_size: tuple[int, int, int] = (LANES, 1, 1)
    bindings: tuple[int, ...] = (BINDING_MASK, BINDING_WORDS)

    @staticmethod
    def workgroups(count: int) -> tuple[int, int, int]:
        """The grid of `count` words."""
        return folded_grid(count)

    @staticmethod
    def push_constants(values: dict[str, int]) -> bytes:
        return folded_push_constants("attention blocks", PUSH_FIELDS, values)


def _emit() -> bytes:
    s = ShaderContext()
    f = s.f
    mask = s.storage_buffer(BINDING_MASK, s.u32, 4, True, "mask", restrict=True)
    words = s.storage_buffer(BINDING_WORDS, s.u32, 4, False, "words", restrict=True)
    flags = s.shared_array(s.u32, LANES, "flags")
    s.push_constants(PUSH_FIELDS, [s.u32] * len(PUSH_FIELDS))
    P = {name: s.param(name) for name in PUSH_FIELDS}
    wg = s.builtin(BuiltIn.WorkgroupId, s.mb.type_vector(s.u32, 3))
    tid = s.builtin(BuiltIn.LocalInvocationIndex, s.u32)
    wx, wy = (f.op(Op.CompositeExtract, s.u32, wg, i) for i in range(2))
    w = s.add(s.mul(wy, P["groups_x"]), wx)

    def ne(a: int, b: int) -> int:
        return f.op(Op.INotEqual, s.bool, a, b)

    def body() -> None:
        step, rest = s.umod(w, P["steps"]), s.udiv(w, P["steps"])
        block, z = s.umod(rest, P["row_blocks"]), s.udiv(rest, P["row_blocks"])
        outer, kv = s.udiv(z, P["kv_heads"]), s.umod(z, P["kv_heads"])
        r0, k0 = s.mul(block, P["block_rows"]), s.mul(step, P["keys"])
        rows = s.mul(P["groups"], P["Lq"])
        total = s.mul(P["block_rows"], P["keys"])
        start = s.add(P["m_base"], s.mul(outer, P["m_outer"]))
        # Elements a word holds (4 or 2), and the mask of one element's bits.
        per_word = s.f.op(Op.ShiftRightLogical, s.u32, s.c(4), P["elem_shift"])
        width = f.op(Op.ShiftLeftLogical, s.u32, s.c(8), P["elem_shift"])
        bits = f.op(Op.ISub, s.u32, f.op(Op.ShiftLeftLogical, s.u32, s.c(1), width), s.c(1))

        found = f.local(s.u32, s.c(0))
        e_var = f.local(s.u32)
        f.emit(Op.Store, e_var, tid)

        def test() -> None:
            e = f.op(Op.Load, s.u32, e_var)
            R, j = s.add(r0, s.udiv(e, P["keys"])), s.add(k0, s.umod(e, P["keys"]))
            inside = s.and_(s.lt(R, rows), s.lt(j, P["Lk"]))
            Rc = s.select(s.u32, inside, R, s.c(0))
            head = s.add(s.mul(kv, P["groups"]), s.udiv(Rc, P["Lq"]))
            at = s.add(start, s.add(s.mul(head, P["m_head"]), s.add(
                s.mul(s.umod(Rc, P["Lq"]), P["m_row"]), s.mul(j, P["m_col"]))))
            at = s.select(s.u32, inside, at, s.c(0))
            word = s.buffer_load(mask, s.udiv(at, per_word))
            shift = s.mul(s.umod(at, per_word), width)
            value = f.op(Op.BitwiseAnd, s.u32, s.f.op(Op.ShiftRightLogical, s.u32, word, shift),
                         bits)
            seen = s.and_(inside, ne(value, P["hidden"]))
            f.emit(Op.Store, found, s.select(s.u32, seen, s.c(1), s.c(0)))

        f.while_(lambda: s.and_(s.lt(f.op(Op.Load, s.u32, e_var), total),
                                f.op(Op.IEqual, s.bool, f.op(Op.Load, s.u32, found), s.c(0))),
                 test,
                 lambda: f.emit(Op.Store, e_var, s.add(f.op(Op.Load, s.u32, e_var), s.c(LANES))),
                 LoopControl.DontUnroll)
        s.shared_store(flags, tid, f.op(Op.Load, s.u32, found))
        s.barrier(Scope.Workgroup)

        def write() -> None:
            any_ = s.shared_load(flags, s.c(0))
            for t in range(1, LANES):
                any_ = f.op(Op.BitwiseOr, s.u32, any_, s.shared_load(flags, s.c(t)))
            s.buffer_store(words, w, any_)

        f.if_(f.op(Op.IEqual, s.bool, tid, s.c(0)), write)

    f.if_(s.lt(w, P["count"]), body)  # uniform in a workgroup: its barrier is safe
    return s.compute_module(LANES)


@functools.cache
def block_kernel() -> BlockKernel:
    """The pass (one for every mask kind and attention tile: both are push constants)."""
    return BlockKernel(BlockTraits(), _emit(), tuple(sorted(vulkan_features(
        {Capability.Shader, Capability.VulkanMemoryModel}))))
