"""Give freed memory back to the system, so a burst of large requests does not leave the
server's resident size high for the rest of its life.

A refused request still allocates what it was refused for: a 32 MiB label or a 23 MB polygon
arrives in Arrow buffers and gRPC slices before its size is checked, and a junk DoPut stream
is read up to its budget; large reads decode units on several threads at once. The allocators
keep what was freed for reuse — glibc's malloc arenas and Arrow's mimalloc pool — so the
resident size stays near the burst's peak. Three things give it back:

* ``limit_malloc_arenas`` at start: glibc makes up to 8 arenas per core, one for each thread
  that finds the others busy, and ``malloc_trim`` leaves what those keep between live blocks;
  with as many arenas as cores it goes back;
* ``core.stream_reduce.trim_scratch``: the read path's kept unit and chunk buffers larger than
  any read asked for since the previous turn are freed (they only ever grew);
* ``MemoryReturn``, every ``interval`` seconds: that trim, ``pyarrow``'s ``release_unused()``
  and glibc's ``malloc_trim(0)`` (0.06 ms on an idle 360 MiB server; a no-op where glibc is not
  the C library).

On the load bench (``bench/load.py``, 2026-12-04: 8 honest clients, a 3-minute hostile client,
a minute after), RSS after / quiet was 1.51× with none of these, 1.43-1.48× with the trims and
1.08× with the arena limit as well (target 1.10; the same load with no hostile client: 1.07×).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable

__all__ = ["MemoryReturn", "limit_malloc_arenas", "release_unused_memory"]

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
#: glibc's ``mallopt`` parameter for the most arenas malloc creates (``M_ARENA_MAX``)
_M_ARENA_MAX = -8


def limit_malloc_arenas(count: int | None = None) -> bool:
    """Let glibc's malloc create at most ``count`` arenas (default: the cores); True when set.

    glibc gives a thread that finds the arenas busy an arena of its own, up to 8 per core, and
    ``malloc_trim`` does not give back what those arenas keep between their live blocks: the
    read path's decode threads allocate a unit's buffers in many arenas at once. Measured on
    this project's 2-core VM, 300 ``tensor_stats`` of the 2048² OME-TIFF fixture in-process,
    anonymous memory after ``release_unused_memory``: +44 MiB with glibc's default, +8 with 2
    arenas, +0 with 1. Called once at start, before the serving threads exist (arenas made
    before stay). A no-op where the C library is not glibc."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, max(1, count or os.cpu_count() or 1)))


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
