"""coopmat on Dask: chunked GEMMs over one worker per Vulkan device, on one host or many
(the optional extra `coopmat[dask]`).

    import coopmat.dask as cd
    cluster = cd.LocalCluster()                 # one worker per device of this host
    client = distributed.Client(cluster)
    y = cd.matmul(x, w)                         # x: dask array of numpy chunks; lazy
    y = cd.linear(x, cd.quantized(w, "q4_0"), bias, "gelu_tanh")
    y.compute()                                 # numpy; the weight stays on each GPU

Several hosts: `dask scheduler` on one, `coopmat-dask-worker SCHEDULER` on every host.
Without a cluster the same calls run under Dask's default scheduler on this process's
device.
"""

from __future__ import annotations

from typing import Any

from coopmat.dask.cache import cache_info, clear_cache, set_cache_limit
from coopmat.dask.devices import held_device
from coopmat.dask.linalg import linear, matmul
from coopmat.dask.weights import Weight, from_gguf, quantized

_CLUSTER = ("LocalCluster", "worker_devices")


def __getattr__(name: str) -> Any:
    # distributed is only needed for a cluster: matmul under the default scheduler, and
    # the worker-side cache, import without it.
    if name in _CLUSTER:
        from coopmat.dask import cluster
        value = getattr(cluster, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'coopmat.dask' has no attribute {name!r}")


__all__ = ["LocalCluster", "Weight", "cache_info", "clear_cache", "from_gguf", "held_device",
           "linear", "matmul", "quantized", "set_cache_limit", "worker_devices"]
