"""One catalog row: a source, opened now or on first use.

A record restored from the catalog store (``catalog/store.py``) carries its listing (the
tensors' ids, labels, shapes and dtypes, ``metadata_json``) and an opener instead of an
adapter: the listing and SQL are served from the row, and the adapter is opened the first
time a handler asks for ``record.source`` (a read, a descriptor). A restart therefore
lists every source without opening any.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter
from tensor_server.core.identity import file_stat_stamp

__all__ = ["SourceRecord", "ServedTensor", "stat_signature", "tensor_row", "is_under", "resolves_under"]


def tensor_row(t: TensorAdapter) -> dict[str, Any]:
    """A tensor's entry of the ``sources.tensors`` column (wire-protocol §9.2)."""
    return {
        "array_id": t.array_id,
        "dim_labels": list(t.dim_labels),
        "shape": [int(n) for n in t.shape],
        "dtype": t.dtype.str,
    }


@dataclass(frozen=True)
class ServedTensor:
    """One tensor a source serves, as every listing shows it (``Catalog.served``)."""

    #: the tensor's own id (what the read rule and the SQL views are keyed on)
    array_id: str
    #: the id it is listed, and read, by: its own, except a bare-id tensor beside attached ones,
    #: listed as ``source_id/`` (the biopb SDK refuses a bare id of a source listing several
    #: tensors for open-ended slices, and reads an exact id: ``core.identity.ArrayId``)
    listed_id: str
    #: the tensor and its field; None for the own tensors of a restored row not opened yet
    tensor: TensorAdapter | None = None
    field: str | None = None
    #: such a tensor's stored entry of the ``sources.tensors`` column
    stored_row: dict[str, Any] | None = None

    @property
    def row(self) -> dict[str, Any]:
        """Its entry of the ``sources.tensors`` column, ``array_id`` as listed (made when asked:
        most listings want the tensor, not the row)."""
        row = tensor_row(self.tensor) if self.tensor is not None else dict(self.stored_row or {})
        return {**row, "array_id": self.listed_id}


def stat_signature(path: Path) -> tuple:
    """Cheap change detector, stats only: a file's ``file_stat_stamp`` (size, mtime_ns,
    ctime_ns, inode: a rewrite whose mtime was set back still changes it); a folder's own
    stamp plus its direct children's (name, *stamp). A change re-opens the source, which
    mints a new content version. ``()``: cannot be stat'ed."""
    try:
        st = path.stat()
        if not stat.S_ISDIR(st.st_mode):
            return file_stat_stamp(st)
        kids = []
        for e in os.scandir(path):
            kids.append((e.name, *file_stat_stamp(e.stat())))
        return (*file_stat_stamp(st), tuple(sorted(kids)))
    except OSError:
        return ()


def resolves_under(path: Path, root: Path) -> bool:
    """``path`` is ``root`` or below it once both are resolved (links followed)."""
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def is_under(path: Path, root: Path) -> bool:
    """``path`` is ``root`` or below it: as spelled when it is (restoring 1e5 rows under their
    root resolves nothing), else once resolved (``resolves_under``)."""
    p, r = str(path), str(root).rstrip(os.sep)
    return p == r or p.startswith(r + os.sep) or resolves_under(path, root)


class SourceRecord:
    """A source of the catalog, resolved or not.

    ``source``: the open adapter; for a restored row it is opened on first access by
    ``opener(record)``, which fills the adapter in (or the reason it failed). ``listing``:
    ``(tensor rows, metadata_json)`` of a restored row until then."""

    def __init__(
        self,
        source_id: str,
        url: str,
        type: str,
        path: Path | None,
        source: SourceAdapter | None,
        unresolved_reason: str | None = None,
        signature: tuple = (),
        member_paths: set[Path] | None = None,
        format_name: str | None = None,
        *,
        listing: tuple[list[dict], str | None] | None = None,
        opener: Callable[[SourceRecord], None] | None = None,
    ) -> None:
        self.source_id, self.url, self.type, self.path = source_id, url, type, path
        self.unresolved_reason = unresolved_reason
        self.signature = signature
        self.member_paths: set[Path] = set(member_paths or ())
        self.format_name = format_name  # the registry entry that opened it (to reopen it the same way)
        self.listing = listing
        self._adapter = source
        self._opener = opener
        self._open_lock = threading.Lock()
        self._real_path: Path | None = None

    @property
    def source(self) -> SourceAdapter | None:
        """The adapter, opened now when this is a restored row not opened yet."""
        if self._opener is not None:
            with self._open_lock:  # one open; other callers wait for it
                if self._opener is not None:
                    try:
                        self._opener(self)
                    finally:
                        self._opener = None
        return self._adapter

    @source.setter
    def source(self, value: SourceAdapter | None) -> None:
        self._adapter = value
        self._opener = None

    def real_path(self) -> Path | None:
        """``path`` resolved, once per record (a changed link target is a new record: its
        signature changed)."""
        if self._real_path is None and self.path is not None:
            self._real_path = Path(self.path).resolve()
        return self._real_path

    def know_real_path(self, real: Path) -> None:
        """``path`` resolved, when the caller has it (a scan resolves each folder once)."""
        self._real_path = real

    def opened(self) -> SourceAdapter | None:
        """The adapter if it is open, without opening it."""
        return self._adapter

    def is_open_pending(self) -> bool:
        """A restored row whose adapter has not been opened yet."""
        return self._opener is not None

    @property
    def is_resolved(self) -> bool:
        """Readable: open, or restored as readable and not opened yet (never opens)."""
        return self._adapter is not None or self._opener is not None

    def tensor_rows(self) -> list[dict[str, Any]]:
        """The listed tensors of the source itself (never opens)."""
        if self._adapter is not None:
            return [tensor_row(t) for t in self._adapter.tensors.values()]
        return list(self.listing[0]) if self.listing is not None and self._opener is not None else []

    def metadata_json(self) -> str | None:
        """The source's metadata (never opens)."""
        if self._adapter is not None:
            return self._adapter.metadata_json()
        return self.listing[1] if self.listing is not None and self._opener is not None else None

    def close_adapter(self, keep: SourceAdapter | None = None) -> None:
        """Close the open adapter unless it is ``keep`` (the one replacing it)."""
        self._opener = None
        if self._adapter is not None and self._adapter is not keep:
            self._adapter.close()

    def is_resident(self) -> bool:
        """Whether the source's bytes are on this machine now: its files are all present
        (a stat each; in-memory data always is)."""
        paths = self.member_paths or ({Path(self.path)} if self.path is not None else set())
        return all(p.exists() for p in paths)

    def __repr__(self) -> str:
        state = "pending open" if self._opener else ("open" if self._adapter else "unresolved")
        return f"SourceRecord({self.source_id!r}, {self.type!r}, {state})"
