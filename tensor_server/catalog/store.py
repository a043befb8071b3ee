"""The catalog kept across restarts: one row per discovered source, in a DuckDB file.

A row holds what the listing needs without opening the source (url, type, the tensors'
ids, labels, shapes and dtypes, ``metadata_json``, the reason an unreadable one failed)
and the per-file signature it was opened at (inode, size, mtime). At boot the catalog puts
the rows back as records whose adapters open on first use, so a restart lists every source
at once; the scan then stats each file and reopens only those whose signature changed
(the biopb reference's ``docs/catalog-persistence.md``: restore, then verify by walking).

The file is a cache: ``FORMAT`` changing drops and rebuilds it. DuckDB lets one process
write a file: a file another server holds raises ``CatalogStoreBusy``, and ``serve`` then
takes a file of its own beside it (``catalog-<port>.duckdb``, as for the annotations and
the chunk cache), so a second server on a machine keeps its catalog across restarts too.
Any other file that cannot be opened leaves the catalog in memory only, with a warning.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from typing import Any

__all__ = ["CatalogStore", "CatalogStoreBusy", "StoredRow", "FORMAT"]

log = logging.getLogger(__name__)

#: bump when a column changes meaning: an older file is dropped and rebuilt by the next scan
FORMAT = "1"

_COLUMNS = (
    "source_id",
    "path",
    "format_name",
    "source_url",
    "source_type",
    "is_resolved",
    "unresolved_reason",
    "signature",
    "member_paths",
    "tensors",
    "metadata_json",
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS catalog_meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS catalog_rows (
    source_id VARCHAR PRIMARY KEY, path VARCHAR, format_name VARCHAR, source_url VARCHAR,
    source_type VARCHAR, is_resolved BOOLEAN, unresolved_reason VARCHAR, signature VARCHAR,
    member_paths VARCHAR, tensors VARCHAR, metadata_json VARCHAR);
"""

StoredRow = dict[str, Any]


def _tuples(value: Any) -> Any:
    """JSON lists back to the nested tuples a signature is compared as."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def encode_signature(signature: tuple) -> str:
    return json.dumps(signature)


def decode_signature(text: str) -> tuple:
    return _tuples(json.loads(text))


class CatalogStoreBusy(Exception):
    """Another process holds the store's file (DuckDB allows one writer process)."""


class CatalogStore:
    """Rows in ``path`` (a DuckDB file). Writes come in batches (``save``), from the scan
    thread and from lazy opens; one lock serialises them."""

    def __init__(self, path: str) -> None:
        import duckdb

        self.path = path
        self._lock = threading.Lock()
        try:
            self._con = duckdb.connect(path)
        except duckdb.Error as exc:
            if "lock" in str(exc).lower():
                raise CatalogStoreBusy(f"the catalog store {path} is held by another process") from None
            raise
        self._con.execute(_SCHEMA)
        found = self._con.execute("SELECT value FROM catalog_meta WHERE key = 'format'").fetchone()
        if found is None or found[0] != FORMAT:
            if found is not None:
                log.warning(
                    "catalog store %s: format %s, this build writes %s: rebuilt by the scan", path, found[0], FORMAT
                )
            self._con.execute("DELETE FROM catalog_rows")
            self._con.execute("INSERT OR REPLACE INTO catalog_meta VALUES ('format', ?)", [FORMAT])

    def load(self) -> list[StoredRow]:
        """Every row, decoded; a row that does not decode is dropped (its file is found
        again by the scan as a new source)."""
        with self._lock:
            raw = self._con.execute(f"SELECT {', '.join(_COLUMNS)} FROM catalog_rows").fetchall()
        rows, bad = [], []
        for values in raw:
            row = dict(zip(_COLUMNS, values))
            try:
                row["signature"] = decode_signature(row["signature"])
                row["member_paths"] = json.loads(row["member_paths"])
                row["tensors"] = json.loads(row["tensors"])
            except (TypeError, ValueError):
                bad.append(row["source_id"])
                continue
            rows.append(row)
        if bad:
            log.warning("catalog store %s: %d rows did not decode and were dropped", self.path, len(bad))
            self.save([], bad)
        return rows

    def save(self, rows: Iterable[StoredRow], removed: Iterable[str] = ()) -> None:
        """Write ``rows`` (replacing rows of the same id) and delete ``removed``, at once."""
        import pyarrow as pa

        rows = list(rows)
        gone = sorted(set(removed) | {r["source_id"] for r in rows})
        if not gone:
            return
        columns = {c: [] for c in _COLUMNS}
        for r in rows:
            for c in _COLUMNS:
                columns[c].append(r[c])
        columns["signature"] = [encode_signature(s) for s in columns["signature"]]
        columns["member_paths"] = [json.dumps(sorted(m)) for m in columns["member_paths"]]
        columns["tensors"] = [json.dumps(t) for t in columns["tensors"]]
        batch = pa.table(
            {c: pa.array(v, pa.bool_() if c == "is_resolved" else pa.string()) for c, v in columns.items()}
        )
        with self._lock:
            cur = self._con.cursor()
            try:
                cur.execute("BEGIN")
                cur.execute("DELETE FROM catalog_rows WHERE source_id IN (SELECT unnest(?))", [gone])
                cur.register("_batch", batch)
                cur.execute(f"INSERT INTO catalog_rows SELECT {', '.join(_COLUMNS)} FROM _batch")
                cur.execute("COMMIT")
            finally:
                cur.close()

    def close(self) -> None:
        with self._lock:
            self._con.close()
