"""Scanning the roots into the catalog: discovery, what changed, opening, what vanished.

A scan walks every root (``catalog/discovery.py``), looks each claim up among the records
found at that path before (an unchanged file costs a stat: no sniffing, no resolving),
opens the new and changed ones (``catalog/_opening.py``: threads, then worker processes for a
big tree), puts each in the catalog as soon as it is open, and drops the rows whose files
are gone or that another source covers. It never raises for a bad file or entry: each
becomes an unresolved row or a line in ``skipped``. The counts it keeps (health, metrics)
and the periodic rescan live here too.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensor_server.adapters.registry import FormatEntry, formats
from tensor_server.catalog._opening import Opening, claim_and_open
from tensor_server.catalog.discovery import Claim, discover
from tensor_server.catalog.persistence import row_record
from tensor_server.catalog.record import SourceRecord, is_under, resolves_under, stat_signature
from tensor_server.catalog.remote import scan_remote_root
from tensor_server.catalog.store import StoredRow
from tensor_server.core.identity import source_id_for_path

if TYPE_CHECKING:
    from tensor_server.catalog.catalog import Catalog

__all__ = ["Scanner", "ScanCounts"]

log = logging.getLogger(__name__)


class ScanCounts:
    """What one scan has done so far (``Scanner.discovery_progress``)."""

    def __init__(self, started_at: float | None = None) -> None:
        self.scan_started_at = started_at
        self.folders_walked = 0  # folders discovery listed
        self.files_seen = 0  # claims discovery found
        self.files_unchanged = 0  # of those, unchanged since they were opened: a stat only
        self.files_opened = 0  # adapters opened
        self.files_failed = 0  # opens that failed (unreadable rows)


class Scanner:
    """The scans of ``catalog``'s roots, and what they found and did (health, metrics)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.first_scan_done = threading.Event()
        self.scan_in_progress = False
        self.last_scan_finished_at: float | None = None
        #: entries the last scan refused to open (path, reason): FIFOs, symlink loops, ...
        self.skipped: list[tuple[Path, str]] = []
        #: what went wrong in the last scan, for health (None: nothing)
        self.scan_error: str | None = None
        #: adapters opened from files by the catalog (scans, lazy opens of restored rows,
        #: reopens): a restart over an unchanged tree adds none
        self.opens = 0
        self._counts = ScanCounts()
        self._counts_lock = threading.Lock()
        self._rescan_stop = threading.Event()
        #: claims ``_known_format`` found unchanged in the running scan, by path as walked
        self._unchanged_now: dict[str, SourceRecord] = {}
        #: folders of the running scan, resolved (a file's real path is its folder's plus its
        #: name unless it is a link: one lstat instead of one per path component)
        self._real_folders: dict[str, str] = {}
        self._formats_by_name: dict[str, FormatEntry] = {}

    def scan(
        self, progress: Callable[[str, int], None] | None = None, on_unclaimed: Callable[[Path], None] | None = None
    ) -> dict[str, int]:
        """Discover sources under the roots: open new or changed ones (on a pool of
        ``open_workers``, each put in the catalog as soon as it is open), drop vanished
        ones; an unchanged source costs a stat. Never raises for a bad file or entry: it
        becomes an unresolved row, or (an entry that must not be opened at all) a line in
        ``skipped``; either way the scan goes on. ``on_unclaimed(path)``: each file no
        format recognises (not a source, not an error: a README beside the data)."""
        cat = self.catalog
        self.scan_in_progress = True
        with self._counts_lock:
            self._counts = ScanCounts(started_at=time.time())
        self._unchanged_now, self._real_folders = {}, {}
        tally = {"added": 0, "changed": 0, "unresolved": 0, "removed": 0}
        seen: set[str] = set()
        skipped: list[tuple[Path, str]] = []
        allowed = None if cat.follow_symlinks_outside_roots else cat.roots
        try:
            with cf.ThreadPoolExecutor(cat.open_workers, thread_name_prefix="tensor-server-scan") as pool:
                opening = Opening(self, pool, tally, skipped, seen, on_unclaimed)
                try:
                    for root in cat.roots:
                        if not os.path.lexists(root):
                            skipped.append((root, "the root does not exist (a typo, or an unmounted disk?)"))
                            continue
                        claims = discover(
                            root,
                            on_progress=lambda p: self._walked(p, progress, len(seen)),
                            allowed_roots=allowed,
                            on_skip=lambda p, why: skipped.append((p, why)),
                            known=self._known_format,
                            on_unclaimed=on_unclaimed,
                            claim_files=False,
                        )
                        for claim in claims:
                            self.count("files_seen")
                            opening.offer(claim)
                    opening.finish()
                finally:
                    opening.close()
            tally["removed"] = self._drop_vanished(seen)
            for url in cat.remote_roots:
                counts = scan_remote_root(cat, url)
                for key in ("added", "changed", "unresolved", "removed"):
                    tally[key] += counts[key]
            self.scan_error = _skipped_summary(skipped)
        except Exception as exc:
            log.exception("scan of %s failed", cat.roots)
            self.scan_error = f"scan failed: {type(exc).__name__}: {exc}"
        finally:
            cat.flush_store()
            self.skipped = skipped
            for path, why in skipped:
                log.warning("skipped %s: %s", path, why)
            self.scan_in_progress = False
            self.last_scan_finished_at = time.time()
            self.first_scan_done.set()
        return {**tally, "skipped": len(skipped), "total": len(cat)}

    def _drop_vanished(self, seen: set[str]) -> int:
        """Remove the rows under the roots the scan did not find, and shadowed members."""
        records = self.catalog.records()
        roots = self.catalog.roots
        gone = {
            r.source_id
            for r in records
            if r.path is not None and r.source_id not in seen and any(is_under(r.path, root) for root in roots)
        }
        gone |= shadowed_members(records)
        return len(self.catalog.remove_records(gone))

    def _known_format(self, path: Path, is_dir: bool) -> FormatEntry | None:
        """For discovery: the format the record found at ``path`` (as walked) was opened
        with, when its files are unchanged since: a stat, no sniffing, no resolving. The
        answer is kept for ``prepare_claim`` of the same claim."""
        rec = self.catalog.record_found_at(path)
        if rec is None or not rec.format_name or not rec.signature:
            return None
        sig = stat_signature(path)
        if sig != rec.signature:
            return None
        self._unchanged_now[str(path)] = rec
        return self._format_named(rec.format_name)

    def _format_named(self, name: str) -> FormatEntry | None:
        known = self._formats_by_name
        if name not in known:
            known.update((e.name, e) for e in formats())
        return known.get(name)

    def prepare_claim(self, claim: Claim, covered: set[Path]) -> tuple[str, tuple, bool] | None:
        """None (not a source of its own), or (id, signature, unchanged). Public: the
        scan's ``Opening`` asks it of each claim before it opens anything."""
        cat = self.catalog
        known = self._unchanged_now.pop(str(claim.path), None)
        still = known is not None and cat.known_record(known.source_id) is known
        if still and not any(is_under(claim.path, ex) for ex in cat.excluded):
            covered |= known.member_paths
            self.count("files_unchanged")
            return known.source_id, known.signature, True
        resolved = self._real_path(claim.path)
        if resolved in covered or any(resolves_under(resolved, ex) for ex in cat.excluded):
            return None
        sid = source_id_for_path(resolved, resolved=True)
        sig = stat_signature(claim.path)
        old = cat.known_record(sid)
        if old is not None and old.path is not None and (old.signature == sig or grew_in_place(old)):
            old.signature = sig
            covered |= old.member_paths
            self.count("files_unchanged")
            return sid, sig, True
        return sid, sig, False

    def _real_path(self, path: Path) -> Path:
        """``path.resolve()``, its folder resolved once per scan."""
        folder, name = os.path.split(str(path))
        if not name or name in (".", "..") or os.path.islink(path):
            return path.resolve()
        real = self._real_folders.get(folder)
        if real is None:
            real = self._real_folders[folder] = os.path.realpath(folder)
        return Path(os.path.join(real, name))

    def open_claim(self, claim: Claim, sid: str, sig: tuple) -> tuple[SourceRecord, bool] | None:
        """(the opened record, whether it is new), put in the catalog as soon as it is open;
        None for a file no format recognises (a claim without a format is sniffed here).
        Public: ``Opening`` runs it on the scan's threads."""
        cat = self.catalog
        rec = claim_and_open(
            claim.path,
            claim.format.name if claim.format else None,
            sid,
            sig,
            cat.roots,
            cat.follow_symlinks_outside_roots,
            cat.open_timeout_seconds,
            cat.montage_gap,
        )
        if rec is None:
            return None
        self.count_open(rec)
        return self._put_found(rec)

    def listed_claim(
        self, claim: Claim, sid: str, sig: tuple, row: StoredRow | None
    ) -> tuple[SourceRecord, bool] | None:
        """Like ``open_claim`` for the row a worker process opened the claim into: listed
        now, its adapter opened here on first use. Public: ``Opening`` hands it what its
        worker processes send back."""
        if row is None:
            return None
        rec = row_record(row, self.catalog.open_listed)
        self.count_open(rec)
        if not rec.is_resolved:
            log.warning("unreadable source %s: %s", rec.path, rec.unresolved_reason)
        return self._put_found(rec)

    def _put_found(self, rec: SourceRecord) -> tuple[SourceRecord, bool]:
        if rec.path is not None:
            rec.know_real_path(self._real_path(rec.path))
        return rec, self.catalog.put_file_record(rec)

    def count_open(self, rec: SourceRecord) -> None:
        """An adapter was opened from a file into ``rec`` (by a scan, a first use, a reopen):
        counted in ``opens`` and the running scan's counts. Public: the catalog opens files
        outside scans too (``Catalog.open_record``)."""
        with self._counts_lock:
            self.opens += 1
        self.count("files_opened" if rec.is_resolved else "files_failed")

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the running scan's count ``name`` (a ``ScanCounts`` field). Public:
        ``Opening`` takes back a claim no format recognised."""
        with self._counts_lock:
            setattr(self._counts, name, getattr(self._counts, name) + n)

    def discovery_progress(self) -> dict[str, Any]:
        """What discovery is doing, for health: whether a scan runs, what the current (or
        last) scan has seen, opened and failed to open, how many rows came back from the
        store at boot and how many of them are not opened yet (``pending_open``: opened on
        first use), adapter opens since start, and when the last full scan finished."""
        cat = self.catalog
        with self._counts_lock:
            counts = dict(vars(self._counts))
        return {
            "scan_in_progress": self.scan_in_progress,
            **counts,
            "restored": cat.restored,
            "pending_open": cat.pending_opens(),
            "opens": self.opens,
            "sources": len(cat),
            "last_full_scan_finished_at": self.last_scan_finished_at,
        }

    def _walked(self, folder: Path, progress: Callable[[str, int], None] | None, found: int) -> None:
        """Discovery entered ``folder``: counted (health, metrics) and told to ``progress``."""
        self.count("folders_walked")
        if progress is not None:
            progress(str(folder), found)

    def start_periodic_rescan(self, seconds: float) -> threading.Thread | None:
        """Rescan every ``seconds`` in a daemon thread (0 = never) until ``stop``."""
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

    def stop(self) -> None:
        """End the periodic rescan (the catalog is closing)."""
        self._rescan_stop.set()


def grew_in_place(rec: SourceRecord) -> bool:
    """The files of an open source changed because a tensor of it grows in place (a live
    acquisition, ``TensorAdapter.refresh_extent``): it has grown since it was opened and
    nothing else about its tensors changed, so the scan keeps it (reopening would mint a new
    content version and drop every cached chunk). A file added beside a growing tensor is
    therefore seen only once the acquisition is over and a later change reopens the source."""
    src = rec.opened()
    if src is None:
        return False
    tensors = list(src.tensors.values())
    if any(t.refresh_extent() is not None for t in tensors):
        return False
    return any(t.extents.sequence > 0 for t in tensors)


def shadowed_members(records: Iterable[SourceRecord]) -> set[str]:
    """Ids of file sources that another source covers (a member file of a multi-file
    dataset opened as its own source before the dataset was seen). ``records`` are visited
    in id order and a record is dropped only when a *kept* one covers it, so two sources
    that cover each other keep one of them. Linear in the member paths."""
    covered: set[Path] = set()  # member paths of the records kept so far
    dropped: set[str] = set()
    for r in sorted(records, key=lambda r: r.source_id):
        own = r.real_path()
        if own is not None and own in covered:
            dropped.add(r.source_id)
        else:
            covered |= r.member_paths
    return dropped


def _skipped_summary(skipped: list[tuple[Path, str]]) -> str | None:
    """One line for health: how many entries were refused, and the first few."""
    if not skipped:
        return None
    shown = "; ".join(f"{p}: {why}" for p, why in skipped[:3])
    more = f" (and {len(skipped) - 3} more)" if len(skipped) > 3 else ""
    return f"{len(skipped)} entries skipped: {shown}{more}"
