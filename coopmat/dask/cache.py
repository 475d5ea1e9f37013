"""The per-process (per-worker) cache of weights kept on the device: bounded by bytes,
least recently used evicted first, keyed by the weight's dask token."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

ENV_VAR = "COOPMAT_DASK_WEIGHT_CACHE"
DEFAULT_LIMIT = 4 << 30


def _parse_limit(value: int | str) -> int:
    if isinstance(value, int):
        nbytes = value
    else:
        from dask.utils import parse_bytes
        nbytes = int(parse_bytes(value))
    if nbytes < 0:
        raise ValueError(f"the weight cache limit must be >= 0 bytes, not {value!r}")
    return nbytes


class WeightCache:
    """Device weights by token; `get` uploads on a miss. An evicted weight is dropped here,
    so its device memory is freed once no running task still holds it."""

    def __init__(self, limit: int):
        self.limit = limit
        self._entries: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        # Held across an upload: two tasks wanting one weight upload it once.
        self._lock = threading.Lock()
        self.uploads = self.hits = self.evictions = 0

    def get(self, token: str, upload: Callable[[], Any]) -> Any:
        with self._lock:
            entry = self._entries.get(token)
            if entry is not None:
                self._entries.move_to_end(token)
                self.hits += 1
                return entry[0]
            value = upload()
            self.uploads += 1
            nbytes = int(getattr(value, "nbytes", 0))
            if nbytes <= self.limit:  # one larger than the whole cache is used, not kept
                self._make_room(self.limit - nbytes)
                self._entries[token] = (value, nbytes)
                self._bytes += nbytes
            return value

    def _make_room(self, budget: int) -> None:
        while self._entries and self._bytes > budget:
            _, (_, nbytes) = self._entries.popitem(last=False)
            self._bytes -= nbytes
            self.evictions += 1

    def set_limit(self, limit: int) -> None:
        with self._lock:
            self.limit = limit
            self._make_room(limit)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def info(self) -> dict[str, int]:
        with self._lock:
            return {"uploads": self.uploads, "hits": self.hits, "evictions": self.evictions,
                    "entries": len(self._entries), "bytes": self._bytes,
                    "limit": self.limit}


_cache = WeightCache(_parse_limit(os.environ.get(ENV_VAR) or DEFAULT_LIMIT))


def weight_cache() -> WeightCache:
    return _cache


def cache_info() -> dict[str, int]:
    """This process's weight cache: uploads (misses), hits, evictions, entries, bytes held
    on the device and the limit. On a cluster: `client.run(coopmat.dask.cache_info)`."""
    return _cache.info()


def clear_cache() -> None:
    """Drop every cached weight of this process (their device memory is freed)."""
    _cache.clear()


def set_cache_limit(limit: int | str) -> None:
    """This process's cache bound in bytes (an int or a string such as "8 GiB"; default
    $COOPMAT_DASK_WEIGHT_CACHE, else 4 GiB); weights past it are evicted now.
    On a cluster: `client.run(coopmat.dask.set_cache_limit, "8 GiB")`."""
    _cache.set_limit(_parse_limit(limit))
