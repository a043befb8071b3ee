"""What the workers of ``serve --workers N`` serve beside the roots: the primary's READY uploads
(private ones with their read grant), the paths added to it with ``add_source`` and the URLs
added the same way, under the same array ids.

The primary owns every write (``cli_workers.py``) and a worker keeps a catalog of its own (the
primary's catalog store is a DuckDB file only one process may open), so what exists only on
the primary is told to the workers by one small JSON file, the *manifest*: per READY upload its
id, member folder, content version, owner and read grant; per added path (a ``dnd://`` record)
its source id, path, format and url; per added URL the URL as given; and the write dir (never
scanned as a root's content). The primary (``ManifestPublisher``) rewrites it whole (temporary
file, then ``os.replace``: a reader sees one version or the next) when its catalog generation
moves and the content differs, and before it answers a write verb that moved it
(``ServingRuntime.catalog_written``); a worker (``ManifestFollower``) opens each entry
read-only, as boot adoption and ``add_source`` do, and drops what left it: a discarded upload
or a removed path or URL stops being served by every process.

Each rule keeps one owner. A private upload's read is ``Access.read``'s rule on every process:
a worker's ``Access`` looks the upload up in ``FollowedUploads`` (the manifest's owner and
grant, the same SHA-256s the upload's marker keeps: never a token), so the same caller is let
in or refused the same way everywhere. An added URL is opened by the worker with
``DroppedPaths.add`` (the host rule and the opening as on the primary) from the URL as given,
which may carry a credential (a presigned query string, say): the manifest is therefore
written 0600, readable only by the user who runs the server, the trust its config file and
command line (where such a URL may already sit) have; that user's processes hold it in memory
already. Forwarding those reads to the primary instead would serve every tile of a URL source
through one process, which is what ``--workers`` exists to avoid.

A worker looks at the file (one ``stat``; read only when it changed) before its first scan,
every ``FOLLOW_SECONDS``, and when a request names a tensor it does not know
(``Catalog.on_miss``), so an upload made READY through Flight answers on a worker's HTTP door
at once. Annotations are not in it: they are forwarded to the primary (``http/forward.py``).

Bounded: at most ``MAX_ENTRIES`` entries of each kind are published (the rest, said once in the
log, stay the primary's), and a worker reads no manifest larger than ``MAX_MANIFEST_BYTES``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensor_server.catalog.catalog import Catalog
from tensor_server.catalog.dropped import DND_PREFIX, DroppedPaths
from tensor_server.catalog.record import stat_signature
from tensor_server.core.identity import ArrayId
from tensor_server.uploads.cache_member import CacheMember
from tensor_server.uploads.marker import READY, sync_path
from tensor_server.uploads.scratch import SCRATCH_SOURCE_ID, ScratchSource
from tensor_server.uploads.zarr_member import ZarrMember

__all__ = [
    "ManifestPublisher",
    "ManifestFollower",
    "FollowedUploads",
    "MAX_ENTRIES",
    "MAX_MANIFEST_BYTES",
    "FOLLOW_SECONDS",
]

log = logging.getLogger(__name__)

#: uploads, and added sources, a manifest lists at most (each)
MAX_ENTRIES = 20_000
#: a manifest larger than this is not read (MAX_ENTRIES entries of long paths fit well within)
MAX_MANIFEST_BYTES = 32 << 20
#: how often a worker looks at the manifest without being asked (a removal reaches it within this)
FOLLOW_SECONDS = 1.0
#: the primary waits this many times a publish's cost before the next (and never longer than
#: MAX_PUBLISH_WAIT): building the manifest walks the catalog's records
PUBLISH_GAP = 20
MAX_PUBLISH_WAIT = 1.0
VERSION = 2


class ManifestPublisher:
    """The primary's side: ``publish`` writes the manifest when its content changed; ``start``
    does so whenever the catalog generation moves (every upload made READY or discarded and
    every path added or removed moves it)."""

    def __init__(
        self,
        catalog: Catalog,
        uploads: Any | None,
        path: Path,
        added_urls: Callable[[], Mapping[str, str]] = dict,
    ) -> None:
        """``added_urls()``: the URLs added with ``add_source``, as shown -> as given
        (``DroppedPaths.added_urls``)."""
        self.catalog, self.uploads, self.path, self.added_urls = catalog, uploads, Path(path), added_urls
        self._last: dict[str, Any] | None = None
        self._said_full = False
        self._writing = threading.Lock()  # one publish at a time: the loop's, or a flush
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def manifest(self) -> dict[str, Any]:
        """What a worker needs to serve what only the primary holds (module docstring)."""
        uploads = [] if self.uploads is None else self.uploads.all_uploads()
        ready = sorted(
            (
                {
                    "array_id": up.array_id,
                    "path": str(up.member.path),
                    "content_version": up.member.marker.content_version,
                    "owner": up.owner,
                    "grant": up.grant,
                }
                for up in uploads
                if up.state == READY
            ),
            key=lambda e: e["array_id"],
        )
        added = [
            {"source_id": r.source_id, "path": str(r.path), "format": r.format_name or r.type, "url": r.url}
            for r in self.catalog.records()
            if r.path is not None and r.url.startswith(DND_PREFIX)
        ]
        urls = [{"shown": shown, "url": url} for shown, url in sorted(self.added_urls().items())]
        if max(len(ready), len(added), len(urls)) > MAX_ENTRIES and not self._said_full:
            self._said_full = True
            log.warning(
                "the workers serve the first %d READY uploads, added paths and added URLs each (%d, %d and %d "
                "here); the rest are served by the primary only",
                MAX_ENTRIES,
                len(ready),
                len(added),
                len(urls),
            )
        write_dir = None if self.uploads is None else str(self.uploads.write_dir)
        return {
            "version": VERSION,
            "write_dir": write_dir,
            "uploads": ready[:MAX_ENTRIES],
            "sources": added[:MAX_ENTRIES],
            "urls": urls[:MAX_ENTRIES],
        }

    def publish(self) -> bool:
        """Write the manifest if it changed since the last write; whether it was written."""
        with self._writing:
            doc = self.manifest()
            if doc == self._last:
                return False
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _write_private(self.path, json.dumps(doc))
            self._last = doc
            return True

    def flush(self) -> None:
        """Publish now, whatever the loop's pace (``ServingRuntime.catalog_written``: a write
        verb's answer waits for it, so a client told READY or added finds it on every worker;
        the loop alone may wait up to ``MAX_PUBLISH_WAIT`` after its last publish)."""
        if self._stop.is_set():  # closed: the file is gone with the workers
            return
        try:
            self.publish()
        except OSError as exc:  # as in the loop: the workers keep the last version, said
            log.warning("cannot write the workers' catalog manifest %s: %s", self.path, exc)

    def start(self) -> None:
        """Publish now (before any worker starts), then each time the catalog generation moves,
        at most once per ``PUBLISH_GAP`` times the last publish's cost (a scan of a large catalog
        moves it often; a small catalog publishes within milliseconds of a change)."""
        self.publish()

        def loop() -> None:
            while not self._stop.is_set():
                self.catalog.moved.wait()
                self.catalog.moved.clear()
                if self._stop.is_set():
                    return
                started = time.monotonic()
                try:
                    self.publish()
                except OSError as exc:  # a full disk: the workers keep the last version
                    log.warning("cannot write the workers' catalog manifest %s: %s", self.path, exc)
                self._stop.wait(min(MAX_PUBLISH_WAIT, PUBLISH_GAP * (time.monotonic() - started)))

        self._thread = threading.Thread(target=loop, name="catalog-manifest", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self.catalog.moved.set()  # wakes the loop
        if self._thread is not None:
            self._thread.join()
        self.path.unlink(missing_ok=True)


@dataclass(frozen=True)
class FollowedUpload:
    """What ``Access`` asks of an upload (``UploadManager.get``'s record), from the manifest."""

    array_id: str
    owner: str
    grant: str
    tensor: Any
    state: str = READY


class FollowedUploads:
    """A worker's answer to ``Access``'s questions about uploads (``get``, ``all_uploads``,
    ``upload_of``): the primary's READY uploads as its manifest lists them, so a private
    upload's grant is checked by the one rule on every process."""

    def __init__(self) -> None:
        self._by_id: dict[str, FollowedUpload] = {}
        self._lock = threading.Lock()

    def get(self, array_id: str) -> FollowedUpload | None:
        with self._lock:
            return self._by_id.get(array_id)

    def all_uploads(self) -> list[FollowedUpload]:
        with self._lock:
            return list(self._by_id.values())

    def upload_of(self, tensor: Any) -> FollowedUpload | None:
        up = self.get(tensor.array_id)
        return up if up is not None and up.tensor is tensor else None

    def put(self, up: FollowedUpload) -> None:
        with self._lock:
            self._by_id[up.array_id] = up

    def drop(self, array_id: str) -> None:
        with self._lock:
            self._by_id.pop(array_id, None)


class ManifestFollower:
    """A worker's side: ``refresh`` serves what the manifest lists and stops serving what left
    it; ``start`` refreshes every ``seconds`` and on every unknown id (``Catalog.on_miss``).
    ``uploads`` is what the worker's ``Access`` consults (``FollowedUploads``)."""

    def __init__(self, catalog: Catalog, path: Path) -> None:
        self.catalog, self.path = catalog, Path(path)
        self.uploads = FollowedUploads()
        self._dropped = DroppedPaths(catalog)  # opens an added URL as the primary's add_source did
        self._seen: tuple[int, int, int] | None = None
        self._sources: dict[str, tuple[str, str, str]] = {}  # source id -> (path, format, url)
        self._uploads: dict[str, tuple[tuple[str, ...], Any]] = {}  # array id -> (its entry, member)
        self._urls: dict[str, str] = {}  # added URL as shown -> as given
        self._retry = False  # an entry failed to open: try again at the next periodic look
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self, *, retry: bool = False) -> bool:
        """Apply the manifest if the file changed (or ``retry`` and an entry failed last time);
        whether anything served changed. A call that waited for another one's apply (the
        periodic look opening a URL while a request missed its id) says True: that apply may
        have served what its caller looks for, so the caller looks again."""
        waited = not self._lock.acquire(blocking=False)
        if waited:
            self._lock.acquire()
        try:
            return self._apply(retry) or waited
        finally:
            self._lock.release()

    def _apply(self, retry: bool) -> bool:
        """``refresh`` under its lock."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key == self._seen and not (retry and self._retry):
            return False
        self._seen = key
        if st.st_size > MAX_MANIFEST_BYTES:
            log.warning("the catalog manifest %s is larger than %d bytes: not read", self.path, MAX_MANIFEST_BYTES)
            return False
        try:
            doc = json.loads(self.path.read_bytes())
        except (OSError, ValueError) as exc:
            log.warning("cannot read the catalog manifest %s: %s", self.path, exc)
            return False
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            return False
        self._retry = False
        self._exclude(doc.get("write_dir"))
        upload_fields = ("array_id", "path", "content_version", "owner", "grant")
        return (
            self._follow_sources(_entries(doc, "sources", ("source_id", "path", "format", "url")))
            | self._follow_uploads(_entries(doc, "uploads", upload_fields))
            | self._follow_urls(_entries(doc, "urls", ("shown", "url")))
        )

    def _exclude(self, write_dir: Any) -> None:
        """The primary's write dir is never scanned as a root's content, and its scratch source
        (on which uploads land) is served as the primary serves it."""
        if not isinstance(write_dir, str):
            return
        if Path(write_dir) not in self.catalog.excluded:
            self.catalog.excluded.append(Path(write_dir))
        if self.catalog.known_record(SCRATCH_SOURCE_ID) is None:
            self.catalog.add_source(ScratchSource())

    def _follow_sources(self, entries: list[dict[str, str]]) -> bool:
        want = {e["source_id"]: (e["path"], e["format"], e["url"]) for e in entries}
        gone = [sid for sid in self._sources if sid not in want]
        self.catalog.remove_records(gone)
        for sid in gone:
            del self._sources[sid]
        changed = bool(gone)
        for sid, entry in want.items():
            if self._sources.get(sid) == entry:
                continue
            path, fmt, url = entry
            try:
                rec = self.catalog.open_record(Path(path), fmt, sid, stat_signature(Path(path)))
            except Exception as exc:  # an adapter raises what its library raises
                log.warning("cannot open the added source %s (%s): %s", sid, path, exc)
                self._retry = True
                continue
            rec.url = url
            self.catalog.put_record(rec)
            self._sources[sid] = entry
            changed = True
        return changed

    def _follow_uploads(self, entries: list[dict[str, str]]) -> bool:
        want = {e["array_id"]: (e["path"], e["content_version"], e["owner"], e["grant"]) for e in entries}
        changed = False
        for aid in [a for a, held in self._uploads.items() if want.get(a) != held[0]]:
            self._detach(aid)
            changed = True
        for aid, entry in want.items():
            if aid in self._uploads:
                continue
            path, version, owner, grant = entry
            try:
                member = _open_member(Path(path), aid, version, grant)
            except Exception as exc:  # a damaged store raises what its library raises
                log.warning("cannot open the upload %s (%s): %s", aid, path, exc)
                member = None
            if member is None:
                self._retry = True
                continue
            source_id, fld = ArrayId.parse(aid)
            reader = member.reader()
            # its grant is known before it is served, and forgotten only after (``_detach``)
            self.uploads.put(FollowedUpload(aid, owner, grant, reader))
            self.catalog.attach(source_id, fld, reader, listed=True)
            self._uploads[aid] = (entry, member)
            changed = True
        return changed

    def _detach(self, array_id: str) -> None:
        _, member = self._uploads.pop(array_id)
        source_id, fld = ArrayId.parse(array_id)
        self.catalog.detach(source_id, fld)
        self.uploads.drop(array_id)
        member.close()

    def _follow_urls(self, entries: list[dict[str, str]]) -> bool:
        """Open each URL added on the primary as its ``add_source`` did; forget the removed."""
        want = {e["shown"]: e["url"] for e in entries}
        changed = False
        for shown in [u for u, url in self._urls.items() if want.get(u) != url]:
            del self._urls[shown]
            self._dropped.remove(shown)
            changed = True
        for shown, url in want.items():
            if shown in self._urls:
                continue
            try:
                self._dropped.add(url)
            except Exception as exc:  # unreachable now: the primary reached it, so look again later
                log.warning("cannot open the added URL %s: %s", shown, exc)
                self._retry = True
                continue
            self._urls[shown] = url
            changed = True
        return changed

    def start(self, seconds: float = FOLLOW_SECONDS) -> None:
        """Refresh now, then every ``seconds`` and whenever the catalog misses an id."""
        self.refresh()
        self.catalog.on_miss = self.refresh

        def loop() -> None:
            while not self._stop.wait(seconds):
                try:
                    self.refresh(retry=True)
                except Exception:  # one bad look must not end the following
                    log.exception("following the catalog manifest %s", self.path)

        self._thread = threading.Thread(target=loop, name="catalog-follow", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self.catalog.on_miss = None
        if self._thread is not None:
            self._thread.join()


def _write_private(path: Path, text: str) -> None:
    """``text`` into ``path`` whole, readable by this user only (0600: the manifest may hold a
    URL's credentials), durable before it is in place."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # a leftover keeps its mode through O_CREAT
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    sync_path(path.parent)  # the rename itself


def _entries(doc: dict[str, Any], key: str, fields: tuple[str, ...]) -> list[dict[str, str]]:
    """The well-formed entries of one kind (each of ``fields`` a string), at most MAX_ENTRIES."""
    items = doc.get(key)
    if not isinstance(items, list):
        return []
    return [e for e in items[:MAX_ENTRIES] if isinstance(e, dict) and all(isinstance(e.get(f), str) for f in fields)]


def _open_member(path: Path, array_id: str, version: str, grant: str) -> Any | None:
    """The READY member at ``path`` the manifest names (its id, content version and grant),
    read-only; None when the folder holds something else now (discarded, or made again since)."""
    kind = next((k for k in (ZarrMember, CacheMember) if k.read_marker(path) is not None), None)
    member = None if kind is None else kind.open(path)
    if member is None:
        return None
    m = member.marker
    if m.state != READY or m.array_id != array_id or m.content_version != version or m.grant != grant:
        member.close()
        return None
    return member
