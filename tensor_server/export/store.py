"""Where an export writes: a staging folder, its zarr arrays (their files' bytes are made in
export/chunk_files.py), and the progress record.

Why a staging folder. An export writes into ``DEST.partial`` and renames it to ``DEST`` only
when every level is written and the image metadata is in place, so ``DEST`` either does not
exist or is a complete image: nothing written claims to be complete before it is, and an
``--overwrite`` that fails leaves the old image whole (it is replaced by two renames at the
very end: the old image to a fresh hidden name of its own, ``.DEST.replaced-XXXXXXXX``, then
the staging folder to ``DEST``; the old image is deleted last).

What an export deletes: only what an export made. The image's group attributes carry the
writer's mark (``tensor_server_export``: its kind and fingerprint, ``export_marker``), so
``--overwrite`` replaces ``DEST`` only when it is a folder (not a symbolic link) with that mark
and nothing at its top an export does not write; a staging folder is removed only when its
progress record says it is one. A symbolic link at ``DEST`` or ``DEST.partial`` is refused,
never followed, and a resumed staging folder holding one is not trusted (an export never makes
one). No fixed sibling name is ever deleted (a user's ``DEST.replaced`` is theirs).
``shutil.rmtree`` removes links inside a tree without following them. One export at a time
writes a given ``DEST`` in this process (``Staging`` is a context manager that claims it).

The progress record (``DEST.partial/.export-progress.jsonl``): a header line with the
export's fingerprint (source identity and version, shape, dtype, options, geometry), then one
line per finished unit naming every file the unit wrote with its size and CRC-32 (or null
where the unit leaves no file: an all-fill uncompressed shard). A line is appended only after
the unit's files are fsynced, and fsynced itself. ``--resume`` trusts a unit only when its line parses and
every file it names still has that size and checksum; a torn last line or a changed file
means the unit is written again, and the record is rewritten from the verified lines first.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
import threading
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.errors import FailedPrecondition, InvalidArgument, StorageFull
from tensor_server.export.chunk_files import ChunkFiles
from tensor_server.export.layout import Layout, Level
from tensor_server.export.options import ZarrFormat

__all__ = ["Staging", "storage_errors", "open_levels", "block_files", "out_start", "written_export"]

RECORD = ".export-progress.jsonl"
RECORD_KIND = "tensor-server export progress"
#: the image group's attribute that marks a folder as an export's (``export_marker``)
MARKER = "tensor_server_export"
MARKER_KIND = "tensor-server export"
#: what an export writes at the top of ``DEST`` (besides level folders "0", "1", ...)
_EXPORT_ENTRIES = frozenset({"zarr.json", ".zgroup", ".zattrs", "labels"})
#: a group metadata file larger than this is not one an export wrote
_MAX_METADATA_BYTES = 4 << 20
_FULL = (errno.ENOSPC, errno.EDQUOT)
#: destinations an export of this process is writing (``Staging.__enter__``)
_CLAIMED: set[str] = set()
_CLAIMED_LOCK = threading.Lock()


class storage_errors:
    """Context manager: a full disk anywhere under it is ``StorageFull`` naming ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, OSError) and exc.errno in _FULL:
            raise StorageFull(
                f"{self.path}: no space left on the device; the finished part is kept: "
                "free space and rerun with --resume"
            ) from None


