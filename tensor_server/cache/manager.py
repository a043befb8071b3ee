"""CacheManager: decoded chunks kept so that none is decoded twice while there is room.

Two tiers. The *file tier* is what the localhost fast path maps: append-only Arrow IPC
segments (segment_store.py) with sidecar indexes (segment_index.py), one byte budget
``max_total_bytes``, evicted a whole segment at a time, least recently used first (unlink,
never truncate: a client may still map it). The *memory tier* is a small LRU of recently used
chunks as read-only arrays, so a hot chunk skips even the index and the IPC parse.

Keys are encoded chunk ids. They carry the content version, so a changed file can never hit
an entry made from its old bytes. Arrays handed out are read-only; the read path copies them
(the read engine hands out read-only arrays; callers copy before writing). One server per cache folder: a
lock file refuses a second one instead of letting two writers interleave segments. The processes
of one server (``serve --workers N``) each write a folder of their own and read each other's
(``peers``, cache/peers.py): a chunk one computed is a hit for all.

Uniform chunks (the engine's broadcast arrays, ``core/uniform.py``) are kept as their value in
a small map of their own (``UNIFORM_ENTRIES``), never as bytes in a segment: a mostly-empty
mask must not fill the budget with zeros. They are not in the file tier, so ``locate`` says
None and a client reads them over DoGet.

The cache is an optimisation, so its disk can never make a read fail or the server stop:

* every batch read from a segment, and every one offered to the fast path (``locate``), is
  verified first (segment_store.verify_batch: Arrow validation, key, checksum); one that fails
  is dropped from both tiers and the chunk is recomputed from its source. A batch offered
  before is offered again when its message's bytes still hash as they did when it verified
  (xxh3 of a 256 KiB message: 4 us, against 22 us for a verification, which is Python under
  the GIL: issue 41's many SDK clients; ``_message_digest`` keeps the GIL through it);
* a write the disk refuses (a full disk) closes the open segment as it stands and pauses file
  writes for ``WRITE_RETRY_SECONDS``; reads go on uncached (memory tier only). Boot never
  writes anything it cannot do without;
* the budget counts the open segment: room is made *before* a batch is appended, and a
  segment is at most a quarter of the budget, so the folder never holds much more than
  ``max_total_bytes``.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from tensor_server.cache.peers import PeerSegments
from tensor_server.cache.segment_index import index_path, read_index, write_index
from tensor_server.cache.segment_store import (
    CorruptEntry,
    SegmentEntry,
    SegmentWriter,
    header_ok,
    segment_name,
    verify_batch,
    walk_segment,
)
from tensor_server.core.folder_lock import FolderHeld, FolderLock
from tensor_server.core.uniform import constant_value
from tensor_server.core.wire import decode_chunk

__all__ = ["CacheManager", "CacheLocked", "Location", "WRITE_RETRY_SECONDS"]

log = logging.getLogger(__name__)

WRITE_RETRY_SECONDS = 10.0  # after the disk refused a write; a full disk is not retried per chunk


#: uniform chunks remembered as values (each costs one element and its key), LRU beyond this
UNIFORM_ENTRIES = 1 << 16


class CacheLocked(FolderHeld):
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
    resolved: str = ""  # the path a fast-path client maps (``locate``), resolved once
    offered: dict[int, int] = field(default_factory=dict)  # a verified batch's offset: its message's xxh3


def _segment_number(path: Path) -> int | None:
    try:
        return int(path.stem.split("_")[1])
    except (IndexError, ValueError):
        return None


#: xxhash gives the interpreter lock up for an input over 128 KiB (xxhash 4.1, measured: 256 KiB
#: gives it up) and the caller then queues to take it back: behind six SDK clients' handlers,
#: that wait cost a warm tile more than the hash. A message up to ``_HELD_BYTES`` (50 us of
#: hashing) is digested in pieces that keep the lock; a larger one gives it up, so others run.
_PIECE_BYTES = 64 << 10
_HELD_BYTES = 1 << 20


def _message_digest(message: pa.Buffer) -> int:
    """The xxh3-64 of a batch's message bytes (the same digest however it is taken)."""
    if message.size <= _PIECE_BYTES or message.size > _HELD_BYTES:
        return xxhash.xxh3_64_intdigest(message)
    digest = xxhash.xxh3_64()
    view = memoryview(message)
    for start in range(0, len(view), _PIECE_BYTES):
        digest.update(view[start : start + _PIECE_BYTES])
    return digest.intdigest()


