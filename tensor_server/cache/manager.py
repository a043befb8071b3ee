"""CacheManager: decoded chunks kept so that none is decoded twice while there is room.

Two tiers. The *file tier* is what the localhost fast path maps: append-only Arrow IPC
segments (segment_store.py) with sidecar indexes (segment_index.py), one byte budget
``max_total_bytes``, evicted a whole segment at a time, least recently used first (unlink,
never truncate: a client may still map it). The *memory tier* is a small LRU of recently used
chunks as read-only arrays, so a hot chunk skips even the index and the IPC parse.

Keys are encoded chunk ids. They carry the content version, so a changed file can never hit
an entry made from its old bytes. Arrays handed out are read-only; the read path copies them
(the read engine hands out read-only arrays; callers copy before writing). One server per cache folder: a
lock file refuses a second one instead of letting two writers interleave segments.
"""
from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from tensor_server.cache.chunk_columns import decode_chunk
from tensor_server.cache.segment_index import index_path, read_index, write_index
from tensor_server.cache.segment_store import SegmentEntry, SegmentWriter, read_batch_at, segment_name, walk_segment

__all__ = ["CacheManager", "CacheLocked", "Location"]

log = logging.getLogger(__name__)


class CacheLocked(RuntimeError):
    """Another server (process or manager) holds this cache folder."""


@dataclass(frozen=True)
class Location:
    """Where a chunk lives on disk, for the fast path (wire-protocol §7.2)."""

    segment_path: str
    byte_offset: int
    byte_length: int
    generation_id: int


@dataclass
class _Segment:
    number: int
    path: Path
    size: int
    last_used: float
    keys: list[bytes] = field(default_factory=list)
    sealed: bool = True
    buffer: Any = None  # pa.Buffer over a mapping of the whole file, made on first read
    inode: int = 0


