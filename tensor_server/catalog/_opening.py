"""Opening what a scan finds: on threads for the first files, then on worker processes.

Why processes. Opening a small file is Python work under the GIL (tifffile parses IFDs,
h5py walks the file, zarr builds an array through its event-loop thread, the sniffers open
HDF5 files to tell EMD from plain HDF5): about 3 ms a file, so 10,000 small files cost ~30 s
of one core however many threads open them, and threads fighting for the GIL (and for
zarr's loop thread) made it slower still. A scan that has opened ``PROCESSES_AFTER`` files on
threads sends the rest to ``open_processes`` worker processes: each claims the file (sniffs
its format), opens it within the deadline and sends back its row (what the catalog store
keeps: the tensors, the metadata, the reason it failed); the catalog lists the row at once
and opens the adapter in the server on first use, the way a row restored at boot is. A small
tree (every test) never starts a process.

The guarantees hold in a worker: each open is bounded by ``open_timeout_seconds`` there
(``open_within``), at most ``4 x workers`` claims are in flight, and one slow file holds one
task, never the others. A reader that kills its process (a crash in a C library) costs
nothing but that file: the claims in flight on the broken pool are opened again one at a
time on a fresh pool, and the one that kills it again is an unreadable row saying so.
Formats registered at run time by a plugin are not known to a fresh process: a catalog
that has one keeps every open on threads.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensor_server.adapters.registry import claim_format, formats, open_source
from tensor_server.catalog.discovery import Claim, links_leaving
from tensor_server.catalog.record import SourceRecord
from tensor_server.catalog.store import StoredRow
from tensor_server.core.adapter_base import SourceAdapter
from tensor_server.core.montage import DEFAULT_GAP_FRACTION
from tensor_server.errors import UnreadableSource

if TYPE_CHECKING:
    from tensor_server.catalog.scanning import Scanner

__all__ = ["Opening", "open_file_record", "open_within", "stored_row", "DEFAULT_OPEN_PROCESSES"]

log = logging.getLogger(__name__)

#: worker processes a big scan opens files on (0: threads only)
DEFAULT_OPEN_PROCESSES = os.cpu_count() or 1
#: opens a scan does on threads before it starts the worker processes (a process costs
#: about a second to start and import the format libraries: only a big tree repays it)
PROCESSES_AFTER = 256
#: seconds between writes of the rows a running scan has found to the store
STORE_FLUSH_SECONDS = 2.0


def open_within(path: Path, fmt: str, seconds: float, montage_gap: float = DEFAULT_GAP_FRACTION) -> SourceAdapter:
    """``open_source`` with a deadline: a reader that does not finish in time (a huge or
    misnamed file, a hung disk) is abandoned and the path reported unreadable, so one entry
    cannot stall the scan. An abandoned reader that finishes later closes what it opened.
    ``montage_gap``: the catalog's (``core/montage.py``)."""
    box: dict[str, Any] = {}
    done = threading.Event()
    lock = threading.Lock()

    def run() -> None:
        try:
            result: Any = open_source(path, format=fmt, timeout=seconds, montage_gap=montage_gap)
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
                raise UnreadableSource(
                    path,
                    f"{fmt}: gave up opening after {seconds:g} s (the file may be huge, or not what its name says)",
                )
    if isinstance(box["result"], BaseException):
        raise box["result"]
    return box["result"]


def _unreadable(path: Path, fmt: str, sid: str, sig: tuple, reason: str) -> SourceRecord:
    log.warning("unreadable source %s: %s", path, reason)
    return SourceRecord(sid, path.resolve().as_uri(), fmt, path, None, reason, sig, {path.resolve()}, fmt)


