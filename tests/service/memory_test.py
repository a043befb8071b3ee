"""MemoryReturn: the server gives freed memory back on a timer, and stops when closed."""

from __future__ import annotations

import threading
import time

from tensor_server.service import memory
from tensor_server.service.memory import MemoryReturn, release_unused_memory


def test_it_calls_the_release_function_on_its_interval_and_stops_when_closed() -> None:
    calls: list[float] = []
    twice = threading.Event()

    def release() -> None:
        calls.append(time.monotonic())
        if len(calls) >= 2:
            twice.set()

    returner = MemoryReturn(interval=0.01, release=release)
    assert twice.wait(10), "the release function was not called twice"
    returner.close()
    after_close = len(calls)
    time.sleep(0.1)  # ten intervals: a thread still running would have called it again
    assert len(calls) == after_close
    assert not any(t.name == "tensor-server-memory-return" and t.is_alive() for t in threading.enumerate())


def test_a_failing_release_does_not_end_the_thread() -> None:
    calls = 0
    third = threading.Event()

    def release() -> None:
        nonlocal calls
        calls += 1
        if calls >= 3:
            third.set()
        raise RuntimeError("allocator said no")

    returner = MemoryReturn(interval=0.01, release=release)
    try:
        assert third.wait(10), "the thread stopped after a failing release"
    finally:
        returner.close()


def test_release_unused_memory_trims_the_c_heap(monkeypatch) -> None:
    assert memory._TRIM is not None, "glibc's malloc_trim was not found (every machine of this project has glibc)"
    trims: list[int] = []
    monkeypatch.setattr(memory, "_TRIM", lambda: trims.append(1))
    release_unused_memory()
    assert trims == [1]


def test_the_arena_limit_is_set_where_glibc_has_mallopt() -> None:
    """glibc accepts M_ARENA_MAX (mallopt answers 1); elsewhere it is a no-op that says so."""
    import ctypes

    has_mallopt = getattr(ctypes.CDLL(None), "mallopt", None) is not None
    assert memory.limit_malloc_arenas(2) is has_mallopt
