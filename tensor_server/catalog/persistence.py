"""The catalog's rows kept across restarts: what goes to the store, when, and what comes back.

The store (``catalog/store.py``) is a DuckDB file of rows; this module decides which records
are kept (file sources under a root: a dropped path lives for one run, in-memory data has no
file), queues their writes and removals so a scan writes in batches (``flush``), and turns
the stored rows back into records at boot, listed at once and opened on first use
(``row_record``), so a restart lists everything without opening anything.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from tensor_server.catalog._opening import stored_row
from tensor_server.catalog.record import SourceRecord, is_under
from tensor_server.catalog.store import CatalogStore, StoredRow

__all__ = ["Persistence", "row_record"]

log = logging.getLogger(__name__)


class Persistence:
    """The rows of the sources under ``roots`` kept in a ``CatalogStore``. ``opener`` opens a
    record made from a row on its first use (``Catalog.open_listed``). Thread-safe: the
    queue of writes has its own lock, taken after the catalog's when both are held."""

    def __init__(self, roots: Sequence[Path], opener: Callable[[SourceRecord], None]) -> None:
        self.roots = roots
        self.opener = opener
        self._store: CatalogStore | None = None
        self._owns_store = True
        #: source_id -> record to write, or None to delete, at the next flush
        self._unsaved: dict[str, SourceRecord | None] = {}
        self._lock = threading.Lock()

    def restore(self, path: str | None, store: CatalogStore | None) -> list[SourceRecord] | None:
        """Open the store (``store`` already open is the caller's to close; else the file at
        ``path``) and return the records of its rows under the current roots, unopened; the
        rows under no current root (a root removed from the config) are queued for removal.
        A store that cannot be opened (another server holds it, a damaged file) is warned
        about and the catalog stays in memory: None."""
        self._owns_store = store is None
        try:
            if store is None:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                store = CatalogStore(path)
            self._store = store
            rows = self._store.load()
        except Exception as exc:
            log.warning(
                "catalog store %s cannot be used (%s: %s): the catalog is kept in memory only, "
                "so the next start opens every source again",
                store.path if store else path,
                type(exc).__name__,
                exc,
            )
            if store is not None and self._owns_store:
                store.close()
            self._store = None
            return None
        restored = []
        for row in rows:
            row_path = Path(row["path"])
            if any(is_under(row_path, root) for root in self.roots):
                restored.append(row_record(row, self.opener, row_path))
            else:
                self.unsave(row["source_id"])
        return restored

    def save_later(self, rec: SourceRecord) -> None:
        """Queue ``rec`` for the store: file sources under a root only (a dropped path lives
        for this run, in-memory data has no file)."""
        if self._store is not None and rec.path is not None and any(is_under(rec.path, r) for r in self.roots):
            with self._lock:
                self._unsaved[rec.source_id] = rec

    def unsave(self, source_id: str) -> None:
        """Queue the row's removal from the store."""
        if self._store is not None:
            with self._lock:
                self._unsaved[source_id] = None

    def flush(self) -> None:
        """Write the queued rows to the store (a scan does every ``STORE_FLUSH_SECONDS``)."""
        store = self._store
        if store is None:
            return
        with self._lock:
            pending, self._unsaved = self._unsaved, {}
        if not pending:
            return
        rows = [stored_row(r) for r in pending.values() if r is not None]
        try:
            store.save(rows, [sid for sid, r in pending.items() if r is None])
        except Exception as exc:  # the store is a cache: serving goes on without it
            if self._store is not None:  # not closed meanwhile
                log.warning("catalog store %s: write failed (%s: %s)", store.path, type(exc).__name__, exc)

    def close(self) -> None:
        """Flush, then stop keeping rows (a scan still running stores nothing more); the store
        is closed when this opened it."""
        self.flush()
        store, self._store = self._store, None
        if store is not None and self._owns_store:
            store.close()


def row_record(row: StoredRow, opener: Callable[[SourceRecord], None], path: Path | None = None) -> SourceRecord:
    """The record of a row (from the store, or from a scan's worker process), opened by
    ``opener`` on first use. A file's member path is usually its own path: one Path object
    then (10,000 rows restored at boot parse a third of the paths)."""
    path = Path(row["path"]) if path is None else path
    resolved = bool(row["is_resolved"])
    members = {path if p == row["path"] else Path(p) for p in row["member_paths"]}
    return SourceRecord(
        row["source_id"],
        row["source_url"],
        row["source_type"],
        path,
        None,
        row["unresolved_reason"],
        row["signature"],
        members,
        row["format_name"],
        listing=(row["tensors"], row["metadata_json"]) if resolved else None,
        opener=opener if resolved else None,
    )
