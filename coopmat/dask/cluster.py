"""coopmat.dask.LocalCluster: one Dask worker process per cooperative-matrix device of
this host, each pinned to its device through its own COOPMAT_DEVICE."""

from __future__ import annotations

import copy
from typing import Any

import distributed

from coopmat.dask.devices import Placement, held_device, placements, worker_env

PRELOAD = "coopmat.dask.preload"


class LocalCluster(distributed.LocalCluster):
    """A distributed.LocalCluster with a worker per device: `devices` lists them (an
    index, a name substring, a UUID or a PCI bus id each; one listed twice gets two
    workers on it), default every cooperative-matrix device of this host once.

    Each worker is a process of `threads_per_worker` threads (2: the next task is on the
    worker, waiting for the device, when the last one finishes; products on one device
    still run one at a time) with COOPMAT_DEVICE set to its device (its UUID where known)
    and the GPU's copy queues opened (COOPMAT_COPY_QUEUES=1 unless set otherwise), a
    `GPU=1` resource, and a start check (a worker without its device refuses to start).
    The other keyword arguments are distributed.LocalCluster's, less n_workers (one per
    device) and processes (always).
    Ask the workers which device each holds with coopmat.dask.worker_devices(client).
    """

    def __init__(self, devices: Any = None, threads_per_worker: int = 2, **kwargs: Any):
        if "n_workers" in kwargs:
            raise TypeError("coopmat.dask.LocalCluster starts one worker per device: pass "
                            "devices=[...] rather than n_workers")
        if kwargs.pop("processes", True) is not True:
            raise ValueError("coopmat.dask.LocalCluster needs processes=True: each worker "
                             "process is pinned to its device by its own environment")
        self.placements: list[Placement] = placements(devices)
        preload = kwargs.pop("preload", None) or []
        preload = [preload] if isinstance(preload, str) else list(preload)
        resources = dict(kwargs.pop("resources", None) or {})
        resources.setdefault("GPU", 1)
        if "memory_limit" not in kwargs:  # host memory shared by the workers, not per core
            kwargs["memory_limit"] = distributed.system.MEMORY_LIMIT // len(self.placements)
        super().__init__(n_workers=0, threads_per_worker=threads_per_worker, processes=True,
                         preload=[PRELOAD] + [p for p in preload if p != PRELOAD],
                         resources=resources, **kwargs)
        self.scale(len(self.placements))
        self.sync(self._correct_state)

    def new_worker_spec(self) -> dict[Any, dict[str, Any]]:
        free = [i for i in range(len(self.placements)) if i not in self.worker_spec]
        if not free:
            raise ValueError(f"coopmat.dask.LocalCluster has {len(self.placements)} devices "
                             f"and a worker on each; list a device twice to share it")
        spec = copy.deepcopy(self.new_spec)
        options = spec["options"]
        options["env"] = {**(options.get("env") or {}), **worker_env(self.placements[free[0]].pin)}
        return {free[0]: spec}


def worker_devices(client: distributed.Client) -> dict[str, str]:
    """{worker address: the device it computes on} (index, name, driver, UUID, PCI bus
    id), as each worker reports it."""
    return client.run(held_device)


__all__ = ["LocalCluster", "worker_devices"]
