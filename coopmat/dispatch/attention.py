"""Run an attention choice (coopmat.policy.attention) on operands in device memory: the
attention kernel, for a split run its workspace and the merging pass, for a kernel that
skips masked blocks the pass marking them (before it) and its words, queued in one
submission on the device's stream (with the call's staging copies before it and a copy
of a small result to host-visible memory after it, as a product's).

Each operand is bound from the 256-byte boundary at or below where it starts (any view's
offset binds: minStorageBufferOffsetAlignment is at most 256), and the kernel adds the
rest, in elements, to its base.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from coopmat.codegen import attention as attn
from coopmat.codegen.attention import AttentionTraits, MaskKind
from coopmat.codegen.attention_blocks import (
    HIDDEN_BF16,
    HIDDEN_BOOL,
    HIDDEN_F16,
    BlockKernel,
    block_kernel,
)
from coopmat.codegen.attention_combine import (
    CombineKernel,
    combine_kernel,
    workgroup_count,
)
from coopmat.codegen.attention_kernels import attention_kernel
from coopmat.common.enums import ComponentType
from coopmat.common.lru import Lru
from coopmat.dispatch.executor import Copy, Dispatch, copies_key
from coopmat.dispatch.memory import Buffer
from coopmat.dispatch.runtime import Runtime
from coopmat.dispatch.staging import OFFSET_ALIGNMENT
from coopmat.policy.attention import (
    AttentionChoice,
    AttentionProblem,
    choose_attention,
    merge_invocations,
)

# A decode loop asks for the same choice every step: the policy runs once per problem.
# Each entry holds its runtime, so the id() in its key is never another's.
CHOICE_CACHE = 256
_choices: Lru[tuple[Runtime, AttentionChoice]] = Lru(CHOICE_CACHE)


@dataclass(frozen=True)
class Operand:
    """q, k, v, o or the mask in device memory: from byte `offset` of `buffer`, element
    strides between outer entries, heads, rows and columns (0 where broadcast)."""

    buffer: Buffer
    offset: int
    itemsize: int
    outer: int
    head: int
    row: int
    col: int = 1

    @property
    def bound(self) -> tuple[int, int]:
        """(byte offset the binding starts at, elements from there to the operand)."""
        start = self.offset - self.offset % OFFSET_ALIGNMENT
        return start, (self.offset - start) // self.itemsize

    def aligned(self) -> bool:
        """Whether 16-byte units read it: its start and strides whole units of 8."""
        return self.col == 1 and not (self.bound[1] | self.outer | self.head | self.row) % 8

    def key(self) -> tuple[int, ...]:
        """Everything a run's recording takes from the operand (its buffer by address)."""
        return (self.buffer.addr, self.offset, self.itemsize, self.outer, self.head,
                self.row, self.col)


@dataclass(frozen=True)
class Sizes:
    """The call's sizes as the kernel takes them."""

    Lq: int
    Lk: int
    groups: int
    kv_heads: int
    batch: int  # entries of the outer axes

    @property
    def rows(self) -> int:
        return self.groups * self.Lq

    @property
    def z(self) -> int:
        return self.batch * self.kv_heads


def _bindings(traits: AttentionTraits, q: Operand, k: Operand, v: Operand,
              o: Operand | None, mask: Operand | None
              ) -> tuple[dict[int, Buffer], list[tuple[int, int]], dict[str, int]]:
    buffers: dict[int, Buffer] = {}
    offsets: list[tuple[int, int]] = []
    values: dict[str, int] = {}
    for binding, prefix, op in ((attn.BINDING_Q, "q", q), (attn.BINDING_K, "k", k),
                                (attn.BINDING_V, "v", v), (attn.BINDING_O, "o", o),
                                (attn.BINDING_MASK, "m", mask)):
        if op is None:
            continue
        start, base = op.bound
        buffers[binding] = op.buffer
        if start:
            offsets.append((binding, start))
        values.update({f"{prefix}_base": base, f"{prefix}_outer": op.outer,
                       f"{prefix}_head": op.head})
        values["m_row" if prefix == "m" else f"{prefix}_ld"] = op.row
        if prefix == "m":
            values["m_col"] = op.col
    return buffers, offsets, values


