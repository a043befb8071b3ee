"""Streamed, pipelined reduction of a scaled chunk's source extent (design: scaled-read-path.md §2).

A scaled chunk's level-0 extent can be large (transfer chunk × scale, e.g. 2048² × 32² px).
Instead of holding it, the extent is cut into *units* aligned to reduction blocks; each unit
is read, reduced with ``downsample_block`` and written into a preallocated output. Because
unit edges land on block edges, every output element depends on exactly one unit, and the
only ragged block is where the extent itself ends, so the streamed result is identical to
reducing the whole extent, for every method and dtype, whatever order or thread reads a unit.

Pipelining (why: decoding dominates a scaled read, and the reduction kernels release the GIL).
Up to ``workers`` units are read ahead on one process-wide pool; the thread that reads a unit
also reduces it into the output (output blocks of different units are disjoint), so decoding
and reducing both run on every core. A reader that can write into a given buffer
(``fetch_into``) gets one of a few buffers the process reuses (``scratch``) instead of a fresh
unit per read: first touches of fresh memory take page faults that serialise parallel decodes (on this
project's machine 4 blosc chunks decoded on 2 threads took 58 ms into fresh buffers, 24 ms into
reused ones). The invariants and how each is bounded:

* **Memory**: at most ``workers`` units are queued or being read per call, plus the one the
  caller reads itself: peak residency is ``workers + 1`` units (``workers=1`` is the serial
  loop: one). The process keeps up to cores + 1 scratch buffers per use between reads (at most
  ``SCRATCH_LIMIT`` bytes each).
* **Threads**: the pool is shared by every read in the process and has a fixed size (the
  largest worker count asked for, at least the cores). Concurrent scaled reads (one per gRPC
  thread) queue their units on it; no read creates threads of its own.
* **No deadlock**: a read never waits for a unit that has not started. When it needs a unit
  still queued (the pool busy with other reads), it takes the unit back and reads it on its own
  thread; it only waits for units some thread is actively reading. So a fetch that itself uses
  a pool, this one included (a nested scaled read), always makes progress.

``fetch`` is therefore called from several threads at once and must be safe for that (the
server already reads one tensor from many threads); the array it returns must not be reused
by a later call.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Sequence

import numpy as np

from tensor_server.core.bounds import Bounds
from tensor_server.core.uniform import fill_uniform_units
from tensor_server_kernels.reference import output_shape

__all__ = ["streaming_unit", "stream_reduce", "iter_units", "default_workers", "run_parallel", "scratch"]

Fetch = Callable[[Bounds], np.ndarray]
FetchInto = Callable[[Bounds, np.ndarray], None]

#: Largest scratch buffer kept between reads (a 4096² uint16 chunk; larger ones live for one use).
SCRATCH_LIMIT = 32 << 20
#: Smallest one kept (below it the heap's own reuse is as good).
SCRATCH_MIN = 1 << 20


def default_workers() -> int:
    """The read-ahead depth when none is configured: the machine's cores."""
    return os.cpu_count() or 1


