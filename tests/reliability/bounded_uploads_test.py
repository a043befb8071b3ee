"""Issue 23 findings 1 (DoPut's half below the door), 6 and 7: uploads count only what was
stored, refuse READY over failed chunks, report a full disk as such, and bound what a client
may declare."""

from __future__ import annotations

import errno

import numpy as np
import pyarrow as pa
import pytest

from tensor_server.catalog import Catalog
from tensor_server.core.bounds import Bounds
from tensor_server.core.chunk_id import ChunkId
from tensor_server.errors import FailedPrecondition, InvalidArgument, RequestTooLarge, ResourceExhausted, StorageFull
from tensor_server.uploads import UploadManager


def _cid(up, bounds):
    t = up.tensor
    return ChunkId.for_extent(t.array_id, bounds, (1,) * t.ndim, "none", t.content_version)


def _cells(up):
    t = up.tensor
    for cell in np.ndindex(*[-(-n // c) for n, c in zip(t.shape, t.chunk_shape)]):
        start = tuple(k * c for k, c in zip(cell, t.chunk_shape))
        yield Bounds(start, tuple(min(s + c, n) for s, c, n in zip(start, t.chunk_shape, t.shape)))


@pytest.fixture
def manager(tmp_path):
    cat = Catalog([])
    m = UploadManager(cat, tmp_path / "write")
    yield m
    m.close()
    cat.close()


class _Pulls:
    def __init__(self, pieces):
        self.pieces, self.pulled = pieces, 0

    def __iter__(self):
        for p in self.pieces:
            self.pulled += 1
            yield p


def _batch(values):
    return pa.record_batch([pa.array(values)], names=["data"])


def test_a_junk_ticket_is_refused_before_its_stream_is_read(manager):
    stream = _Pulls([_batch(np.zeros(1 << 20, np.uint8))] * 100)
    with pytest.raises(InvalidArgument):
        manager.write_chunk_stream(b"not a chunk id", stream)
    assert stream.pulled == 0


def test_a_stream_past_one_chunk_plus_slack_is_refused_where_it_passes(manager):
    up = manager.add_tensor("cache://scratch/@fields/big", (64, 64), "<u2", chunk_shape=(32, 32))
    b = next(_cells(up))
    plan = manager.plan_chunk_write(_cid(up, b))
    assert plan.expected_bytes == 32 * 32 * 2 and plan.max_stream_bytes == plan.expected_bytes + (1 << 20)
    stream = _Pulls([_batch(np.zeros(1 << 18, np.uint16))] * 100)  # 512 KiB each, 50 MiB in all
    with pytest.raises(RequestTooLarge, match="more than"):
        manager.write_chunk_stream(_cid(up, b), stream)
    assert stream.pulled == 3  # the third piece passes the ~1 MiB budget: nothing after it is read
    assert up.status()["uploaded_chunks"] == 0


def test_a_chunk_sent_in_several_batches_is_stored(manager):
    up = manager.add_tensor("zarr://scratch/@fields/pieces", (4, 8), "<u2")
    data = np.arange(32, dtype=np.uint16)
    manager.write_chunk_stream(_cid(up, Bounds((0, 0), (4, 8))), [_batch(data[:10]), _batch(data[10:])])
    manager.set_ready(up.array_id)
    np.testing.assert_array_equal(up.tensor.read_region(Bounds((0, 0), (4, 8))), data.reshape(4, 8))


def test_enospc_is_storage_full_and_failed_chunks_are_not_counted(manager, monkeypatch):
    up = manager.add_tensor("cache://scratch/@fields/full", (40, 40), "<u1", chunk_shape=(10, 10))
    cells = list(_cells(up))
    real_write, calls = up.member.write, {"n": 0}

    def write(bounds, data):
        calls["n"] += 1
        if calls["n"] > 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(bounds, data)

    monkeypatch.setattr(up.member, "write", write)
    failures = 0
    for b in cells:
        try:
            manager.write_chunk(_cid(up, b), np.ones(b.shape, np.uint8))
        except StorageFull as exc:
            failures += 1
            assert str(manager.write_dir) in str(exc)
    assert failures == len(cells) - 5
    assert up.status()["uploaded_chunks"] == 5 and up.status()["expected_chunks"] == 16
    with pytest.raises(FailedPrecondition, match="11 chunk\\(s\\) failed to write"):
        manager.set_ready(up.array_id)
    assert up.state == "PENDING"
    monkeypatch.setattr(up.member, "write", real_write)  # space freed: the client re-sends
    for b in cells[5:]:
        manager.write_chunk(_cid(up, b), np.ones(b.shape, np.uint8))
    assert manager.set_ready(up.array_id).status()["uploaded_chunks"] == 16


def test_never_written_chunks_block_ready_only_when_asked(tmp_path):
    cat = Catalog([])
    strict = UploadManager(cat, tmp_path / "write", refuse_unwritten_chunks=True)
    up = strict.add_tensor("cache://scratch/@fields/holes", (20, 20), "<u1", chunk_shape=(10, 10))
    b = next(_cells(up))
    strict.write_chunk(_cid(up, b), np.ones(b.shape, np.uint8))
    with pytest.raises(FailedPrecondition, match="3 of 4 planned chunks were never written"):
        strict.set_ready(up.array_id)
    assert strict.set_ready(up.array_id, holes_are_fill=True).state == "READY"
    strict.close()
    cat.close()


@pytest.mark.parametrize("shape", [(2**40, 2**40), (2**62, 4), (2**63,), (0, 4), (1,) * 33])
def test_declared_shapes_beyond_int64_are_refused(manager, shape):
    with pytest.raises(InvalidArgument):
        manager.add_tensor("cache://scratch/@fields/huge", shape, "<u1")
    assert manager.get("scratch/@fields/huge") is None


def test_pending_uploads_and_declared_bytes_have_quotas(tmp_path):
    cat = Catalog([])
    m = UploadManager(cat, tmp_path / "write", max_pending_uploads=2, max_declared_bytes=1 << 20)
    m.add_tensor("zarr://scratch/@fields/a", (512, 512), "<u1")  # 256 KiB
    with pytest.raises(ResourceExhausted, match="max_declared_bytes"):
        m.add_tensor("zarr://scratch/@fields/b", (1024, 1024), "<u1")  # 1 MiB more
    m.add_tensor("zarr://scratch/@fields/c", (8, 8), "<u1")
    with pytest.raises(ResourceExhausted, match="2 uploads are PENDING"):
        m.add_tensor("zarr://scratch/@fields/d", (8, 8), "<u1")
    m.discard("scratch/@fields/a")
    assert m.add_tensor("zarr://scratch/@fields/d", (8, 8), "<u1").state == "PENDING"
    m.close()
    cat.close()


def test_the_default_declared_quota_is_the_write_dirs_free_space(manager):
    import shutil

    free = shutil.disk_usage(manager.write_dir).free
    with pytest.raises(ResourceExhausted, match="free space"):
        manager.add_tensor("cache://scratch/@fields/tera", (free + 1,), "<u1", chunk_shape=(1 << 20,))


def test_deep_metadata_json_is_invalid_argument(manager):
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(InvalidArgument, match="nested 100000 deep"):
        manager.add_tensor("zarr://scratch/@fields/x/@labels/l", (4, 4), "<u1", metadata_json=deep)
