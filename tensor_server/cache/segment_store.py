"""Append-only Arrow IPC segment files: ``seg_NNNN.arrow``.

A segment is an Arrow IPC *stream*: the schema message at offset 0, then one encapsulated
record-batch message per chunk, in the unified chunk schema (``data``, ``shape``, ``dtype``)
plus the cache ``key`` and a ``checksum``. The byte offset and length of every batch are
recorded as it is written, because clients on the same machine map the file and read one
message at an offset (wire-protocol §7.3). We write the schema and the messages ourselves: a
pyarrow stream writer emits its schema lazily, which would make the first offsets wrong.

Every batch carries its own checksum (xxh3-64 over key, dtype, shape and pixel bytes), written
with it, so a batch read back is *verified* (``verify_batch``) before anything is sliced or
served: the IPC framing and Arrow metadata are validated, the key must be the one asked for
and the checksum must match. A disk (or a person) flipping one byte then costs a recompute,
never a crash or wrong pixels. The checksum lives in the batch, not only in the sidecar,
because a segment left unsealed by a crash is recovered by walking it without a sidecar.

A segment is *sealed* at a size limit or at shutdown: the end-of-stream marker is appended,
the data is flushed, and a ``.idx`` sidecar (segment_index.py) is written. A sealed segment
is never modified again; eviction unlinks it whole (a client's mapping survives the unlink).
A write that fails (a full disk) cuts the file back to its last whole batch, so whatever is
on disk stays walkable.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import xxhash

from tensor_server.core.wire import CHUNK_FIELDS, encode_chunk_columns, one_value_column

__all__ = [
    "SEGMENT_SCHEMA",
    "CorruptEntry",
    "SegmentEntry",
    "SegmentWriter",
    "chunk_record_batch",
    "header_ok",
    "message_parts",
    "read_batch_at",
    "verify_batch",
    "walk_segment",
    "segment_name",
]

SEGMENT_SCHEMA = pa.schema(
    [*CHUNK_FIELDS, pa.field("key", pa.binary()), pa.field("checksum", pa.uint64())],
    metadata={b"chunk_wire_protocol": b"2", b"checksum": b"xxh3_64(data, seed=xxh3_64(key, dtype, shape))"},
)
_HEADER = SEGMENT_SCHEMA.serialize().to_pybytes()  # the schema message every segment starts with
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_PREFIX = 8  # continuation marker + metadata length in front of every message


class CorruptEntry(ValueError):
    """A stored batch that does not verify: damaged framing, metadata, key or checksum."""


def segment_name(number: int) -> str:
    return f"seg_{number:04d}.arrow"


@dataclass(frozen=True)
class SegmentEntry:
    key: bytes
    byte_offset: int
    byte_length: int
    nbytes: int  # the chunk's pixel bytes


def _checksum(key: bytes, dtype: str, shape: list[int], data) -> int:  # buffer
    """xxh3-64 of the pixel bytes, seeded with a digest of (key, dtype, shape): one pass over
    the pixels (a streaming hasher measured slower on 8 MiB than the one-shot call)."""
    meta = len(key).to_bytes(4, "little") + key + dtype.encode() + b"\0" + np.asarray(shape, dtype="<i8").tobytes()
    return xxhash.xxh3_64_intdigest(data, seed=xxhash.xxh3_64_intdigest(meta))


def chunk_record_batch(arr: np.ndarray, key: bytes) -> pa.RecordBatch:
    """One-row batch in the segment schema, checksum included; wraps ``arr``'s bytes without
    copying."""
    data, shape, dtype = encode_chunk_columns(arr)
    digest = _checksum(key, dtype[0].as_py(), shape[0].as_py(), data.buffers()[2])
    return pa.RecordBatch.from_arrays(
        [
            data,
            shape,
            dtype,
            one_value_column(key, pa.binary()),
            pa.Array.from_buffers(pa.uint64(), 1, [None, pa.py_buffer(np.array([digest], np.uint64))]),
        ],
        schema=SEGMENT_SCHEMA,
    )


class _Gather:
    """A write-only file for pyarrow's IPC writer that keeps what it is given (pyarrow hands
    body buffers over as views of their memory, not copies)."""

    closed = False

    def __init__(self) -> None:
        self.parts: list = []

    def write(self, data) -> int:  # bytes-like
        self.parts.append(data)
        return memoryview(data).nbytes

    def flush(self) -> None:
        pass


def message_parts(batch: pa.RecordBatch) -> list:
    """The IPC message of ``batch`` (exactly the bytes of ``batch.serialize()``) as the
    pieces pyarrow's stream writer emits: framing and metadata, then each body buffer as a
    view of the batch's own memory, padding. A writer's stream starts with the schema
    message, which is ``_HEADER`` for the segment schema; it is checked and dropped."""
    sink = _Gather()
    writer = pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), SEGMENT_SCHEMA)
    writer.write_batch(batch)
    parts, skip, head = sink.parts, len(_HEADER), bytearray()
    while skip:
        view = memoryview(parts.pop(0)).cast("B")
        head += view[:skip]
        if len(view) > skip:
            parts.insert(0, view[skip:])
        skip -= min(skip, len(view))
    if head != _HEADER:  # a pyarrow that frames the schema otherwise: its own serialisation
        return [batch.serialize()]
    return parts


def header_ok(segment_bytes) -> bool:  # bytes-like
    """True when the segment starts with exactly our schema message. A client of the fast path
    reads the schema from offset 0 of the file, so a batch is only as good as this header.
    Compared byte for byte (no parser meets damaged bytes); a pyarrow that serialises the
    schema differently makes old segments unreadable, i.e. recomputed, which is safe."""
    view = memoryview(segment_bytes).cast("B")  # pa.Buffer exports signed bytes
    return len(view) >= len(_HEADER) and view[: len(_HEADER)] == _HEADER


def verify_batch(message_bytes: pa.Buffer, key: bytes | None) -> pa.RecordBatch:
    """The one-row batch in ``message_bytes`` (exactly one IPC message), checked before use:
    framing and flatbuffer metadata (the IPC reader), array structure (full validation: no
    offset may point outside its buffer), the key (``None`` accepts any: the walk of a segment
    without sidecar) and the checksum. Raises CorruptEntry; never returns unverified bytes."""
    try:
        reader = pa.BufferReader(message_bytes)
        message = pa.ipc.read_message(reader)
        if reader.tell() != message_bytes.size:
            raise CorruptEntry(f"message spans {reader.tell()} bytes, the index says {message_bytes.size}")
        batch = pa.ipc.read_record_batch(message, SEGMENT_SCHEMA)
        if batch.num_rows != 1:
            raise CorruptEntry(f"{batch.num_rows} rows, not 1")
        batch.validate(full=True)
        stored_key = batch.column("key")[0].as_py()
        if key is not None and stored_key != key:
            raise CorruptEntry("the batch holds another chunk (key mismatch)")
        dtype = batch.column("dtype")[0].as_py()
        shape = batch.column("shape")[0].as_py()
        stored = batch.column("checksum")[0].as_py()
        data = batch.column("data")
        if data.offset != 0 or data.buffers()[1] is None:
            raise CorruptEntry("data column is not at offset 0")
        raw = data.buffers()[2]
        offsets = np.frombuffer(data.buffers()[1], dtype="<i4", count=2)
        if offsets[0] != 0 or raw is None or offsets[1] != raw.size:
            raise CorruptEntry("data buffer is not exactly the chunk's bytes")
        if None in (stored_key, dtype, shape, stored) or any(v is None or v < 0 for v in shape):
            raise CorruptEntry("null or negative field")
        dt = np.dtype(dtype)
        if dt.hasobject or math.prod(shape) * dt.itemsize != raw.size:  # Python ints: no overflow
            raise CorruptEntry("shape and dtype do not match the data size")
        if _checksum(stored_key, dtype, shape, raw) != stored:
            raise CorruptEntry("checksum mismatch")
        return batch
    except CorruptEntry:
        raise
    except (pa.ArrowException, ValueError, TypeError, OverflowError, IndexError, OSError, EOFError) as exc:
        raise CorruptEntry(f"{type(exc).__name__}: {exc}") from None


def read_batch_at(buf: pa.Buffer, offset: int, key: bytes | None = None) -> pa.RecordBatch:
    """The verified batch whose message starts at ``offset`` of a mapped segment, for a reader
    that knows an offset but not the length (upload members, uploads/cache_member.py). The
    length is taken from the message's own framing, bounded by the buffer; then as
    ``verify_batch``. Raises CorruptEntry."""
    if not 0 <= offset <= buf.size - _PREFIX:
        raise CorruptEntry(f"offset {offset} is outside the {buf.size}-byte segment")
    try:
        reader = pa.BufferReader(buf.slice(offset))
        pa.ipc.read_message(reader)
    except (pa.ArrowException, OSError, ValueError, EOFError) as exc:
        raise CorruptEntry(f"{type(exc).__name__}: {exc}") from None
    return verify_batch(buf.slice(offset, reader.tell()), key)


class SegmentWriter:
    """Appends batches to one new segment file until sealed. Not thread-safe: the cache
    manager serialises writers. Unbuffered, so a failed write is known at once and the file
    can be cut back to its last whole batch."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fh = open(self.path, "xb", buffering=0)  # never reuse a name: clients may map old inodes
        self.size = 0
        self.entries: list[SegmentEntry] = []
        self.ended = False  # the end-of-stream marker is written (``end_stream``)
        self.sealed = False  # synced and closed (``sync``)
        try:
            self._write(_HEADER)
        except OSError:
            self._fh.close()
            self.path.unlink(missing_ok=True)
            raise

    def _write(self, data) -> None:  # bytes-like
        """All of ``data`` at the end, or nothing (``_write_parts``)."""
        self._write_parts([data])

    def _write_parts(self, parts: list) -> None:
        """All of ``parts`` (bytes-likes, in order) at the end in gathered writes, or nothing:
        on an error (ENOSPC) the partial tail is cut off, which is safe for mapping clients
        because no location ever pointed into it."""
        views = [v for v in (memoryview(p).cast("B") for p in parts) if len(v)]
        written = 0
        try:
            while views:
                n = os.writev(self._fh.fileno(), views)
                if not n:
                    raise OSError(f"{self.path}: short write")
                written += n
                while views and n >= len(views[0]):
                    n -= len(views.pop(0))
                if n:
                    views[0] = views[0][n:]
        except OSError:
            try:
                os.ftruncate(self._fh.fileno(), self.size)
                self._fh.seek(self.size)  # a later write (the seal's marker) must not leave a hole
            except OSError:
                pass
            raise
        self.size += written

    def append(self, arr: np.ndarray, key: bytes) -> SegmentEntry:
        """One batch of ``arr`` at the end: its message written from ``arr``'s own memory in
        one gathered write (``message_parts``), no serialised copy of the chunk."""
        if self.ended:
            raise RuntimeError(f"{self.path} is sealed")
        parts = message_parts(chunk_record_batch(arr, key))
        offset = self.size
        self._write_parts(parts)  # unbuffered: readers (and other processes) map the file at once
        size = self.size - offset
        entry = SegmentEntry(key, offset, size, int(arr.nbytes))
        self.entries.append(entry)
        return entry

    def seal(self) -> None:
        """End-of-stream marker, fsync, sidecar index. Idempotent. Raises OSError when the disk
        refuses; the segment is then closed as it stands (walkable at the next boot)."""
        if self.sealed:
            return
        try:
            self.end_stream()
        except OSError:
            self.sealed = True
            self._fh.close()
            raise
        self.sync()
        self.write_index()

    def end_stream(self) -> None:
        """The end-of-stream marker: nothing is appended after it, and a walker stops there.
        The quick part of a seal; ``sync`` and ``write_index`` are the rest (the cache manager
        runs ``sync``, an fsync of up to a segment's bytes, outside its lock)."""
        if not self.ended:
            self.ended = True
            self._write(_EOS)

    def sync(self) -> None:
        """fsync and close (after ``end_stream``); idempotent. Raises OSError when the disk
        refuses; the file is closed as it stands either way."""
        if self.sealed:
            return
        self.sealed = True
        try:
            os.fsync(self._fh.fileno())
        finally:
            self._fh.close()

    def write_index(self) -> None:
        """The sidecar index of a synced segment (a missing one is re-walked at boot)."""
        from tensor_server.cache.segment_index import write_index

        write_index(self.path, self.entries, self.size)

    def abandon(self) -> None:
        """Close without sealing (a failed disk; tests simulate a crash with this)."""
        self.sealed = True
        if not self._fh.closed:
            self._fh.close()


