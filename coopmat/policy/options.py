"""The options that steer kernel choice and how a product runs.

`Options.from_env()` is the one place the COOPMAT_* variables that affect kernel choice
(and the numpy -> numpy pipeline's switch, COOPMAT_PIPELINE) are parsed; everything below it
takes an Options value. A bad value is a ValueError that names the variable.

The process reads those variables once, at its first product (`get_options()`), as numpy and
CuPy read theirs at start-up; later changes go through `set_options()` (the process's
defaults), the `options()` context manager (this thread or task only) or
`reload_environment()` (after os.environ was changed on purpose).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

FAMILY_ENV = "COOPMAT_FAMILY"
SPECIALIZE_ENV = "COOPMAT_SPECIALIZE"
NO_TUNING_ENV = "COOPMAT_NO_TUNING"
SPLIT_K_ENV = "COOPMAT_SPLIT_K"
DEQUANT_ENV = "COOPMAT_DEQUANT"
PIPELINE_ENV = "COOPMAT_PIPELINE"
ATTENTION_SPLITS_ENV = "COOPMAT_ATTENTION_SPLITS"
ATTENTION_TILE_ENV = "COOPMAT_ATTENTION_TILE"

FAMILIES = ("khr", "nv2", "rows", "gemv")
_SPECIALIZE = {"1": "always", "0": "never", "": "auto", "auto": "auto"}
DEQUANT_MODES = ("auto", "first", "fused")
PIPELINE_MODES = ("auto", "always", "copy-queues", "off")


@dataclass(frozen=True)
class Options:
    """family: force 'khr', 'nv2', 'rows' or 'gemv' (None: the policy's choice).
    specialize: 'auto' (large problems, within a per-process budget), 'always' or 'never'.
    tuning: use tuned choices (the user's table, else the shipped one).
    split_k: force a split-K of this many K slices (1: never split) where the problem
    allows one (policy.kernel.split_k_violation; elsewhere it runs unsplit); None: the
    policy's rule (policy.kernel.split_k_for, while SPLIT_K_DEFAULT is on).
    dequant: for a quantized B, 'first' (a pass into a float B, then the float kernel),
    'fused' (the kernel dequantizes as it reads B) or 'auto' (the policy's rule,
    policy.kernel.dequantizes_first).
    pipeline: how a large numpy -> numpy product is pipelined (dispatch/pipeline.py):
    'auto' (the way the device offers, if any), 'always' (also a numpy x against a
    resident weight on memory the host maps, which 'auto' leaves unpipelined),
    'copy-queues' (the copy queues' way even on a device without copy queues, its steps
    in order on the compute queue: for tests) or 'off' (never: one product, for
    measurements).
    attention_splits: coopmat.attention's slices of the keys (1: never split; None: the
    policy's rule, policy.attention.split_count).
    attention_tile: fields replacing those of the attention kernel the policy chose, for
    measuring others: "rows=32,subgroups=4,keys=64,family=nv2" (policy.attention.parse_tile).
    trace: called with the name of each step of a pipelined product as it happens (for
    profiling, with time.perf_counter beside it); not part of equality."""

    family: str | None = None
    specialize: str = "auto"
    tuning: bool = True
    split_k: int | None = None
    dequant: str = "auto"
    pipeline: str = "auto"
    attention_splits: int | None = None
    attention_tile: str = ""
    trace: Callable[[str], None] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.family not in (None, *FAMILIES):
            raise ValueError(f"unknown kernel family {self.family!r}: use 'khr', 'nv2', "
                             f"'rows', 'gemv' or None (the policy's choice)")
        if self.specialize not in ("auto", "always", "never"):
            raise ValueError(f"specialize={self.specialize!r}: use 'auto', 'always' or "
                             f"'never'")
        if self.split_k is not None and (isinstance(self.split_k, bool) or
                                         not isinstance(self.split_k, int) or
                                         self.split_k < 1):
            raise ValueError(f"split_k={self.split_k!r}: use a whole number of K slices "
                             f">= 1 (1: never split), or None for the policy's choice")
        if self.attention_splits is not None and (
                isinstance(self.attention_splits, bool) or
                not isinstance(self.attention_splits, int) or self.attention_splits < 1):
            raise ValueError(f"attention_splits={self.attention_splits!r}: use a whole number "
                             f">= 1 (1: never split), or None for the policy's choice")
        if self.dequant not in DEQUANT_MODES:
            raise ValueError(f"dequant={self.dequant!r}: use 'first', 'fused' or 'auto'")
        if self.pipeline not in PIPELINE_MODES:
            raise ValueError(f"pipeline={self.pipeline!r}: use 'auto', 'always', "
                             f"'copy-queues' or 'off'")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Options:
        """The options the COOPMAT_* variables of `env` (default: os.environ, now) ask for."""
        return cls._parse(os.environ if env is None else env)

    @classmethod
    def _parse(cls, env: Mapping[str, str]) -> Options:
        family = env.get(FAMILY_ENV, "").strip() or None
        if family not in (None, "auto", *FAMILIES):
            raise ValueError(f"{FAMILY_ENV}={family!r} is not a kernel family: use "
                             f"'khr', 'nv2', 'rows', 'gemv' or 'auto'")
        spec = env.get(SPECIALIZE_ENV, "").strip()
        if spec not in _SPECIALIZE:
            raise ValueError(f"{SPECIALIZE_ENV}={spec!r}: use 1 (always), 0 (never) or "
                             f"leave it unset (large problems)")
        split = env.get(SPLIT_K_ENV, "").strip()
        if split in ("", "auto"):
            split_k = None
        elif split.isdigit() and int(split) >= 1:
            split_k = int(split)
        else:
            raise ValueError(f"{SPLIT_K_ENV}={split!r}: use a whole number of K slices >= 1 "
                             f"(1: never split), 'auto' or leave it unset (the policy's "
                             f"choice)")
        dequant = env.get(DEQUANT_ENV, "").strip() or "auto"
        if dequant not in DEQUANT_MODES:
            raise ValueError(f"{DEQUANT_ENV}={dequant!r}: use 'first' (a float copy of a "
                             f"quantized weight first), 'fused', 'auto' or leave it unset "
                             f"(the policy's choice)")
        pipeline = env.get(PIPELINE_ENV, "").strip() or "auto"
        if pipeline not in PIPELINE_MODES:
            raise ValueError(f"{PIPELINE_ENV}={pipeline!r}: use 'always', 'copy-queues' (its "
                             f"steps in order where the device has no copy queues), 'off', "
                             f"'auto' or leave it unset")
        raw = env.get(ATTENTION_SPLITS_ENV, "").strip()
        if raw and not (raw.isdigit() and int(raw) >= 1):
            raise ValueError(f"{ATTENTION_SPLITS_ENV}={raw!r}: use a whole number of key "
                             f"slices >= 1 (1: never split) or leave it unset")
        return cls(family=None if family == "auto" else family,
                   specialize=_SPECIALIZE[spec],
                   tuning=env.get(NO_TUNING_ENV, "").strip() != "1", split_k=split_k,
                   dequant=dequant, pipeline=pipeline,
                   attention_splits=int(raw) if raw else None,
                   attention_tile=env.get(ATTENTION_TILE_ENV, "").strip())

    def with_family(self, family: str | None) -> Options:
        """These options with a per-call family (None or 'auto' keeps the current one)."""
        if family is None or family == "auto":
            return self
        if family not in FAMILIES:
            raise ValueError(f"unknown kernel family {family!r}: use 'khr', 'nv2', 'rows', "
                             f"'gemv' or 'auto'")
        return replace(self, family=family)


# The process's defaults: the environment as read at the first product, or set_options'.
_process: Options | None = None
# A scope's options (the options() context manager): per thread and per asyncio task.
_scoped: ContextVar[Options | None] = ContextVar("coopmat_options", default=None)


def get_options() -> Options:
    """The options a product started now runs with."""
    scoped = _scoped.get()
    if scoped is not None:
        return scoped
    return _process if _process is not None else reload_environment()


def reload_environment() -> Options:
    """Read the COOPMAT_* variables again and make them the process's defaults."""
    global _process
    _process = Options.from_env()
    return _process


def set_options(**changes: Any) -> Options:
    """Change the process's defaults (Options' field names: family, specialize, tuning,
    split_k, dequant, pipeline, trace); returns the new defaults."""
    global _process
    _process = _changed(_process if _process is not None else reload_environment(), changes)
    return _process


@contextmanager
def options(**changes: Any) -> Iterator[Options]:
    """Options changed for the products started inside the block, in this thread (or
    asyncio task) only: `with coopmat.options(family="khr", split_k=4): ...`."""
    token = _scoped.set(_changed(get_options(), changes))
    try:
        yield _scoped.get()  # type: ignore[misc]
    finally:
        _scoped.reset(token)


def _changed(base: Options, changes: dict[str, Any]) -> Options:
    if changes.get("family") == "auto":
        changes = {**changes, "family": None}
    return replace(base, **changes)
