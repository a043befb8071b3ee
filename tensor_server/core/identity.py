"""Identity of sources and data: source ids and content versions.

A chunk id names (array_id, extent, scale, method, content version). These functions mint
the two identity parts that do not come from a request: the ``source_id`` (stable across
restarts, unique per path) and the ``content_version`` (changes whenever the bytes change,
so a cached chunk or a client-held chunk id of old data is never served as new).
"""

from __future__ import annotations

import hashlib
import os
import struct
import uuid
from pathlib import Path

__all__ = [
    "ArrayId",
    "LABEL_SETS",
    "NO_DEFAULT_TENSOR",
    "file_content_version",
    "stamps_content_version",
    "stat_stamp_bytes",
    "file_stat_stamp",
    "label_set_image",
    "minted_content_version",
    "source_id_for_path",
    "source_id_for_url",
]

#: the separator of an array id's two parts; a source id never contains it, a field may
SEP = "/"
#: the slug of the NOT_FOUND a bare source id answers when its source holds no tensor of its
#: own (the scratch source: every tensor on it is a field, named in full)
NO_DEFAULT_TENSOR = "no_default_tensor"
#: the segment that files a label set under its image: ``<image array_id>/@labels/<name>``,
#: for label images a file stores and label sets uploaded alike (the biopb clients group a
#: source's tensors by it: the last such segment with a name after it)
LABEL_SETS = "@labels"
#: a file_stat_stamp as file_content_version digests it: four little-endian signed 64-bit ints
_STAMP = struct.Struct("<4q")


class ArrayId(tuple):
    """The one grammar of tensor ids: ``source_id`` (the source's default tensor) or
    ``source_id/field``. The source id has no ``/``; the field is everything after the first
    one and may hold more (``grp/data``, ``@fields/result``). ``source_id/`` (an empty
    field) also names the default tensor: it is how the catalog lists a bare-id tensor
    whose source has other listed tensors, so the biopb SDK reads it by exact id.

    A ``(source_id, field)`` pair; ``field`` is ``""`` for the default tensor."""

    __slots__ = ()

    def __new__(cls, source_id: str, field: str = "") -> ArrayId:
        return super().__new__(cls, (source_id, field))

    @classmethod
    def parse(cls, text: str) -> ArrayId:
        source_id, _, field = text.partition(SEP)
        return cls(source_id, field)

    @property
    def source_id(self) -> str:
        return self[0]

    @property
    def field(self) -> str:
        return self[1]

    def __str__(self) -> str:
        return f"{self[0]}{SEP}{self[1]}" if self[1] else self[0]

    def __repr__(self) -> str:
        return f"ArrayId({str(self)!r})"


def label_set_image(array_id: str) -> str | None:
    """The array id of the image a label set ``array_id`` annotates, or None when it names no
    label set: the last ``@labels`` segment past the source id with a name after it (the
    biopb clients' rule; anything after the name is a level of the set)."""
    parts = array_id.split(SEP)
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == LABEL_SETS and parts[i + 1]:
            return SEP.join(parts[:i])
    return None


def file_content_version(*paths: str | os.PathLike[str]) -> bytes:
    """A data version from file stats (16 bytes): a digest of each path's ``file_stat_stamp``,
    so a rewritten file never matches an old chunk id."""
    return stamps_content_version(b"".join(stat_stamp_bytes(os.stat(p)) for p in paths))


def stat_stamp_bytes(st: os.stat_result) -> bytes:
    """A ``file_stat_stamp`` packed as ``file_content_version`` digests it (a reader that took
    the stat as it read the file, ``fstat``, needs no second one)."""
    return _STAMP.pack(*file_stat_stamp(st))


def stamps_content_version(stamps: bytes) -> bytes:
    """``file_content_version`` of files whose ``stat_stamp_bytes`` were taken already."""
    return hashlib.blake2b(stamps, digest_size=16).digest()


def file_stat_stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    """(size, mtime_ns, ctime_ns, inode): what says a file's bytes may have changed. The
    mtime alone does not: a file rewritten in place can have its mtime set back (``touch
    -r``, ``os.utime``, ``cp -p``, a restore), and one replaced by a rename can carry the
    old one. The ctime cannot be set back by a user (any write or ``utime`` moves it) and a
    replacement is a new inode, so a rewrite changes the stamp whatever the mtime says."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def minted_content_version() -> bytes:
    """A fresh random version for in-memory data (no file to stat)."""
    return uuid.uuid4().bytes


def source_id_for_path(path: str | os.PathLike[str], *, resolved: bool = False) -> str:
    """Stable id for a source at ``path``: readable stem plus a hash of the resolved path.
    Same across restarts, unique per path, never contains ``/``. ``resolved``: the caller
    resolved ``path`` already (a scan resolves each folder once)."""
    full = str(path) if resolved else str(Path(path).resolve())
    return _readable_id(Path(full).name, full)


def source_id_for_url(url: str) -> str:
    """Stable id for a source at a URL (an object-store store, an upstream server's source):
    the same readable stem plus a hash of the URL, so it never collides with a local path's."""
    return _readable_id(url.rstrip("/").rpartition("/")[2], url.rstrip("/"))


def _readable_id(name: str, key: str) -> str:
    for suffix in (".ome.zarr", ".ome.tiff", ".ome.tif", ".zarr", ".nii.gz"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    else:
        name = Path(name).stem or name
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:48] or "source"
    digest = hashlib.blake2b(key.encode(), digest_size=4).hexdigest()
    return f"{stem}-{digest}"
