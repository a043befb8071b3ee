"""Precache: after a client reads a chunk, warm what a viewer asks next, at low priority.

A viewer that has just read chunk ``k`` of a level next pans (the neighbouring chunks of the
same level) or zooms (the chunk of the next coarser level covering the region, the chunks of
the next finer one). ``Precacher.after_read`` notes the chunk read; the worker thread plans
its neighbours through the normal planner — so their ids are the ones the client will send —
queues the ones not cached yet, up to ``budget_bytes`` of output per trigger, and computes
them through the read engine, which stores them in the chunk cache. Planning is the worker's,
not the client's: done on the request thread it cost a warm 512² IIIF tile 1.1 ms of its
6.2 ms (p50 over HTTP, idle machine); a chunk already planned around (the last
``MAX_PLANNED`` of them) is not planned around again.

Never delaying a client's own read: the worker runs at the lowest scheduling priority
(``os.setpriority`` on its own thread id) and starts an item only once no client read has
been in flight for ``QUIET_S`` (``client_read()`` brackets them), so precache work only fills
idle time: a viewer's burst of tile requests is not shared with a chunk computation started
between two of them (in one process the worker's GIL turns and its cores would slow every
tile of the burst). The queue is bounded
(oldest dropped): a fast-panning viewer's stale neighbours are not worth warming.

``stats``: scheduled, warmed, dropped, and ``hits`` — client reads served from an entry the
precacher warmed (reported by the server's ``cache_stats``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from tensor_server.core.bounds import Bounds
from tensor_server.core.chunk_id import PRECOMPUTE, ChunkId
from tensor_server.core.plan import grid_of, plan_read
from tensor_server.core.pyramid import PyramidPolicy, advertised_levels

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.core.adapter_base import TensorAdapter
    from tensor_server.core.engine import ReadEngine

__all__ = ["Precacher"]

log = logging.getLogger(__name__)
_SPATIAL = ("z", "y", "x")
#: seconds without a client read before the worker starts the next item
QUIET_S = 0.2
#: chunks whose neighbours were planned, remembered so a re-read does not plan them again
MAX_PLANNED = 4096


class Precacher:
    def __init__(
        self,
        engine: ReadEngine,
        *,
        policy: PyramidPolicy | None = None,
        budget_bytes: int = 64 << 20,
        max_queue: int = 256,
    ) -> None:
        if engine.store is None:
            raise ValueError("precache needs a read engine with a chunk store")
        self.engine = engine
        self.store = engine.store
        self.policy = policy
        self.budget_bytes = int(budget_bytes)
        self._queue: deque[tuple[TensorAdapter, ChunkId]] = deque(maxlen=max_queue)
        self._queued: set[bytes] = set()
        #: chunks a door computed and did not store (``keep``): stored first, never dropped
        self._kept: OrderedDict[bytes, tuple[ChunkId, np.ndarray]] = OrderedDict()
        self._kept_bytes = 0
        self._warmed: OrderedDict[bytes, None] = OrderedDict()
        #: chunks read, their neighbours not planned yet (the oldest dropped beyond max_queue)
        self._triggers: OrderedDict[bytes, tuple[TensorAdapter, ChunkId]] = OrderedDict()
        self._max_triggers = max_queue
        self._planned: OrderedDict[bytes, None] = OrderedDict()
        self._planning = False  # a trigger popped, its neighbours not queued yet (not idle)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._active_client_reads = 0
        self._last_client_read = 0.0  # time.monotonic() when the last client read ended
        self.stats = {"scheduled": 0, "warmed": 0, "dropped": 0, "hits": 0, "errors": 0}
        self._thread = threading.Thread(target=self._run, name="precache", daemon=True)
        self._thread.start()

    # ---- client side -------------------------------------------------------------------------------
    @contextmanager
    def client_read(self) -> Iterator[None]:
        """Bracket a client's chunk read: the worker waits while any is in flight."""
        with self._lock:
            self._active_client_reads += 1
        try:
            yield
        finally:
            with self._lock:
                self._active_client_reads -= 1
                self._last_client_read = time.monotonic()

    def after_read(self, tensor: TensorAdapter, cid: ChunkId) -> None:
        """A client read ``cid`` of ``tensor``: count a hit if we warmed it; the worker plans
        what is next (unless it did around this chunk already). The read ended now, for the
        quiet rule too: a chunk the fast path offers (``chunk_locate``) is read by the client
        itself, outside any ``client_read`` bracket, and a burst of them kept the worker
        computing neighbours beside the burst (12 % of the server's samples, 6 SDK clients)."""
        key = cid.encode()
        with self._lock:
            self._last_client_read = time.monotonic()
            if key in self._warmed:
                del self._warmed[key]
                self.stats["hits"] += 1
            if key in self._planned:
                self._planned.move_to_end(key)
                return
            self._triggers[key] = (tensor, cid)
            if len(self._triggers) > self._max_triggers:
                self._triggers.popitem(last=False)
                self.stats["dropped"] += 1
        self._wake.set()

    def _plan_around(self, key: bytes, tensor: TensorAdapter, cid: ChunkId) -> None:
        with self._lock:
            self._planned[key] = None
            while len(self._planned) > MAX_PLANNED:
                self._planned.popitem(last=False)
        try:
            candidates = self._next_reads(tensor, cid)
        except Exception as exc:  # a neighbour that cannot be planned is not warmed, nothing more
            log.debug("precache: cannot plan around %s: %s", cid.array_id, exc)
            return
        self.warm(tensor, candidates, skip=key)

    def keep(self, tensor: TensorAdapter, cid: ChunkId, pixels: np.ndarray) -> None:
        """A door computed ``cid``'s pixels without storing them, to answer sooner: store
        them when idle, before any other work and never dropped for a neighbour (at most
        ``budget_bytes`` held; past that the chunk is queued to be recomputed), and plan its
        neighbours as for a read."""
        if not self.engine.settled(tensor, cid):  # the live edge of a growing tensor is never stored
            return
        key = cid.encode()
        with self._lock:
            fits = self._kept_bytes + pixels.nbytes <= self.budget_bytes
            if fits and key not in self._kept and not self.store.contains_all([key]):
                self._kept[key] = (cid, pixels.copy())  # the door goes on using its own array
                self._kept_bytes += pixels.nbytes
        if not fits:
            self.warm(tensor, [cid])
        self.after_read(tensor, cid)

    def warm(self, tensor: TensorAdapter, cids: list[ChunkId], skip: bytes | None = None) -> None:
        """Queue the chunks of ``cids`` not cached or queued yet, up to ``budget_bytes``
        (``after_read``'s neighbours; a door's chunks it served a cold region without)."""
        spent = 0
        store = self.store
        with self._lock:
            for nxt in cids:
                nkey = nxt.encode()
                if nkey == skip or nkey in self._queued or nkey in self._warmed or nkey in self._kept:
                    continue
                nbytes = _prod(nxt.output_shape) * tensor.dtype.itemsize
                if spent + nbytes > self.budget_bytes:
                    break
                if store.contains_all([nkey]):
                    continue
                if len(self._queue) == self._queue.maxlen:
                    _, dropped = self._queue.popleft()
                    self._queued.discard(dropped.encode())
                    self.stats["dropped"] += 1
                self._queue.append((tensor, nxt))
                self._queued.add(nkey)
                self.stats["scheduled"] += 1
                spent += nbytes
        if spent:
            self._wake.set()

    def _next_reads(self, tensor: TensorAdapter, cid: ChunkId) -> list[ChunkId]:
        """Neighbours on the same level, then the next coarser and finer levels' chunks over
        the same region, in that order (the budget keeps the first)."""
        levels = [(tuple(lv.scale), lv.method) for lv in advertised_levels(tensor, self.policy)]
        if cid.method == PRECOMPUTE:
            level0 = Bounds(
                tuple(a * s for a, s in zip(cid.start, cid.scale)),
                tuple(min(b * s, n) for b, s, n in zip(cid.stop, cid.scale, tensor.shape)),
            )
        else:
            level0 = cid.bounds
        here = next((i for i, (scale, _) in enumerate(levels) if scale == cid.scale), None)
        grid = grid_of(tensor, cid)  # a tile's neighbours are the tiles the viewer asks next
        out: list[ChunkId] = []
        grown = self._grow(tensor, level0, cid.scale, tensor.tile_shape if grid == "tile" else tensor.chunk_shape)
        out += [pc.chunk_id for pc in plan_read(tensor, grown, cid.scale, _wire(cid.method), grid).chunks]
        if here is not None:
            for j in (here + 1, here - 1):
                if 0 <= j < len(levels):
                    scale, method = levels[j]
                    out += [pc.chunk_id for pc in plan_read(tensor, level0, scale, method, grid).chunks]
        return out

    @staticmethod
    def _grow(tensor: TensorAdapter, bounds: Bounds, scale: tuple[int, ...], chunk: tuple[int, ...]) -> Bounds:
        """``bounds`` widened by one ``chunk`` (at ``scale``) on the spatial axes (clamped)."""
        start, stop = list(bounds.start), list(bounds.stop)
        for axis, label in enumerate(tensor.dim_labels):
            if label in _SPATIAL:
                step = chunk[axis] * scale[axis]
                start[axis] = max(0, start[axis] - step)
                stop[axis] = min(tensor.shape[axis], stop[axis] + step)
        return Bounds(tuple(start), tuple(stop))

    # ---- worker ------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (OSError, AttributeError):  # not Linux, or not allowed: still idle-only below
            pass
        while not self._stop.is_set():
            with self._lock:
                quiet = self._active_client_reads == 0 and time.monotonic() - self._last_client_read >= QUIET_S
                kept = next(iter(self._kept.items())) if self._kept and quiet else None
                trigger = self._triggers.popitem(last=False) if self._triggers and quiet and kept is None else None
                self._planning = trigger is not None
                item = self._queue.popleft() if self._queue and quiet and trigger is None and kept is None else None
                waiting = bool(self._queue or self._triggers or self._kept)
                # until the quiet time can have passed (a read in flight: soon, it may end)
                pause = 0.01 if self._active_client_reads else QUIET_S - (time.monotonic() - self._last_client_read)
            if kept is not None:  # a store, no computation: it makes a tile a hit, so it goes first
                self._store_kept(kept[0], *kept[1])
                continue
            if trigger is not None:  # planning is cheap beside a chunk: it goes before the next item
                try:
                    self._plan_around(trigger[0], *trigger[1])
                finally:
                    with self._lock:
                        self._planning = False
                continue
            if item is None:
                if waiting:
                    self._stop.wait(max(pause, 0.01))  # a client read is in flight or just ended; close() ends it
                else:
                    self._wake.wait(0.5)
                    self._wake.clear()
                continue
            tensor, cid = item
            key = cid.encode()
            try:
                self.engine.chunk(cid, tensor)
                with self._lock:
                    self.stats["warmed"] += 1
                    self._warmed[key] = None
                    while len(self._warmed) > 4096:
                        self._warmed.popitem(last=False)
            except Exception as exc:  # stale, evicted source, ...: a precache miss is harmless
                with self._lock:
                    self.stats["errors"] += 1
                log.debug("precache of %s failed: %s", cid.array_id, exc)
            finally:
                with self._lock:
                    self._queued.discard(key)

    def _store_kept(self, key: bytes, cid: ChunkId, pixels: np.ndarray) -> None:
        try:
            self.store.get_or_compute(key, lambda: pixels)
        except Exception as exc:  # a full disk: the chunk is computed on its next read
            with self._lock:
                self.stats["errors"] += 1
            log.debug("precache: cannot store %s: %s", cid.array_id, exc)
        finally:
            with self._lock:
                self._kept.pop(key, None)
                self._kept_bytes -= pixels.nbytes

    def idle(self) -> bool:
        with self._lock:
            return not (self._queue or self._queued or self._triggers or self._planning or self._kept)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)


def _wire(method: str) -> str | None:
    return None if method == "none" else method


def _prod(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out
