"""The tables the catalog publishes to SQL, and the queries over them.

Three tables, each keyed by tensor: ``sources`` (one row per source, wire-protocol §9.2, its
``tensors`` the ones ``Catalog.served`` lists), ``decode_rates`` and ``rois``. They are
written into a read-only DuckDB snapshot per class of caller (``catalog/sql.py`` says why and
how); this module says what goes in them and when a snapshot is stale: the version the
catalog moves whenever its rows change, the annotations' generation, and the decode rates',
the last at most every ``decode_rates_refresh`` seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from tensor_server.catalog.record import SourceRecord
from tensor_server.catalog.sql import EVERY_ROW, RowView, SqlLimits, SqlViews

if TYPE_CHECKING:
    from tensor_server.catalog.catalog import Catalog

__all__ = ["SqlTables", "sources_schema"]


class SqlTables:
    """The SQL side of ``catalog``: its tables (``sources_table``), their version
    (``rows_changed``) and read-only queries over them within ``limits`` (``query``)."""

    def __init__(self, catalog: Catalog, limits: SqlLimits) -> None:
        self.catalog = catalog
        self.limits = limits
        self._views = SqlViews(limits)
        self._views_lock = threading.Lock()
        #: bumped whenever the rows SQL publishes change (sources, attached tensors)
        self._version = 0
        #: seconds between re-publications of the measured decode rates: a snapshot is a
        #: database file written whole, dearer than a sample
        self.decode_rates_refresh = 10.0
        self._rates_published = (0, 0.0)

    def rows_changed(self) -> None:
        """The catalog's rows changed: the next query writes a new snapshot. The catalog calls
        it under its own lock, which orders the calls."""
        self._version += 1

    def sources_table(self, records: Iterable[SourceRecord] | None = None, view: RowView = EVERY_ROW):
        """The ``sources`` rows (of ``records``, default all) as an Arrow table
        (wire-protocol §9.2 columns), listing only the tensors ``view`` shows."""
        import pyarrow as pa

        cat = self.catalog
        rows: dict[str, list] = {name: [] for name in sources_schema().names}
        for r in cat.records() if records is None else records:
            tensors = [t.row for t in cat.served(r) if not view.hides(t.array_id)]
            if not tensors and view.hides_source(r.source_id):
                continue
            rows["source_id"].append(r.source_id)
            rows["source_url"].append(r.url)
            rows["source_type"].append(r.type)
            rows["is_resolved"].append(r.is_resolved)
            rows["tensors"].append(tensors)
            rows["metadata_json"].append(r.metadata_json())
            rows["unresolved_reason"].append(r.unresolved_reason)
        return pa.table(rows, schema=sources_schema())

    def _tables(self, view: RowView) -> dict[str, Any]:
        """Every table SQL publishes, with only the rows ``view`` shows (each table is keyed
        by tensor: a hidden tensor leaves no row anywhere)."""
        return {
            "sources": self.sources_table(view=view),
            "decode_rates": view.rows_of(self.catalog.decode_rates.table()),
            "rois": view.rows_of(self.catalog.rois.table()),
        }

    def _stamp(self) -> tuple[int, int, int]:
        """The version of the published tables (caller holds ``_views_lock``): the rows, the
        annotations and the decode rates (these at most every ``decode_rates_refresh`` s)."""
        rates = self.catalog.decode_rates
        rates_gen, rates_at = self._rates_published
        if rates.generation != rates_gen and time.monotonic() - rates_at >= self.decode_rates_refresh:
            self._rates_published = (rates.generation, time.monotonic())
        return self._version, self.catalog.rois.generation, self._rates_published[0]

    def query(self, sql: str, cancelled: Callable[[], bool] | None = None, view: RowView = EVERY_ROW):
        """Run one read-only SELECT within ``self.limits`` over the rows ``view`` shows
        (``catalog/sql.py``: each view queries its own snapshot); return an Arrow table.
        ``cancelled`` is polled while it runs, to stop the work of a client that left."""
        with self._views_lock:
            snapshot = self._views.acquire(view, self._stamp(), self._tables)
        try:
            return snapshot.query(sql, cancelled)
        finally:
            snapshot.release()

    def close(self) -> None:
        """Retire every snapshot (each closes when its last query ends)."""
        with self._views_lock:
            self._views.close()


def sources_schema():
    """The Arrow schema of the ``sources`` table (wire-protocol §9.2)."""
    import pyarrow as pa

    tensor = pa.struct(
        [
            ("array_id", pa.string()),
            ("dim_labels", pa.list_(pa.string())),
            ("shape", pa.list_(pa.int64())),
            ("dtype", pa.string()),
        ]
    )
    return pa.schema(
        [
            ("source_id", pa.string()),
            ("source_url", pa.string()),
            ("source_type", pa.string()),
            ("is_resolved", pa.bool_()),
            ("tensors", pa.list_(tensor)),
            ("metadata_json", pa.string()),
            ("unresolved_reason", pa.string()),
        ]
    )