def walk_segment(path: Path, start: int = 0) -> Iterator[SegmentEntry]:
    """Re-walk a segment whose index is missing or untrusted: yield every batch that verifies.
    A damaged batch whose framing is intact is skipped; the walk stops at the end-of-stream
    marker or at framing it cannot follow (a crash's torn tail, a damaged length, a batch
    another process is still writing). ``start``: the end of a batch an earlier walk yielded
    (a peer's open segment is walked again from there, cache/peers.py)."""
    with pa.memory_map(str(path), "r") as mm:  # mapped, not read: a stray 1 TiB sparse file costs nothing
        buf = mm.read_buffer()
    if not header_ok(buf):
        return
    size = buf.size
    pos = max(len(_HEADER), start)
    while pos + _PREFIX <= size:
        marker, meta_len = np.frombuffer(buf, dtype="<u4", count=2, offset=pos)
        if marker != 0xFFFFFFFF or meta_len == 0:
            return  # end of stream, or framing lost
        try:
            reader = pa.BufferReader(buf.slice(pos))
            message = pa.ipc.read_message(reader)
        except (pa.ArrowException, OSError, ValueError, EOFError):
            return
        end = pos + reader.tell()
        if message is None or end > size:
            return
        try:
            batch = verify_batch(buf.slice(pos, end - pos), None)
        except CorruptEntry:
            pos = end  # framing held: skip just this batch
            continue
        yield SegmentEntry(batch.column("key")[0].as_py(), pos, end - pos, batch.column("data").buffers()[2].size)
        pos = end
