"""Policy: which kernel runs a product, as pure functions of the device's capabilities
(a PhysicalDeviceInfo, live or recorded), the problem and the options. Mechanism (how a
choice is run: buffers, pipelines, submission) lives in coopmat.dispatch.

    from coopmat.policy import Options, Problem, OperandLayout, choose, resolve
    pair = resolve(info, np.float16, np.float16)          # float16 -> float16, f32 acc.
    choice = choose(info, Problem(pair, M, N, K, a, b), current_options())
    choice.traits, choice.params, choice.packs, choice.margins
"""

from coopmat.policy.kernel import (
    MEDIUM_MN,
    PACK_MIN_M,
    SPECIALIZE_MIN_OPS,
    KernelChoice,
    OperandLayout,
    PackChoice,
    Problem,
    Tuned,
    bounds_checked,
    choose,
    choose_family,
    fastest_variant,
    fills_small,
    repacks,
    shape_class,
    slice_problem,
    specializes,
    split_k_for,
    split_k_violation,
)
from coopmat.policy.options import Options
from coopmat.policy.options import get_options as current_options
from coopmat.policy.tiles import SMALL_M
from coopmat.policy.types import (
    TypePair,
    config_for,
    config_pairs,
    resolve,
    result_pairs,
    usable_configs,
)

__all__ = [
    "MEDIUM_MN", "PACK_MIN_M", "SMALL_M", "SPECIALIZE_MIN_OPS", "KernelChoice", "OperandLayout",
    "Options", "PackChoice", "Problem", "Tuned", "TypePair", "bounds_checked", "choose",
    "choose_family", "config_for", "config_pairs", "current_options", "fastest_variant",
    "fills_small", "repacks", "resolve", "result_pairs",
    "shape_class", "slice_problem", "specializes", "split_k_for", "split_k_violation",
    "usable_configs",
]
