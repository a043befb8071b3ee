"""``.idx`` sidecars: where each chunk lives in a sealed segment.

Written at seal, read at boot, so a cache of tens of thousands of chunks starts without
parsing its segments. The sidecar is a small Arrow IPC file (key, byte_offset, byte_length,
nbytes) whose schema metadata records the segment's size at seal, behind a header that holds
an xxh3-64 digest of those bytes. The digest is checked before a single byte is parsed: a
damaged sidecar must cost a re-walk of its segment, never a crash at boot (a flipped byte in
IPC metadata can make a parser read outside the file). A sidecar is trusted only when it
verifies, every entry lies inside the segment and the segment still has the recorded size;
otherwise the segment is re-walked (segment_store.walk_segment). Entries are still verified
one by one when read (segment_store.verify_batch): the sidecar says only where to look.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pyarrow as pa
import xxhash

from tensor_server.cache.segment_store import SegmentEntry
from tensor_server.core.wire import binary_column, int64_column, int64_values

__all__ = ["index_path", "write_index", "read_index"]

_SCHEMA = pa.schema(
    [("key", pa.binary()), ("byte_offset", pa.int64()), ("byte_length", pa.int64()), ("nbytes", pa.int64())]
)
_MAGIC = b"TSIDX\x00\x02\x00"  # format 2: digest header + Arrow IPC file
_HEADER = len(_MAGIC) + 8


def index_path(segment: Path) -> Path:
    return segment.with_suffix(".idx")


def write_index(segment: Path, entries: list[SegmentEntry], segment_size: int) -> Path:
    """Write the sidecar atomically (temp file + rename): a crash leaves none or a whole one.
    Raises OSError when the disk refuses (the temp file is removed)."""
    # columns from buffers: ``pa.array``/``to_numpy`` import pandas on first use (1.2-2 s,
    # paid by the read whose put seals the first segment, or by a restart reading the index)
    table = pa.Table.from_arrays(
        [
            binary_column([e.key for e in entries]),
            int64_column([e.byte_offset for e in entries]),
            int64_column([e.byte_length for e in entries]),
            int64_column([e.nbytes for e in entries]),
        ],
        schema=_SCHEMA.with_metadata({b"segment_size": str(segment_size).encode()}),
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    body = sink.getvalue()
    target = index_path(segment)
    tmp = target.with_suffix(".idx.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(_MAGIC + xxhash.xxh3_64_digest(body))
            fh.write(body)
        os.replace(tmp, target)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return target


def read_index(segment: Path) -> list[SegmentEntry] | None:
    """The sidecar's entries, or None when it is missing, damaged, stale (size mismatch) or
    names bytes outside its segment."""
    target = index_path(segment)
    try:
        segment_size = segment.stat().st_size
        st = target.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > segment_size + 65536:
            return None  # a FIFO would block the read; a huge file is not ours: never read it whole
        raw = target.read_bytes()
    except OSError:
        return None
    if len(raw) < _HEADER or raw[: len(_MAGIC)] != _MAGIC:
        return None
    body = memoryview(raw)[_HEADER:]
    if xxhash.xxh3_64_digest(body) != raw[len(_MAGIC) : _HEADER]:
        return None
    try:
        table = pa.ipc.open_file(pa.py_buffer(body)).read_all()
        table.validate(full=True)
        if not table.schema.equals(_SCHEMA, check_metadata=False):
            return None
        recorded = int((table.schema.metadata or {}).get(b"segment_size", b"-1"))
    except (pa.ArrowException, ValueError):
        return None
    if recorded != segment_size or any(c.null_count for c in table.columns):
        return None
    offsets = int64_values(table.column("byte_offset"))
    lengths = int64_values(table.column("byte_length"))
    if len(offsets) and (offsets.min() < 0 or lengths.min() <= 0 or (offsets + lengths).max() > segment_size):
        return None
    keys = table.column("key").to_pylist()
    nbytes = table.column("nbytes").to_pylist()
    return [SegmentEntry(k, int(o), int(n), b) for k, o, n, b in zip(keys, offsets, lengths, nbytes)]
