"""Lazily opened file handles, closed by a reaper after idle time.

A server holds thousands of sources but reads few at a time. Keeping every file open wastes
descriptors (and on network filesystems, locks); reopening per read costs a header parse.
``LazyHandle`` opens on first use, counts reads in flight, and lets one daemon reaper close
handles that have been idle for ``idle_seconds``, never while a read holds them.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

__all__ = ["LazyHandle", "reap_idle_handles", "DEFAULT_IDLE_SECONDS"]

T = TypeVar("T")
DEFAULT_IDLE_SECONDS = 60.0

_registry: weakref.WeakSet[LazyHandle[Any]] = weakref.WeakSet()
_registry_lock = threading.Lock()
_reaper: threading.Thread | None = None


class LazyHandle(Generic[T]):
    """``with handle.use() as h:`` opens (once) and pins the handle for the block."""

    def __init__(
        self,
        opener: Callable[[], T],
        closer: Callable[[T], None] | None = None,
        idle_seconds: float = DEFAULT_IDLE_SECONDS,
        name: str = "",
    ) -> None:
        self._opener = opener
        self._closer = closer or (lambda h: getattr(h, "close", lambda: None)())
        self.idle_seconds = idle_seconds
        self.name = name
        self._handle: T | None = None
        self._in_flight = 0
        self._last_used = 0.0
        self._cond = threading.Condition()
        self.opens = 0  # how many times the file was (re)opened, for tests and stats
        with _registry_lock:
            _registry.add(self)
        _ensure_reaper()

    @contextmanager
    def use(self) -> Iterator[T]:
        with self._cond:
            if self._handle is None:
                self._handle = self._opener()
                self.opens += 1
            self._in_flight += 1
            handle = self._handle
        try:
            yield handle
        finally:
            with self._cond:
                self._in_flight -= 1
                self._last_used = time.monotonic()
                self._cond.notify_all()

    @property
    def is_open(self) -> bool:
        return self._handle is not None

    def close_if_idle(self, now: float | None = None) -> bool:
        """Close when open, unused by any read, and idle long enough. True if closed."""
        now = time.monotonic() if now is None else now
        with self._cond:
            if self._handle is None or self._in_flight:
                return False
            if now - self._last_used < self.idle_seconds:
                return False
            handle, self._handle = self._handle, None
        self._closer(handle)
        return True

    def close(self) -> None:
        """Close now, waiting for reads in flight to finish first."""
        with self._cond:
            while self._in_flight:
                self._cond.wait()
            handle, self._handle = self._handle, None
        if handle is not None:
            self._closer(handle)

    def __del__(self) -> None:
        """A source dropped without ``close()`` still closes its file, quietly: readers such
        as ``nd2`` warn about files the garbage collector finds open, and a user who lets a
        source go out of scope has done nothing wrong."""
        handle, self._handle = getattr(self, "_handle", None), None
        if handle is not None:
            try:
                self._closer(handle)
            except Exception:  # never raise from a finalizer
                pass


def reap_idle_handles(now: float | None = None) -> int:
    """Close every idle handle; return how many were closed."""
    with _registry_lock:
        handles = list(_registry)
    return sum(1 for h in handles if h.close_if_idle(now))


def _ensure_reaper(interval: float = 5.0) -> None:
    global _reaper
    with _registry_lock:
        if _reaper is not None and _reaper.is_alive():
            return

        def loop() -> None:
            while True:
                time.sleep(interval)
                try:
                    reap_idle_handles()
                except Exception:  # the reaper must never die of one bad closer
                    pass

        _reaper = threading.Thread(target=loop, name="tensor-server-handle-reaper", daemon=True)
        _reaper.start()
