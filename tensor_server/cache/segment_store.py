"""Append-only Arrow IPC segment files: ``seg_NNNN.arrow``.

A segment is an Arrow IPC *stream*: the schema message at offset 0, then one encapsulated
record-batch message per chunk, in the unified chunk schema (``data``, ``shape``, ``dtype``)
plus the cache ``key``. The byte offset and length of every batch are recorded as it is
written, because clients on the same machine map the file and read one message at an offset
(wire-protocol §7.3). We write the schema and the messages ourselves: a pyarrow stream
writer emits its schema lazily, which would make the first offsets wrong.

A segment is *sealed* at a size limit or at shutdown: the end-of-stream marker is appended,
the data is flushed, and a ``.idx`` sidecar (segment_index.py) is written. A sealed segment
is never modified again; eviction unlinks it whole (a client's mapping survives the unlink).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa

from tensor_server.cache.chunk_columns import encode_chunk_columns, one_value_column

__all__ = ["SEGMENT_SCHEMA", "SegmentEntry", "SegmentWriter", "chunk_record_batch", "read_batch_at", "walk_segment", "segment_name"]

SEGMENT_SCHEMA = pa.schema(
    [
        pa.field("data", pa.binary()),
        pa.field("shape", pa.list_(pa.int64())),
        pa.field("dtype", pa.string()),
        pa.field("key", pa.binary()),
    ],
    metadata={b"chunk_wire_protocol": b"2"},
)
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def segment_name(number: int) -> str:
    return f"seg_{number:04d}.arrow"


@dataclass(frozen=True)
class SegmentEntry:
    key: bytes
    byte_offset: int
    byte_length: int
    nbytes: int  # the chunk's pixel bytes


def chunk_record_batch(arr: np.ndarray, key: bytes) -> pa.RecordBatch:
    """One-row batch in the segment schema; wraps ``arr``'s bytes without copying."""
    data, shape, dtype = encode_chunk_columns(arr)
    return pa.RecordBatch.from_arrays([data, shape, dtype, one_value_column(key, pa.binary())], schema=SEGMENT_SCHEMA)


class SegmentWriter:
    """Appends batches to one new segment file until sealed. Not thread-safe: the cache
    manager serialises writers."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fh = open(self.path, "xb")  # never reuse a name: clients may map old inodes
        self._fh.write(SEGMENT_SCHEMA.serialize().to_pybytes())
        self.size = self._fh.tell()
        self.entries: list[SegmentEntry] = []
        self.sealed = False

    def append(self, arr: np.ndarray, key: bytes) -> SegmentEntry:
        if self.sealed:
            raise RuntimeError(f"{self.path} is sealed")
        message = chunk_record_batch(arr, key).serialize()
        offset = self.size
        self._fh.write(message)
        self._fh.flush()  # readers (and other processes) map the file: make bytes visible
        self.size += message.size
        entry = SegmentEntry(key, offset, message.size, int(arr.nbytes))
        self.entries.append(entry)
        return entry

    def seal(self) -> None:
        """End-of-stream marker, fsync, sidecar index. Idempotent."""
        if self.sealed:
            return
        from tensor_server.cache.segment_index import write_index

        self._fh.write(_EOS)
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self.size = self.path.stat().st_size
        write_index(self.path, self.entries, self.size)
        self.sealed = True

    def abandon(self) -> None:
        """Close without sealing (tests simulate a crash with this)."""
        if not self._fh.closed:
            self._fh.close()


def read_batch_at(mm: pa.MemoryMappedFile | pa.Buffer, offset: int) -> pa.RecordBatch:
    """The record batch whose message starts at ``offset`` (zero-copy over a mapping)."""
    buf = mm if isinstance(mm, pa.Buffer) else None
    if buf is None:
        mm.seek(offset)
        message = pa.ipc.read_message(mm)
    else:
        message = pa.ipc.read_message(pa.BufferReader(buf.slice(offset)))
    return pa.ipc.read_record_batch(message, SEGMENT_SCHEMA)


def walk_segment(path: Path) -> Iterator[SegmentEntry]:
    """Re-walk a segment whose index is missing or untrusted: yield every complete batch.
    Stops at the end-of-stream marker or at the first incomplete message (a crash's tail)."""
    size = path.stat().st_size
    with pa.memory_map(str(path), "r") as mm:
        try:
            schema = pa.ipc.read_schema(mm)
        except (pa.ArrowInvalid, OSError):
            return
        if not schema.equals(SEGMENT_SCHEMA, check_metadata=False):
            return
        pos = mm.tell()
        while pos + 8 <= size:
            try:
                message = pa.ipc.read_message(mm)
            except (pa.ArrowInvalid, OSError, EOFError):
                return
            end = mm.tell()
            if message is None or end > size:
                return
            try:
                batch = pa.ipc.read_record_batch(message, SEGMENT_SCHEMA)
                key = batch.column("key")[0].as_py()
                nbytes = batch.column("data").buffers()[2].size if batch.num_rows else 0
            except (pa.ArrowInvalid, IndexError, OSError):
                return
            yield SegmentEntry(key, pos, end - pos, nbytes)
            pos = end
