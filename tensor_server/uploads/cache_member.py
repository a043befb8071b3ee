"""``cache://`` members: ``descriptor.json`` + ``seg_NNNN.arrow`` / ``.idx``, one Arrow batch
per uploaded chunk, stored exactly as uploaded.

The segments are the chunk cache's own format (cache/segment_store.py, segment_index.py),
written and sealed by the same code, so a member chunk is a batch a client can map through
the localhost fast path straight from the member's sealed segment, with no copy into the
chunk cache. They are the tensor, not a cache of it: nothing here is budgeted or evicted.

The index keys by *bounds* (the batch ``key`` column holds the chunk's level-0 box), never by
chunk id: a chunk id carries the serving epoch, which may move on an upgrade while the bytes
on disk do not. A chunk re-sent while PENDING appends a new batch; the last one wins. An
unwritten chunk is not in the index and reads as zeros.

This module is the one place the upload subsystem touches the segment store's API.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.cache.segment_index import read_index
from tensor_server.cache.segment_store import SegmentEntry, SegmentWriter, read_batch_at, segment_name, walk_segment
from tensor_server.core.adapter_base import TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.core.wire import decode_chunk
from tensor_server.uploads.integrity import StoreDamaged, check_manifest, require_files, write_manifest
from tensor_server.uploads.marker import MARKER_KEY, Marker, read_json, sync_path, write_json_atomic

__all__ = ["CacheMember", "CacheMemberAdapter"]

DESCRIPTOR = "descriptor.json"
#: A member's open segment is sealed and a new one started past this size.
SEGMENT_BYTES = 1 << 30
#: Written bytes of a segment flushed to disk in the background while the upload runs, so
#: the fsync that READY's seal owes finds little left to write (the disk works while the
#: network does, instead of after it).
SYNC_BEHIND_BYTES = 32 << 20


def bounds_key(bounds: Bounds) -> bytes:
    return json.dumps([list(bounds.start), list(bounds.stop)], separators=(",", ":")).encode()


def _key_bounds(key: bytes) -> Bounds | None:
    try:
        start, stop = json.loads(key)
        return Bounds(tuple(start), tuple(stop))
    except (ValueError, TypeError):
        return None


class CacheMember:
    store_format = "cache"

    def __init__(
        self, path: Path, marker: Marker, shape: tuple[int, ...], dtype: np.dtype, grid: tuple[int, ...]
    ) -> None:
        self.path = path
        self.marker = marker
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.grid = grid
        self._lock = threading.Lock()
        #: bounds -> (segment path, entry); the last write of a box wins
        self._index: dict[Bounds, tuple[Path, SegmentEntry]] = {}
        #: open segments not being appended to right now. Concurrent DoPuts each take one (a
        #: new segment when none is free), so chunk writes run in parallel, never interleaved
        #: in one file; READY seals them all.
        self._free: list[SegmentWriter] = []
        self._open: set[Path] = set()
        self._unsynced: dict[Path, int] = {}
        self._syncs: list[Any] = []
        self._next_segment = 0
        self._maps: dict[Path, Any] = {}

    # ---- create / open -----------------------------------------------------------------------
    def _descriptor(self, marker: Marker) -> dict[str, Any]:
        return {
            "shape": list(self.shape),
            "dtype": self.dtype.str,
            "chunk_shape": list(self.grid),
            MARKER_KEY: marker.to_json(),
        }

    @classmethod
    def create(
        cls, path: Path, marker: Marker, shape: tuple[int, ...], dtype: np.dtype, grid: tuple[int, ...]
    ) -> CacheMember:
        path.mkdir(parents=True, exist_ok=False)
        member = cls(path, marker, shape, dtype, grid)
        write_json_atomic(path / DESCRIPTOR, member._descriptor(marker))
        return member

    @staticmethod
    def read_marker(path: Path) -> Marker | None:
        return Marker.from_json((read_json(path / DESCRIPTOR) or {}).get(MARKER_KEY))

    @classmethod
    def open(cls, path: Path) -> CacheMember | None:
        """The member at ``path`` for adoption (None when it carries no marker); raises
        ``StoreDamaged`` when its descriptor is incomplete or a segment READY recorded is
        missing or cut short (a torn segment would otherwise lose its tail chunks quietly)."""
        doc = read_json(path / DESCRIPTOR)
        marker = Marker.from_json((doc or {}).get(MARKER_KEY))
        if doc is None or marker is None:
            return None
        try:
            shape = tuple(int(n) for n in doc["shape"])
            grid = tuple(int(n) for n in doc["chunk_shape"])
            dtype = np.dtype(doc["dtype"])
        except (KeyError, TypeError, ValueError):
            raise StoreDamaged(f"{DESCRIPTOR} has no valid shape, dtype and chunk_shape") from None
        check_manifest(path)
        member = cls(path, marker, shape, dtype, grid)
        for seg in sorted(path.glob("seg_*.arrow")):
            entries = read_index(seg)
            if entries is None:
                entries = list(walk_segment(seg))
            for e in entries:
                b = _key_bounds(e.key)
                if b is not None:
                    member._index[b] = (seg, e)
            member._next_segment = max(member._next_segment, int(seg.stem.split("_")[1]) + 1)
        return member

    # ---- writes ------------------------------------------------------------------------------
    def write(self, bounds: Bounds, data: np.ndarray) -> None:
        with self._lock:
            if self._free:
                writer = self._free.pop()
            else:
                writer = SegmentWriter(self.path / segment_name(self._next_segment))
                self._next_segment += 1
                self._open.add(writer.path)
        try:
            entry = writer.append(data, bounds_key(bounds))
        except BaseException:
            # a partial message may be in the file: never append to it again (it stays in
            # _open, so its chunks are read through the mapping but never offered to clients)
            writer.abandon()
            raise
        full = writer.size > SEGMENT_BYTES
        if full:
            writer.seal()
        with self._lock:
            self._index[bounds] = (writer.path, entry)
            behind = self._unsynced.get(writer.path, 0) + entry.byte_length
            if behind >= SYNC_BEHIND_BYTES and not full:
                behind = 0
                self._syncs = [f for f in self._syncs if not f.done()]
                self._syncs.append(_syncer().submit(sync_path, writer.path))
            self._unsynced[writer.path] = behind
            if full:
                self._open.discard(writer.path)
            else:
                self._free.append(writer)

    def publish(self, marker: Marker) -> None:
        """READY (no write in flight: the manager waits them out): the descriptor and every
        segment holding a chunk are there; seal the open segments (fsync, sidecars), record
        the segments' sizes, then flip the marker."""
        with self._lock:
            segments = sorted({seg.name for seg, _ in self._index.values()})
        require_files(self.path, [DESCRIPTOR, *segments], marker.array_id)
        with self._lock:
            writers, self._free = self._free, []
            syncs, self._syncs = self._syncs, []
            self._open.clear()
        for f in syncs:
            f.result()
        for writer in writers:
            writer.seal()
        files = sorted(self.path.glob("seg_*.arrow"))
        for seg in files:  # the sealed ones have nothing left to flush; one abandoned after a failed write may
            sync_path(seg)
        write_manifest(self.path, files)
        write_json_atomic(self.path / DESCRIPTOR, self._descriptor(marker))
        self.marker = marker

    # ---- reads (READY only: the manager gates) -------------------------------------------------
    def _buffer(self, seg: Path) -> Any:
        import pyarrow as pa

        buf = self._maps.get(seg)
        if buf is None:
            with self._lock:
                buf = self._maps.get(seg)
                if buf is None:
                    buf = pa.memory_map(str(seg), "r").read_buffer()
                    self._maps[seg] = buf
        return buf

    def stored(self, bounds: Bounds) -> np.ndarray | None:
        """The chunk stored at exactly ``bounds`` (a read-only view of the mapping), or None."""
        hit = self._index.get(bounds)
        if hit is None:
            return None
        seg, entry = hit
        return decode_chunk(read_batch_at(self._buffer(seg), entry.byte_offset))

    def locate(self, bounds: Bounds) -> tuple[str, int, int, int] | None:
        """(segment path, byte offset, byte length, inode) of a stored chunk in a sealed
        segment, for the localhost fast path; None for an unwritten chunk."""
        hit = self._index.get(bounds)
        if hit is None or hit[0] in self._open:
            return None
        seg, entry = hit
        return str(seg.resolve()), entry.byte_offset, entry.byte_length, os.stat(seg).st_ino

    def reader(self) -> CacheMemberAdapter:
        return CacheMemberAdapter(self)

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            for writer in self._free:
                writer.abandon()
            self._free = []
            self._open.clear()
            self._maps.clear()