def written_export(path: Path) -> dict[str, Any] | None:
    """The writer's mark (``export_marker``) of the export at ``path``, or None when ``path``
    is no folder an export wrote (a symbolic link never is)."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return None
    except FileNotFoundError:
        return None
    for name, inside in (("zarr.json", "attributes"), (".zattrs", None)):
        try:  # never through a link, never waiting on a FIFO
            fd = os.open(path / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            text = f.read(_MAX_METADATA_BYTES + 1)
        try:
            attrs = json.loads(text) if len(text) <= _MAX_METADATA_BYTES else None
        except ValueError:
            attrs = None
        if isinstance(attrs, dict) and inside:
            attrs = attrs.get(inside)
        mark = attrs.get(MARKER) if isinstance(attrs, dict) else None
        return mark if isinstance(mark, dict) and mark.get("kind") == MARKER_KIND else None
    return None


def _refuse_link(path: Path) -> None:
    if path.is_symlink():
        raise FailedPrecondition(
            f"{path} is a symbolic link; an export never writes through one, nor deletes what it points to: "
            "remove the link or choose another DEST"
        )


def check_replaceable(dest: Path) -> None:
    """Refuse to replace ``dest`` unless it is an export this tool wrote, as it wrote it."""
    _refuse_link(dest)
    if written_export(dest) is None:
        raise FailedPrecondition(
            f"{dest} exists and is not an image this export tool wrote (its metadata has no {MARKER!r} mark); "
            "not replacing it: remove it yourself or choose another DEST"
        )
    strays = sorted(e for e in os.listdir(dest) if e not in _EXPORT_ENTRIES and not e.isdigit())
    if strays:
        raise FailedPrecondition(f"{dest} holds {strays[:5]}, which no export writes; not replacing it")


class Staging:
    """The staging folder of ``dest`` and its progress record. As a context manager it claims
    ``dest`` for this export: a second export to it in this process is refused until this one
    ends (two would delete each other's staging folder)."""

    def __init__(self, dest: str | os.PathLike[str], fingerprint: Mapping[str, Any]) -> None:
        self.dest = Path(dest)
        self.path = self.dest.with_name(self.dest.name + ".partial")
        self.record = self.path / RECORD
        self.fingerprint = dict(fingerprint)
        #: (part, unit index) -> the unit's record line; part "" is the image, "labels/<name>/" a label image
        self.done: dict[tuple[str, int], dict[str, Any]] = {}
        self._claim = os.path.join(os.path.realpath(self.dest.parent), self.dest.name)

    def __enter__(self) -> Staging:
        with _CLAIMED_LOCK:
            if self._claim in _CLAIMED:
                raise FailedPrecondition(f"{self.dest}: another export to it is running; wait for it to end")
            _CLAIMED.add(self._claim)
        return self

    def __exit__(self, *exc: object) -> None:
        with _CLAIMED_LOCK:
            _CLAIMED.discard(self._claim)

    def export_marker(self) -> dict[str, Any]:
        """The image group's attribute that marks it as this export's (``written_export``)."""
        return {MARKER: {"kind": MARKER_KIND, "version": 1, "fingerprint": self.fingerprint}}

    # ---- before writing ------------------------------------------------------------------------
    def prepare(self, mode: str) -> bool:
        """Make the staging folder ready for ``mode``; return False when there is nothing to
        do (``resume`` of this very export, already finished). Fills ``done`` on resume."""
        if not self.dest.parent.is_dir():
            raise InvalidArgument(f"{self.dest.parent}: the destination's folder does not exist")
        _refuse_link(self.path)
        if mode == "create":
            if os.path.lexists(self.dest):
                raise FailedPrecondition(f"{self.dest} exists; pass --overwrite to replace it")
            if os.path.lexists(self.path):
                raise FailedPrecondition(
                    f"{self.path} holds an interrupted export; pass --resume to continue it or --overwrite to start over"
                )
        if mode == "overwrite":
            if os.path.lexists(self.dest):
                check_replaceable(self.dest)
            self._remove_staging()
        if mode == "resume":
            if not os.path.lexists(self.path):
                if os.path.lexists(self.dest):
                    self._check_finished()
                    return False
            else:
                self._check_no_links()
                self._load_record()
        if not self.path.exists():
            self.path.mkdir()
            self._write_record_atomically([])
        return True

    def _check_finished(self) -> None:
        """``resume`` with nothing staged: ``dest`` must be this export, finished."""
        _refuse_link(self.dest)
        mark = written_export(self.dest)
        if mark is None or mark.get("fingerprint") != self.fingerprint:
            raise FailedPrecondition(
                f"{self.dest} exists and is not this export, finished ("
                + ("another source or other options" if mark is not None else "not an image this export tool wrote")
                + "); there is nothing to resume: pass --overwrite to replace it, or choose another DEST"
            )

    def _check_no_links(self) -> None:
        """A staging folder to resume holds no symbolic link (an export never makes one; a
        link would send its writes elsewhere)."""
        if not self.path.is_dir():
            raise FailedPrecondition(f"{self.path} is not a folder; it is no export's staging folder")
        for root, dirs, files in os.walk(self.path):
            for name in dirs + files:
                if os.path.islink(os.path.join(root, name)):
                    rel = os.path.relpath(os.path.join(root, name), self.path)
                    raise FailedPrecondition(
                        f"{self.path} holds a symbolic link ({rel}), which an export never writes; not resuming "
                        "into it: pass --overwrite to start over"
                    )

    def _is_staging(self) -> bool:
        """Whether the staging path is an export's staging folder: its record's header says
        so, or it is empty (made, then stopped before the record)."""
        if not self.path.is_dir():
            return False
        if not any(self.path.iterdir()):
            return True
        if self.record.is_symlink() or not self.record.is_file():
            return False
        with open(self.record, "rb") as f:
            first = f.readline(1 << 20)
        try:
            header = json.loads(first)
        except ValueError:
            return False
        return isinstance(header, dict) and header.get("kind") == RECORD_KIND

    def _remove_staging(self) -> None:
        if not os.path.lexists(self.path):
            return
        if not self._is_staging():
            raise FailedPrecondition(f"{self.path} exists but is not an export's staging folder; remove it yourself")
        shutil.rmtree(self.path)

    def _load_record(self) -> None:
        lines = self._record_lines()
        header = next(lines, None)
        if header is None and not any(p.name != RECORD for p in self.path.iterdir()):
            self._write_record_atomically([])  # stopped before anything was written: start afresh
            return
        if header is None or header.get("kind") != RECORD_KIND:
            raise FailedPrecondition(f"{self.record}: not a readable progress record; pass --overwrite to start over")
        if header.get("fingerprint") != self.fingerprint:
            raise FailedPrecondition(
                f"{self.path} was started from another source or with other options; "
                "pass --overwrite to start over, or the same options to resume"
            )
        for entry in lines:
            unit, part = entry.get("unit"), entry.get("part", "")
            if isinstance(unit, int) and isinstance(part, str) and self._verified(entry.get("files")):
                self.done[(part, unit)] = entry
        self._write_record_atomically(list(self.done.values()))

    def _record_lines(self) -> Iterator[dict[str, Any]]:
        """The record's complete lines (a torn or garbled line is skipped, never trusted)."""
        try:
            text = self.record.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return
        for line in text.split("\n")[:-1] if not text.endswith("\n") else text.split("\n"):
            try:
                value = json.loads(line) if line else None
            except ValueError:
                continue
            if isinstance(value, dict):
                yield value

    def _verified(self, files: Any) -> bool:
        if not isinstance(files, dict):
            return False
        for key, expect in files.items():
            path = self.path / key
            if expect is None:
                if path.exists():
                    return False
                continue
            if not path.is_file() or path.stat().st_size != expect[0] or file_crc(path) != expect[1]:
                return False
        return True

    def _write_record_atomically(self, entries: list[dict[str, Any]]) -> None:
        tmp = self.record.with_name(RECORD + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps({"kind": RECORD_KIND, "version": 1, "fingerprint": self.fingerprint}) + "\n")
            for entry in entries:
                f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.record)
        _fsync_dir(self.path)

    # ---- while writing -------------------------------------------------------------------------
    def commit_unit(self, entry: dict[str, Any]) -> None:
        """Append a finished unit's line (its files are already fsynced)."""
        with open(self.record, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.done[(entry.get("part", ""), entry["unit"])] = entry

    def write_file(self, key: str, pieces: list[bytes] | None) -> list[int] | None:
        """Write ``pieces`` one after the other as the file ``key``, whole, and fsync it;
        return [size, CRC-32] of the bytes (from memory: nothing is read back). None removes
        the file: an all-fill uncompressed shard or chunk is no file, and one left by an
        interrupted run is not trusted."""
        path = self.path / key
        if pieces is None:
            path.unlink(missing_ok=True)
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, pieces)
            os.fsync(fd)
        finally:
            os.close(fd)
        crc = 0
        for piece in pieces:
            crc = zlib.crc32(piece, crc)
        return [sum(len(p) for p in pieces), crc]

    # ---- at the end ----------------------------------------------------------------------------
    def publish(self) -> None:
        """Drop the record and move the staging folder to ``dest``, replacing an old image
        only now (checked again: it must still be an export's), by renames, so it is never
        half overwritten; the old image goes to a fresh name of its own first, never onto a
        name something else may hold."""
        replacing = os.path.lexists(self.dest)
        if replacing:  # before the record goes: refused, the finished work can still be resumed
            check_replaceable(self.dest)
        self.record.unlink()
        _fsync_dir(self.path)
        old = None
        if replacing:
            old = Path(tempfile.mkdtemp(prefix=f".{self.dest.name[:64]}.replaced-", dir=self.dest.parent))
            os.replace(self.dest, old)  # onto the empty folder mkdtemp made: a rename, never a merge
        try:
            os.replace(self.path, self.dest)
        except BaseException:
            if old is not None:
                os.replace(old, self.dest)
            raise
        _fsync_dir(self.dest.parent)
        if old is not None:
            shutil.rmtree(old)


