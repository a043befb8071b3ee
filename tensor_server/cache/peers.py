"""The chunk cache shared by the processes of one server (``serve --workers N``).

Each process writes segments into a folder of its own (``process_folder``: the cache folder
for the primary, ``worker-<slot>`` inside it for a worker), under its own folder lock, with
the cache manager's budget divided by N: each evicts only what it wrote, so the sum holds
without any lock or message between processes. Every process also reads the others'
segments (``PeerSegments``): a chunk one process computed is a hit for all.

A segment is append-only and every batch in it is verified before use
(segment_store.verify_batch), so a peer's file is read like a recovered one: a sealed
segment through its sidecar (segment_index.read_index), an open one walked from where the
last walk stopped (segment_store.walk_segment), which stops at a batch still being written.
A peer killed mid-write leaves a torn tail that no walk passes and no reader trusts. A peer
that evicts a segment unlinks it; a reader that mapped it keeps its bytes, the next refresh
forgets it. The fast path (``locate``) offers a peer's segment as it offers the process's
own. The folders are listed again on a miss only (a listing and a stat per segment):
a hit costs nothing more than in a single process.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from tensor_server.cache.segment_index import read_index
from tensor_server.cache.segment_store import SegmentEntry, header_ok, walk_segment
from tensor_server.core.folder_lock import FolderHeld, FolderLock

__all__ = ["PeerSegments", "process_folder", "peer_folders", "clear_stale_folders"]

log = logging.getLogger(__name__)

_WORKER_PREFIX = "worker-"


def process_folder(cache_dir: Path, slot: int) -> Path:
    """Where process ``slot`` (0: the primary) of a server writes its segments."""
    return Path(cache_dir) if slot == 0 else Path(cache_dir) / f"{_WORKER_PREFIX}{slot}"


def peer_folders(cache_dir: Path, slot: int, count: int) -> list[Path]:
    """The folders the other processes of a ``count``-process server write."""
    return [process_folder(cache_dir, s) for s in range(count) if s != slot]


def clear_stale_folders(cache_dir: Path, count: int) -> None:
    """Remove the folders of workers a ``count``-process server does not have (an earlier run
    had more): nobody reads them, and their bytes would sit outside every budget. A folder
    another process still holds is left alone."""
    for folder in Path(cache_dir).glob(f"{_WORKER_PREFIX}*"):
        slot = folder.name[len(_WORKER_PREFIX) :]
        if not folder.is_dir() or not slot.isdigit() or int(slot) < count:
            continue
        try:
            lock = FolderLock(folder)
        except (FolderHeld, OSError):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        lock.release()


@dataclass
class _PeerSegment:
    path: Path
    walked: int = 0  # the end of the last whole batch seen (0: not walked yet)
    sealed: bool = False
    keys: list[bytes] = field(default_factory=list)
    buffer: Any = None  # pa.Buffer over a mapping of the file, made on first read
    inode: int = 0  # of the file mapped: the fast path's generation id


class PeerSegments:
    """The segments the processes writing ``folders`` have put there, read-only. Not
    thread-safe: the cache manager calls it under its lock."""

    def __init__(self, folders: list[Path]) -> None:
        self.folders = [Path(f) for f in folders]
        self._segments: dict[Path, _PeerSegment] = {}
        self._index: dict[bytes, tuple[_PeerSegment, SegmentEntry]] = {}

    def __contains__(self, key: bytes) -> bool:
        return key in self._index

    def has(self, key: bytes) -> bool:
        """Whether a peer holds ``key``, looking at the folders again when not known yet."""
        if key not in self._index:
            self.refresh()
        return key in self._index

    @property
    def entries(self) -> int:
        return len(self._index)

    @property
    def file_bytes(self) -> int:
        return sum(s.walked for s in self._segments.values())

    def keys(self) -> set[bytes]:
        return set(self._index)

    def refresh(self) -> None:
        """Learn the segments added, grown, sealed or removed since the last look."""
        seen: set[Path] = set()
        for folder in self.folders:
            try:
                names = [e for e in os.scandir(folder) if e.name.startswith("seg_") and e.name.endswith(".arrow")]
            except OSError:
                continue  # a worker that has not started yet
            for item in names:
                path = Path(item.path)
                seen.add(path)
                seg = self._segments.get(path)
                if seg is None:
                    seg = self._segments[path] = _PeerSegment(path)
                if not seg.sealed:
                    self._grow(seg)
        for path in [p for p in self._segments if p not in seen]:
            self._forget(self._segments[path])

    def _grow(self, seg: _PeerSegment) -> None:
        """Index what a peer appended to ``seg`` since the last look: all of it through the
        sidecar once sealed, else the whole batches past ``walked``."""
        entries = read_index(seg.path)
        if entries is not None:
            seg.sealed = True
            fresh = [e for e in entries if e.byte_offset >= seg.walked]
        else:
            try:
                fresh = list(walk_segment(seg.path, start=seg.walked))
            except (OSError, ValueError, pa.ArrowException):
                return  # removed under the walk: the next refresh forgets it
        for e in fresh:
            self._index[e.key] = (seg, e)
            seg.keys.append(e.key)
            seg.walked = max(seg.walked, e.byte_offset + e.byte_length)

    def _forget(self, seg: _PeerSegment) -> None:
        for key in seg.keys:
            where = self._index.get(key)
            if where is not None and where[0] is seg:
                del self._index[key]
        self._segments.pop(seg.path, None)
        seg.buffer = None  # live arrays keep the mapping alive

    def message(self, key: bytes) -> pa.Buffer | None:
        """The stored bytes of ``key``'s batch in a peer's segment (unverified), or None."""
        where = self._index.get(key)
        if where is None:
            self.refresh()
            where = self._index.get(key)
            if where is None:
                return None
        seg, entry = where
        end = entry.byte_offset + entry.byte_length
        if seg.buffer is None or seg.buffer.size < end:
            try:
                with pa.memory_map(str(seg.path), "r") as mm:
                    seg.buffer = mm.read_buffer()
                    seg.inode = os.fstat(mm.fileno()).st_ino
            except (OSError, pa.ArrowException):
                self._forget(seg)  # evicted by its owner
                return None
            if not header_ok(seg.buffer) or seg.buffer.size < end:
                self._forget(seg)
                return None
        return seg.buffer.slice(entry.byte_offset, entry.byte_length)

    def where(self, key: bytes) -> tuple[str, int, int, int] | None:
        """(segment path, byte offset, byte length, inode) of ``key`` once ``message`` mapped it."""
        found = self._index.get(key)
        if found is None or not found[0].inode:
            return None
        seg, entry = found
        return str(seg.path.resolve()), entry.byte_offset, entry.byte_length, seg.inode

    def drop(self, key: bytes) -> None:
        """Forget an entry that failed verification (its owner drops it when it reads it)."""
        self._index.pop(key, None)

    def close(self) -> None:
        for seg in self._segments.values():
            seg.buffer = None
