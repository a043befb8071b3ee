"""Client SQL over the catalog's tables, in a DuckDB database opened read-only.

Why read-only: a keyword check on the statement cannot make SQL read-only (``WITH x AS
(DELETE FROM sources RETURNING 1) SELECT ...`` is a SELECT to the parser). Each version of
the catalog's tables is written once to a database file (a *snapshot*) which is then opened
with ``read_only=True``: DuckDB itself refuses every write to it, whatever the statement
looks like, so no query can change what other clients see. Queries run on their own
connection (a cursor) to the snapshot; a new snapshot replaces it when the sources change,
and the old one is closed once its last query ends. (A fresh in-memory database per query
would also isolate clients, but starting a DuckDB instance costs ~100 ms; a cursor ~1 ms.)

Why one snapshot per *view*: a caller sees only the rows of tensors it may read (the read
rule of ``service/access.py``: an uploaded tensor that carries a grant is its holder's alone,
so a stranger sees neither its ``sources.tensors`` entry nor its ``rois`` or ``decode_rates``
rows). Filtering what DuckDB answers cannot be trusted to SQL text (a client reads any table
it can name), so the rows a caller may not see are never written into the database it
queries: each class of caller (a ``RowView``: full access, no grant, or the holder of one
grant) gets its own snapshot, written from the tables filtered in Python. Callers of one
class share it; ``SqlViews`` keeps a few, each rebuilt when the tables change.

Why the limits: a client must not be able to exhaust the server with SQL. The query text is
capped before DuckDB parses it (a 10 MB text costs GBs while parsing); the snapshot runs with
one thread, a DuckDB ``memory_limit`` shared by its queries and no spill directory; the result
is streamed and refused once it passes a row or byte cap; a watchdog interrupts the query at
its deadline or as soon as the client has gone (``range(1e15)`` stops); and at most a few
queries run at once.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import tempfile
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensor_server.errors import InvalidArgument

__all__ = ["CatalogQueryError", "SqlLimits", "SqlSnapshot", "SqlViews", "RowView", "EVERY_ROW", "MAX_VIEWS"]

#: snapshots kept at once (classes of caller querying the same catalog version)
MAX_VIEWS = 8


class CatalogQueryError(InvalidArgument):
    """A catalog query was refused (not one SELECT, over a limit) or failed. The message is
    one line, and also travels as ``message`` in the error's details (Flight ``extra_info``):
    pyarrow's client appends gRPC's debug text to every Flight error it formats, so a
    client that shows only the problem takes it from there (docs/wire-protocol.md §12)."""

    slug = "catalog_query"

    def __init__(self, message: str) -> None:
        super().__init__(message, message=message)


@dataclass(frozen=True)
class SqlLimits:
    """Per-query resource caps (defaults fit the catalog's small tables with a wide margin)."""

    max_query_chars: int = 64 * 1024
    max_result_rows: int = 1_000_000
    max_result_bytes: int = 64 << 20
    timeout_seconds: float = 10.0
    memory_limit_bytes: int = 256 << 20
    max_concurrent: int = 4


@dataclass(frozen=True)
class RowView:
    """The rows one class of caller sees. ``key`` names the class: callers with equal keys
    see exactly the same rows, so they share a snapshot. ``hides(array_id)``: whether the
    rows of that tensor are left out. It must give the same answer for as long as the
    tensor is served (a grant is fixed when its upload is created), so a snapshot written
    once stays right until the tables themselves change. ``hides_source(source_id)``: whether
    a source none of whose tensors the view shows is left out whole (its row, its place in
    the tree: a sign-in bound by folder rules sees no name or path of another folder's file);
    by default such a source still shows, with no tensors (an unreadable file says why)."""

    key: Hashable
    hides: Callable[[str], bool]
    hides_source: Callable[[str], bool] = lambda source_id: False

    def rows_of(self, table: Any) -> Any:
        """``table`` (an Arrow table with an ``array_id`` column) without the rows of the
        tensors this view hides; ``hides`` is asked once per distinct id."""
        import pyarrow as pa
        import pyarrow.compute as pc

        ids = table.column("array_id")
        hidden = [a for a in pc.unique(ids).to_pylist() if a is not None and self.hides(a)]
        if not hidden:
            return table
        return table.filter(pc.invert(pc.is_in(ids, value_set=pa.array(hidden, pa.string()))))


#: full access: every row
EVERY_ROW = RowView("every row", lambda array_id: False)

_BATCH_ROWS = 8192
_WATCH_INTERVAL = 0.05
# absolute paths in DuckDB's messages (its extension and secret directories under the
# server's home) say nothing useful to a client and reveal the host's layout. A message
# quotes the client's query, so both patterns run over client text (up to max_query_chars);
# both are linear (docs/service.md, "Parsing client input"): here each segment ends at the
# one "/" its class excludes, so an attempt never backtracks into an earlier segment, and
# one that fails has scanned only up to the first space or quote, where the next may start.
_PATH = re.compile(r"(?<![\w.])/(?:[^\s\"'/]+/)+[^\s\"'/]*")
# anchored at a line start; ".*" stops at the line's end, so each line is scanned at most
# twice (its own attempt, and as the caret line of the one before)
_WHERE = re.compile(r"^LINE (\d+): (.*)\n( *)\^", re.MULTILINE)


def _clean(message: str) -> str:
    """DuckDB's error text on one line: its first line without host paths, then where in
    the query it points (DuckDB draws a caret under a quoted line; the line and column say
    the same in a message that stays readable after a client appends to it)."""
    text = _PATH.sub("<path>", message.strip())
    head = text.partition("\n")[0]
    where = _WHERE.search(text)
    if where is not None:
        column = len(where.group(3)) - len(f"LINE {where.group(1)}: ") + 1
        head += f" (line {where.group(1)}, column {max(1, column)})"
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


class SqlSnapshot:
    """One version of the catalog's tables in a read-only DuckDB database file under
    ``folder``. ``acquire``/``release`` count running queries; ``retire`` closes the database
    (and removes its file) once none is left. ``slots`` (``limits.max_concurrent`` of them)
    are shared by the snapshots of one catalog."""

    _numbers = itertools.count()

    def __init__(
        self, folder: Path, tables: Mapping[str, Any], limits: SqlLimits, slots: threading.BoundedSemaphore
    ) -> None:
        import duckdb

        self.limits = limits
        self._slots = slots
        self.path = Path(folder) / f"catalog-{os.getpid()}-{next(self._numbers)}.duckdb"
        writer = duckdb.connect(str(self.path))
        try:
            for name, table in tables.items():
                writer.register(f"_{name}", table)
                writer.execute(f'CREATE TABLE "{name}" AS SELECT * FROM "_{name}"')
        finally:
            writer.close()
        self._db = duckdb.connect(
            str(self.path),
            read_only=True,
            config={
                "enable_external_access": False,
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
                "threads": 1,
                "memory_limit": f"{max(limits.memory_limit_bytes >> 20, 16)}MB",
                "temp_directory": "",  # no spilling to disk: over memory_limit is an error
                "lock_configuration": True,  # SET cannot lift any of the above
            },
        )
        self._lock = threading.Lock()
        self._users = 0
        self._retired = False

    def acquire(self) -> SqlSnapshot:
        with self._lock:
            self._users += 1
        return self

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._retired and self._users == 0
        if last:
            self._close()

    def retire(self) -> None:
        with self._lock:
            self._retired = True
            last = self._users == 0
        if last:
            self._close()

    def _close(self) -> None:
        self._db.close()
        for path in (self.path, self.path.with_name(self.path.name + ".wal")):
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    def query(self, sql: str, cancelled: Callable[[], bool] | None = None):
        """Run one SELECT within the limits; an Arrow table. ``cancelled`` is polled while the
        query runs (e.g. the Flight call context's). The caller holds ``acquire``."""
        import duckdb
        import pyarrow as pa

        limits = self.limits
        if len(sql) > limits.max_query_chars:
            raise CatalogQueryError(
                f"Catalog query refused: the text is {len(sql)} characters, "
                f"more than the limit of {limits.max_query_chars}"
            )
        try:
            statements = duckdb.extract_statements(sql)
        except duckdb.Error as exc:
            raise CatalogQueryError(f"Catalog query failed: {_clean(str(exc))}") from None
        if len(statements) != 1:
            raise CatalogQueryError(f"Catalog query refused: expected one statement, got {len(statements)}")
        if statements[0].type != duckdb.StatementType.SELECT:
            raise CatalogQueryError(f"Catalog query refused: only SELECT is allowed, not {statements[0].type.name}")
        slots = self._slots
        if not slots.acquire(timeout=limits.timeout_seconds):
            raise CatalogQueryError(
                f"Catalog query refused: {limits.max_concurrent} queries already running; retry later"
            )
        try:
            con = self._db.cursor()
            try:
                watchdog = _Watchdog(con, time.monotonic() + limits.timeout_seconds, cancelled)
                try:
                    return _collect(con, sql, limits, pa)
                except duckdb.Error as exc:
                    if watchdog.why == "timeout":
                        raise CatalogQueryError(
                            f"Catalog query stopped: it ran longer than {limits.timeout_seconds:g} s"
                        ) from None
                    if watchdog.why == "cancelled":
                        raise CatalogQueryError("Catalog query stopped: the client cancelled the call") from None
                    raise CatalogQueryError(f"Catalog query failed: {_clean(str(exc))}") from None
                finally:
                    watchdog.stop()
            finally:
                con.close()
        finally:
            slots.release()


class SqlViews:
    """The snapshots of one catalog: one per ``RowView`` key, stamped with the version of
    the tables it was written from and rewritten when a query finds the tables moved on;
    at most ``max_views`` kept, the least recently queried retired first. Not thread-safe:
    the catalog calls it under its lock (a snapshot is written while other queries wait).

    Cost: a snapshot is written once per catalog version per class of caller that queries
    it (measured ~0.2 s for 10 to 1,000 sources on the loaded 2-core development VM, as the
    single snapshot cost before: DuckDB writing the file and opening it read-only); a caller
    of a class whose snapshot is current pays a cursor (~1 ms). With a server token only
    full access reaches SQL: one class, one snapshot, as before."""

    def __init__(self, limits: SqlLimits, max_views: int = MAX_VIEWS) -> None:
        self.limits = limits
        self.max_views = max(1, int(max_views))
        #: shared by every snapshot: at most ``limits.max_concurrent`` queries run at once
        self.slots = threading.BoundedSemaphore(limits.max_concurrent)
        self._snapshots: OrderedDict[Hashable, tuple[Hashable, SqlSnapshot]] = OrderedDict()
        self._folder: str | None = None

    def acquire(self, view: RowView, stamp: Hashable, tables: Callable[[RowView], Mapping[str, Any]]) -> SqlSnapshot:
        """The snapshot of ``view`` at ``stamp``, acquired (the caller releases it); written
        first from ``tables(view)`` when there is none at that stamp."""
        entry = self._snapshots.pop(view.key, None)
        if entry is not None and entry[0] != stamp:
            entry[1].retire()
            entry = None
        if entry is None:
            entry = (stamp, SqlSnapshot(Path(self._dir()), tables(view), self.limits, self.slots))
        self._snapshots[view.key] = entry
        while len(self._snapshots) > self.max_views:
            self._snapshots.popitem(last=False)[1][1].retire()
        return entry[1].acquire()

    def _dir(self) -> str:
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="tensor-server-catalog-")
            weakref.finalize(self, shutil.rmtree, self._folder, True)  # also when never closed
        return self._folder

    def close(self) -> None:
        """Retire every snapshot (each closes when its last query ends) and remove the folder."""
        snapshots, self._snapshots = list(self._snapshots.values()), OrderedDict()
        for _, snapshot in snapshots:
            snapshot.retire()
        folder, self._folder = self._folder, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


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
            raise CatalogQueryError(
                f"Catalog query refused: the result has more than {limits.max_result_rows} rows; add a LIMIT"
            )
        if nbytes > limits.max_result_bytes:
            raise CatalogQueryError(
                f"Catalog query refused: the result is larger than {limits.max_result_bytes} bytes; "
                "add a LIMIT or select fewer columns"
            )
        batches.append(batch)
    return pa.Table.from_batches(batches, schema=reader.schema)
