"""Where coopmat keeps files between processes (SPIR-V, driver pipeline caches, tuning)."""

from __future__ import annotations

import os
from pathlib import Path

ENV = "COOPMAT_CACHE_DIR"


def cache_root() -> Path | None:
    """$COOPMAT_CACHE_DIR, else $XDG_CACHE_HOME/coopmat or ~/.cache/coopmat.

    None when COOPMAT_CACHE_DIR is set but empty: every disk cache is then off."""
    env = os.environ.get(ENV)
    if env is not None:
        return Path(env) if env else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "coopmat"
