"""Give freed memory back to the system, so a burst of large requests does not leave the
server's resident size high for the rest of its life.

A refused request still allocates what it was refused for: a 32 MiB label or a 23 MB polygon
arrives in Arrow buffers and gRPC slices before its size is checked, and a junk DoPut stream
is read up to its budget. The allocators keep what was freed for reuse — glibc's malloc
arenas (one per thread that allocated, so every worker thread of a burst keeps its own) and
Arrow's mimalloc pool — so the resident size stays at the burst's peak. Twelve 32 MiB label
floods left +50 MiB that one ``malloc_trim`` took back to +18 MiB. It is not the whole answer:
on the load bench (``bench/load.py``, 2026-12-04) RSS a minute after a 3-minute hostile client
was still 1.48× its quiet level with this thread running (1.51× in an earlier run without it), against 1.07× for
the same load with no hostile client (``--control``) — the rest is memory still held, not
free-list slack.

The read path's scratch buffers were the largest of what was still held: a hostile client's
``tensor_stats`` of the 2048² fixture left three 32 MiB unit buffers kept for reuse (+88 MiB
anonymous memory); ``core.stream_reduce.trim_scratch`` now frees the kept buffers larger than
any read asked for since the previous turn.

``MemoryReturn`` trims those, then asks both allocators to release what they hold unused every ``interval``
seconds: ``pyarrow``'s ``release_unused()`` and glibc's ``malloc_trim(0)`` (0.06 ms on an
idle 360 MiB server; a no-op where glibc is not the C library).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable

__all__ = ["MemoryReturn", "release_unused_memory"]

log = logging.getLogger(__name__)


def _malloc_trim() -> Callable[[], None] | None:
    """glibc's ``malloc_trim(0)``, looked up in the process's own symbols (no ``find_library``
    subprocess at import); None where the C library has none (musl, macOS return memory
    themselves)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


_TRIM = _malloc_trim()


def release_unused_memory() -> None:
    """Free the read path's scratch buffers no read used since the last turn, then ask Arrow's
    pool and the C allocator to give back the memory they hold unused."""
    import pyarrow as pa

    from tensor_server.core.stream_reduce import trim_scratch

    trim_scratch()
    pa.default_memory_pool().release_unused()
    if _TRIM is not None:
        _TRIM()


class MemoryReturn:
    """A daemon thread that calls ``release`` (``release_unused_memory`` by default) every
    ``interval`` seconds until ``close()``."""

    def __init__(self, interval: float = 10.0, release: Callable[[], None] = release_unused_memory) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(interval, release), name="tensor-server-memory-return", daemon=True
        )
        self._thread.start()

    def _run(self, interval: float, release: Callable[[], None]) -> None:
        while not self._stop.wait(interval):
            try:
                release()
            except Exception:  # never fatal: memory is given back at the next turn, or not at all
                log.exception("giving unused memory back failed")

    def close(self) -> None:
        """Stop the thread; returns once it has ended (or after 5 s)."""
        self._stop.set()
        self._thread.join(timeout=5)