class CacheManager:
    """Two-tier chunk cache over ``cache_dir`` (see module docstring)."""

    def __init__(
        self,
        cache_dir: str | os.PathLike[str],
        *,
        max_total_bytes: int = 4 << 30,
        memory_bytes: int = 256 << 20,
        segment_bytes: int = 64 << 20,
        peers: PeerSegments | None = None,
    ) -> None:
        """``peers``: the segments the other processes of this server write (their budgets
        are theirs: ``max_total_bytes`` is this process's share)."""
        self.dir = Path(cache_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_total_bytes = int(max_total_bytes)
        self.memory_bytes = int(memory_bytes)
        # a quarter of the budget at most: eviction frees room in steps smaller than the budget
        self.segment_bytes = max(1, min(int(segment_bytes), self.max_total_bytes // 4))
        self._lock = threading.RLock()
        self._folder_lock = FolderLock(self.dir, "lock", CacheLocked)
        self._memory: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._memory_used = 0
        self._uniform: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._index: dict[bytes, tuple[int, SegmentEntry]] = {}
        self._segments: dict[int, _Segment] = {}
        self._writer: SegmentWriter | None = None
        self._writer_number = -1
        #: full segments whose stream has ended, waiting for their fsync outside the lock
        #: (``_seal_writer(later=True)``, ``_finish_seals``), by number
        self._sealing: list[tuple[int, SegmentWriter]] = []
        self._closed = False
        self._next_number = 0  # never reuse a segment name, not even one taken by a stray file
        self._writes_paused_until = 0.0
        self._pending: dict[bytes, threading.Event] = {}
        self._peers = peers
        self.stats = {
            "hits": 0,
            "misses": 0,
            "evictions": 0,
            "pending_waits": 0,
            "oversized_skips": 0,
            "memory_hits": 0,
            "file_hits": 0,
            "recovered_segments": 0,
            "dropped_segments": 0,
            "corrupt_entries": 0,
            "write_errors": 0,
            "peer_hits": 0,
        }
        t0 = time.perf_counter()
        self._boot()
        self.boot_seconds = time.perf_counter() - t0

    # ---- boot ------------------------------------------------------------------------------------
    def _boot(self) -> None:
        """Index the segments on disk. Reads what it can, never fails on what it finds or on a
        disk that refuses writes: a damaged sidecar means a re-walk, a segment with nothing
        whole in it is removed, anything that is not a regular file is left alone."""
        for tmp in self.dir.glob("*.idx.tmp"):
            self._unlink(tmp)
        for path in sorted(self.dir.glob("seg_*.arrow")):
            number = _segment_number(path)
            if number is None:
                continue
            self._next_number = max(self._next_number, number + 1)
            try:
                st = path.lstat()
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                log.warning("cache: %s is not a regular file; ignored", path)
                continue
            entries = read_index(path)
            if entries is None:
                try:
                    entries = list(walk_segment(path))  # unsealed at a crash, or a damaged sidecar
                except OSError as exc:
                    log.warning("cache: cannot read %s (%s); ignored", path, exc)
                    continue
                if not entries:
                    self._unlink(path)
                    self._unlink(index_path(path))
                    self.stats["dropped_segments"] += 1
                    continue
                try:
                    write_index(path, entries, st.st_size)  # sealed as it stands
                except OSError as exc:  # a full disk: the walk is repeated at the next boot
                    log.warning("cache: cannot write the sidecar of %s (%s)", path, exc)
                self.stats["recovered_segments"] += 1
            seg = _Segment(number, path, st.st_size, st.st_mtime, [e.key for e in entries], True, None, st.st_ino)
            self._segments[number] = seg
            for e in entries:
                self._index[e.key] = (number, e)
        self._make_room(0)

    @staticmethod
    def _unlink(path: Path) -> None:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cache: cannot remove %s (%s)", path, exc)

    # ---- accounting -------------------------------------------------------------------------------
    @property
    def file_bytes(self) -> int:
        return sum(s.size for s in self._segments.values())

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: bytes) -> bool:
        with self._lock:
            return self._has(key)

    def contains_all(self, keys: list[bytes]) -> bool:
        """True when every key is cached; stops at the first miss (one lookup when cold)."""
        with self._lock:
            return all(self._has(k) for k in keys)

    def _has(self, key: bytes) -> bool:
        """In a tier of this process, or (looking again on a miss) in a peer's segments."""
        if key in self._memory or key in self._index or key in self._uniform:
            return True
        return self._peers is not None and self._peers.has(key)

    def cache_stats(self) -> dict[str, Any]:
        """The ``cache_stats`` action's JSON (wire-protocol §11). Entries and bytes are the
        shared cache's (this process's and its peers'); hits and misses this process's."""
        with self._lock:
            peers = self._peers
            if peers is not None:
                peers.refresh()
            return {
                "total_entries": len(self._index.keys() | peers.keys()) if peers else len(self._index),
                "total_bytes": self.file_bytes + (peers.file_bytes if peers else 0),
                "max_entries": None,
                "max_bytes": self.max_total_bytes * (1 + len(peers.folders) if peers else 1),
                "processes": 1 + len(peers.folders) if peers else 1,
                "hits": self.stats["hits"],
                "misses": self.stats["misses"],
                "evictions": self.stats["evictions"],
                "pending_waits": self.stats["pending_waits"],
                "ref_held_evictions_skipped": 0,
                "oversized_skips": self.stats["oversized_skips"],
                "uniform_entries": len(self._uniform),
                "corrupt_entries": self.stats["corrupt_entries"],
                "write_errors": self.stats["write_errors"],
                "pool_stats": {
                    "memory": {
                        "hits": self.stats["memory_hits"],
                        "misses": 0,
                        "segments": 0,
                        "bytes": self._memory_used,
                    },
                    "file": {
                        "hits": self.stats["file_hits"],
                        "peer_hits": self.stats["peer_hits"],
                        "misses": self.stats["misses"],
                        "segments": len(self._segments),
                        "bytes": self.file_bytes,
                    },
                },
            }

    # ---- reads ------------------------------------------------------------------------------------
    def get(self, key: bytes) -> np.ndarray | None:
        """The cached chunk as a read-only array, or None (also when the stored entry failed
        verification: it is dropped, and the caller recomputes)."""
        with self._lock:
            uniform = self._uniform.get(key)
            if uniform is not None:
                self._uniform.move_to_end(key)
                self.stats["hits"] += 1
                return uniform
            arr = self._memory.get(key)
            if arr is not None:
                self._memory.move_to_end(key)
                self.stats["hits"] += 1
                self.stats["memory_hits"] += 1
                return arr
            found = self._message(key)
            peer = self._peers.message(key) if found is None and self._peers is not None else None
        if found is None:
            return None if peer is None else self._from_peer(key, peer)
        message, number = found
        try:
            batch = verify_batch(message, key)
        except CorruptEntry as exc:
            with self._lock:
                self._drop_corrupt(key, number, str(exc))
            return None
        arr = decode_chunk(batch)
        with self._lock:
            self._count_file_hit(peer=False)
            self._remember(key, arr)
        return arr

    def _from_peer(self, key: bytes, message: pa.Buffer) -> np.ndarray | None:
        """The chunk in a peer's segment, verified as our own are (None when it fails)."""
        try:
            arr = decode_chunk(verify_batch(message, key))
        except CorruptEntry as exc:
            with self._lock:
                assert self._peers is not None
                self._peers.drop(key)
                self.stats["corrupt_entries"] += 1
                log.warning("cache: a peer's entry failed verification: %s", exc)
            return None
        with self._lock:
            self._count_file_hit(peer=True)
            self._remember(key, arr)
        return arr

    def _message(self, key: bytes) -> tuple[pa.Buffer, int] | None:
        """The stored bytes of ``key``'s batch (unverified) and its segment number, or None.
        A segment that cannot be mapped, or is shorter than its index says, is dropped."""
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
            try:
                with pa.memory_map(str(seg.path), "r") as mm:
                    seg.buffer = mm.read_buffer()
            except (OSError, pa.ArrowException) as exc:
                self._drop_damaged_segment(seg, f"cannot map it ({exc})")
                return None
            if not header_ok(seg.buffer):
                self._drop_damaged_segment(seg, "its schema header is damaged")
                return None
            if seg.buffer.size < end:
                self._drop_damaged_segment(seg, f"{seg.buffer.size} bytes, an entry ends at {end}")
                return None
        return seg.buffer.slice(entry.byte_offset, entry.byte_length), number

    def locate(self, key: bytes, *, read: bool = False) -> Location | None:
        """Where the chunk's batch lives in a segment file, for a client to map, or None when
        it is not in the file tier. The batch is verified first: the client maps the bytes
        itself and checks nothing, so only a batch that verified just now is offered (a
        segment is never written again once a batch is in it). A peer's segment is offered
        the same way (``_peer_location``). ``read``: the location is a client's read of the
        chunk, counted as a hit as ``get`` counts one (the caller found it here, not in ``get``)."""
        with self._lock:
            found = self._message(key)
            if found is not None:
                offered = self._segments[found[1]].offered.get(self._index[key][1].byte_offset)
        if found is None:
            location = self._peer_location(key) if self._peers is not None else None
            if read and location is not None:
                with self._lock:
                    self._count_file_hit(peer=True)
            return location
        message, number = found
        digest = _message_digest(message)
        if digest != offered:
            try:
                verify_batch(message, key)
            except CorruptEntry as exc:
                with self._lock:
                    self._drop_corrupt(key, number, str(exc))
                return None
        with self._lock:
            where = self._index.get(key)
            if where is None or where[0] != number:
                return None  # evicted (or rewritten elsewhere) meanwhile
            location = self._location(*where, digest)
            if read and location is not None:
                self._count_file_hit(peer=False)
            return location

    def _count_file_hit(self, *, peer: bool) -> None:
        """A read served from the file tier (a peer's segment when ``peer``), under the lock."""
        self.stats["hits"] += 1
        self.stats["file_hits"] += 1
        self.stats["peer_hits"] += peer

    def _location(self, number: int, entry: SegmentEntry, digest: int) -> Location | None:
        """The fast-path location of ``entry`` in segment ``number`` (under the lock), whose
        message bytes, verified, hash to ``digest``."""
        seg = self._segments[number]
        if not seg.resolved:
            try:
                seg.inode = seg.inode or seg.path.stat().st_ino
                seg.resolved = str(seg.path.resolve())
            except OSError:
                return None
        seg.offered[entry.byte_offset] = digest
        return Location(seg.resolved, entry.byte_offset, entry.byte_length, seg.inode)

    def _peer_location(self, key: bytes) -> Location | None:
        """Where a peer's segment holds ``key``, once its batch verified just now."""
        assert self._peers is not None
        with self._lock:
            message = self._peers.message(key)
            where = self._peers.where(key) if message is not None else None
        if where is None:
            return None
        try:
            verify_batch(message, key)
        except CorruptEntry:
            with self._lock:
                self._peers.drop(key)
            return None
        return Location(*where)

    def _drop_corrupt(self, key: bytes, number: int, reason: str) -> None:
        """Forget one entry that failed verification (both tiers: a memory-tier array may be a
        view of the same damaged bytes). The chunk is recomputed on its next read."""
        where = self._index.get(key)
        if where is not None and where[0] == number:
            del self._index[key]
            seg = self._segments.get(number)
            log.warning(
                "cache: dropped a damaged entry at byte %d of %s: %s",
                where[1].byte_offset,
                seg.path if seg else number,
                reason,
            )
        old = self._memory.pop(key, None)
        if old is not None:
            self._memory_used -= old.nbytes
        self.stats["corrupt_entries"] += 1

    def _drop_damaged_segment(self, seg: _Segment, reason: str) -> None:
        log.warning("cache: dropped %s: %s", seg.path, reason)
        if seg.number == self._writer_number and self._writer is not None:
            self._writer.abandon()
            self._writer = None
        self._drop_segment(seg, evicted=False)

    def get_or_compute(self, key: bytes, compute: Callable[[], np.ndarray]) -> np.ndarray:
        """The cached chunk, or ``compute()`` stored then returned. Concurrent misses on one
        key compute once; the others wait for it (``pending_waits``)."""
        while True:
            arr = self.get(key)
            if arr is not None:
                return arr
            with self._lock:
                if key in self._memory or key in self._index or key in self._uniform:
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
        """Store a chunk (file tier, and the memory tier). False when it was not written to the
        file tier: larger than the whole budget, or the disk refused (then it is kept in the
        memory tier only, and file writes pause for WRITE_RETRY_SECONDS). A uniform chunk is
        kept as its value (module docstring)."""
        if constant_value(arr) is not None:
            with self._lock:
                self._uniform[key] = arr
                self._uniform.move_to_end(key)
                while len(self._uniform) > UNIFORM_ENTRIES:
                    self._uniform.popitem(last=False)
            return True
        arr = np.ascontiguousarray(arr)
        with self._lock:
            if key in self._index:
                return True
            if arr.nbytes > self.max_total_bytes:
                self.stats["oversized_skips"] += 1
                return False
            frozen = arr.view()
            frozen.flags.writeable = False
            self._remember(key, frozen)
            if time.monotonic() < self._writes_paused_until:
                return False
            try:
                self._append(key, arr)
            except OSError as exc:
                self._write_failed(exc)
                return False
        if self._sealing:
            self._finish_seals()
        return True

    def _append(self, key: bytes, arr: np.ndarray) -> None:
        self._make_room(arr.nbytes + 4096)  # a batch is its pixels plus < 1 KiB of metadata
        writer = self._writer_for(arr.nbytes)
        entry = writer.append(arr, key)
        seg = self._segments[self._writer_number]
        seg.size = writer.size
        seg.keys.append(key)
        seg.last_used = time.time()
        self._index[key] = (self._writer_number, entry)
        if writer.size >= self.segment_bytes:
            self._seal_writer(later=True)

    def _write_failed(self, exc: OSError) -> None:
        """The disk refused a write: close the open segment as it stands (its whole batches
        stay readable; a missing sidecar is re-walked at boot) and pause file writes."""
        self.stats["write_errors"] += 1
        self._writes_paused_until = time.monotonic() + WRITE_RETRY_SECONDS
        log.warning("cache: cannot write to %s (%s); serving uncached for %.0f s", self.dir, exc, WRITE_RETRY_SECONDS)
        writer, self._writer = self._writer, None
        if writer is None:
            return
        seg = self._segments.get(self._writer_number)
        try:
            writer.seal()
        except OSError:
            writer.abandon()
        if seg is not None:
            seg.sealed = True
            try:
                seg.size = seg.path.stat().st_size
            except OSError:
                seg.size = writer.size
            if not seg.keys:
                self._drop_segment(seg, evicted=False)

    def _make_room(self, nbytes: int) -> None:
        """Evict until ``nbytes`` more fit the budget; the open segment counts, and is sealed
        (so it can be evicted) when the sealed ones are not enough."""
        while self.file_bytes + nbytes > self.max_total_bytes:
            if not any(s.sealed for s in self._segments.values()):
                if self._sealing:
                    self._finish_seals_now()
                    continue
                if self._writer is None or not self._writer.entries:
                    return
                self._seal_writer()
            victim = min((s for s in self._segments.values() if s.sealed), key=lambda s: (s.last_used, s.number))
            self._drop_segment(victim)

    def _writer_for(self, nbytes: int) -> SegmentWriter:
        if self._writer is not None and self._writer.size + nbytes > self.segment_bytes and self._writer.entries:
            self._seal_writer(later=True)
        while self._writer is None:
            number = self._next_number
            self._next_number += 1
            path = self.dir / segment_name(number)
            try:
                self._writer = SegmentWriter(path)
            except FileExistsError:
                continue  # a stray file took the name; take the next
            self._writer_number = number
            self._segments[number] = _Segment(
                number, path, self._writer.size, time.time(), [], False, None, path.stat().st_ino
            )
        return self._writer

    def _seal_writer(self, *, later: bool = False) -> None:
        """Seal the open segment (under the lock). ``later``: end its stream only, and leave
        its fsync and index to ``_finish_seals``, which ``put`` runs once it has let go of the
        lock: an fsync of a full 64 MiB segment took 23 ms, and every read and write of the
        cache waited for it. Until then the segment is readable as before and not yet a
        candidate for eviction."""
        if self._writer is None:
            return
        writer, self._writer = self._writer, None
        seg = self._segments[self._writer_number]
        if later:
            try:
                writer.end_stream()
            except OSError:
                seg.sealed = True
                writer.abandon()
                raise
            finally:
                seg.size = writer.size
            self._sealing.append((self._writer_number, writer))
            return
        seg.sealed = True
        try:
            writer.seal()
        finally:
            seg.size = writer.size

    def _finish_seals(self) -> None:
        """The fsync of every segment ``_seal_writer(later=True)`` left, outside the lock; then,
        under it, its index and its place among the sealed segments (unless it was dropped or
        the cache closed meanwhile: then its index is left to the next boot's walk)."""
        while True:
            with self._lock:
                if not self._sealing:
                    return
                number, writer = self._sealing.pop(0)
            self._complete_seal(number, writer)

    def _finish_seals_now(self) -> None:
        """``_finish_seals`` under the lock the caller holds (eviction needs a sealed segment;
        close and clear leave none behind)."""
        while self._sealing:
            self._complete_seal(*self._sealing.pop(0))

    def _complete_seal(self, number: int, writer: SegmentWriter) -> None:
        try:
            writer.sync()
            synced = True
        except OSError as exc:
            log.warning("cache: cannot seal %s (%s); it is re-walked at the next boot", writer.path, exc)
            synced = False
        with self._lock:
            seg = self._segments.get(number)
            if seg is None or self._closed:
                return
            if synced:
                try:
                    writer.write_index()
                except OSError as exc:
                    log.warning("cache: cannot write the index of %s (%s)", writer.path, exc)
            seg.sealed = True

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

    def _drop_segment(self, seg: _Segment, *, evicted: bool = True) -> None:
        for key in seg.keys:
            where = self._index.get(key)
            if where is not None and where[0] == seg.number:
                del self._index[key]
        del self._segments[seg.number]
        seg.buffer = None  # live arrays keep the mapping alive; the inode outlives the unlink
        self._unlink(seg.path)
        self._unlink(index_path(seg.path))
        self.stats["evictions" if evicted else "dropped_segments"] += 1

    def _seal_quietly(self) -> None:
        self._finish_seals_now()
        try:
            self._seal_writer()
        except OSError as exc:  # closed as it stands; re-walked at the next boot
            log.warning("cache: cannot seal the open segment in %s (%s)", self.dir, exc)

    def clear(self) -> None:
        with self._lock:
            self._seal_quietly()
            for seg in list(self._segments.values()):
                self._drop_segment(seg)
            self._memory.clear()
            self._uniform.clear()
            self._memory_used = 0

    def close(self) -> None:
        """Seal the open segment and release the folder lock."""
        with self._lock:
            self._seal_quietly()
            for seg in self._segments.values():
                seg.buffer = None
            if self._peers is not None:
                self._peers.close()
            self._closed = True
            self._folder_lock.release()

    def __enter__(self) -> CacheManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
