"""Decode attention's gemv kernel (codegen/attention_gemv.py: subgroup shuffles, a
transposing reduction, FMax over the subgroup, exp2), the khr kernel (codegen/attention.py:
cooperative matrices, scores and P through shared memory) and the merge of split key
slices (codegen/attention_combine.py), executed by the reference interpreter at each
recorded device's subgroup size and matrix shapes, against the float64 softmax attention
of tests/support/attention_oracle.py and its bound. The operands are laid out and bound
as dispatch/attention.py binds contiguous ones; nothing here runs on a Vulkan device.
"""

from __future__ import annotations

import numpy as np
import pytest
from attention_oracle import tolerance
from test_interpreter import DEVICES, matrix_configs

from coopmat.codegen import attention as attn
from coopmat.codegen.attention_combine import CombineKernel, combine_kernel, workgroup_count
from coopmat.codegen.attention_kernels import attention_kernel
from coopmat.common.enums import ComponentType as CT
from coopmat.device.model import PhysicalDeviceInfo
from coopmat.policy.attention import (
    AttentionProblem,
    attention_config,
    choose_attention,
    merge_invocations,
)
from spirv_interp import Interpreter

F16 = np.float16

# (q heads, kv heads, Lq, E, Ev, Lk, causal, slices, prefetch)
CASES = [
    (8, 2, 1, 64, 64, 257, False, 3, True),  # 4 grouped q heads a kv head, one tile
    (6, 2, 2, 80, 96, 100, True, 4, False),  # odd E, 6 rows a kv head, causal
    (2, 2, 1, 32, 32, 5, False, 2, True),    # fewer keys than a step: one slice empty
]


def _flat(x: np.ndarray) -> np.ndarray:
    """An operand's elements and 64 bytes more (a 16-byte unit past a row stays inside)."""
    return np.concatenate([x.ravel(), np.zeros(32, x.dtype)])


def _run(info: PhysicalDeviceInfo, H: int, kv: int, Lq: int, E: int, Ev: int, Lk: int,
         causal: bool, slices: int, tile: str, family: str) -> None:
    """Attention of random q, k, v under the kernel `tile` asks for (and, split, the merge
    of its slices), run by the interpreter; the result against the float64 oracle."""
    rng = np.random.default_rng(11)
    q = (3 * rng.standard_normal((1, H, Lq, E))).astype(F16)
    k = rng.standard_normal((1, kv, Lk, E)).astype(F16)
    v = rng.standard_normal((1, kv, Lk, Ev)).astype(F16)
    groups, scale = H // kv, 1.0 / np.sqrt(E)
    p = AttentionProblem(CT.FLOAT16, CT.FLOAT16, E, Ev, groups * Lq, Lk, kv,
                         aligned=E % 8 == 0 and Ev % 8 == 0, causal=causal)
    choice = choose_attention(info, p, splits=slices, tile=tile)
    t = choice.traits
    assert t.family == family and t.split == (choice.splits > 1 or family == "gemv")
    kernel = attention_kernel(t)
    rows_pad = -(-p.rows // t.block_rows) * t.block_rows
    values = {"Lq": Lq, "Lk": Lk, "groups": groups, "kv_heads": kv,
              "scale_log2": scale * attn.LOG2_E, "flags": attn.FLAG_CAUSAL if causal else 0,
              "rows_pad": rows_pad, "splits": choice.splits, "split_keys": choice.split_keys}
    o = np.full(H * Lq * Ev, np.nan, F16)
    operands = [("q", q), ("k", k), ("v", v)] + ([] if t.split else [("o", o.reshape(1, H,
                                                                                      Lq, Ev))])
    for prefix, x in operands:
        values.update({f"{prefix}_base": 0, f"{prefix}_outer": x[0].size,
                       f"{prefix}_head": x[0, 0].size, f"{prefix}_ld": x.shape[-1]})
    buffers = {attn.BINDING_Q: _flat(q), attn.BINDING_K: _flat(k), attn.BINDING_V: _flat(v)}
    interp = Interpreter(kernel.spirv, subgroup_size=t.subgroup_size,
                         matrix_configs=matrix_configs(info))
    if not t.split:
        buffers[attn.BINDING_O] = o
        interp.dispatch(kernel.workgroups(p.rows, kv), buffers, kernel.push_constants(values))
    else:
        slots = kv * choice.splits * rows_pad
        partial = np.full(slots * t.value_dim_padded, np.nan, np.float32)
        ml = np.full(2 * slots, np.nan, np.float32)
        buffers.update({attn.BINDING_O: partial, attn.BINDING_ML: ml})
        interp.dispatch(kernel.workgroups(p.rows, kv, choice.splits), buffers,
                        kernel.push_constants(values))
        ck = combine_kernel(t.out, merge_invocations(info.limits, choice.splits))
        count = workgroup_count(kv * p.rows, t.value_dim)
        push = CombineKernel.push_constants({
            "count": count, "value_dim": t.value_dim, "ws_ld": t.value_dim_padded,
            "Lq": Lq, "groups": groups, "kv_heads": kv, "rows_pad": rows_pad,
            "splits": choice.splits, "o_base": 0, "o_ld": Ev, "o_outer": H * Lq * Ev,
            "o_head": Lq * Ev})
        Interpreter(ck.spirv, subgroup_size=t.subgroup_size).dispatch(
            CombineKernel.workgroups(count), {0: partial, 1: ml, 2: o}, push)
    ref, tol = tolerance(q, k, v, causal=causal, scale=scale)
    err = np.abs(o.reshape(1, H, Lq, Ev).astype(np.float64) - ref)
    assert np.all(err <= tol), (t, float(err.max()))


def _float16_attention(info: PhysicalDeviceInfo) -> None:
    if attention_config(info, CT.FLOAT16) is None or info.limits.subgroup_arithmetic is False:
        pytest.skip("no float16 attention here")


@pytest.mark.parametrize("name,info", DEVICES, ids=[n for n, _ in DEVICES])
@pytest.mark.parametrize("H,kv,Lq,E,Ev,Lk,causal,slices,prefetch", CASES)
def test_gemv_decode_and_merge(name: str, info: PhysicalDeviceInfo, H: int, kv: int, Lq: int,
                               E: int, Ev: int, Lk: int, causal: bool, slices: int,
                               prefetch: bool) -> None:
    _float16_attention(info)
    _run(info, H, kv, Lq, E, Ev, Lk, causal, slices,
         f"family=gemv,prefetch={int(prefetch)}", "gemv")


# (q heads, kv heads, Lq, E, Ev, Lk, causal, slices): ragged rows and keys with grouped
# heads; causal with Lq != Lk; a split of the keys merged by the second pass.
KHR_CASES = [
    (4, 2, 33, 64, 64, 70, False, 1),
    (2, 2, 40, 64, 32, 52, True, 1),
    (8, 2, 1, 64, 64, 130, False, 3),
]


@pytest.mark.parametrize("name,info", DEVICES, ids=[n for n, _ in DEVICES])
@pytest.mark.parametrize("H,kv,Lq,E,Ev,Lk,causal,slices", KHR_CASES)
def test_khr_attention(name: str, info: PhysicalDeviceInfo, H: int, kv: int, Lq: int, E: int,
                       Ev: int, Lk: int, causal: bool, slices: int) -> None:
    """The khr kernel (scores and P staged in shared memory, rows walked there) at each
    device's subgroup size and matrix shapes."""
    _float16_attention(info)
    _run(info, H, kv, Lq, E, Ev, Lk, causal, slices, "family=khr", "khr")