def streaming_unit(
    transfer: Sequence[int],
    read_block: Sequence[int] | None,
    scale: Sequence[int],
) -> tuple[int, ...]:
    """The unit a scaled read streams its extent in.

    Start from the transfer grid (a unit of about one transfer chunk of source pixels), floor
    it at ``read_block`` (what the reader cannot read below: a smaller unit would make every
    unit overlapping a block pay for decoding all of it; ``None`` = the reader crops cheaply),
    then round up to whole reduction blocks so units never split a block.
    """
    unit = []
    for axis, (t, s) in enumerate(zip(transfer, scale)):
        u = max(int(t), 1)
        if read_block is not None and read_block[axis] is not None:
            u = max(u, int(read_block[axis]))
        u = -(-u // s) * s
        unit.append(u)
    return tuple(unit)


def iter_units(bounds: Bounds, unit: Sequence[int]):
    """Yield the units covering ``bounds`` in row-major order (last axis fastest)."""
    ranges = [range(a, b, u) for a, b, u in zip(bounds.start, bounds.stop, unit)]
    for starts in itertools.product(*ranges):
        stops = tuple(min(a + u, b) for a, u, b in zip(starts, unit, bounds.stop))
        yield Bounds(starts, stops)


# ---- the shared read-ahead pool ----------------------------------------------------------------
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()
def _submit(run: Callable[[], None], workers: int) -> None:
    """Queue ``run`` on the process-wide pool, first growing it (a new pool replaces the old
    one, whose queued units still run) when a read asks for more workers than it has."""
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or workers > _pool_size:
            old = _pool
            _pool_size = max(workers, default_workers(), _pool_size)
            _pool = ThreadPoolExecutor(_pool_size, thread_name_prefix="tensor-read")
            if old is not None:
                old.shutdown(wait=False)
        _pool.submit(run)


_free: dict[str, list[np.ndarray]] = {}
_free_lock = threading.Lock()


@contextlib.contextmanager
def scratch(shape: Sequence[int], dtype: np.dtype, slot: str) -> Iterator[np.ndarray]:
    """A C-contiguous buffer of ``shape`` and ``dtype`` for the ``with`` block, taken from the
    process's free buffers of ``slot`` (the use: a unit, a chunk decoded into it) and given
    back after: memory that has been touched before, so no page faults. At most the cores + 1
    buffers of ``SCRATCH_MIN`` to ``SCRATCH_LIMIT`` bytes are kept per slot; other sizes, and
    buffers beyond that count, are allocated for the one use (small ones come from the heap,
    which reuses its memory anyway)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if not SCRATCH_MIN <= nbytes <= SCRATCH_LIMIT:
        yield np.empty(tuple(shape), dtype)
        return
    keep = default_workers() + 1
    with _free_lock:
        free = _free.setdefault(slot, [])  # smallest first
        buf = next((b for b in free if b.nbytes >= nbytes), None)
        if buf is not None:
            free.remove(buf)
        elif len(free) >= keep:
            free.pop(0)  # every kept one is too small: make room for a larger one
    if buf is None:
        buf = np.empty(nbytes, np.uint8)
    try:
        yield buf[:nbytes].view(dtype).reshape(tuple(shape))
    finally:
        with _free_lock:
            if len(free) < keep:
                free.append(buf)
                free.sort(key=lambda b: b.nbytes)


def run_parallel(jobs: Sequence[object], run: Callable[[object], None]) -> None:
    """``run(job)`` for every job, on the shared pool and on this thread at once; raises the
    first error. The caller waits only for jobs some thread is running, never for a helper
    still queued behind other reads (those find nothing left and return), so a nested use
    (a pool thread reading a unit whose pieces it spreads) always makes progress."""
    if len(jobs) <= 1:
        for job in jobs:
            run(job)
        return
    todo = iter(jobs)
    cond = threading.Condition()
    state: dict[str, object] = {"active": 0, "error": None}

    def drain() -> None:
        while True:
            with cond:
                job = None if state["error"] is not None else next(todo, None)
                if job is None:
                    return
                state["active"] += 1
            try:
                run(job)
            except BaseException as exc:  # handed to the caller
                with cond:
                    state["error"] = state["error"] or exc
            finally:
                with cond:
                    state["active"] -= 1
                    cond.notify_all()

    for _ in range(min(len(jobs) - 1, default_workers())):
        _submit(drain, 1)
    drain()
    with cond:
        cond.wait_for(lambda: state["active"] == 0)
    if state["error"] is not None:
        raise state["error"]


class _UnitRead:
    """One unit's read and reduction, run by whichever thread claims it first (a pool thread,
    or the caller taking it back); the other one skips it. ``done`` is told when it ends."""

    __slots__ = ("bounds", "_work", "_claim", "_done", "error", "finished")

    def __init__(self, bounds: Bounds, work: Callable[[Bounds], None], done: threading.Condition) -> None:
        self.bounds, self._work, self._done = bounds, work, done
        self._claim = threading.Lock()
        self.error: BaseException | None = None
        self.finished = False

    def run(self) -> None:
        if not self._claim.acquire(blocking=False):
            return  # taken back by the caller, or cancelled
        try:
            self._work(self.bounds)
        except BaseException as exc:  # handed to the caller, raised there
            self.error = exc
        finally:
            with self._done:
                self.finished = True
                self._done.notify_all()

    @property
    def started(self) -> bool:
        """Claimed by some thread (running or ended), or cancelled."""
        return self._claim.locked()

    def cancel(self) -> None:
        self._claim.acquire(blocking=False)


def stream_reduce(
    bounds: Bounds,
    unit: Sequence[int],
    scale: Sequence[int],
    method: str,
    fetch: Fetch,
    dtype: np.dtype,
    out: np.ndarray | None = None,
    *,
    workers: int | None = None,
    unit_value: Callable[[Bounds], object | None] | None = None,
    fetch_into: FetchInto | None = None,
) -> np.ndarray:
    """Reduce ``bounds`` unit by unit into ``out`` (allocated when None); return ``out``.

    ``unit`` must be a whole number of reduction blocks on every axis (``streaming_unit``
    guarantees it); ``fetch(unit_bounds)`` returns that unit's level-0 pixels, or, when given,
    ``fetch_into(unit_bounds, buf)`` writes them into ``buf`` (a C-contiguous array of the
    unit's shape and ``dtype``; module docstring). ``workers`` is the read-ahead depth (None:
    ``default_workers()``; 1: read and reduce one unit at a time on this thread). The result
    does not depend on it. ``unit_value(unit_bounds)``, consulted before each fetch, may
    answer a unit's reduced value in closed form (a uniform unit, ``core/uniform.py``): that
    unit is never fetched.
    """
    from tensor_server.core.downsample import downsample_block

    scale = tuple(int(s) for s in scale)
    if any(u % s for u, s in zip(unit, scale)):
        raise ValueError(f"unit {tuple(unit)} is not a whole number of blocks of scale {scale}")
    workers = default_workers() if workers is None else int(workers)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    out_shape = output_shape(bounds.shape, scale)
    if out is None:
        out = np.empty(out_shape, dtype=dtype)
    elif out.shape != out_shape:
        raise ValueError(f"out has shape {out.shape}, expected {out_shape}")

    def place(ub: Bounds, block: np.ndarray) -> None:
        reduced = downsample_block(block, scale, method)
        o0 = tuple((a - b0) // s for a, b0, s in zip(ub.start, bounds.start, scale))
        out[tuple(slice(a, a + n) for a, n in zip(o0, reduced.shape))] = reduced

    def read_and_reduce(ub: Bounds) -> None:
        if fetch_into is None:
            place(ub, fetch(ub))  # the unit is dropped before the next is read: one per thread
            return
        with scratch(ub.shape, dtype, "unit") as block:
            fetch_into(ub, block)
            place(ub, block)

    units = iter_units(bounds, unit)
    if unit_value is not None:
        units = fill_uniform_units(units, unit_value, out, bounds.start, scale)
    if workers == 1:
        for ub in units:
            read_and_reduce(ub)
        return out

    # Up to ``workers`` units are queued or being read; whenever one ends, whichever it was,
    # the next is queued, so a thread that finishes early starts the next unit at once (waiting
    # for the oldest first left it idle: 8 units of a 8192² zarr tile took 70-94 ms where 2
    # cores read them in 60). The caller waits only while some unit is running: when none has
    # started (the pool busy with other reads), it takes one back and reads it itself.
    ahead: list[_UnitRead] = []
    ended = threading.Condition()

    def top_up() -> None:
        for ub in itertools.islice(units, workers - len(ahead)):
            read = _UnitRead(ub, read_and_reduce, ended)
            ahead.append(read)
            _submit(read.run, workers)

    try:
        top_up()
        while ahead:
            if not any(r.started for r in ahead):
                ahead[0].run()  # none started (the pool is busy with other reads): read one here
            with ended:
                ended.wait_for(lambda: any(r.finished for r in ahead))
            for read in [r for r in ahead if r.finished]:
                ahead.remove(read)
                if read.error is not None:
                    raise read.error
            top_up()
    finally:
        for pending in ahead:  # an error: queued units are skipped, running ones finish and drop
            pending.cancel()
    return out