class CacheManager:
    """Two-tier chunk cache over ``cache_dir`` (see module docstring)."""

    def __init__(
        self,
        cache_dir: str | os.PathLike[str],
        *,
        max_total_bytes: int = 4 << 30,
        memory_bytes: int = 256 << 20,
        segment_bytes: int = 64 << 20,
    ) -> None:
        self.dir = Path(cache_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_total_bytes = int(max_total_bytes)
        self.memory_bytes = int(memory_bytes)
        self.segment_bytes = int(segment_bytes)
        self._lock = threading.RLock()
        self._lock_file = open(self.dir / "lock", "a+")
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise CacheLocked(f"{self.dir}: another tensor-server holds this cache folder (lock file)") from None
        self._memory: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._memory_used = 0
        self._index: dict[bytes, tuple[int, SegmentEntry]] = {}
        self._segments: dict[int, _Segment] = {}
        self._writer: SegmentWriter | None = None
        self._writer_number = -1
        self._pending: dict[bytes, threading.Event] = {}
        self.stats = {"hits": 0, "misses": 0, "evictions": 0, "pending_waits": 0, "oversized_skips": 0,
                      "memory_hits": 0, "file_hits": 0, "recovered_segments": 0, "dropped_segments": 0}
        t0 = time.perf_counter()
        self._boot()
        self.boot_seconds = time.perf_counter() - t0

    # ---- boot ------------------------------------------------------------------------------------
    def _boot(self) -> None:
        for tmp in self.dir.glob("*.idx.tmp"):
            tmp.unlink(missing_ok=True)
        for path in sorted(self.dir.glob("seg_*.arrow")):
            try:
                number = int(path.stem.split("_")[1])
            except (IndexError, ValueError):
                continue
            entries = read_index(path)
            if entries is None:
                entries = list(walk_segment(path))  # unsealed at a crash, or a stale sidecar
                if not entries:
                    path.unlink(missing_ok=True)
                    index_path(path).unlink(missing_ok=True)
                    self.stats["dropped_segments"] += 1
                    continue
                write_index(path, entries, path.stat().st_size)  # sealed as it stands
                self.stats["recovered_segments"] += 1
            st = path.stat()
            seg = _Segment(number, path, st.st_size, st.st_mtime, [e.key for e in entries], True, None, st.st_ino)
            self._segments[number] = seg
            for e in entries:
                self._index[e.key] = (number, e)
        self._evict_if_needed()

    # ---- accounting -------------------------------------------------------------------------------
    @property
    def file_bytes(self) -> int:
        return sum(s.size for s in self._segments.values())

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: bytes) -> bool:
        with self._lock:
            return key in self._memory or key in self._index

    def contains_all(self, keys: list[bytes]) -> bool:
        """True when every key is cached; stops at the first miss (one lookup when cold)."""
        with self._lock:
            return all(k in self._memory or k in self._index for k in keys)

    def cache_stats(self) -> dict[str, Any]:
        """The ``cache_stats`` action's JSON (wire-protocol §11)."""
        with self._lock:
            return {
                "total_entries": len(self._index),
                "total_bytes": self.file_bytes,
                "max_entries": None,
                "max_bytes": self.max_total_bytes,
                "hits": self.stats["hits"],
                "misses": self.stats["misses"],
                "evictions": self.stats["evictions"],
                "pending_waits": self.stats["pending_waits"],
                "ref_held_evictions_skipped": 0,
                "oversized_skips": self.stats["oversized_skips"],
                "pool_stats": {
                    "memory": {"hits": self.stats["memory_hits"], "misses": 0, "segments": 0, "bytes": self._memory_used},
                    "file": {"hits": self.stats["file_hits"], "misses": self.stats["misses"],
                             "segments": len(self._segments), "bytes": self.file_bytes},
                },
            }

    # ---- reads ------------------------------------------------------------------------------------
    def get(self, key: bytes) -> np.ndarray | None:
        """The cached chunk as a read-only array, or None."""
        with self._lock:
            arr = self._memory.get(key)
            if arr is not None:
                self._memory.move_to_end(key)
                self.stats["hits"] += 1
                self.stats["memory_hits"] += 1
                return arr
            where = self._index.get(key)
            if where is None:
                return None
            number, entry = where
            seg = self._segments[number]
            seg.last_used = time.time()
            end = entry.byte_offset + entry.byte_length
            if seg.buffer is None or seg.buffer.size < end:
                # map (or remap: the open segment grows past an older mapping) once, then
                # every reader slices the same buffer: no shared seek position
                with pa.memory_map(str(seg.path), "r") as mm:
                    seg.buffer = mm.read_buffer()
            message = seg.buffer.slice(entry.byte_offset, entry.byte_length)
        arr = decode_chunk(read_batch_at(message, 0))
        with self._lock:
            self.stats["hits"] += 1
            self.stats["file_hits"] += 1
            self._remember(key, arr)
        return arr

    def locate(self, key: bytes) -> Location | None:
        """Where the chunk's batch lives in a segment file, or None when not in the file tier."""
        with self._lock:
            where = self._index.get(key)
            if where is None:
                return None
            number, entry = where
            seg = self._segments[number]
            seg.last_used = time.time()
            if not seg.inode:
                seg.inode = seg.path.stat().st_ino
            return Location(str(seg.path.resolve()), entry.byte_offset, entry.byte_length, seg.inode)

    def get_or_compute(self, key: bytes, compute: Callable[[], np.ndarray]) -> np.ndarray:
        """The cached chunk, or ``compute()`` stored then returned. Concurrent misses on one
        key compute once; the others wait for it (``pending_waits``)."""
        while True:
            arr = self.get(key)
            if arr is not None:
                return arr
            with self._lock:
                if key in self._memory or key in self._index:
                    continue
                event = self._pending.get(key)
                if event is None:
                    event = self._pending[key] = threading.Event()
                    owner = True
                else:
                    owner = False
                    self.stats["pending_waits"] += 1
            if not owner:
                event.wait()
                continue
            try:
                with self._lock:
                    self.stats["misses"] += 1
                arr = compute()
                self.put(key, arr)
                arr = np.asarray(arr)
                if arr.flags.writeable and arr.flags.owndata:
                    arr.flags.writeable = False
                return arr
            finally:
                with self._lock:
                    self._pending.pop(key, None)
                event.set()

    # ---- writes -----------------------------------------------------------------------------------
    def put(self, key: bytes, arr: np.ndarray) -> bool:
        """Store a chunk (file tier, and the memory tier). False when it is larger than the
        whole budget and was skipped."""
        arr = np.ascontiguousarray(arr)
        with self._lock:
            if key in self._index:
                return True
            if arr.nbytes > self.max_total_bytes:
                self.stats["oversized_skips"] += 1
                return False
            writer = self._writer_for(arr.nbytes)
            entry = writer.append(arr, key)
            seg = self._segments[self._writer_number]
            seg.size = writer.size
            seg.keys.append(key)
            seg.last_used = time.time()
            self._index[key] = (self._writer_number, entry)
            frozen = arr.view()
            frozen.flags.writeable = False
            self._remember(key, frozen)
            if writer.size >= self.segment_bytes:
                self._seal_writer()
            self._evict_if_needed()
            return True

    def _writer_for(self, nbytes: int) -> SegmentWriter:
        if self._writer is not None and self._writer.size + nbytes > self.segment_bytes and self._writer.entries:
            self._seal_writer()
        if self._writer is None:
            number = max(self._segments, default=-1) + 1
            path = self.dir / segment_name(number)
            self._writer = SegmentWriter(path)
            self._writer_number = number
            self._segments[number] = _Segment(number, path, self._writer.size, time.time(), [], False, None, path.stat().st_ino)
        return self._writer

    def _seal_writer(self) -> None:
        if self._writer is None:
            return
        self._writer.seal()
        seg = self._segments[self._writer_number]
        seg.size = self._writer.size
        seg.sealed = True
        self._writer = None

    def _remember(self, key: bytes, arr: np.ndarray) -> None:
        if arr.nbytes > self.memory_bytes:
            return
        old = self._memory.pop(key, None)
        if old is not None:
            self._memory_used -= old.nbytes
        self._memory[key] = arr
        self._memory_used += arr.nbytes
        while self._memory_used > self.memory_bytes and self._memory:
            _, dropped = self._memory.popitem(last=False)
            self._memory_used -= dropped.nbytes

    def _evict_if_needed(self) -> None:
        """Unlink least-recently-used sealed segments until the file tier fits its budget."""
        while self.file_bytes > self.max_total_bytes:
            sealed = [s for s in self._segments.values() if s.sealed]
            if not sealed:
                return
            victim = min(sealed, key=lambda s: (s.last_used, s.number))
            self._drop_segment(victim)

    def _drop_segment(self, seg: _Segment) -> None:
        for key in seg.keys:
            where = self._index.get(key)
            if where is not None and where[0] == seg.number:
                del self._index[key]
        del self._segments[seg.number]
        seg.buffer = None  # live arrays keep the mapping alive; the inode outlives the unlink
        seg.path.unlink(missing_ok=True)
        index_path(seg.path).unlink(missing_ok=True)
        self.stats["evictions"] += 1

    def clear(self) -> None:
        with self._lock:
            self._seal_writer()
            for seg in list(self._segments.values()):
                self._drop_segment(seg)
            self._memory.clear()
            self._memory_used = 0

    def close(self) -> None:
        """Seal the open segment and release the folder lock."""
        with self._lock:
            self._seal_writer()
            for seg in self._segments.values():
                seg.buffer = None
            if not self._lock_file.closed:
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
                self._lock_file.close()

    def __enter__(self) -> CacheManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
