"""``.idx`` sidecars: where each chunk lives in a sealed segment.

Written at seal, read at boot, so a cache of tens of thousands of chunks starts without
parsing its segments. The sidecar is a small Arrow IPC file (key, byte_offset, byte_length,
nbytes) whose schema metadata records the segment's size at seal. It is trusted only when the
segment still has that size; otherwise the segment is re-walked (segment_store.walk_segment).
"""
from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

from tensor_server.cache.segment_store import SegmentEntry

__all__ = ["index_path", "write_index", "read_index"]

_SCHEMA = pa.schema([("key", pa.binary()), ("byte_offset", pa.int64()), ("byte_length", pa.int64()), ("nbytes", pa.int64())])


def index_path(segment: Path) -> Path:
    return segment.with_suffix(".idx")


def write_index(segment: Path, entries: list[SegmentEntry], segment_size: int) -> Path:
    """Write the sidecar atomically (temp file + rename): a crash leaves none or a whole one."""
    table = pa.table(
        {
            "key": pa.array([e.key for e in entries], pa.binary()),
            "byte_offset": pa.array([e.byte_offset for e in entries], pa.int64()),
            "byte_length": pa.array([e.byte_length for e in entries], pa.int64()),
            "nbytes": pa.array([e.nbytes for e in entries], pa.int64()),
        },
        schema=_SCHEMA.with_metadata({b"segment_size": str(segment_size).encode()}),
    )
    target = index_path(segment)
    tmp = target.with_suffix(".idx.tmp")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(tmp, target)
    return target


def read_index(segment: Path) -> list[SegmentEntry] | None:
    """The sidecar's entries, or None when it is missing, unreadable or stale (size mismatch)."""
    target = index_path(segment)
    try:
        with pa.memory_map(str(target), "r") as mm:
            table = pa.ipc.open_file(mm).read_all()
        recorded = int((table.schema.metadata or {}).get(b"segment_size", b"-1"))
        if recorded != segment.stat().st_size:
            return None
    except (OSError, pa.ArrowInvalid, ValueError):
        return None
    cols = table.to_pydict()
    return [SegmentEntry(k, o, n, b) for k, o, n, b in zip(cols["key"], cols["byte_offset"], cols["byte_length"], cols["nbytes"])]
