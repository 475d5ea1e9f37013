"""A bounded, thread-safe map that forgets its least recently used entries: the caches of
call recipes, plans and kept small products hold one each."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class Lru(Generic[V]):
    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._items: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        """The value for key (now the most recently used), or None."""
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Hashable, value: V) -> list[V]:
        """Store value for key; returns what was pushed out (a value key had before, and
        the least recently used past capacity), for the caller to release."""
        with self._lock:
            old = self._items.pop(key, None)
            self._items[key] = value
            out = [old] if old is not None else []
            while len(self._items) > self.capacity:
                out.append(self._items.popitem(last=False)[1])
            return out

    def clear(self) -> list[V]:
        """Forget everything; returns what was held."""
        with self._lock:
            out = list(self._items.values())
            self._items.clear()
            return out

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