def open_file_record(
    path: Path,
    fmt: str,
    sid: str,
    sig: tuple,
    roots: Sequence[Path],
    follow_links: bool,
    timeout: float,
    montage_gap: float = DEFAULT_GAP_FRACTION,
) -> SourceRecord:
    """Open ``path`` as a record within ``timeout``; an unreadable file is a record with the
    reason (so is a folder source holding symlinks out of ``roots`` unless ``follow_links``)."""
    try:
        src = open_within(path, fmt, timeout, montage_gap)
    except UnreadableSource as exc:
        reason = exc.reason
        member = Path(exc.path).resolve()
        if member != path.resolve():  # a member file failed: the row names it
            reason = f"{os.path.relpath(member, path.resolve()) if path.is_dir() else member}: {reason}"
        return _unreadable(path, fmt, sid, sig, reason)
    except Exception as exc:  # never let one file take the scan down
        return _unreadable(path, fmt, sid, sig, f"{type(exc).__name__}: {exc}")
    if path.is_dir() and not follow_links:
        leaving = links_leaving(path, roots)
        if leaving:
            src.close()
            return _unreadable(
                path,
                fmt,
                sid,
                sig,
                f"holds symlinks to targets outside the served roots ({', '.join(sorted(leaving)[:3])}"
                f"{', ...' if len(leaving) > 3 else ''}): not served (follow_symlinks_outside_roots = false)",
            )
    if src.source_id != sid:
        src.source_id = sid
    return SourceRecord(sid, src.url, src.type, path, src, None, sig, set(src.member_paths) | {path.resolve()}, fmt)


def stored_row(rec: SourceRecord) -> StoredRow:
    """What the store keeps of a record (and a worker process sends back): the listing, the
    claim and its signature."""
    return {
        "source_id": rec.source_id,
        "path": str(rec.path),
        "format_name": rec.format_name or rec.type,
        "source_url": rec.url,
        "source_type": rec.type,
        "is_resolved": rec.is_resolved,
        "unresolved_reason": rec.unresolved_reason,
        "signature": rec.signature,
        "member_paths": [str(p) for p in rec.member_paths],
        "tensors": rec.tensor_rows(),
        "metadata_json": rec.metadata_json(),
    }


def claim_and_open(
    path: Path,
    fmt: str | None,
    sid: str,
    sig: tuple,
    roots: Sequence[Path],
    follow_links: bool,
    timeout: float,
    montage_gap: float = DEFAULT_GAP_FRACTION,
) -> SourceRecord | None:
    """The record of a claim; ``fmt`` None: a file whose format is sniffed here (None when
    no format recognises it: not a source)."""
    if fmt is None:
        entry = claim_format(path, False, formats())
        if entry is None:
            return None
        fmt = entry.name
    return open_file_record(path, fmt, sid, sig, roots, follow_links, timeout, montage_gap)


def _row_in_worker(
    path: str,
    fmt: str | None,
    sid: str,
    sig: tuple,
    roots: list[str],
    follow_links: bool,
    timeout: float,
    montage_gap: float,
) -> StoredRow | None:
    """In a worker process: the row of one claim (its adapter closed), None if not a source."""
    rec = claim_and_open(Path(path), fmt, sid, sig, [Path(r) for r in roots], follow_links, timeout, montage_gap)
    if rec is None:
        return None
    try:
        return stored_row(rec)
    finally:
        rec.close_adapter()


def _worker_start() -> None:
    """A worker process says nothing itself: the catalog logs what its rows say."""
    logging.getLogger("tensor_server").setLevel(logging.ERROR)


def _plugins_only_here() -> bool:
    """Whether a format was registered by code a fresh process does not run (a plugin, a test)."""
    return any(not getattr(e.opener, "__module__", "").startswith("tensor_server.") for e in formats())


