"""A Dask worker preload (`dask worker --preload coopmat.dask.preload`; coopmat.dask's
LocalCluster and coopmat-dask-worker add it): the worker checks at start that it has a
cooperative-matrix device, and refuses to start with one line saying why."""

from __future__ import annotations

import logging
from typing import Any

from coopmat import CoopmatError

logger = logging.getLogger("coopmat.dask")


class NoWorkerDeviceError(CoopmatError):
    """A Dask worker started without a cooperative-matrix device to compute on."""


def dask_setup(worker: Any) -> None:
    from coopmat.dask.devices import held_device
    try:
        held = held_device()
    except CoopmatError as e:
        line = f"coopmat.dask: worker {getattr(worker, 'name', '')} has no device: {e}"
        logger.error(line)
        if getattr(worker, "nanny", None) is not None:
            # distributed logs an Exception from a preload and starts the worker anyway;
            # SystemExit ends the worker process, and its nanny's start fails.
            raise SystemExit(1) from None
        raise NoWorkerDeviceError(line) from None
    logger.info("coopmat.dask: worker %s computes on %s", getattr(worker, "name", ""), held)
