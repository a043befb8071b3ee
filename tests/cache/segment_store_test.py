"""Segment writes (tensor_server/cache/segment_store.py): a batch's message is written from the
chunk's own memory (no serialised copy), byte for byte what ``serialize`` makes, readable by
offset and by a walk; a write the disk refuses half-way leaves the file at its last whole
batch."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from tensor_server.cache import segment_store
from tensor_server.cache.segment_store import (
    SegmentWriter,
    chunk_record_batch,
    message_parts,
    read_batch_at,
    walk_segment,
)
from tensor_server.core.wire import decode_chunk


def _arr(seed: int, shape=(64, 48), dtype=np.uint16) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 4000, shape).astype(dtype)


@pytest.mark.parametrize(
    "shape, dtype", [((64, 48), np.uint16), ((3, 5, 7), np.float32), ((0, 4), np.uint8), ((9,), np.int64)]
)
def test_message_parts_are_the_serialised_message_without_a_copy_of_the_pixels(shape, dtype):
    arr = _arr(1, shape, dtype)
    batch = chunk_record_batch(arr, b"key")
    parts = message_parts(batch)
    assert b"".join(bytes(memoryview(p)) for p in parts) == batch.serialize().to_pybytes()
    if arr.nbytes:
        views = [np.frombuffer(memoryview(p).cast("B"), np.uint8) for p in parts]
        assert any(np.shares_memory(v, arr) for v in views), "the pixels are written from the array itself"


def test_appended_batches_read_back_by_offset_and_by_walk(tmp_path):
    path = tmp_path / "seg_0000.arrow"
    writer = SegmentWriter(path)
    arrays = [_arr(i) for i in range(3)]
    entries = [writer.append(a, b"k%d" % i) for i, a in enumerate(arrays)]
    assert [e.byte_offset for e in entries[1:]] == [e.byte_offset + e.byte_length for e in entries[:-1]]
    assert entries[-1].byte_offset + entries[-1].byte_length == writer.size == os.path.getsize(path)
    writer.seal()
    buf = pa.memory_map(str(path), "r").read_buffer()
    for e, a, i in zip(entries, arrays, range(3)):
        np.testing.assert_array_equal(decode_chunk(read_batch_at(buf, e.byte_offset, b"k%d" % i)), a)
    assert [(e.key, e.byte_offset, e.byte_length) for e in walk_segment(path)] == [
        (e.key, e.byte_offset, e.byte_length) for e in entries
    ]


def test_a_write_refused_half_way_leaves_the_last_whole_batch(tmp_path, monkeypatch):
    path = tmp_path / "seg_0000.arrow"
    writer = SegmentWriter(path)
    first = writer.append(_arr(0), b"a")
    real = os.writev
    calls = []

    def refuse_after_some(fd, views):
        calls.append(1)
        if len(calls) == 1:
            return real(fd, views[:2])  # a partial gathered write ...
        raise OSError(28, "No space left on device")  # ... then the disk is full

    monkeypatch.setattr(segment_store.os, "writev", refuse_after_some)
    with pytest.raises(OSError):
        writer.append(_arr(1), b"b")
    monkeypatch.setattr(segment_store.os, "writev", real)
    assert os.path.getsize(path) == writer.size == first.byte_offset + first.byte_length
    second = writer.append(_arr(2), b"c")
    writer.seal()
    assert [e.key for e in walk_segment(path)] == [b"a", b"c"]
    assert second.byte_offset == first.byte_offset + first.byte_length
