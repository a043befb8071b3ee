"""Client SQL over the catalog's tables, on a throwaway DuckDB connection per query.

Why a connection per query: a keyword check on the statement cannot make SQL read-only
(``WITH x AS (DELETE FROM sources RETURNING 1) SELECT ...`` is a SELECT to the parser).
Here each query gets its own in-memory database in which the catalog's tables are Arrow
views (DuckDB refuses DELETE/UPDATE/INSERT on a view), and the database is dropped when the
query ends, so whatever a query manages to create or change is seen by nobody else.

Why the limits: a client must not be able to exhaust the server with SQL. The query text is
capped before DuckDB parses it (a 10 MB text costs GBs while parsing); each query runs with
one thread, a DuckDB ``memory_limit`` and no spill directory; the result is streamed and
refused once it passes a row or byte cap; a watchdog interrupts the query at its deadline or
as soon as the client has gone (``range(1e15)`` stops); and at most a few queries run at once.
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from tensor_server.errors import InvalidArgument

__all__ = ["CatalogQueryError", "SqlLimits", "run_query"]


class CatalogQueryError(InvalidArgument):
    """A catalog query was refused (not one SELECT, over a limit) or failed."""


@dataclass(frozen=True)
class SqlLimits:
    """Per-query resource caps (defaults fit the catalog's small tables with a wide margin)."""

    max_query_chars: int = 64 * 1024
    max_result_rows: int = 1_000_000
    max_result_bytes: int = 64 << 20
    timeout_seconds: float = 30.0
    memory_limit_bytes: int = 256 << 20
    max_concurrent: int = 4


_BATCH_ROWS = 8192
_WATCH_INTERVAL = 0.05
# absolute paths in DuckDB's messages (its extension and secret directories under the
# server's home) say nothing useful to a client and reveal the host's layout
_PATH = re.compile(r"(?<![\w.])/(?:[^\s\"'/]+/)+[^\s\"'/]*")


def _clean(message: str) -> str:
    """DuckDB's error text without host paths and without its multi-line advice."""
    text = _PATH.sub("<path>", message.strip())
    head, _, rest = text.partition("\n")
    if rest.lstrip().startswith("LINE "):  # keep the caret lines that point into the query
        return text[:2000]
    return head[:2000]


class _Watchdog:
    """Interrupts ``con`` at ``deadline`` or when ``cancelled()`` turns true."""

    def __init__(self, con: Any, deadline: float, cancelled: Callable[[], bool] | None) -> None:
        self.con = con
        self.deadline = deadline
        self.cancelled = cancelled
        self.why: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tensor-server-sql-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(_WATCH_INTERVAL):
            if time.monotonic() >= self.deadline:
                self.why = "timeout"
            elif self.cancelled is not None and self.cancelled():
                self.why = "cancelled"
            else:
                continue
            self.con.interrupt()
            return

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


_slots_lock = threading.Lock()
_slots: dict[int, threading.BoundedSemaphore] = {}


def _slots_for(limits: SqlLimits) -> threading.BoundedSemaphore:
    with _slots_lock:
        return _slots.setdefault(limits.max_concurrent, threading.BoundedSemaphore(limits.max_concurrent))


def run_query(sql: str, tables: Mapping[str, Any], limits: SqlLimits,
              cancelled: Callable[[], bool] | None = None):
    """Run one SELECT over ``tables`` (name → Arrow table) within ``limits``; an Arrow table.
    ``cancelled`` is polled while the query runs (e.g. the Flight call context's)."""
    import duckdb
    import pyarrow as pa

    if len(sql) > limits.max_query_chars:
        raise CatalogQueryError(f"Catalog query refused: the text is {len(sql)} characters, "
                                f"more than the limit of {limits.max_query_chars}")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise CatalogQueryError(f"Catalog query failed: {_clean(str(exc))}") from None
    if len(statements) != 1:
        raise CatalogQueryError(f"Catalog query refused: expected one statement, got {len(statements)}")
    if statements[0].type != duckdb.StatementType.SELECT:
        raise CatalogQueryError(f"Catalog query refused: only SELECT is allowed, not {statements[0].type.name}")

    slots = _slots_for(limits)
    if not slots.acquire(timeout=limits.timeout_seconds):
        raise CatalogQueryError(f"Catalog query refused: {limits.max_concurrent} queries already running; retry later")
    try:
        con = duckdb.connect(":memory:", config={
            "enable_external_access": False,
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "threads": 1,
            "memory_limit": f"{max(limits.memory_limit_bytes >> 20, 16)}MB",
            "temp_directory": "",  # no spilling to disk: over memory_limit is an error
            "lock_configuration": True,  # SET cannot lift any of the above
        })
        try:
            for name, table in tables.items():
                con.register(name, table)
            watchdog = _Watchdog(con, time.monotonic() + limits.timeout_seconds, cancelled)
            try:
                return _collect(con, sql, limits, pa)
            except duckdb.Error as exc:
                if watchdog.why == "timeout":
                    raise CatalogQueryError(f"Catalog query stopped: it ran longer than {limits.timeout_seconds:g} s") from None
                if watchdog.why == "cancelled":
                    raise CatalogQueryError("Catalog query stopped: the client cancelled the call") from None
                raise CatalogQueryError(f"Catalog query failed: {_clean(str(exc))}") from None
            finally:
                watchdog.stop()
        finally:
            con.close()
    finally:
        slots.release()


def _collect(con: Any, sql: str, limits: SqlLimits, pa: Any):
    """Stream the result in batches, refusing it as soon as it passes a cap (a huge result
    is never held whole)."""
    rel = con.sql(sql)
    if rel is None:  # a SELECT always yields a relation; be defensive anyway
        raise CatalogQueryError("Catalog query returned no result")
    reader = rel.to_arrow_reader(_BATCH_ROWS)
    batches, rows, nbytes = [], 0, 0
    for batch in reader:
        rows += batch.num_rows
        nbytes += batch.nbytes
        if rows > limits.max_result_rows:
            raise CatalogQueryError(f"Catalog query refused: the result has more than {limits.max_result_rows} rows; add a LIMIT")
        if nbytes > limits.max_result_bytes:
            raise CatalogQueryError(f"Catalog query refused: the result is larger than {limits.max_result_bytes} bytes; "
                                    "add a LIMIT or select fewer columns")
        batches.append(batch)
    return pa.Table.from_batches(batches, schema=reader.schema)
