"""Paths added at runtime (the Tensor Browser's drag-and-drop, ``register_local_path``).

A path outside the served roots is walked with the same discovery as the roots and its
sources join the catalog for this server's lifetime. Their ``source_url`` is
``dnd://<label>/<path under the drop>`` (the biopb reference's marking), where the label is
the dropped item's name, made unique among the drops and the roots' top folders
(``tree.root_top_names``): that url is what ``remove_source`` takes back, and
the only thing it removes. A path under a served root is already served: it is reported
present and left as it is; a served root under an added path is not entered (its sources
are reported present, never relabelled), so a client can never deregister a served root's
sources.

What a client may add is bounded: the path must lie under an allowed folder
(``allowed_paths``; by default the user's home and the served roots), never be ``/`` nor
under ``/proc``, ``/sys``, ``/dev``, ``/etc``, the write dir or the cache (``PermissionDenied``
naming the rule); the walk never follows a link out of the added path, spends a
``WalkBudget`` (entries, seconds) and stops when the client has gone. ``add_events`` yields
progress as each source is registered, so a door streams it while the walk goes on.

A URL (``https://``, ``http://``, ``s3://``) is added as a remote root instead: an http(s) image
is opened at once under the host rule (``adapters/_url_rules.py``: never loopback, private,
link-local or the metadata address unless ``[remote] allowed_hosts`` lists the host), and a
URL that cannot be read is refused naming it and the reason (404, HTML, a timeout), not kept
as an unreadable row; an ``s3://`` URL is listed like an ``s3://`` root. ``remove_source``
takes the URL back.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tensor_server.adapters.registry import formats
from tensor_server.catalog.catalog import Catalog, SourceRecord
from tensor_server.catalog.discovery import Claim, WalkBudget, discover
from tensor_server.catalog.record import resolves_under, stat_signature
from tensor_server.catalog.tree import root_top_names
from tensor_server.core.identity import source_id_for_path
from tensor_server.errors import (
    InvalidArgument,
    PermissionDenied,
    RemoteUnavailable,
    ResourceExhausted,
    UnreadableSource,
)

__all__ = ["DND_PREFIX", "AddProgress", "AddTally", "AddLimits", "DroppedPaths", "SYSTEM_PATHS"]

DND_PREFIX = "dnd://"
#: never added, nor anything under them (``/`` itself only: everything is under it)
SYSTEM_PATHS = ("/proc", "/sys", "/dev", "/etc")


@dataclass(frozen=True)
class AddLimits:
    """What one add_source may walk."""

    max_entries: int = 100_000
    max_seconds: float = 60.0


@dataclass(frozen=True)
class AddProgress:
    """One source registered: how many so far, and its path."""

    added_count: int
    current_path: str


@dataclass
class AddTally:
    added: list[str] = field(default_factory=list)
    already_present: list[str] = field(default_factory=list)
    refreshed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)


class DroppedPaths:
    """The drops of one server: label -> the resolved path it names."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        allowed_paths: Sequence[str | os.PathLike[str]] | None = None,
        refused_paths: Sequence[str | os.PathLike[str]] = (),
        limits: AddLimits = AddLimits(),
    ) -> None:
        """``allowed_paths``: folders an added path must lie under (None: the user's home and
        the served roots). ``refused_paths``: folders never added nor walked into besides the
        system ones and the catalog's excluded ones (the write dir): the cache dir."""
        self.catalog = catalog
        self.allowed_paths = None if allowed_paths is None else [Path(p) for p in allowed_paths]
        self.refused_paths = [Path(p) for p in refused_paths]
        self.limits = limits
        self._labels: dict[str, Path] = {}
        self._urls: dict[str, str] = {}  # added URLs as shown -> as given
        self._lock = threading.Lock()

    def _allowed(self) -> list[Path]:
        if self.allowed_paths is not None:
            return self.allowed_paths
        return [Path.home(), *self.catalog.roots]

    def _refused(self) -> list[Path]:
        return [*self.refused_paths, *self.catalog.excluded]

    def check_allowed(self, path: Path) -> None:
        """``PermissionDenied`` naming the rule when ``path`` (resolved) may not be added."""
        real = Path(os.path.realpath(path))
        if real == Path("/"):
            raise PermissionDenied(f"add_source: {path}: the whole filesystem cannot be added; add a data folder")
        for system in SYSTEM_PATHS:
            if _inside(real, Path(system)):
                raise PermissionDenied(f"add_source: {path}: under {system}, which holds no data and is never added")
        for folder in self._refused():
            if _inside(real, Path(os.path.realpath(folder))):
                raise PermissionDenied(
                    f"add_source: {path}: under {folder}, the server's own storage "
                    "(write dir or cache), which is never added"
                )
        allowed = self._allowed()
        if not any(_inside(real, Path(os.path.realpath(a))) for a in allowed):
            raise PermissionDenied(
                f"add_source: {path}: not under an allowed folder (catalog allowed_paths: "
                f"{', '.join(str(a) for a in allowed[:5])}); ask the operator to allow it"
            )

    def _label_for(self, path: Path) -> str:
        with self._lock:
            for label, p in self._labels.items():
                if p == path:
                    return label
            base = path.name or "root"
            label, n = base, 2
            taken = root_top_names(self.catalog.roots)  # the roots' top folders are theirs
            while label in self._labels or label in taken:
                label, n = f"{base} ({n})", n + 1
            self._labels[label] = path
            return label

    def add(
        self,
        raw_path: str,
        source_type: str = "",
        on_source: Callable[[int, str], None] | None = None,
        *,
        cancelled: Callable[[], bool] | None = None,
    ) -> AddTally:
        """``add_events`` drained: ``on_source(count, path)`` hears each progress event."""
        for event in self.add_events(raw_path, source_type, cancelled=cancelled):
            if isinstance(event, AddTally):
                return event
            if on_source is not None:
                on_source(event.added_count, event.current_path)
        raise AssertionError("add_events ends with its tally")

    def _checked_path(self, raw_path: str) -> Path:
        if not raw_path:
            raise InvalidArgument("add_source: the path is empty")
        if "://" in raw_path and not raw_path.startswith("file://"):
            raise InvalidArgument(f"add_source: {raw_path[:200]}: only paths on the server's own disk can be added")
        path = Path(raw_path[len("file://") :] if raw_path.startswith("file://") else raw_path).expanduser()
        if not path.is_absolute():
            raise InvalidArgument(f"add_source: {raw_path[:200]}: give an absolute path on the server")
        self.check_allowed(path)  # before any stat: a refused path is not even looked at
        if not path.exists():
            raise InvalidArgument(f"add_source: {path}: no such file or folder on the server")
        if not os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
            raise InvalidArgument(f"add_source: {path}: the server may not read it (permission denied)")
        return path.resolve()

    def add_events(
        self, raw_path: str, source_type: str = "", *, cancelled: Callable[[], bool] | None = None
    ) -> Iterator[AddProgress | AddTally]:
        """Register every source at or under ``raw_path``, yielding an ``AddProgress`` per
        source as it is registered and, last, the ``AddTally``. Refuses (naming the path) a
        path that does not exist, that the server may not read or that the allow-list
        refuses; a file no format reads, or a source that fails to open, is a ``failed``
        entry with the reason. ``source_type`` (a format name) opens ``raw_path`` itself as
        that format instead of discovering. A walk past its budget ends with what it found
        and a ``failed`` entry saying why (nothing is removed then); ``ReadCancelled`` when
        ``cancelled()`` turns true."""
        if "://" in raw_path and not raw_path.startswith("file://"):
            yield from self._add_url(raw_path)
            return
        path = self._checked_path(raw_path)
        known = {e.name: e for e in formats()}
        if source_type and source_type not in known:
            raise InvalidArgument(f"add_source: unknown source_type {source_type[:100]!r}; known: {sorted(known)}")
        tally = AddTally()
        if any(resolves_under(path, root) for root in self.catalog.roots):
            self._tally_served(path, tally)
            yield tally
            return
        served_inside = [r for r in self.catalog.roots if resolves_under(r, path)]
        for root in served_inside:  # a parent of a root: the root's sources stay the root's
            self._tally_served(root, tally, say_when_none=False)
        label = self._label_for(path)
        budget = WalkBudget(self.limits.max_entries, self.limits.max_seconds, cancelled)
        claims = (
            iter([Claim(path, known[source_type])])
            if source_type
            else discover(path, allowed_roots=[path], budget=budget, exclude=[*served_inside, *self._refused()])
        )
        seen: set[str] = set()
        complete = True
        try:
            for claim in claims:
                sid = self._register(claim, path, label, tally)
                seen.add(sid)
                yield AddProgress(len(seen), str(claim.path))
        except ResourceExhausted as exc:
            complete = False
            tally.failed.append((str(path), f"{exc}; the sources found so far were added"))
        if complete:
            prefix = f"{DND_PREFIX}{label}"
            gone = [
                r.source_id
                for r in self.catalog.records()
                if (r.url == prefix or r.url.startswith(prefix + "/")) and r.source_id not in seen
            ]
            tally.removed = self.catalog.remove_records(gone)
        if not seen and not served_inside and complete:
            tally.failed.append((str(path), "no supported image format found there"))
        yield tally

    def _register(self, claim: Claim, path: Path, label: str, tally: AddTally) -> str:
        """Open one claim as a ``dnd://`` record; its source id."""
        sid = source_id_for_path(claim.path)
        rel = claim.path.resolve().relative_to(path).as_posix()
        url = f"{DND_PREFIX}{label}" + ("" if rel == "." else f"/{rel}")
        try:
            old = self.catalog.get_record(sid)
        except KeyError:
            old = None
        rec = self.catalog.open_record(claim.path, claim.format.name, sid, stat_signature(claim.path))
        rec.url = url
        self.catalog.put_record(rec)
        if old is None:
            tally.added.append(sid)
        else:
            tally.already_present.append(sid)
            tally.refreshed.append(sid)
        if not rec.is_resolved:
            tally.failed.append((str(claim.path), rec.unresolved_reason or "unreadable"))
        return sid

    def _tally_served(self, path: Path, tally: AddTally, *, say_when_none: bool = True) -> None:
        """Report the served sources at or under ``path`` as present (they stay the root's)."""
        present = [
            r.source_id for r in self.catalog.records() if r.path is not None and resolves_under(Path(r.path), path)
        ]
        tally.already_present.extend(present)
        if not present and say_when_none:
            tally.failed.append((str(path), "under a served root, but no source there (yet: the next scan finds it)"))

    def _add_url(self, url: str) -> Iterator[AddProgress | AddTally]:
        """A remote image (or an s3:// prefix) as a root of this server's lifetime (module
        docstring): the tally, or an error naming the URL and the reason."""
        from tensor_server.adapters.url_source import checked_addresses, is_image_url, open_url_source, url_scheme
        from tensor_server.adapters.zarr_remote import public_url
        from tensor_server.catalog.remote import scan_remote_root
        from tensor_server.core.identity import source_id_for_url

        scheme = url_scheme(url.strip())
        url, shown = url.strip(), public_url(url.strip()).rstrip("/")
        tally = AddTally()
        if scheme != "s3":
            checked_addresses(url)  # the host rule before any byte is fetched
        # known as added before its rows are put (and as before again if it fails): a reader
        # woken by their change (a ``serve --workers`` primary's manifest) sees the URL with them
        with self._lock:
            before = self._urls.get(shown)
            self._urls[shown] = url
        if scheme == "s3" and not is_image_url(url):  # a prefix: its stores, listed
            scan_remote_root(self.catalog, url)
            rows = [r for r in self.catalog.records() if r.url == shown or r.url.startswith(shown + "/")]
            if all(not r.is_resolved for r in rows):
                self._restore_url(shown, before)
                self.catalog.remove_records([r.source_id for r in rows])
                why = "; ".join(str(r.unresolved_reason) for r in rows) or "no zarr or OME-Zarr store there"
                raise InvalidArgument(f"add_source: {shown}: {why}")
            tally.added = [r.source_id for r in rows if r.is_resolved]
        else:
            sid = source_id_for_url(shown)
            known = any(r.source_id == sid for r in self.catalog.records())
            try:
                src = open_url_source(url, sid)
            except RemoteUnavailable:
                self._restore_url(shown, before)
                raise
            except UnreadableSource as exc:
                self._restore_url(shown, before)
                raise InvalidArgument(f"add_source: {exc}") from None
            self.catalog.put_record(SourceRecord(sid, shown, src.type, None, src, None, (shown,)))
            (tally.already_present if known else tally.added).append(sid)
        yield AddProgress(len(tally.added) + len(tally.already_present), shown)
        yield tally

    def added_urls(self) -> dict[str, str]:
        """The URLs added, as shown (what ``remove_source`` takes) -> as given (what opens it,
        credentials included): what a ``serve --workers`` primary tells its workers."""
        with self._lock:
            return dict(self._urls)

    def _restore_url(self, shown: str, before: str | None) -> None:
        """A URL that failed to add is added as it was before (or not at all)."""
        with self._lock:
            if before is None:
                self._urls.pop(shown, None)
            else:
                self._urls[shown] = before

    def remove(self, root_url: str) -> list[str]:
        """Deregister every source at or under a ``dnd://`` branch root (or an added URL);
        return their ids."""
        with self._lock:
            added_url = self._urls.pop(root_url.rstrip("/"), None)
        if added_url is not None:
            root = root_url.rstrip("/")
            return self.catalog.remove_records(
                [r.source_id for r in self.catalog.records() if r.url == root or r.url.startswith(root + "/")]
            )
        if not root_url.startswith(DND_PREFIX) or not root_url[len(DND_PREFIX) :].strip("/"):
            raise InvalidArgument(
                f"remove_source: {root_url!r} is not a dnd:// branch of an added path; "
                "only paths added at runtime can be removed"
            )
        root = root_url.rstrip("/")
        ids = [
            r.source_id
            for r in self.catalog.records()
            if (r.url == root or r.url.startswith(root + "/"))
            and not (r.path is not None and any(resolves_under(Path(r.path), s) for s in self.catalog.roots))
        ]
        removed = self.catalog.remove_records(ids)
        label = root[len(DND_PREFIX) :].split("/", 1)[0]
        if "/" not in root[len(DND_PREFIX) :]:
            with self._lock:
                self._labels.pop(label, None)
        return removed


def _inside(path: Path, folder: Path) -> bool:
    """``path`` is ``folder`` or under it (both already resolved: no filesystem access)."""
    return path == folder or folder in path.parents
