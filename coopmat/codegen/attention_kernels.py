"""Build an attention kernel of either family (attention.py: khr, attention_nv2.py: nv2)."""

from __future__ import annotations

import functools

from coopmat.codegen.attention import (
    AttentionEmitter,
    AttentionKernel,
    AttentionTraits,
    capability_features,
)
from coopmat.codegen.attention_nv2 import Nv2AttentionEmitter


@functools.cache
def attention_kernel(traits: AttentionTraits) -> AttentionKernel:
    """The kernel for `traits`, generated once per process."""
    emitter = Nv2AttentionEmitter if traits.family == "nv2" else AttentionEmitter
    spirv = emitter(traits).build()
    return AttentionKernel(traits, spirv, capability_features(traits),
                           (traits.invocations, 1, 1), traits.subgroup_size,
                           traits.shared_memory_bytes)
