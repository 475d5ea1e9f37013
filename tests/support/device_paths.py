"""A unified-memory device (lavapipe) made to take a discrete GPU's memory paths, so CI
runs the code that GPUs run."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import coopmat


@contextmanager
def discrete(rt, mapped: bool = False) -> Iterator[None]:
    """Make a unified-memory device (lavapipe) take the discrete GPU's paths: device
    buffers that the host cannot map, reached through staging lanes; with `mapped`, small
    operands written into device memory the host maps (a resizable BAR, as on the H200),
    else staged and copied."""
    saved = rt.pool.unified, rt.transfers.unified, rt.pool.device_mapped
    rt.pool.unified = rt.transfers.unified = False
    rt.pool.device_mapped = mapped
    try:
        yield
    finally:
        coopmat.synchronize()
        rt.pool.unified, rt.transfers.unified, rt.pool.device_mapped = saved
