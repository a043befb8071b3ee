"""Streamed, pipelined reduction of a scaled chunk's source extent (design: scaled-read-path.md §2).

A scaled chunk's level-0 extent can be large (transfer chunk × scale, e.g. 2048² × 32² px).
Instead of holding it, the extent is cut into *units* aligned to reduction blocks; each unit
is read, reduced with ``downsample_block`` and written into a preallocated output. Because
unit edges land on block edges, every output element depends on exactly one unit, and the
only ragged block is where the extent itself ends, so the streamed result is identical to
reducing the whole extent, for every method and dtype, whatever order or thread reads a unit.

Pipelining (why: decoding dominates a scaled read, and the reduction kernels release the GIL).
``workers - 1`` threads of one process-wide pool and the calling thread each take the next unit,
read it and reduce it into the preallocated output (output blocks of different units are
disjoint), until none is left (``run_parallel``); so decoding and reducing both run on every
core, and a thread that finishes a unit starts the next without waiting for another thread to
hand it over (each hand-off cost two thread wake-ups, 0.4-0.9 ms on this project's VM: a
4096² uint16 zarr plane of 16 chunks took 14-18 ms that way, 12-14 ms now). A reader that can
write into a given buffer (``fetch_into``) gets one of a few buffers the process reuses
(``scratch``) instead of a fresh unit per read: first touches of fresh memory take page faults
that serialise parallel decodes (on this project's machine 4 blosc chunks decoded on 2 threads
took 58 ms into fresh buffers, 24 ms into reused ones). The invariants and how each is bounded:

* **Memory**: each thread holds one unit at a time, so at most ``workers`` units are read at
  once per call (``workers=1`` is the serial loop: one), within the ``workers + 1`` the tests
  hold it to. The process keeps up to cores + 1 scratch buffers per use between reads (at most
  ``SCRATCH_LIMIT`` bytes each).
* **Threads**: the pool is shared by every read in the process and has a fixed size (the
  largest worker count asked for, at least the cores). Concurrent scaled reads (one per gRPC
  thread) queue their helpers on it; no read creates threads of its own.
* **No deadlock**: the calling thread reads units itself, so a read always makes progress; it
  waits at the end only for units some thread is reading, never for a helper still queued
  behind other reads (that helper finds nothing left and returns). So a fetch that itself uses
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
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
from tensor_server_kernels.reference import output_shape

from tensor_server.core.bounds import Bounds
from tensor_server.core.uniform import fill_uniform_units

__all__ = [
    "streaming_unit",
    "stream_reduce",
    "iter_units",
    "default_workers",
    "run_parallel",
    "scratch",
    "trim_scratch",
]

Fetch = Callable[[Bounds], np.ndarray]
FetchInto = Callable[[Bounds, np.ndarray], None]

#: Largest scratch buffer kept between reads (a 4096² uint16 chunk; larger ones live for one use).
SCRATCH_LIMIT = 32 << 20
#: Smallest one kept (below it the heap's own reuse is as good).
SCRATCH_MIN = 1 << 20


def default_workers() -> int:
    """The threads a streamed reduction reads on when none is configured: the machine's cores."""
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
#: per slot, the largest buffer a read asked for since the last ``trim_scratch``
_asked: dict[str, int] = {}
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
        _asked[slot] = max(_asked.get(slot, 0), nbytes)
        free = _free.setdefault(slot, [])  # smallest first
        fits = next((i for i, b in enumerate(free) if b.nbytes >= nbytes), None)
        # by index: list.remove compares arrays with ==, which fails on buffers of two sizes
        buf = free.pop(fits) if fits is not None else None
        if buf is None and len(free) >= keep:
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


def trim_scratch() -> int:
    """Free the kept buffers no read asked for since the last call: those larger than the
    largest size asked of their slot (all of a slot nobody used). Returns the bytes freed.

    The kept buffers only grow (a read that needs more than every kept one evicts the smallest),
    so a client's large reduction left up to cores + 1 buffers of up to 32 MiB per slot for the
    life of the process. Called by the service's ``MemoryReturn`` every few seconds; a steady
    load keeps the sizes it asks for, so its reads still find touched memory."""
    freed = 0
    with _free_lock:
        for slot, free in _free.items():
            asked = _asked.pop(slot, 0)
            kept = [b for b in free if b.nbytes <= asked]
            freed += sum(b.nbytes for b in free) - sum(b.nbytes for b in kept)
            free[:] = kept
    return freed


_Job = TypeVar("_Job")


def run_parallel(jobs: Iterable[_Job], run: Callable[[_Job], None], helpers: int | None = None) -> None:
    """``run(job)`` for every job, on the shared pool and on this thread at once; raises the
    first error. Each thread takes the next job itself when it finishes one (a job handed out
    one at a time through the caller costs two thread wake-ups, 0.4-0.9 ms on this project's
    VM, a third of a 1 MiB chunk's decode). ``helpers``: pool threads asked to join (default:
    the cores, and for a sequence at most one per job after the first); so at most
    ``helpers + 1`` jobs run at once. The caller waits only for jobs some thread is running, never for a helper still
    queued behind other reads (those find nothing left and return), so a nested use (a pool
    thread reading a unit whose pieces it spreads) always makes progress."""
    if helpers is None:
        helpers = min(len(jobs) - 1, default_workers()) if isinstance(jobs, Sequence) else default_workers()
    todo = iter(jobs)
    cond = threading.Condition()
    active = 0
    error: BaseException | None = None

    def drain() -> None:
        nonlocal active, error
        while True:
            with cond:
                job = None if error is not None else next(todo, None)
                if job is None:
                    return
                active += 1
            try:
                run(job)
            except BaseException as exc:  # handed to the caller
                with cond:
                    error = error or exc
            finally:
                with cond:
                    active -= 1
                    cond.notify_all()

    for _ in range(helpers):
        _submit(drain, helpers)
    drain()
    with cond:
        cond.wait_for(lambda: active == 0)
    if error is not None:
        raise error


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
    unit_value: Callable[[Bounds], np.generic | None] | None = None,
    fetch_into: FetchInto | None = None,
) -> np.ndarray:
    """Reduce ``bounds`` unit by unit into ``out`` (allocated when None); return ``out``.

    ``unit`` must be a whole number of reduction blocks on every axis (``streaming_unit``
    guarantees it); ``fetch(unit_bounds)`` returns that unit's level-0 pixels, or, when given,
    ``fetch_into(unit_bounds, buf)`` writes them into ``buf`` (a C-contiguous array of the
    unit's shape and ``dtype``; module docstring). ``workers``: the threads that read units,
    this one included (None: ``default_workers()``; 1: one unit at a time on this thread). The result
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
    # ``workers - 1`` pool threads and this one each read and reduce the next unit until none
    # is left (module docstring); workers=1 is this thread alone
    run_parallel(units, read_and_reduce, helpers=workers - 1)
    return out
