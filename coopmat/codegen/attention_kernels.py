"""Build an attention kernel of any family (attention.py: khr, attention_nv2.py: nv2,
attention_gemv.py: gemv)."""

from __future__ import annotations

import functools

from coopmat.codegen.attention import (
    AttentionEmitter,
    AttentionKernel,
    AttentionTraits,
    capability_features,
)
from coopmat.codegen.attention_gemv import GemvAttentionEmitter
from coopmat.codegen.attention_nv2 import Nv2AttentionEmitter

EMITTERS = {"khr": AttentionEmitter, "nv2": Nv2AttentionEmitter, "gemv": GemvAttentionEmitter}


@functools.cache
def attention_kernel(traits: AttentionTraits) -> AttentionKernel:
    """The kernel for `traits`, generated once per process."""
    spirv = EMITTERS[traits.family](traits).build()
    return AttentionKernel(traits, spirv, capability_features(traits),
                           (traits.invocations, 1, 1), traits.subgroup_size,
                           traits.shared_memory_bytes)
