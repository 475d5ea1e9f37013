"""Deterministic samples of a parameter grid that keep every value and every pair.

The full product of a kernel sweep (types x layouts x C x edge handling x buffering) is a
pipeline compile per case on lavapipe, seconds each; the suite runs the product once (the
interpreter's sweep over every recorded variant, test_codegen_live.test_every_variant) and
elsewhere a covering sample: every value of every factor, and every pair of values of any
two factors, appears in at least one case, so an interaction of two choices still shows."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any


def pairwise(*factors: Sequence[Any],
             allowed: Callable[[tuple[Any, ...]], bool] = lambda case: True
             ) -> list[tuple[Any, ...]]:
    """Cases (one value per factor) covering every pair of values of any two factors
    that some allowed case holds; greedy, deterministic (the same list on every run), in
    the product's order."""
    n = len(factors)
    grid = [c for c in itertools.product(*(range(len(f)) for f in factors))
            if allowed(tuple(factors[i][k] for i, k in enumerate(c)))]
    if n < 2:
        return [tuple(factors[0][k] for k in c) for c in grid]
    uncovered = {(i, c[i], j, c[j]) for c in grid
                 for i, j in itertools.combinations(range(n), 2)}
    chosen: list[tuple[int, ...]] = []
    while uncovered:
        # The case of the product covering most pairs not yet covered (first such, in order).
        best = max(grid, key=lambda c: sum((i, c[i], j, c[j]) in uncovered
                                           for i, j in itertools.combinations(range(n), 2)))
        chosen.append(best)
        uncovered -= {(i, best[i], j, best[j]) for i, j in itertools.combinations(range(n), 2)}
    chosen.sort()
    return [tuple(factors[i][k] for i, k in enumerate(c)) for c in chosen]