def workspace_bytes(choice: AttentionChoice, sizes: Sizes) -> tuple[int, int]:
    """(partial O bytes, (m, l) bytes) of a split run's workspace."""
    t = choice.traits
    rows_pad = -(-sizes.rows // t.block_rows) * t.block_rows
    slots = sizes.z * choice.splits * rows_pad
    return slots * t.value_dim_padded * 4, slots * 2 * 4


def shared_blocks(mask: Operand | None) -> bool:
    """Whether the mask is the same for every batch entry and head: one set of block
    words serves every z."""
    return mask is not None and mask.outer == 0 and mask.head == 0


def block_words(choice: AttentionChoice, sizes: Sizes, mask: Operand | None) -> int:
    """Words of the block pass (0 where the kernel skips nothing): one per (z, row
    block, key step), z 1 where the mask is shared (shared_blocks)."""
    t = choice.traits
    if not t.skip_blocks:
        return 0
    zs = 1 if shared_blocks(mask) else sizes.z
    return zs * -(-sizes.rows // t.block_rows) * -(-sizes.Lk // t.keys)


def _block_pass(rt: Runtime, t: AttentionTraits, sizes: Sizes, mask: Operand,
                words: Buffer, count: int) -> Dispatch:
    kernel = block_kernel()
    start, base = mask.bound
    if t.mask is MaskKind.BOOL:
        shift, hidden = 0, HIDDEN_BOOL
    else:
        shift = 1
        hidden = HIDDEN_BF16 if t.operand == ComponentType.BFLOAT16 else HIDDEN_F16
    push = BlockKernel.push_constants({
        "count": count, "Lq": sizes.Lq, "Lk": sizes.Lk, "groups": sizes.groups,
        "kv_heads": sizes.kv_heads, "block_rows": t.block_rows, "keys": t.keys,
        "row_blocks": -(-sizes.rows // t.block_rows), "steps": -(-sizes.Lk // t.keys),
        "m_base": base, "m_row": mask.row, "m_col": mask.col, "m_outer": mask.outer,
        "m_head": mask.head, "elem_shift": shift, "hidden": hidden})
    return Dispatch(rt.pipelines.get(kernel), {0: mask.buffer, 1: words}, push,
                    BlockKernel.workgroups(count), ((0, start),) if start else ())


def attention_choice(rt: Runtime, problem: AttentionProblem, splits: int | None = None,
                     tile: str = "") -> AttentionChoice:
    """choose_attention on rt's device, kept per problem and options."""
    key = (id(rt), problem, splits, tile)
    kept = _choices.get(key)
    if kept is not None:
        return kept[1]
    choice = choose_attention(rt.device.info, problem, splits, tile)
    _choices.put(key, (rt, choice))
    return choice


def attention_dispatches(rt: Runtime, choice: AttentionChoice, sizes: Sizes, q: Operand,
                         k: Operand, v: Operand, o: Operand, mask: Operand | None,
                         scale: float, causal: bool,
                         workspace: Sequence[Buffer] = ()) -> list[Dispatch]:
    """The run's dispatches: for a kernel that skips masked blocks the block pass first,
    the attention kernel, and for a split run the merge (the workspace, taken by the
    caller with take_workspace: a split run's two buffers of workspace_bytes, then the
    block words)."""
    t = choice.traits
    kernel = attention_kernel(t)
    rows_pad = -(-sizes.rows // t.block_rows) * t.block_rows
    flags = (attn.FLAG_CAUSAL if causal else 0) | \
        (attn.FLAG_SHARED_BLOCKS if t.skip_blocks and shared_blocks(mask) else 0)
    common = {"Lq": sizes.Lq, "Lk": sizes.Lk, "groups": sizes.groups,
              "kv_heads": sizes.kv_heads, "scale_log2": scale * attn.LOG2_E,
              "flags": flags, "rows_pad": rows_pad,
              "splits": choice.splits, "split_keys": choice.split_keys}
    if (mask is None) != (t.mask is None):
        raise ValueError("attention: the kernel's mask and the call's disagree")
    before: list[Dispatch] = []
    if t.skip_blocks:
        assert mask is not None
        words = workspace[-1]
        before.append(_block_pass(rt, t, sizes, mask, words,
                                  block_words(choice, sizes, mask)))
    if not t.split:
        buffers, offsets, values = _bindings(t, q, k, v, o, mask)
        if t.skip_blocks:
            buffers[attn.BINDING_BLOCKS] = words
        return before + [Dispatch(rt.pipelines.get(kernel), buffers,
                                  kernel.push_constants({**common, **values}),
                                  kernel.workgroups(sizes.rows, sizes.z), tuple(offsets))]
    partial, ml = workspace[:2]
    buffers, offsets, values = _bindings(t, q, k, v, None, mask)
    if t.skip_blocks:
        buffers[attn.BINDING_BLOCKS] = words
    buffers[attn.BINDING_O] = partial
    buffers[attn.BINDING_ML] = ml
    first = Dispatch(rt.pipelines.get(kernel), buffers,
                     kernel.push_constants({**common, **values}),
                     kernel.workgroups(sizes.rows, sizes.z, choice.splits), tuple(offsets))
    ck = combine_kernel(t.out, merge_invocations(rt.device.info.limits, choice.splits))
    start, base = o.bound
    count = workgroup_count(sizes.z * sizes.rows, t.value_dim)
    push = CombineKernel.push_constants({
        "count": count, "value_dim": t.value_dim, "ws_ld": t.value_dim_padded,
        "Lq": sizes.Lq, "groups": sizes.groups, "kv_heads": sizes.kv_heads,
        "rows_pad": rows_pad, "splits": choice.splits, "o_base": base, "o_ld": o.row,
        "o_outer": o.outer, "o_head": o.head})
    merge = Dispatch(rt.pipelines.get(ck), {0: partial, 1: ml, 2: o.buffer}, push,
                     CombineKernel.workgroups(count), ((2, start),) if start else ())
    return before + [first, merge]


def take_workspace(rt: Runtime, choice: AttentionChoice, sizes: Sizes,
                   mask: Operand | None = None) -> list[Buffer]:
    """The run's workspace from the pool: a split run's two buffers (workspace_bytes),
    then the block pass's words where the kernel skips masked blocks (none for an unsplit
    run without them); the caller gives it back (pool.recycle) once the run is queued."""
    kind = rt.pool.kinds()[0]
    nbytes = list(workspace_bytes(choice, sizes)) if choice.traits.split else []
    words = block_words(choice, sizes, mask)
    if words:
        nbytes.append(4 * words)
    return [rt.pool.acquire(kind, n) for n in nbytes]


def enqueue_attention(rt: Runtime, choice: AttentionChoice, sizes: Sizes, q: Operand,
                      k: Operand, v: Operand, o: Operand, mask: Operand | None, scale: float,
                      causal: bool, uploads: Sequence[Copy] = (),
                      downloads: Sequence[Copy] = ()) -> int:
    """Queue the run after the staging copies `uploads` and before the copies
    `downloads`, in one submission; returns the stream's ticket. A repeat on the same
    buffers submits the kept recording without building its dispatches again."""
    temps = take_workspace(rt, choice, sizes, mask)
    try:
        key = ("attention", choice, sizes, q.key(), k.key(), v.key(), o.key(),
               mask.key() if mask is not None else None, scale, causal,
               *(t.addr for t in temps), *copies_key(uploads), None, *copies_key(downloads))
        return rt.executor.submit_keyed(key, lambda: (uploads, attention_dispatches(
            rt, choice, sizes, q, k, v, o, mask, scale, causal, temps), downloads))
    finally:
        for buf in temps:
            rt.pool.recycle(buf)


def flops(sizes: Sizes, D: int, Dv: int, causal: bool) -> float:
    """Multiply-adds of Q K^T and P V counted twice (torch's count: 4 L^2 D a head where
    D = Dv), halved where causal (Lq = Lk)."""
    total = 2.0 * sizes.z * sizes.rows * sizes.Lk * (D + Dv)
    return total / 2 if causal else total


def kv_bytes(sizes: Sizes, D: int, Dv: int, itemsize: int) -> int:
    """Bytes of K and V one run reads at least once."""
    return sizes.z * sizes.Lk * (D + Dv) * itemsize


__all__ = ["Operand", "Sizes", "attention_choice", "attention_dispatches", "block_words",
           "enqueue_attention", "flops", "kv_bytes", "shared_blocks", "take_workspace",
           "workspace_bytes"]