class Opening:
    """The claims of one scan, opened on ``pool`` (threads) and, past ``PROCESSES_AFTER``
    opens, on worker processes (module docstring): at most ``4 x workers`` in flight, so a
    walk of millions of files never queues millions of opens."""

    def __init__(
        self,
        scanner: Scanner,
        pool: cf.ThreadPoolExecutor,
        tally: dict[str, int],
        skipped: list[tuple[Path, str]],
        seen: set[str],
        on_unclaimed=None,
    ) -> None:
        self.scanner, self.catalog = scanner, scanner.catalog
        self.pool, self.tally, self.skipped, self.seen = pool, tally, skipped, seen
        self.on_unclaimed = on_unclaimed
        self.covered: set[Path] = set()
        #: future -> (claim, id, signature, on a process)
        self.inflight: dict[cf.Future, tuple[Claim, str, tuple, bool]] = {}
        self.window = 4 * self.catalog.open_workers
        self.flushed_at = time.monotonic()
        self.submitted = 0
        self.procs: cf.ProcessPoolExecutor | None = None
        self.use_procs = self.catalog.open_processes > 0 and self.catalog.open_workers > 1 and not _plugins_only_here()

    def offer(self, claim: Claim) -> None:
        try:
            prepared = self.scanner.prepare_claim(claim, self.covered)
        except Exception as exc:  # nothing about one entry may end the scan
            self.skipped.append((claim.path, f"{type(exc).__name__}: {exc}"))
            return
        if prepared is None:
            return
        sid, sig, unchanged = prepared
        self.seen.add(sid)
        if not unchanged:
            self._submit(claim, sid, sig)
        self._collect(block=len(self.inflight) >= self.window)

    def _submit(self, claim: Claim, sid: str, sig: tuple) -> None:
        self.submitted += 1
        if self.use_procs and self.submitted > PROCESSES_AFTER:
            if self.procs is None:
                self.procs = self._start_processes()
                self.window = 4 * max(self.catalog.open_workers, self.catalog.open_processes)
            fut = self.procs.submit(*self._task(claim, sid, sig))
            self.inflight[fut] = (claim, sid, sig, True)
        else:
            self.inflight[self.pool.submit(self.scanner.open_claim, claim, sid, sig)] = (claim, sid, sig, False)

    def _task(self, claim: Claim, sid: str, sig: tuple) -> tuple:
        cat = self.catalog
        return (
            _row_in_worker,
            str(claim.path),
            claim.format.name if claim.format else None,
            sid,
            sig,
            [str(r) for r in cat.roots],
            cat.follow_symlinks_outside_roots,
            cat.open_timeout_seconds,
            cat.montage_gap,
        )

    def _start_processes(self) -> cf.ProcessPoolExecutor:
        return cf.ProcessPoolExecutor(
            self.catalog.open_processes, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_start
        )

    def finish(self) -> None:
        while self.inflight:
            self._collect(block=True)

    def close(self) -> None:
        """Stop the worker processes (a scan that ended early drops what they still hold)."""
        if self.procs is not None:
            self.procs.shutdown(wait=True, cancel_futures=True)
            self.procs = None

    def _collect(self, block: bool) -> None:
        done, _ = cf.wait(list(self.inflight), timeout=None if block else 0, return_when=cf.FIRST_COMPLETED)
        broken: list[tuple[Claim, str, tuple]] = []
        for fut in done:
            claim, sid, sig, on_proc = self.inflight.pop(fut)
            try:
                rec = self.scanner.listed_claim(claim, sid, sig, fut.result()) if on_proc else fut.result()
            except BrokenProcessPool:
                broken.append((claim, sid, sig))
                continue
            except Exception as exc:
                self.skipped.append((claim.path, f"{type(exc).__name__}: {exc}"))
                continue
            self._took(claim, sid, rec)
        if broken:
            self._after_crash(broken)
        if time.monotonic() - self.flushed_at > STORE_FLUSH_SECONDS:
            self.catalog.flush_store()
            self.flushed_at = time.monotonic()

    def _took(self, claim: Claim, sid: str, rec: tuple[SourceRecord, bool] | None) -> None:
        if rec is None:  # no format recognises the file: not a source
            self.seen.discard(sid)
            self.scanner.count("files_seen", -1)
            if self.on_unclaimed is not None:
                self.on_unclaimed(claim.path)
            return
        rec, is_new = rec
        self.covered |= rec.member_paths  # a member of an opened multi-file source is not its own source
        self.tally["added" if is_new else "changed"] += 1
        self.tally["unresolved"] += not rec.is_resolved

    def _after_crash(self, broken: list[tuple[Claim, str, tuple]]) -> None:
        """A worker died: every claim in flight on its pool is opened again, alone on a fresh
        pool; the one that kills that pool too is an unreadable row."""
        broken += [(c, s, g) for fut, (c, s, g, on_proc) in list(self.inflight.items()) if on_proc]
        for fut in [f for f, v in self.inflight.items() if v[3]]:
            del self.inflight[fut]
        log.warning("a worker process died opening one of %d files: opening them again one at a time", len(broken))
        self.procs.shutdown(wait=True, cancel_futures=True)
        self.procs = self._start_processes()
        for claim, sid, sig in broken:
            try:
                row = self.procs.submit(*self._task(claim, sid, sig)).result()
            except BrokenProcessPool:
                self.procs.shutdown(wait=True, cancel_futures=True)
                self.procs = self._start_processes()
                row = stored_row(
                    _unreadable(
                        claim.path,
                        claim.format.name if claim.format else "unknown",
                        sid,
                        sig,
                        "the reader crashed the process opening this file",
                    )
                )
            except Exception as exc:
                self.skipped.append((claim.path, f"{type(exc).__name__}: {exc}"))
                continue
            self._took(claim, sid, self.scanner.listed_claim(claim, sid, sig, row))
