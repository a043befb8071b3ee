"""The catalog: every discovered source, resolved or not, and read-only SQL over them.

Sources live in memory (opened adapters, shared by all handlers); their rows live in an
Arrow snapshot served to SQL as the ``sources`` table of wire-protocol §9.2, so clients can
query them with the SQL the biopb SDK issues (§9.3) or their own. Queries run in a DuckDB
database opened read-only, with external access disabled and resource caps
(``catalog/sql.py``), so SQL can neither change what other clients see, nor read the disk,
nor exhaust the server.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from tensor_server.adapters.registry import open_source
from tensor_server.catalog.discovery import Claim, discover, links_leaving
from tensor_server.catalog.remote import is_remote_root, resolve_remote, scan_remote_root
from tensor_server.catalog.decode_rates import DecodeRates
from tensor_server.catalog.rois import RoiStore
from tensor_server.catalog.sql import CatalogQueryError, SqlLimits, SqlSnapshot
from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter
from tensor_server.core.identity import SEP, ArrayId, source_id_for_path
from tensor_server.errors import InvalidArgument, SourceUnresolved, TensorNotFound, UnreadableSource

__all__ = ["Catalog", "SourceRecord", "SourceUnresolved", "CatalogQueryError"]

log = logging.getLogger(__name__)


@dataclass
class SourceRecord:
    source_id: str
    url: str
    type: str
    path: Path | None
    source: SourceAdapter | None
    unresolved_reason: str | None = None
    signature: tuple = ()
    member_paths: set[Path] = field(default_factory=set)
    format_name: str | None = None  # the registry entry that opened it (to reopen it the same way)

    @property
    def is_resolved(self) -> bool:
        return self.source is not None

    def is_resident(self) -> bool:
        """Whether the source's bytes are on this machine now: its files are all present
        (a stat each; in-memory data always is)."""
        paths = self.member_paths or ({Path(self.path)} if self.path is not None else set())
        return all(p.exists() for p in paths)


def _stat_signature(path: Path) -> tuple:
    """Cheap change detector: a file's (mtime_ns, size); a folder's own mtime plus its direct
    children's. A change re-opens the source, which mints a new content version."""
    try:
        st = path.stat()
        if not path.is_dir():
            return (st.st_mtime_ns, st.st_size)
        kids = tuple(sorted((e.name, e.stat().st_mtime_ns, e.stat().st_size) for e in os.scandir(path)))
        return (st.st_mtime_ns, kids)
    except OSError:
        return ()


