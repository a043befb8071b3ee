"""The catalog: every discovered source, resolved or not, and the lookups over them.

Sources live in memory (adapters shared by all handlers); ``Catalog`` keeps the records and
answers which tensors each serves and which tensor an id names. Three parts it holds do the
rest, each in its own module, and the catalog delegates to them in one line:

- ``catalog/scanning.py`` (``Scanner``): walking the roots, opening new or changed files on a
  bounded pool (each within ``open_timeout_seconds``), dropping what vanished, the counts
  health and metrics show, the periodic rescan;
- ``catalog/persistence.py`` (``Persistence``): with a store (``catalog/store.py``) the rows
  are also kept on disk and put back at boot as records opened on first use, so a restart
  lists everything at once and reopens only what changed;
- ``catalog/sql_tables.py`` (``SqlTables``): the rows served to SQL as the ``sources`` table of
  wire-protocol §9.2 (with ``decode_rates`` and ``rois``), so clients can query them with the
  SQL the biopb SDK issues (§9.3) or their own, in a DuckDB database opened read-only with
  resource caps (``catalog/sql.py``); each class of caller queries a database holding only
  the rows of the tensors it may read (``query``'s ``view``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tensor_server.adapters.registry import formats
from tensor_server.catalog._opening import DEFAULT_OPEN_PROCESSES, open_file_record
from tensor_server.catalog.decode_rates import DecodeRates
from tensor_server.catalog.persistence import Persistence
from tensor_server.catalog.record import ServedTensor, SourceRecord, stat_signature
from tensor_server.catalog.remote import is_remote_root, resolve_remote
from tensor_server.catalog.rois import RoiStore
from tensor_server.catalog.scanning import Scanner
from tensor_server.catalog.sql import EVERY_ROW, CatalogQueryError, RowView, SqlLimits
from tensor_server.catalog.sql_tables import SqlTables
from tensor_server.catalog.store import CatalogStore
from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter
from tensor_server.core.growth import ExtentLog
from tensor_server.core.identity import SEP, ArrayId, label_set_image
from tensor_server.core.label_sets import carry_image_scale
from tensor_server.core.montage import DEFAULT_GAP_FRACTION, check_gap_fraction
from tensor_server.errors import InvalidArgument, SourceUnresolved, TensorNotFound

__all__ = ["Catalog", "SourceRecord", "SourceUnresolved", "CatalogQueryError", "looks_like_path"]

log = logging.getLogger(__name__)


#: adapters opened at once by a scan on threads (a big scan adds processes: ``_opening.py``)
DEFAULT_OPEN_WORKERS = max(4, min(16, 4 * (os.cpu_count() or 1)))


class Catalog:
    """Sources under ``roots`` plus any added in memory; thread-safe.

    ``rois_path``: the DuckDB file of the ROI annotations (``rois`` table); None keeps them
    in memory for this process only. ``store_path``: the DuckDB file the rows are kept in
    across restarts (restored here, at construction); None keeps them in memory only;
    ``store``: that store already open, the caller's to close after the catalog (``serve``
    opens it first, to pick a file no other server holds).
    ``open_workers``: adapters a scan opens at once on threads; ``open_processes``: worker
    processes a big scan opens the rest of its files on (``catalog/_opening.py``; 0: none).
    ``montage_gap``: the gap between a plate's wells or a file's positions in the montage its
    source serves, a fraction of a cell (``core/montage.py``)."""

    def __init__(
        self,
        roots: Sequence[str | os.PathLike[str]] = (),
        rois_path: str | None = None,
        *,
        sql_limits: SqlLimits = SqlLimits(),
        follow_symlinks_outside_roots: bool = False,
        open_timeout_seconds: float = 60.0,
        montage_gap: float = DEFAULT_GAP_FRACTION,
        store_path: str | None = None,
        open_workers: int = DEFAULT_OPEN_WORKERS,
        open_processes: int = DEFAULT_OPEN_PROCESSES,
        store: CatalogStore | None = None,
    ) -> None:
        self.roots = [Path(r) for r in roots if not is_remote_root(r)]
        #: object-store and upstream-server URLs (``catalog/remote.py``)
        self.remote_roots = [str(r) for r in roots if is_remote_root(r)]
        self.rois = RoiStore(rois_path)
        #: measured decode throughput per tensor (the ``decode_rates`` table; the serving
        #: runtime records into it)
        self.decode_rates = DecodeRates()
        if rois_path:
            self.decode_rates.attach(self.rois)  # kept beside the annotations, across restarts
        #: serve symlinks whose targets leave the roots (off: they would expose any readable file)
        self.follow_symlinks_outside_roots = follow_symlinks_outside_roots
        #: said after an unknown source's refusal (a worker of ``serve --workers`` says what it lacks)
        self.unknown_hint = ""
        #: asked when an id is not found: whether it changed what is served (then the look-up is
        #: tried once more). A worker of ``serve --workers`` looks at its primary's manifest
        #: (``service/worker_catalog.py``); None: an unknown id is unknown.
        self.on_miss: Callable[[], bool] | None = None
        #: a source whose reader takes longer to open becomes an unreadable row; the scan goes on
        self.open_timeout_seconds = open_timeout_seconds
        #: the gap of the montages its sources build (a plate, a file's positions: core/montage.py)
        self.montage_gap = check_gap_fraction(montage_gap)
        self._records: dict[str, SourceRecord] = {}
        self._lock = threading.RLock()
        self._reopen_lock = threading.Lock()
        #: the tables SQL publishes and the queries over them
        self.sql_tables = SqlTables(self, sql_limits)
        #: bumped whenever a row is written or removed, or a listed tensor is attached to a
        #: source or detached (an upload published or discarded): a client holding what it
        #: read under one value knows it is current while the value stays (health
        #: ``catalog_generation``; the Tensor Browser re-lists when it moves)
        self.generation = 0
        #: set whenever ``generation`` moves (never cleared here): a follower of the catalog
        #: (the primary's manifest for its workers) waits on it instead of polling
        self.moved = threading.Event()
        #: source_id -> field -> (tensor, listed): tensors attached to a source by the upload
        #: subsystem (``@fields/..``, ``../@labels/..``). Kept by source id, not on the record,
        #: so a field whose source vanished (an orphan) is kept and comes back with the source.
        self._attached: dict[str, dict[str, tuple[TensorAdapter, bool]]] = {}
        #: folders never discovered (the write_dir: the upload subsystem registers what is in it)
        self.excluded: list[Path] = []
        self.open_workers = max(1, int(open_workers))
        self.open_processes = max(0, int(open_processes))
        #: records by the path they were found at, as walked: a rescan looks its files up
        #: without resolving them
        self._by_claim_path: dict[str, SourceRecord] = {}
        #: the scans of the roots, and what they found and did
        self.scanner = Scanner(self)
        #: the rows kept across restarts (with a store)
        self.persistence = Persistence(self.roots, self.open_listed)
        #: rows put back from the store at boot
        self.restored = 0
        if store is not None or store_path is not None:
            self._restore(store_path, store)

    def _restore(self, store_path: str | None, store: CatalogStore | None) -> None:
        """Put the stored rows under the current roots back, unopened (``Persistence.restore``)."""
        restored = self.persistence.restore(store_path, store)
        if restored is None:  # the store cannot be used: the catalog is kept in memory only
            return
        with self._lock:
            for rec in restored:
                self._set_record(rec)
            self._changed()
        self.restored = len(restored)

    def _changed(self) -> None:
        """Rows changed (caller holds ``_lock``): re-publish the SQL table on the next query."""
        self.sql_tables.rows_changed()
        self._move()

    def _move(self) -> None:
        """The generation moves (caller holds ``_lock``)."""
        self.generation += 1
        self.moved.set()

    def _set_record(self, rec: SourceRecord) -> SourceRecord | None:
        """Put ``rec`` in place (caller holds ``_lock``); return the record it replaces."""
        old = self._records.get(rec.source_id)
        if old is not None and old.path is not None:
            self._by_claim_path.pop(str(old.path), None)
        self._records[rec.source_id] = rec
        if rec.path is not None:
            self._by_claim_path[str(rec.path)] = rec
        return old

    def _pop_record(self, source_id: str) -> SourceRecord:
        """Take a record out (caller holds ``_lock``)."""
        rec = self._records.pop(source_id)
        if rec.path is not None and self._by_claim_path.get(str(rec.path)) is rec:
            del self._by_claim_path[str(rec.path)]
        return rec

    # ---- contents ----------------------------------------------------------------------------
    def add_source(self, source: SourceAdapter) -> SourceRecord:
        """Serve an already-open source (in-memory data, tests, the demo)."""
        rec = SourceRecord(
            source.source_id, source.url, source.type, source.path, source, member_paths=set(source.member_paths)
        )
        with self._lock:
            old = self._set_record(rec)
            self._changed()
        if old is not None:
            old.close_adapter(keep=source)
        return rec

    def put_record(self, rec: SourceRecord) -> None:
        """Add or replace one record (a dropped path, a resolve), closing what it replaces."""
        with self._lock:
            prior = self._records.get(rec.source_id)
        if prior is not None:
            _carry_extents(prior.opened(), rec.opened())
        with self._lock:
            old = self._set_record(rec)
            self._changed()
        if old is not None:
            old.close_adapter(keep=rec.opened())

    def put_file_record(self, rec: SourceRecord) -> bool:
        """``put_record`` for a record opened from a file (a scan's find, a reopen), queued for
        the store too (``Persistence.save_later`` keeps those under a root); whether its id
        is new. Public: the scan puts what it opens through it."""
        with self._lock:
            is_new = rec.source_id not in self._records
        self.put_record(rec)
        with self._lock:
            self.persistence.save_later(rec)
        return is_new

    def remove_records(self, source_ids: Iterable[str]) -> list[str]:
        """Drop these records (closing their sources); return the ids that were present."""
        with self._lock:
            removed = [self._pop_record(sid) for sid in source_ids if sid in self._records]
            if removed:
                self._changed()
            for r in removed:
                self.persistence.unsave(r.source_id)
        for r in removed:
            r.close_adapter()
        return [r.source_id for r in removed]

    def resolve(self, source_id: str) -> SourceRecord:
        """Open the source again now when it is unreadable or its files changed (the file
        may have been repaired): the row is updated either way and returned, with the
        reason when it still cannot be read. A readable, unchanged source is left as is."""
        rec = self.get_record(source_id)
        if rec.path is None:
            return resolve_remote(self, rec)
        sig = stat_signature(rec.path)
        if rec.is_resolved and sig == rec.signature:
            return rec
        return self._reopen(rec, sig)

    def _reopen(self, rec: SourceRecord, sig: tuple) -> SourceRecord:
        """Open ``rec``'s path again, the way it was opened, and put the new record in its place."""
        new = self.open_record(rec.path, rec.format_name or rec.type, rec.source_id, sig)
        if rec.url != Path(rec.path).resolve().as_uri():  # a dropped path keeps its dnd:// url
            new.url = rec.url
        self.put_file_record(new)
        return new

    def attach(self, source_id: str, field: str, tensor: TensorAdapter, *, listed: bool) -> None:
        """Serve ``tensor`` as ``source_id/field``; ``listed`` puts it in the source's row
        (and moves the generation: the listing changed)."""
        tensor.array_id = f"{source_id}/{field}"
        with self._lock:
            fields = self._attached.setdefault(source_id, {})
            was = fields.get(field)
            fields[field] = (tensor, listed)
            self.sql_tables.rows_changed()
            if listed or (was is not None and was[1]):
                self._move()

    def detach(self, source_id: str, field: str) -> None:
        """Stop serving ``source_id/field``; the generation moves when it was listed."""
        with self._lock:
            fields = self._attached.get(source_id, {})
            was = fields.pop(field, None)
            if not fields:
                self._attached.pop(source_id, None)
            self.sql_tables.rows_changed()
            if was is not None and was[1]:
                self._move()

    def served(self, rec: SourceRecord) -> list[ServedTensor]:
        """Every tensor ``rec`` serves and lists, in order: the source's own (from its adapter,
        or from a restored row's listing without opening it), then the attached ones that are
        listed (READY uploads, label sets included); none while it cannot be read. The one
        answer to "which tensors does this source serve" below the callers' rule: SQL rows,
        the catalog tree and page, and ``ServingRuntime.fields`` all start from it."""
        if not rec.is_resolved:
            return []
        with self._lock:
            attached = [(f, t) for f, (t, listed) in self._attached.get(rec.source_id, {}).items() if listed]
        src = rec.opened()
        own: list[tuple[str, str | None, TensorAdapter | None, dict[str, Any] | None]]
        if src is not None:
            own = [(t.array_id, f, t, None) for f, t in src.tensors.items()]
        else:
            own = [(row["array_id"], None, None, row) for row in rec.tensor_rows()]
        for _, tensor in attached:
            self._carry_image_scale(tensor, src)
        # a bare-id tensor beside attached fields is listed as ``source_id/``: the biopb SDK
        # refuses a bare id of a source listing several tensors for open-ended slices, and reads
        # an exact id (core.identity.ArrayId). Beside label sets only it keeps its bare id, the
        # one the sets are filed under (``<id>/@labels/<name>``), so the clients group them with
        # it (docs/uploading.md#label-sets-and-their-image says what that costs)
        fields_beside = any(label_set_image(t.array_id) is None for _, t in attached)
        out = []
        for aid, field, tensor, stored in own:
            listed = aid + SEP if fields_beside and aid == rec.source_id else aid
            out.append(ServedTensor(aid, listed, tensor, field, stored))
        out += [ServedTensor(t.array_id, t.array_id, t, f) for f, t in attached]
        return out

    def lists_tensors(self, rec: SourceRecord, view: RowView = EVERY_ROW) -> bool:
        """Shown in the catalog tree to the callers of ``view``: unreadable (so the reason
        shows) unless the view hides the source, or its ``sources`` row lists a tensor they may read, its own or an attached
        one (the scratch source holds only uploads). Never opens."""
        if not rec.is_resolved:
            return not view.hides_source(rec.source_id)
        if any(not view.hides(row["array_id"]) for row in rec.tensor_rows()):
            return True
        with self._lock:
            attached = list(self._attached.get(rec.source_id, {}).values())
        return any(listed and not view.hides(t.array_id) for t, listed in attached)

    def _carry_image_scale(self, tensor: TensorAdapter, src: SourceAdapter | None) -> TensorAdapter:
        """``tensor``, given its image's physical scale when it is an attached label set that
        has none (``core.label_sets``). Done when the set is served, not when it is attached:
        an upload adopted at boot is attached before the scan opens its image's source."""
        image_id = label_set_image(tensor.array_id) if tensor.is_labels and tensor.physical_scale is None else None
        if image_id is None or src is None:
            return tensor
        field = ArrayId.parse(image_id).field
        with self._lock:
            image = self._attached.get(src.source_id, {}).get(field, (None,))[0]
        image = image or (src.tensors.get(field) if field else next(iter(src.tensors.values()), None))
        if image is not None:
            carry_image_scale(tensor, image)
        return tensor

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
            raise TensorNotFound(f"unknown source {source_id!r}{_path_hint(source_id)}")
        return rec

    def known_record(self, source_id: str) -> SourceRecord | None:
        """The record of ``source_id``, None when there is none (``get_record`` refuses).
        Public: the scan compares what it finds with what the catalog has."""
        with self._lock:
            return self._records.get(source_id)

    def record_found_at(self, path: Path) -> SourceRecord | None:
        """The record found at ``path`` as walked (not resolved), if any. Public: a rescan
        looks its files up by path without resolving them."""
        with self._lock:
            return self._by_claim_path.get(str(path))

    def pending_opens(self) -> int:
        """Records listed from a row whose adapter is not opened yet (health's ``pending_open``)."""
        with self._lock:
            return sum(r.is_open_pending() for r in self._records.values())

    def find_tensor(self, array_id: str) -> tuple[TensorAdapter, str]:
        """``_find_tensor``, tried once more when ``on_miss`` says what is served changed."""
        try:
            return self._find_tensor(array_id)
        except TensorNotFound:
            if self.on_miss is None or not self.on_miss():
                raise
        return self._find_tensor(array_id)

    def _find_tensor(self, array_id: str) -> tuple[TensorAdapter, str]:
        """(tensor, the id to echo) for an array id (``core.identity.ArrayId``): ``source_id``
        or ``source_id/`` (the default tensor) or ``source_id/field``. The echo is the request
        itself when it names a tensor exactly (``source_id/`` names the default tensor
        exactly: it is how the listing spells a bare-id tensor next to attached ones), and
        the tensor's qualified id for a bare id of a multi-tensor source. A field the format
        renamed (``SourceAdapter.former_fields``) still names its tensor."""
        if not array_id:
            raise InvalidArgument("empty array_id")
        aid = ArrayId.parse(array_id)
        with self._lock:
            known = aid.source_id in self._records
        if not known:
            raise TensorNotFound(f"unknown source {aid.source_id!r}{_path_hint(array_id)}{self.unknown_hint}")
        rec = self.get_record(aid.source_id)
        if rec.source is None:
            rec = self._reopened_if_changed(rec)
        if rec.source is None:
            raise SourceUnresolved(f"source {aid.source_id!r} cannot be read: {rec.unresolved_reason}")
        src = rec.source
        if not aid.field:
            t = src.tensor()
            return t, array_id if array_id.endswith(SEP) else t.array_id
        with self._lock:
            attached = self._attached.get(aid.source_id, {}).get(aid.field)
        if attached is not None:
            return self._carry_image_scale(attached[0], src), array_id
        field = src.former_fields.get(aid.field, aid.field)
        if field in src.tensors:  # a former field echoes as asked: the SDK reads a changed echo as a default
            return src.tensors[field], array_id
        raise TensorNotFound(
            f"source {aid.source_id!r} has no tensor {aid.field!r}; fields: {list(src.tensors)}", slug="unknown_field"
        )

    # ---- scanning (catalog/scanning.py) ----------------------------------------------------
    def scan(
        self, progress: Callable[[str, int], None] | None = None, on_unclaimed: Callable[[Path], None] | None = None
    ) -> dict[str, int]:
        """``Scanner.scan``: discover the roots' sources; the tally of what changed."""
        return self.scanner.scan(progress, on_unclaimed)

    def discovery_progress(self) -> dict[str, Any]:
        """``Scanner.discovery_progress``: what discovery is doing, for health."""
        return self.scanner.discovery_progress()

    def start_periodic_rescan(self, seconds: float) -> threading.Thread | None:
        """``Scanner.start_periodic_rescan``: rescan every ``seconds`` (0 = never)."""
        return self.scanner.start_periodic_rescan(seconds)

    @property
    def first_scan_done(self) -> threading.Event:
        return self.scanner.first_scan_done

    @property
    def scan_in_progress(self) -> bool:
        return self.scanner.scan_in_progress

    @property
    def last_scan_finished_at(self) -> float | None:
        return self.scanner.last_scan_finished_at

    @property
    def skipped(self) -> list[tuple[Path, str]]:
        """Entries the last scan refused to open (path, reason)."""
        return self.scanner.skipped

    @property
    def scan_error(self) -> str | None:
        """What went wrong in the last scan, for health (None: nothing)."""
        return self.scanner.scan_error

    @property
    def opens(self) -> int:
        """Adapters opened from files by this catalog (a restart over an unchanged tree adds none)."""
        return self.scanner.opens

    def open_record(self, path: Path, fmt: str, sid: str, sig: tuple) -> SourceRecord:
        """Open ``path`` as a record; an unreadable file is a record with the reason."""
        rec = open_file_record(
            path,
            fmt,
            sid,
            sig,
            self.roots,
            self.follow_symlinks_outside_roots,
            self.open_timeout_seconds,
            self.montage_gap,
        )
        self.scanner.count_open(rec)
        return rec

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
            current = old.opened() if old is not None else None
            if current is None or old.path is None:
                return
            if not any(t is tensor for t in current.tensors.values()):
                return  # already reopened by another request
            log.info("reopening %s: %s", old.path, reason)
            self._reopen(old, stat_signature(old.path))

    def _reopened_if_changed(self, rec: SourceRecord) -> SourceRecord:
        """An unreadable file's record opened again when the file changed since it failed: a
        writer that restarts an acquisition (ome-writers' overwrite) can be caught between its
        new file and the OME-XML it writes next, and the file must not stay unreadable until a
        rescan (off by default). One ``stat`` a request for an unreadable source."""
        if rec.path is None:
            return rec
        with self._reopen_lock:
            with self._lock:
                current = self._records.get(rec.source_id)
            if current is not rec:  # reopened (or dropped) by another request meanwhile
                return current if current is not None else rec
            sig = stat_signature(rec.path)
            if not sig or sig == rec.signature:
                return rec
            log.info("reopening %s: it changed since it could not be read", rec.path)
            return self._reopen(rec, sig)

    def open_listed(self, rec: SourceRecord) -> None:
        """Open the adapter of a record listed from a row (restored from the store at boot, or
        sent back by a scan's worker process) on its first use. Public: ``Persistence`` and
        the scan make such records and give them this as their opener. The row is rewritten
        only when what it lists changed (or the open failed)."""
        listed = rec.listing[0] if rec.listing is not None else None
        new = self.open_record(rec.path, rec.format_name or rec.type, rec.source_id, rec.signature)
        rec.type, rec.member_paths, rec.unresolved_reason = new.type, new.member_paths, new.unresolved_reason
        rec.source, rec.listing = new.opened(), None
        if new.tensor_rows() != listed or not new.is_resolved:
            with self._lock:
                self._changed()
                self.persistence.save_later(rec)

    def flush_store(self) -> None:
        """Write the rows queued for the store (``Persistence.flush``)."""
        self.persistence.flush()

    def close(self) -> None:
        self.scanner.stop()
        self.decode_rates.flush()
        self.rois.close()
        self.persistence.close()
        with self._lock:
            recs = list(self._records.values())
            self._records.clear()
            self._by_claim_path.clear()
        for r in recs:
            r.close_adapter()
        self.sql_tables.close()

    # ---- SQL (catalog/sql_tables.py) -------------------------------------------------------
    def sources_table(self, records: Iterable[SourceRecord] | None = None, view: RowView = EVERY_ROW):
        """``SqlTables.sources_table``: the ``sources`` rows as an Arrow table."""
        return self.sql_tables.sources_table(records, view)

    def query(self, sql: str, cancelled: Callable[[], bool] | None = None, view: RowView = EVERY_ROW):
        """``SqlTables.query``: one read-only SELECT over the rows ``view`` shows."""
        return self.sql_tables.query(sql, cancelled, view)

    @property
    def decode_rates_refresh(self) -> float:
        """Seconds between re-publications of the decode rates to SQL (``SqlTables``)."""
        return self.sql_tables.decode_rates_refresh

    @decode_rates_refresh.setter
    def decode_rates_refresh(self, seconds: float) -> None:
        self.sql_tables.decode_rates_refresh = seconds


def _carry_extents(old: SourceAdapter | None, new: SourceAdapter | None) -> None:
    """A reopened source's tensors go on numbering their extents after the ones they replace
    (``core/growth.py``: a watcher sees one more record, the reopened shape, and no gap), and
    the watchers waiting on the old ones wake to look the tensor up again."""
    if old is None or new is None:
        return
    for field, tensor in new.tensors.items():
        was = old.tensors.get(field)
        if was is not None:
            tensor.extents = ExtentLog(tensor.shape, was.extents.sequence + 1)
            was.extents.wake()


def looks_like_path(text: str) -> bool:
    """Whether an id someone typed is a path or a file name rather than an array id (ids
    are ``<stem>-<hash>[/field]``): it starts like a path, exists, or ends in a format's
    extension."""
    if text.startswith(("/", "~", ".", "file:")) or "\\" in text or os.path.exists(text):
        return True
    suffix = Path(text.split("/", 1)[0]).suffix.lower()
    return bool(suffix) and any(suffix in e.extensions for e in formats())


def _path_hint(requested: str) -> str:
    """A hint for an id that is a path or a file name (a common first mistake)."""
    if not looks_like_path(requested):
        return ""
    return (
        "; it looks like a path or file name, but ids are the source ids the catalog lists "
        "(`python -m tensor_server list ROOT` prints them, or SELECT source_id FROM sources)"
    )
