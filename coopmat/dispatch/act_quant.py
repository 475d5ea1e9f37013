"""The plan of the opt-in integer product (matmul's activation_quant="q8_1"): the integer
gemv kernel quantizing x itself (one dispatch), or x quantized to q8_1 blocks by a pass
of its own into a temporary buffer, then the kernel reading those blocks as its A
(policy/act_quant.py chooses).

The pass is the plan's pack step on operand 0, as an 8-bit repack is: plan_dispatches
runs it into a buffer of plan_temps and binds that buffer as the GEMM's A, so prepared,
queued and timed runs all include it.
"""

from __future__ import annotations

from dataclasses import replace

from coopmat.codegen import Layout
from coopmat.codegen.gemv_q8_1 import GemvQ8_1Traits
from coopmat.codegen.quant_q8_1 import quantize_q8_1_kernel, quantized_bytes, quantized_lda
from coopmat.codegen.traits import EpilogueOps
from coopmat.common.lru import Lru
from coopmat.dispatch.gemm import PLAN_CACHE, PackStep, Plan, plan_of
from coopmat.dispatch.runtime import Runtime
from coopmat.dispatch.staging import DeviceOperand, Staged
from coopmat.policy import Options
from coopmat.policy.act_quant import q8_1_kernel, q8_1_violation
from coopmat.policy.types import TypePair

_plans: Lru[Plan] = Lru(PLAN_CACHE)


def q8_1_plan(rt: Runtime, pair: TypePair, a: DeviceOperand, b: DeviceOperand,
              shape: tuple[int, int, int, int], alpha: float | int, options: Options,
              ops: EpilogueOps | None = None, fused: bool | None = None,
              traits: GemvQ8_1Traits | None = None) -> Plan:
    """The plan of a @ b with a (M x K float16, row-major) quantized to q8_1 and b a
    quantized weight's transpose; ValueError where the integer product cannot run it.
    fused: quantize x inside the kernel (True) or in a pass first (False); None: the
    policy's choice. traits: the integer kernel to run instead of the policy's (as a
    sweep times others; its fused_quant then decides)."""
    batch, M, N, K = shape
    why = q8_1_violation(rt.device.info, pair, b.staged.quant, K)
    if why is None and (batch != 1 or a.staged.layout is not Layout.ROW_MAJOR):
        why = "it takes one row-major x (M x K, rows contiguous)"
    if why is None and a.staged.ld % 8:
        why = f"x's row stride ({a.staged.ld} elements) is not a multiple of 8"
    if why is not None:
        raise ValueError(f"activation_quant='q8_1' cannot run this {M}x{N}x{K} product: "
                         f"{why}")
    assert b.staged.quant is not None
    if traits is None:
        traits = q8_1_kernel(rt.device.info, pair, M, N, K, b.staged.quant, ops, fused)
    if traits.fused_quant:
        return plan_of(rt, pair, a.staged, b.staged, None, shape, alpha, 0, traits, options,
                       ops=ops)
    blocks = Staged(Layout.ROW_MAJOR, quantized_lda(K), 0, quantized_bytes(M, K))
    gemm = plan_of(rt, pair, blocks, b.staged, None, shape, alpha, 0, traits, options, ops=ops)
    key = (id(rt), gemm.serial, a.staged)
    plan = _plans.get(key)
    if plan is None:
        qk = quantize_q8_1_kernel()
        step = PackStep(0, rt.pipelines.get(qk), qk.push_constants(M, K, a.staged.ld),
                        qk.workgroups(M, K), quantized_bytes(M, K))
        plan = replace(gemm, staged=(a.staged, b.staged, None), packs=(step,))
        _plans.put(key, plan)
    return plan