class Catalog:
    """Sources under ``roots`` plus any added in memory; thread-safe.

    ``rois_path``: the DuckDB file of the ROI annotations (``rois`` table); None keeps them
    in memory for this process only."""

    def __init__(self, roots: Sequence[str | os.PathLike[str]] = (), rois_path: str | None = None, *,
                 sql_limits: SqlLimits = SqlLimits(), follow_symlinks_outside_roots: bool = False,
                 open_timeout_seconds: float = 60.0) -> None:
        self.roots = [Path(r) for r in roots if not is_remote_root(r)]
        #: object-store and upstream-server URLs (``catalog/remote.py``)
        self.remote_roots = [str(r) for r in roots if is_remote_root(r)]
        self.rois = RoiStore(rois_path)
        self._rois_published = -1
        #: measured decode throughput per tensor (the ``decode_rates`` table; the serving
        #: runtime records into it), re-published at most every ``decode_rates_refresh``
        #: seconds: a snapshot is a database file written whole, dearer than a sample
        self.decode_rates = DecodeRates()
        if rois_path:
            self.decode_rates.attach(self.rois)  # kept beside the annotations, across restarts
        self.decode_rates_refresh = 10.0
        self._rates_published = (0, 0.0)
        #: serve symlinks whose targets leave the roots (off: they would expose any readable file)
        self.follow_symlinks_outside_roots = follow_symlinks_outside_roots
        #: a source whose reader takes longer to open becomes an unreadable row; the scan goes on
        self.open_timeout_seconds = open_timeout_seconds
        self._records: dict[str, SourceRecord] = {}
        self._lock = threading.RLock()
        self._db_lock = threading.Lock()
        self._reopen_lock = threading.Lock()
        self._snapshot: SqlSnapshot | None = None
        self._sql_dir: str | None = None
        self.sql_limits = sql_limits
        self._sql_slots = threading.BoundedSemaphore(sql_limits.max_concurrent)
        self._dirty = True
        #: bumped whenever a row is written or removed: a client holding what it read under
        #: one value knows it is current while the value stays (health ``catalog_generation``)
        self.generation = 0
        self.first_scan_done = threading.Event()
        self.scan_in_progress = False
        self.last_scan_finished_at: float | None = None
        #: entries the last scan refused to open (path, reason): FIFOs, symlink loops, ...
        self.skipped: list[tuple[Path, str]] = []
        #: what went wrong in the last scan, for health (None: nothing)
        self.scan_error: str | None = None
        self._rescan_stop = threading.Event()
        #: source_id -> field -> (tensor, listed): tensors attached to a source by the upload
        #: subsystem (``@fields/..``, ``../@labels/..``). Kept by source id, not on the record,
        #: so a field whose source vanished (an orphan) is kept and comes back with the source.
        self._attached: dict[str, dict[str, tuple[TensorAdapter, bool]]] = {}
        #: folders never discovered (the write_dir: the upload subsystem registers what is in it)
        self.excluded: list[Path] = []

    def _changed(self) -> None:
        """Rows changed (caller holds ``_lock``): re-publish the SQL table on the next query."""
        self._dirty = True
        self.generation += 1

    # ---- contents ----------------------------------------------------------------------------
    def add_source(self, source: SourceAdapter) -> SourceRecord:
        """Serve an already-open source (in-memory data, tests, the demo)."""
        rec = SourceRecord(source.source_id, source.url, source.type, source.path, source,
                           member_paths=set(source.member_paths))
        with self._lock:
            old = self._records.get(source.source_id)
            self._records[source.source_id] = rec
            self._changed()
        if old is not None and old.source is not None and old.source is not source:
            old.source.close()
        return rec

    def put_record(self, rec: SourceRecord) -> None:
        """Add or replace one record (a dropped path, a resolve), closing what it replaces."""
        with self._lock:
            old = self._records.get(rec.source_id)
            self._records[rec.source_id] = rec
            self._changed()
        if old is not None and old.source is not None and old.source is not rec.source:
            old.source.close()

    def remove_records(self, source_ids: Iterable[str]) -> list[str]:
        """Drop these records (closing their sources); return the ids that were present."""
        with self._lock:
            removed = [self._records.pop(sid) for sid in source_ids if sid in self._records]
            if removed:
                self._changed()
        for r in removed:
            if r.source is not None:
                r.source.close()
        return [r.source_id for r in removed]

    def resolve(self, source_id: str) -> SourceRecord:
        """Open the source again now when it is unreadable or its files changed (the file
        may have been repaired): the row is updated either way and returned, with the
        reason when it still cannot be read. A readable, unchanged source is left as is."""
        rec = self.get_record(source_id)
        if rec.path is None:
            return resolve_remote(self, rec)
        sig = _stat_signature(rec.path)
        if rec.is_resolved and sig == rec.signature:
            return rec
        return self._reopen(rec, sig)

    def _reopen(self, rec: SourceRecord, sig: tuple) -> SourceRecord:
        """Open ``rec``'s path again, the way it was opened, and put the new record in its place."""
        new = self.open_record(rec.path, rec.format_name or rec.type, rec.source_id, sig)
        if rec.url != Path(rec.path).resolve().as_uri():  # a dropped path keeps its dnd:// url
            new.url = rec.url
        self.put_record(new)
        return new
    def attach(self, source_id: str, field: str, tensor: TensorAdapter, *, listed: bool) -> None:
        """Serve ``tensor`` as ``source_id/field``; ``listed`` puts it in the source's row."""
        tensor.array_id = f"{source_id}/{field}"
        with self._lock:
            self._attached.setdefault(source_id, {})[field] = (tensor, listed)
            self._dirty = True

    def detach(self, source_id: str, field: str) -> None:
        with self._lock:
            fields = self._attached.get(source_id, {})
            fields.pop(field, None)
            if not fields:
                self._attached.pop(source_id, None)
            self._dirty = True

    def records(self) -> list[SourceRecord]:
        with self._lock:
            return sorted(self._records.values(), key=lambda r: r.source_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    def get_record(self, source_id: str) -> SourceRecord:
        with self._lock:
            rec = self._records.get(source_id)
        if rec is None:
            raise TensorNotFound(f"unknown source {source_id!r}")
        return rec

    def find_tensor(self, array_id: str) -> tuple[TensorAdapter, str]:
        """(tensor, the id to echo) for an array id (``core.identity.ArrayId``): ``source_id``
        or ``source_id/`` (the default tensor) or ``source_id/field``. The echo is the request
        itself when it names a tensor exactly (``source_id/`` names the default tensor
        exactly: it is how the listing spells a bare-id tensor next to attached ones), and
        the tensor's qualified id for a bare id of a multi-tensor source."""
        if not array_id:
            raise InvalidArgument("empty array_id")
        aid = ArrayId.parse(array_id)
        rec = self.get_record(aid.source_id)
        if rec.source is None:
            raise SourceUnresolved(f"source {aid.source_id!r} cannot be read: {rec.unresolved_reason}")
        src = rec.source
        if not aid.field:
            t = src.tensor()
            return t, array_id if array_id.endswith(SEP) else t.array_id
        with self._lock:
            attached = self._attached.get(aid.source_id, {}).get(aid.field)
        if attached is not None:
            return attached[0], array_id
        if aid.field in src.tensors:
            return src.tensors[aid.field], array_id
        raise TensorNotFound(f"source {aid.source_id!r} has no tensor {aid.field!r}; fields: {list(src.tensors)}",
                             slug="unknown_field")

    # ---- discovery -------------------------------------------------------------------------
    def scan(self, progress: Callable[[str, int], None] | None = None) -> dict[str, int]:
        """Discover sources under the roots: open new or changed ones, drop vanished ones.
        Never raises for a bad file or entry: it becomes an unresolved row, or (an entry
        that must not be opened at all) a line in ``skipped``; either way the scan goes on."""
        self.scan_in_progress = True
        added = changed = failed = remote_removed = 0
        seen: set[str] = set()
        skipped: list[tuple[Path, str]] = []
        removed: list[SourceRecord] = []
        allowed = None if self.follow_symlinks_outside_roots else self.roots
        try:
            covered: set[Path] = set()
            for root in self.roots:
                claims = discover(root, on_progress=(lambda p: progress(str(p), len(seen))) if progress else None,
                                  allowed_roots=allowed, on_skip=lambda p, why: skipped.append((p, why)))
                for claim in claims:
                    try:
                        outcome = self._scan_claim(claim, covered)
                    except Exception as exc:  # nothing about one entry may end the scan
                        skipped.append((claim.path, f"{type(exc).__name__}: {exc}"))
                        continue
                    if outcome is None:
                        continue
                    sid, rec, old = outcome
                    seen.add(sid)
                    if rec is None:
                        continue
                    added += old is None
                    changed += old is not None
                    failed += not rec.is_resolved
            with self._lock:
                gone = {sid for sid, r in self._records.items()
                        if r.path is not None and sid not in seen
                        and any(_under(r.path, root) for root in self.roots)}
                gone |= self._shadowed_members()
                removed = [self._records.pop(sid) for sid in gone]
                if removed:
                    self._changed()
            for r in removed:
                if r.source is not None:
                    r.source.close()
            for url in self.remote_roots:
                counts = scan_remote_root(self, url)
                added, changed, failed = added + counts["added"], changed + counts["changed"], failed + counts["unresolved"]
                remote_removed += counts["removed"]
            self.scan_error = _skipped_summary(skipped)
        except Exception as exc:
            log.exception("scan of %s failed", self.roots)
            self.scan_error = f"scan failed: {type(exc).__name__}: {exc}"
        finally:
            self.skipped = skipped
            for path, why in skipped:
                log.warning("skipped %s: %s", path, why)
            self.scan_in_progress = False
            self.last_scan_finished_at = time.time()
            self.first_scan_done.set()
        return {"added": added, "changed": changed, "removed": len(removed) + remote_removed, "unresolved": failed,
                "skipped": len(skipped), "total": len(self)}

    def _scan_claim(self, claim: Claim, covered: set[Path]) -> tuple[str, SourceRecord | None, SourceRecord | None] | None:
        """Open one claim unless unchanged or covered: None (not a source of its own), or
        (id, the new record or None when unchanged, the record it replaces)."""
        resolved = claim.path.resolve()
        if resolved in covered or any(_under(resolved, ex) for ex in self.excluded):
            return None
        sid = source_id_for_path(claim.path)
        sig = _stat_signature(claim.path)
        with self._lock:
            old = self._records.get(sid)
        if old is not None and old.signature == sig and old.path is not None:
            covered |= old.member_paths
            return sid, None, old
        rec = self.open_record(claim.path, claim.format.name, sid, sig)
        covered |= rec.member_paths  # a member of an earlier-opened multi-file source is not its own source
        self.put_record(rec)
        return sid, rec, old

    def _shadowed_members(self) -> set[str]:
        """Ids of file sources that another source covers (a member file of a multi-file
        dataset opened as its own source before the dataset was seen). Records are visited
        in id order and a record is dropped only when a *kept* one covers it, so two
        sources that cover each other keep one of them."""
        kept: list[SourceRecord] = []
        dropped: set[str] = set()
        for sid in sorted(self._records):
            r = self._records[sid]
            own = r.path.resolve() if r.path is not None else None
            if own is not None and any(own in k.member_paths for k in kept):
                dropped.add(sid)
            else:
                kept.append(r)
        return dropped

    def open_record(self, path: Path, fmt: str, sid: str, sig: tuple) -> SourceRecord:
        """Open ``path`` as a record; an unreadable file is a record with the reason."""
        try:
            src = _open_within(path, fmt, self.open_timeout_seconds)
        except UnreadableSource as exc:
            reason = exc.reason
            member = Path(exc.path).resolve()
            if member != path.resolve():  # a member file failed: the row names it
                reason = f"{os.path.relpath(member, path.resolve()) if path.is_dir() else member}: {reason}"
            log.warning("unreadable source %s: %s", path, reason)
            return SourceRecord(sid, path.resolve().as_uri(), fmt, path, None, reason, sig, {path.resolve()}, fmt)
        except Exception as exc:  # never let one file take the scan down
            reason = f"{type(exc).__name__}: {exc}"
            log.warning("unreadable source %s: %s", path, reason)
            return SourceRecord(sid, path.resolve().as_uri(), fmt, path, None, reason, sig, {path.resolve()}, fmt)
        if path.is_dir() and not self.follow_symlinks_outside_roots:
            leaving = links_leaving(path, self.roots)
            if leaving:
                src.close()
                reason = (f"holds symlinks to targets outside the served roots ({', '.join(sorted(leaving)[:3])}"
                          f"{', ...' if len(leaving) > 3 else ''}): not served (follow_symlinks_outside_roots = false)")
                log.warning("unreadable source %s: %s", path, reason)
                return SourceRecord(sid, path.resolve().as_uri(), fmt, path, None, reason, sig, {path.resolve()}, fmt)
        if src.source_id != sid:
            src.source_id = sid
        return SourceRecord(sid, src.url, src.type, path, src, None, sig, set(src.member_paths) | {path.resolve()}, fmt)

    def reopen_changed(self, tensor: TensorAdapter, reason: str) -> None:
        """Reopen the source of ``tensor`` because its bytes changed under it (``reason``,
        from ``stale_reason``): the new source carries a new content version, so ids planned
        before are refused as stale and cached chunks of the old version are never looked up
        again, with or without rescans. Many requests may notice at once; the source is
        reopened once (only while the catalog still serves the source ``tensor`` came from)."""
        source_id = ArrayId.parse(tensor.array_id).source_id
        with self._reopen_lock:
            with self._lock:
                old = self._records.get(source_id)
            if old is None or old.path is None or old.source is None:
                return
            if not any(t is tensor for t in old.source.tensors.values()):
                return  # already reopened by another request
            log.info("reopening %s: %s", old.path, reason)
            self._reopen(old, _stat_signature(old.path))

    def start_periodic_rescan(self, seconds: float) -> threading.Thread | None:
        """Rescan every ``seconds`` in a daemon thread (0 = never)."""
        if seconds <= 0:
            return None

        def loop() -> None:
            while not self._rescan_stop.wait(seconds):
                try:
                    self.scan()
                except Exception:
                    log.exception("periodic rescan failed")

        t = threading.Thread(target=loop, name="tensor-server-rescan", daemon=True)
        t.start()
        return t

    def close(self) -> None:
        self._rescan_stop.set()
        self.decode_rates.flush()
        self.rois.close()
        with self._lock:
            recs = list(self._records.values())
            self._records.clear()
        for r in recs:
            if r.source is not None:
                r.source.close()
        with self._db_lock:
            snapshot, self._snapshot, folder, self._sql_dir = self._snapshot, None, self._sql_dir, None
        if snapshot is not None:
            snapshot.retire()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    # ---- SQL ---------------------------------------------------------------------------------
    def sources_table(self, records: Iterable[SourceRecord] | None = None):
        """The ``sources`` rows (of ``records``, default all) as an Arrow table
        (wire-protocol §9.2 columns)."""
        import pyarrow as pa

        rows = {k: [] for k in ("source_id", "source_url", "source_type", "is_resolved", "tensors", "metadata_json", "unresolved_reason")}
        for r in self.records() if records is None else records:
            rows["source_id"].append(r.source_id)
            rows["source_url"].append(r.url)
            rows["source_type"].append(r.type)
            rows["is_resolved"].append(r.is_resolved)
            tensors = []
            if r.source is not None:
                with self._lock:
                    attached = [t for t, listed in self._attached.get(r.source_id, {}).values() if listed]
                for t in [*r.source.tensors.values(), *attached]:
                    # a bare-id tensor listed beside attached ones is spelled ``source_id/``:
                    # the biopb SDK refuses a bare id of a source listing several tensors
                    # for open-ended slices, and reads an exact id
                    listed_id = t.array_id + SEP if attached and t.array_id == r.source_id else t.array_id
                    tensors.append({"array_id": listed_id, "dim_labels": list(t.dim_labels),
                                    "shape": list(t.shape), "dtype": t.dtype.str})
            rows["tensors"].append(tensors)
            rows["metadata_json"].append(r.source.metadata_json() if r.source is not None else None)
            rows["unresolved_reason"].append(r.unresolved_reason)
        return pa.table(rows, schema=sources_schema())

    def _sql_snapshot(self) -> SqlSnapshot:
        """The current snapshot, acquired (the caller releases it); rebuilt first when the
        sources, the annotations or (at most every ``decode_rates_refresh`` s) the decode
        rates changed since it was written."""
        with self._db_lock:
            rates_gen, rates_at = self._rates_published
            rates_due = (self.decode_rates.generation != rates_gen
                         and time.monotonic() - rates_at >= self.decode_rates_refresh)
            if self._dirty or self._snapshot is None or self._rois_published != self.rois.generation or rates_due:
                self._dirty = False
                self._rates_published = (self.decode_rates.generation, time.monotonic())
                decode_rates = self.decode_rates.table()
                if self._sql_dir is None:
                    self._sql_dir = tempfile.mkdtemp(prefix="tensor-server-catalog-")
                    weakref.finalize(self, shutil.rmtree, self._sql_dir, True)  # also when never closed
                self._rois_published = self.rois.generation
                tables = {"sources": self.sources_table(), "decode_rates": decode_rates, "rois": self.rois.table()}
                old, self._snapshot = self._snapshot, SqlSnapshot(Path(self._sql_dir), tables, self.sql_limits,
                                                                  self._sql_slots)
                if old is not None:
                    old.retire()
            return self._snapshot.acquire()

    def query(self, sql: str, cancelled: Callable[[], bool] | None = None):
        """Run one read-only SELECT within ``self.sql_limits``; return an Arrow table.
        ``cancelled`` is polled while it runs, to stop the work of a client that left."""
        snapshot = self._sql_snapshot()
        try:
            return snapshot.query(sql, cancelled)
        finally:
            snapshot.release()


def sources_schema():
    import pyarrow as pa

    tensor = pa.struct([("array_id", pa.string()), ("dim_labels", pa.list_(pa.string())),
                        ("shape", pa.list_(pa.int64())), ("dtype", pa.string())])
    return pa.schema([("source_id", pa.string()), ("source_url", pa.string()), ("source_type", pa.string()),
                      ("is_resolved", pa.bool_()), ("tensors", pa.list_(tensor)),
                      ("metadata_json", pa.string()), ("unresolved_reason", pa.string())])


def _open_within(path: Path, fmt: str, seconds: float) -> SourceAdapter:
    """``open_source`` with a deadline: a reader that does not finish in time (a huge or
    misnamed file, a hung disk) is abandoned and the path reported unreadable, so one entry
    cannot stall the scan. An abandoned reader that finishes later closes what it opened."""
    box: dict[str, Any] = {}
    done = threading.Event()
    lock = threading.Lock()

    def run() -> None:
        try:
            result: Any = open_source(path, format=fmt, timeout=seconds)
        except BaseException as exc:  # re-raised in the scanning thread
            result = exc
        with lock:
            if box.get("abandoned"):
                if isinstance(result, SourceAdapter):
                    result.close()
                return
            box["result"] = result
            done.set()

    threading.Thread(target=run, name="tensor-server-open", daemon=True).start()
    if not done.wait(seconds):
        with lock:
            if not done.is_set():
                box["abandoned"] = True
                raise UnreadableSource(path, f"{fmt}: gave up opening after {seconds:g} s "
                                             "(the file may be huge, or not what its name says)")
    if isinstance(box["result"], BaseException):
        raise box["result"]
    return box["result"]


def _skipped_summary(skipped: list[tuple[Path, str]]) -> str | None:
    """One line for health: how many entries were refused, and the first few."""
    if not skipped:
        return None
    shown = "; ".join(f"{p}: {why}" for p, why in skipped[:3])
    more = f" (and {len(skipped) - 3} more)" if len(skipped) > 3 else ""
    return f"{len(skipped)} entries skipped: {shown}{more}"


def _under(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False
