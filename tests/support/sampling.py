"""Deterministic samples of a parameter grid that keep every value and every pair.

The full product of a kernel sweep (types x layouts x C x edge handling x buffering) is a
pipeline compile per case on lavapipe, seconds each, and seconds in the interpreter; the
suite runs a full sweep once and elsewhere a covering sample: every value of every
factor, and every pair of values of any two factors, appears in at least one case, so an
interaction of two choices still shows."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def covering(cases: Sequence[T], *keys: Callable[[T], Hashable]) -> list[T]:
    """The cases (a sublist, in their order) that hold every pair of key values any case
    holds: greedy, the case covering most pairs not yet covered first (the earliest of
    equals), so the same list on every run."""
    def held(c: T) -> set[tuple[Hashable, ...]]:
        if len(keys) < 2:  # one factor: every value once
            return {(keys[0](c),)} if keys else {(id(c),)}
        return {(i, keys[i](c), j, keys[j](c))
                for i, j in itertools.combinations(range(len(keys)), 2)}

    pairs = [held(c) for c in cases]
    uncovered = set().union(*pairs)
    chosen: list[int] = []
    while uncovered:
        best = max(range(len(cases)), key=lambda k: len(pairs[k] & uncovered))
        chosen.append(best)
        uncovered -= pairs[best]
    return [cases[k] for k in sorted(chosen)]


def pairwise(*factors: Sequence[Any],
             allowed: Callable[[tuple[Any, ...]], bool] = lambda case: True
             ) -> list[tuple[Any, ...]]:
    """Cases (one value per factor, in the product's order) covering every pair of values
    of any two factors that some allowed case holds."""
    grid = [c for c in itertools.product(*(range(len(f)) for f in factors))
            if allowed(tuple(factors[i][k] for i, k in enumerate(c)))]
    keys = [lambda c, i=i: c[i] for i in range(len(factors))]
    return [tuple(factors[i][k] for i, k in enumerate(c)) for c in covering(grid, *keys)]
