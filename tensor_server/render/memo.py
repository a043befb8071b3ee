"""A bounded, thread-safe memo: what rendering measures or builds once and reuses (a tensor's
render settings, a channel's histogram, a render spec's tables), least recently used first out."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["LruMemo"]

V = TypeVar("V")


class LruMemo(Generic[V]):
    """Values by key, at most ``size`` of them. ``make`` runs outside the lock: two threads
    missing the same key may both make it (the second result is kept), but no thread waits on
    another's read."""

    def __init__(self, size: int = 1024) -> None:
        self._items: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()
        self.size = size

    def get(self, key: Hashable, make: Callable[[], V]) -> V:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = make()
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value
