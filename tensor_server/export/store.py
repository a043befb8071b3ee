"""Where an export writes: a staging folder, its zarr arrays (their files' bytes are made in
export/chunk_files.py), and the progress record.

Why a staging folder. An export writes into ``DEST.partial`` and renames it to ``DEST`` only
when every level is written and the image metadata is in place, so ``DEST`` either does not
exist or is a complete image: nothing written claims to be complete before it is, and an
``--overwrite`` that fails leaves the old image whole (it is replaced by two renames at the
very end).

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
import zlib
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from tensor_server.errors import FailedPrecondition, InvalidArgument, StorageFull
from tensor_server.export.chunk_files import ChunkFiles
from tensor_server.export.layout import Layout, Level

__all__ = ["Staging", "storage_errors", "open_levels", "block_files", "out_start"]

RECORD = ".export-progress.jsonl"
RECORD_KIND = "tensor-server export progress"
_FULL = (errno.ENOSPC, errno.EDQUOT)


class storage_errors:
    """Context manager: a full disk anywhere under it is ``StorageFull`` naming ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> bool:
        if isinstance(exc, OSError) and exc.errno in _FULL:
            raise StorageFull(
                f"{self.path}: no space left on the device; the finished part is kept: "
                "free space and rerun with --resume"
            ) from None
        return False


def _looks_like_zarr(path: Path) -> bool:
    return any((path / name).is_file() for name in ("zarr.json", ".zgroup", ".zattrs", ".zarray"))


class Staging:
    """The staging folder of ``dest`` and its progress record."""

    def __init__(self, dest: str | os.PathLike[str], fingerprint: Mapping[str, Any]) -> None:
        self.dest = Path(dest)
        self.path = self.dest.with_name(self.dest.name + ".partial")
        self.record = self.path / RECORD
        self.fingerprint = dict(fingerprint)
        #: (part, unit index) -> the unit's record line; part "" is the image, "labels/<name>/" a label image
        self.done: dict[tuple[str, int], dict[str, Any]] = {}

    # ---- before writing ------------------------------------------------------------------------
    def prepare(self, mode: str) -> bool:
        """Make the staging folder ready for ``mode``; return False when there is nothing to
        do (``resume`` of an export that already finished). Fills ``done`` on resume."""
        if not self.dest.parent.is_dir():
            raise InvalidArgument(f"{self.dest.parent}: the destination's folder does not exist")
        if mode == "create":
            if self.dest.exists():
                raise FailedPrecondition(f"{self.dest} exists; pass --overwrite to replace it")
            if self.path.exists():
                raise FailedPrecondition(
                    f"{self.path} holds an interrupted export; pass --resume to continue it or --overwrite to start over"
                )
        if mode == "overwrite":
            if self.dest.exists() and not (self.dest.is_dir() and _looks_like_zarr(self.dest)):
                raise FailedPrecondition(f"{self.dest} exists and is not a zarr folder; not replacing it")
            self._remove_staging()
        if mode == "resume":
            if not self.path.exists():
                if self.dest.exists():
                    return False
            else:
                self._load_record()
        if not self.path.exists():
            self.path.mkdir()
            self._write_record_atomically([])
        return True

    def _remove_staging(self) -> None:
        if not self.path.exists():
            return
        if not self.record.is_file() and any(self.path.iterdir()):
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
        """Drop the record and move the staging folder to ``dest`` (replacing an old image
        only now, by renames, so it is never half overwritten)."""
        self.record.unlink()
        _fsync_dir(self.path)
        old = None
        if self.dest.exists():
            old = self.dest.with_name(self.dest.name + ".replaced")
            if old.exists():
                shutil.rmtree(old)
            os.replace(self.dest, old)
        os.replace(self.path, self.dest)
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
def _compressors(codec: str, zarr_format: int) -> Any:
    if codec == "none":
        return None
    if zarr_format == 3:
        from zarr.codecs import BloscCodec, ZstdCodec

        return ZstdCodec(level=3) if codec == "zstd" else BloscCodec(cname="zstd", clevel=5, shuffle="shuffle")
    import numcodecs

    return numcodecs.Zstd(level=3) if codec == "zstd" else numcodecs.Blosc(cname="zstd", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)


def _fill(dtype: np.dtype) -> Any:
    return False if dtype.kind == "b" else 0


def open_levels(staging: Staging, layout: Layout, dtype: np.dtype, codec: str, zarr_format: int,
                root: str = "") -> list[ChunkFiles]:
    """The files of one array per level in the staging folder (under the group ``root``, ""
    or "labels/<name>/"): the arrays a resumed export made (same metadata, since the
    fingerprint matched), the others created."""
    import zarr
    from zarr.storage import LocalStore

    store = LocalStore(staging.path)
    # "a": the folder already holds the progress record, which "w" would delete
    group = zarr.open_group(store, mode="a", zarr_format=zarr_format)
    for name in filter(None, root.split("/")):
        group = group[name] if name in group else group.create_group(name)
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
        arrays.append(group.create_array(
            lv.path, shape=out(lv.shape), dtype=dtype, chunks=out(lv.chunk), compressors=_compressors(codec, zarr_format),
            fill_value=_fill(dtype), **kw,
        ))
    return [ChunkFiles(a) for a in arrays]


def block_files(files: ChunkFiles, layout: Layout, level: Level, start: tuple[int, ...], block: np.ndarray,
                root: str = "") -> list[tuple[str, np.ndarray]]:
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