_SYNCER: Any = None
_SYNCER_LOCK = threading.Lock()


def _syncer() -> Any:
    """One background thread for every member's sync-behind flushes (the disk is one queue)."""
    global _SYNCER
    with _SYNCER_LOCK:
        if _SYNCER is None:
            from concurrent.futures import ThreadPoolExecutor

            _SYNCER = ThreadPoolExecutor(1, thread_name_prefix="tensor-server-upload-sync")
        return _SYNCER


class CacheMemberAdapter(TensorAdapter):
    """The tensor a cache:// member serves. Its transfer grid is the uploaded grid exactly,
    so a planned chunk is a stored batch (handed back without a decode); any other region
    is assembled from the stored chunks it overlaps, zeros where nothing was written."""

    def __init__(self, member: CacheMember) -> None:
        m = member.marker
        self.member = member
        super().__init__(
            TensorInfo(
                member.shape,
                member.dtype,
                dim_labels=m.dim_labels or None,
                is_labels=m.is_labels,
                content_version=bytes.fromhex(m.content_version),
                transfer_chunk_shape=member.grid,
                metadata={"store_format": "cache"},
            )
        )

    @property
    def read_block_shape(self) -> tuple[int, ...] | None:
        return None  # a stored batch crops for free

    def read_region(self, bounds: Bounds) -> np.ndarray:
        exact = self.member.stored(bounds)
        if exact is not None:
            return exact
        out = np.zeros(bounds.shape, self.dtype)
        g = self.member.grid
        first = [a // c for a, c in zip(bounds.start, g)]
        last = [-(-b // c) for b, c in zip(bounds.stop, g)]
        for cell in np.ndindex(*[e - f for f, e in zip(first, last)]):
            start = tuple((f + i) * c for f, i, c in zip(first, cell, g))
            box = Bounds(start, tuple(min(s + c, n) for s, c, n in zip(start, g, self.shape)))
            data = self.member.stored(box)
            if data is None:
                continue
            lo = tuple(max(a, b) for a, b in zip(box.start, bounds.start))
            hi = tuple(min(a, b) for a, b in zip(box.stop, bounds.stop))
            out[tuple(slice(a - s, b - s) for a, b, s in zip(lo, hi, bounds.start))] = data[
                tuple(slice(a - s, b - s) for a, b, s in zip(lo, hi, box.start))
            ]
        return out