def file_crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while piece := f.read(1 << 20):
            crc = zlib.crc32(piece, crc)
    return crc


def _write_all(fd: int, pieces: list[bytes]) -> None:
    """``os.writev`` until every piece is written (a write may stop short, and an IOV_MAX of
    1024 pieces is the most one call takes)."""
    views = [memoryview(p) for p in pieces if len(p)]
    while views:
        done = os.writev(fd, views[:1024])
        while views and done >= len(views[0]):
            done -= len(views[0])
            views.pop(0)
        if done:
            views[0] = views[0][done:]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- zarr --------------------------------------------------------------------------------------
def _compressors(codec: str, zarr_format: ZarrFormat) -> Any:
    if codec == "none":
        return None
    if zarr_format == 3:
        from zarr.codecs import BloscCodec, ZstdCodec

        return ZstdCodec(level=3) if codec == "zstd" else BloscCodec(cname="zstd", clevel=5, shuffle="shuffle")
    import numcodecs

    return (
        numcodecs.Zstd(level=3)
        if codec == "zstd"
        else numcodecs.Blosc(cname="zstd", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    )


def _fill(dtype: np.dtype) -> Any:
    return False if dtype.kind == "b" else 0


def open_levels(
    staging: Staging, layout: Layout, dtype: np.dtype, codec: str, zarr_format: ZarrFormat, root: str = ""
) -> list[ChunkFiles]:
    """The files of one array per level in the staging folder (under the group ``root``, ""
    or "labels/<name>/"): the arrays a resumed export made (same metadata, since the
    fingerprint matched), the others created."""
    import zarr
    from zarr.storage import LocalStore

    store = LocalStore(staging.path)
    # "a": the folder already holds the progress record, which "w" would delete
    group = zarr.open_group(store, mode="a", zarr_format=zarr_format)
    for name in filter(None, root.split("/")):
        group = group.require_group(name)
    out = layout.axes.out_shape
    arrays = []
    for lv in layout.levels:
        if lv.path in group:  # made by the export being resumed (same fingerprint, same metadata)
            arrays.append(group[lv.path])
            continue
        kw: dict[str, Any] = {}
        if zarr_format == 3:
            kw["shards"] = out(lv.shard)
            kw["dimension_names"] = list(layout.axes.out_labels)
        else:
            kw["chunk_key_encoding"] = {"name": "v2", "separator": "/"}
        arrays.append(
            group.create_array(
                lv.path,
                shape=out(lv.shape),
                dtype=dtype,
                chunks=out(lv.chunk),
                compressors=_compressors(codec, zarr_format),
                fill_value=_fill(dtype),
                **kw,
            )
        )
    return [ChunkFiles(a) for a in arrays]


def block_files(
    files: ChunkFiles, layout: Layout, level: Level, start: tuple[int, ...], block: np.ndarray, root: str = ""
) -> list[tuple[str, np.ndarray]]:
    """The files (shards on v3, chunks on v2) a unit's (source-ordered) block of ``level`` (of
    the group ``root``) fills: each one's key relative to the staging folder and its part of
    the block, which ``files.encode`` turns into the file's bytes."""
    data = layout.axes.to_output(block)
    return [(f"{root}{level.path}/{name}", part) for name, part in files.files(out_start(layout, start), data)]


def out_start(layout: Layout, start: tuple[int, ...]) -> tuple[int, ...]:
    """A source-ordered block origin in output coordinates (a folded channel's origin is
    ``c · samples``; the samples axis is whole, so its own origin is 0)."""
    labels = layout.axes.source_labels
    out = []
    for label in layout.axes.out_labels:
        if label == "c" and "s" in labels:
            samples = layout.shape[labels.index("s")]
            out.append(start[labels.index("c")] * samples if "c" in labels else 0)
        else:
            out.append(start[labels.index(label)])
    return tuple(out)
