"""Geometry of the rows kernel's tiles (rows.py): the row fragments that hold M rows, and
whether a tile fits the device's shared memory. Which tile runs is the policy's
(coopmat/policy/rows_tiles.py).
"""

from __future__ import annotations

from coopmat.codegen.traits import RowsTraits


def row_frags_for(M: int, m: int) -> int:
    """Row fragments that hold M rows (at least one)."""
    return max(1, -(-M // m))


def rows_tile_fits(traits: RowsTraits, shared_limit: int) -> bool:
    """Whether the kernel of `traits` lays out and stages within `shared_limit` bytes."""
    from coopmat.codegen.rows import RowsPlan

    try:
        plan = RowsPlan(traits)
    except ValueError:
        return False
    return plan.shared_bytes <= shared_limit
