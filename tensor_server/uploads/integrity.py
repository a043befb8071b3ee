"""Whether a member's files are whole: what READY checks and records, what boot checks, and
what a member boot cannot adopt becomes.

READY promises that every file the store's metadata names is on the disk, so ``publish``
refuses (``FailedPrecondition``, the upload stays PENDING) while one is missing, and records
``files.json``: the size of every data file it fsynced. At boot a READY member is checked
against both (a stat per file, no chunk is read), so a store deleted, truncated or rewritten
behind the server's back is found before a read trips over it. A member published before
``files.json`` existed is checked for its metadata files only.

A member boot cannot adopt (its marker or metadata unreadable, a file missing or cut short)
is served as a DISCARDED tombstone with the reason, through a ``DamagedMember`` that keeps
every file: it may be all that is left of a READY upload, and deleting what the server cannot
identify is never a repair.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from tensor_server.core.adapter_base import TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.errors import FailedPrecondition
from tensor_server.uploads.marker import Marker, read_json, write_json_atomic

__all__ = [
    "MANIFEST",
    "DamagedMember",
    "StoreDamaged",
    "check_manifest",
    "require_files",
    "write_manifest",
]

#: the data files READY fsynced, with their sizes (``{"files": {relative path: bytes}}``)
MANIFEST = "files.json"


class StoreDamaged(Exception):
    """A member directory whose files are not what its metadata says (the message is why)."""


def require_files(path: Path, names: Iterable[str], array_id: str) -> None:
    """READY's check: ``FailedPrecondition`` naming every file of ``names`` missing under ``path``."""
    missing = [n for n in names if not (path / n).is_file()]
    if missing:
        raise FailedPrecondition(
            f"{array_id}: the store {path} is missing {', '.join(missing)} (changed behind the server's back), so "
            "it cannot be READY; DISCARD the upload and upload it again",
            slug="upload_incomplete",
        )


def write_manifest(path: Path, files: Iterable[Path]) -> None:
    """Record the size of each of ``files`` (under ``path``; already fsynced), atomically."""
    sizes = {f.relative_to(path).as_posix(): f.stat().st_size for f in files}
    write_json_atomic(path / MANIFEST, {"files": sizes})


def check_manifest(path: Path) -> None:
    """Boot's check: every file ``files.json`` lists is there at its recorded size."""
    doc = read_json(path / MANIFEST)
    if doc is None:
        if (path / MANIFEST).exists():
            raise StoreDamaged(f"{MANIFEST} is unreadable")
        return  # published before manifests: its metadata files were checked
    files = doc.get("files")
    if not isinstance(files, dict):
        raise StoreDamaged(f"{MANIFEST} lists no files")
    for rel, size in files.items():
        try:
            actual = (path / rel).stat().st_size
        except OSError:
            raise StoreDamaged(f"{rel} is missing") from None
        if actual != size:
            raise StoreDamaged(f"{rel} holds {actual} bytes where READY wrote {size} (truncated or rewritten)")


def _declared(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype a damaged member's metadata still tells (zarr's ``0/.zarray``, a
    cache member's descriptor), or a 0-d placeholder when neither can be read."""
    from tensor_server.uploads.cache_member import (
        DESCRIPTOR,  # the members import this module
    )

    for name in ("0/.zarray", DESCRIPTOR):
        doc = read_json(path / name) or {}
        try:
            shape, dtype = tuple(int(n) for n in doc["shape"]), np.dtype(doc["dtype"])
        except (KeyError, TypeError, ValueError):
            continue
        if all(n >= 1 for n in shape):
            return shape, dtype
    return (), np.dtype(np.uint8)


class DamagedStoreTensor(TensorAdapter):
    """What a damaged member's tombstone describes: its declared shape and dtype, no pixels."""

    def __init__(self, array_id: str, path: Path, marker: Marker | None, reason: str) -> None:
        shape, dtype = _declared(path)
        labels = marker.dim_labels if marker is not None and len(marker.dim_labels) == len(shape) else None
        super().__init__(
            TensorInfo(
                shape, dtype, dim_labels=labels, transfer_chunk_shape=shape, is_labels=bool(marker and marker.is_labels)
            )
        )
        self.array_id = array_id
        self._reason = reason

    def read_region(self, bounds: Bounds) -> np.ndarray:
        raise FailedPrecondition(f"{self.array_id} is a damaged upload store: {self._reason}")


class DamagedMember:
    """A member directory boot could not adopt: its files stay where they are, its name stays
    taken, and removing it is the operator's (the tombstone's reason says where it is)."""

    store_format = "damaged"

    def __init__(self, path: Path, array_id: str, marker: Marker | None, reason: str) -> None:
        self.path = path
        self.marker = marker
        self.tensor = DamagedStoreTensor(array_id, path, marker, reason)

    def reader(self) -> TensorAdapter:
        return self.tensor

    def remove(self) -> None:
        """Kept: never delete what the server cannot identify as a whole upload of its own."""

    def close(self) -> None:
        pass
