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
with large ones. The table is kept for the server's lifetime (the reference also persists
it in its catalog database; this server does not yet, so a restart measures afresh).
Bounded: at most ``max_rows`` arrays, the least recently sampled dropped first.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

__all__ = ["DecodeRates", "EMA_ALPHA", "MAX_ROWS"]

#: weight of a new sample in the moving average (the reference's)
EMA_ALPHA = 0.25
#: arrays a table keeps (ids come from the catalog, so this is a backstop, not a limit a
#: client can reach by asking)
MAX_ROWS = 65536


class DecodeRates:
    """``record(array_id, nbytes, seconds)`` folds a sample in; ``table()`` is the Arrow
    table the SQL snapshot publishes; ``generation`` moves on every sample."""

    def __init__(self, max_rows: int = MAX_ROWS) -> None:
        self.max_rows = max_rows
        self._lock = threading.Lock()
        #: array_id -> [mbps, samples, updated_at (epoch seconds)]
        self._rows: OrderedDict[str, list[Any]] = OrderedDict()
        self.generation = 0

    def record(self, array_id: str, nbytes: int, seconds: float) -> None:
        if seconds <= 0.0 or nbytes <= 0:
            return
        mbps = nbytes / 1e6 / seconds
        now = time.time()
        with self._lock:
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

    def rate(self, array_id: str) -> float | None:
        """``array_id``'s MB/s, or None when it was never sampled."""
        with self._lock:
            row = self._rows.get(array_id)
            return None if row is None else row[0]

    def snapshot(self) -> dict[str, tuple[float, int]]:
        with self._lock:
            return {k: (v[0], v[1]) for k, v in sorted(self._rows.items())}

    def table(self):  # noqa: ANN201 - pa.Table
        """The rows as the ``decode_rates`` table (array_id, mbps, samples, updated_at)."""
        import datetime

        import pyarrow as pa

        with self._lock:
            rows = sorted((k, v[0], v[1], v[2]) for k, v in self._rows.items())
        utc = datetime.timezone.utc
        return pa.table({
            "array_id": pa.array([r[0] for r in rows], pa.string()),
            "mbps": pa.array([r[1] for r in rows], pa.float64()),
            "samples": pa.array([r[2] for r in rows], pa.int64()),
            "updated_at": pa.array([datetime.datetime.fromtimestamp(r[3], utc).replace(tzinfo=None) for r in rows],
                                   pa.timestamp("us")),
        })
