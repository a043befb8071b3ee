"""Paths added at runtime (the Tensor Browser's drag-and-drop, ``register_local_path``).

A path outside the served roots is walked with the same discovery as the roots and its
sources join the catalog for this server's lifetime. Their ``source_url`` is
``dnd://<label>/<path under the drop>`` (the biopb reference's marking), where the label is
the dropped item's name, made unique: that url is what ``remove_source`` takes back, and
the only thing it removes, so a client can never deregister a served root's sources. A
path under a served root is already served: it is reported present and left as it is.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tensor_server.catalog.catalog import Catalog, _stat_signature, _under
from tensor_server.adapters.registry import formats
from tensor_server.catalog.discovery import Claim, discover
from tensor_server.core.identity import source_id_for_path
from tensor_server.errors import InvalidArgument

__all__ = ["DND_PREFIX", "AddTally", "DroppedPaths"]

DND_PREFIX = "dnd://"


@dataclass
class AddTally:
    added: list[str] = field(default_factory=list)
    already_present: list[str] = field(default_factory=list)
    refreshed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)


class DroppedPaths:
    """The drops of one server: label -> the resolved path it names."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._labels: dict[str, Path] = {}
        self._lock = threading.Lock()

    def _label_for(self, path: Path) -> str:
        with self._lock:
            for label, p in self._labels.items():
                if p == path:
                    return label
            base = path.name or "root"
            label, n = base, 2
            while label in self._labels:
                label, n = f"{base} ({n})", n + 1
            self._labels[label] = path
            return label

    def add(self, raw_path: str, source_type: str = "", on_source: Callable[[int, str], None] | None = None
            ) -> AddTally:
        """Register every source at or under ``raw_path``. Refuses (naming the path) a path
        that does not exist or that the server may not read; a file no format reads, or a
        source that fails to open, is a ``failed`` entry with the reason. ``source_type``
        (a format name) opens ``raw_path`` itself as that format instead of discovering."""
        if not raw_path:
            raise InvalidArgument("add_source: the path is empty")
        if "://" in raw_path and not raw_path.startswith("file://"):
            raise InvalidArgument(f"add_source: {raw_path}: only paths on the server's own disk can be added")
        path = Path(raw_path[len("file://"):] if raw_path.startswith("file://") else raw_path).expanduser()
        if not path.is_absolute():
            raise InvalidArgument(f"add_source: {raw_path}: give an absolute path on the server")
        if not path.exists():
            raise InvalidArgument(f"add_source: {path}: no such file or folder on the server")
        if not os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
            raise InvalidArgument(f"add_source: {path}: the server may not read it (permission denied)")
        path = path.resolve()
        known = {e.name: e for e in formats()}
        if source_type and source_type not in known:
            raise InvalidArgument(f"add_source: unknown source_type {source_type!r}; known: {sorted(known)}")
        claims = [Claim(path, known[source_type])] if source_type else discover(path)
        tally = AddTally()
        if any(_under(path, root) for root in self.catalog.roots):
            self._tally_served(path, tally)
            return tally
        label = self._label_for(path)
        seen: set[str] = set()
        for claim in claims:
            sid = source_id_for_path(claim.path)
            seen.add(sid)
            rel = claim.path.resolve().relative_to(path).as_posix()
            url = f"{DND_PREFIX}{label}" + ("" if rel == "." else f"/{rel}")
            try:
                old = self.catalog.get_record(sid)
            except KeyError:
                old = None
            rec = self.catalog.open_record(claim.path, claim.format.name, sid, _stat_signature(claim.path))
            rec.url = url
            self.catalog.put_record(rec)
            if old is None:
                tally.added.append(sid)
            else:
                tally.already_present.append(sid)
                tally.refreshed.append(sid)
            if not rec.is_resolved:
                tally.failed.append((str(claim.path), rec.unresolved_reason or "unreadable"))
            if on_source is not None:
                on_source(len(seen), str(claim.path))
        prefix = f"{DND_PREFIX}{label}"
        gone = [r.source_id for r in self.catalog.records()
                if (r.url == prefix or r.url.startswith(prefix + "/")) and r.source_id not in seen]
        tally.removed = self.catalog.remove_records(gone)
        if not seen:
            tally.failed.append((str(path), "no supported image format found there"))
        return tally

    def _tally_served(self, path: Path, tally: AddTally) -> None:
        for r in self.catalog.records():
            if r.path is not None and _under(Path(r.path), path):
                tally.already_present.append(r.source_id)
        if not tally.already_present:
            tally.failed.append((str(path), "under a served root, but no source there (yet: the next scan finds it)"))

    def remove(self, root_url: str) -> list[str]:
        """Deregister every source at or under a ``dnd://`` branch root; return their ids."""
        if not root_url.startswith(DND_PREFIX) or not root_url[len(DND_PREFIX):].strip("/"):
            raise InvalidArgument(f"remove_source: {root_url!r} is not a dnd:// branch of an added path; "
                                  "only paths added at runtime can be removed")
        root = root_url.rstrip("/")
        ids = [r.source_id for r in self.catalog.records() if r.url == root or r.url.startswith(root + "/")]
        removed = self.catalog.remove_records(ids)
        label = root[len(DND_PREFIX):].split("/", 1)[0]
        if "/" not in root[len(DND_PREFIX):]:
            with self._lock:
                self._labels.pop(label, None)
        return removed
