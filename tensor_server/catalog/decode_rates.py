"""Measured decode throughput per tensor: the catalog's ``decode_rates`` table.

What the biopb SDK's ``biopb tensor decode-rates`` reads (``SELECT array_id, mbps, samples,
updated_at FROM decode_rates``), with the reference server's semantics
(``core/retention.py`` there): one row per array id, sampled on a full-resolution read that
decoded source bytes (a cache hit is never a sample: counting one would fold the cache's own
speed into the number that says what the cache should keep; a scaled read is never one: it
may be built from cached chunks). The rate is an exponential moving average (alpha 0.25, so
a source whose cost changes is described by its recent reads within about ten samples), in
MB/s of decoded bytes; a duration the clock could not resolve is not a sample.

The rows are what a rebuild costs per byte as the read path issues it: small chunks
amortise their per-read overhead over fewer bytes and read slower here than the same format
with large ones. Bounded: at most ``max_rows`` arrays, the least recently sampled dropped
first.

Rows outlive the run that measured them (the SDK shows ``updated_at`` for that reason):
``attach(store)`` keeps them in the annotation file beside ``rois`` (not beside the chunk
cache: clearing the cache should cost the bytes, not the measurements), loaded on first use
(a live sample beats a stored one), written through at most every ``FLUSH_SECONDS`` from the
read path and by ``flush()`` at close. A store that fails is logged and never fails a read:
in one line when it says why (a second server finds the annotation file held by the first),
with a traceback only when something unforeseen broke. A run that measured nothing writes
nothing, so such a second server says nothing about the rates at all.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

from tensor_server.errors import TensorServerError

__all__ = ["DecodeRates", "DecodeRateStore", "EMA_ALPHA", "MAX_ROWS", "FLUSH_SECONDS"]

log = logging.getLogger(__name__)

#: weight of a new sample in the moving average (the reference's)
EMA_ALPHA = 0.25
#: arrays a table keeps (ids come from the catalog, so this is a backstop, not a limit a
#: client can reach by asking)
MAX_ROWS = 65536
#: how stale the stored rows may get (a rewrite of the table costs about what a read does,
#: so writing per sample would cost more than what it measures)
FLUSH_SECONDS = 60.0


class DecodeRateStore(Protocol):
    """Where the rows outlive the process (``catalog.rois.RoiStore``)."""

    def load_decode_rates(self) -> Mapping[str, tuple[float, int, float]]: ...

    def save_decode_rates(self, rows: Mapping[str, tuple[float, int, float]]) -> None: ...


class DecodeRates:
    """``record(array_id, nbytes, seconds)`` folds a sample in; ``table()`` is the Arrow
    table the SQL snapshot publishes; ``generation`` moves on every sample."""

    def __init__(self, max_rows: int = MAX_ROWS) -> None:
        self.max_rows = max_rows
        self._lock = threading.Lock()
        #: array_id -> [mbps, samples, updated_at (epoch seconds)]
        self._rows: OrderedDict[str, list[Any]] = OrderedDict()
        self.generation = 0
        self._store: DecodeRateStore | None = None
        self._loaded = True
        self._next_flush = 0.0

    def attach(self, store: DecodeRateStore) -> None:
        """Persist through ``store``; its rows are read on first use (not here: opening the
        file is the server's start-up step, not the catalog constructor's)."""
        with self._lock:
            self._store, self._loaded = store, False
            self._next_flush = time.monotonic() + FLUSH_SECONDS

    def _load(self) -> None:
        """The stored rows under the live ones, once (caller holds ``_lock``)."""
        self._loaded = True
        try:
            stored = self._store.load_decode_rates()
        except Exception as exc:
            _store_failed("cannot load the stored rows; measuring afresh", exc)
            return
        for array_id, (mbps, samples, updated_at) in stored.items():
            if array_id not in self._rows and mbps > 0 and samples > 0 and len(self._rows) < self.max_rows:
                self._rows[array_id] = [mbps, samples, updated_at]
                self._rows.move_to_end(array_id, last=False)
        self.generation += 1

    def flush(self) -> None:
        """Write the rows through to the store (nothing without one)."""
        with self._lock:
            if self._store is None or (not self._loaded and not self._rows):
                return  # nothing measured: the store holds what it held
            if not self._loaded:
                self._load()
            rows = {k: tuple(v) for k, v in self._rows.items()}
            store, self._next_flush = self._store, time.monotonic() + FLUSH_SECONDS
        try:
            store.save_decode_rates(rows)
        except Exception as exc:
            _store_failed("cannot store the rows", exc)

    def record(self, array_id: str, nbytes: int, seconds: float) -> None:
        if seconds <= 0.0 or nbytes <= 0:
            return
        mbps = nbytes / 1e6 / seconds
        now = time.time()
        with self._lock:
            if not self._loaded:
                self._load()
            row = self._rows.get(array_id)
            if row is None:
                self._rows[array_id] = [mbps, 1, now]
                while len(self._rows) > self.max_rows:
                    self._rows.popitem(last=False)
            else:
                row[0] += EMA_ALPHA * (mbps - row[0])
                row[1] += 1
                row[2] = now
                self._rows.move_to_end(array_id)
            self.generation += 1
            due = self._store is not None and time.monotonic() >= self._next_flush
        if due:
            self.flush()

    def forget(self, array_id: str) -> None:
        """Drop a tensor that is gone for good (a discarded upload); the store follows at the
        next flush."""
        with self._lock:
            if not self._loaded:
                self._load()
            if self._rows.pop(array_id, None) is not None:
                self.generation += 1

    def rate(self, array_id: str) -> float | None:
        """``array_id``'s MB/s, or None when it was never sampled."""
        with self._lock:
            if not self._loaded:
                self._load()
            row = self._rows.get(array_id)
            return None if row is None else row[0]

    def snapshot(self) -> dict[str, tuple[float, int]]:
        with self._lock:
            if not self._loaded:
                self._load()
            return {k: (v[0], v[1]) for k, v in sorted(self._rows.items())}

    def table(self):  # pa.Table
        """The rows as the ``decode_rates`` table (array_id, mbps, samples, updated_at)."""
        import datetime

        import pyarrow as pa

        with self._lock:
            if not self._loaded:
                self._load()
            rows = sorted((k, v[0], v[1], v[2]) for k, v in self._rows.items())
        utc = datetime.UTC
        return pa.table(
            {
                "array_id": pa.array([r[0] for r in rows], pa.string()),
                "mbps": pa.array([r[1] for r in rows], pa.float64()),
                "samples": pa.array([r[2] for r in rows], pa.int64()),
                "updated_at": pa.array(
                    [datetime.datetime.fromtimestamp(r[3], utc).replace(tzinfo=None) for r in rows], pa.timestamp("us")
                ),
            }
        )


def _store_failed(what: str, exc: Exception) -> None:
    """Log a store failure: one line when the store said why (a TensorServerError: the file is
    held by another server, or unreadable), the traceback when it is a bug."""
    if isinstance(exc, TensorServerError):
        log.warning("decode rates: %s (%s)", what, exc)
    else:
        log.warning("decode rates: %s", what, exc_info=exc)
