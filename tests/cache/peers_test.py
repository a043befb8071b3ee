"""The chunk cache shared by a server's processes (cache/peers.py): each writes its own folder
and reads the others'; a chunk one computed is a hit for the other; the budget is per process,
so the sum holds; a torn tail (a writer killed mid-batch) is never read."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from tensor_server.cache import CacheManager
from tensor_server.cache.peers import PeerSegments, clear_stale_folders, peer_folders, process_folder


def _pair(root, budget=1 << 20, segment_bytes=64 << 10):
    """Two processes' managers (slot 0 and 1) over one cache folder, as ``--workers 2`` makes them."""
    return [
        CacheManager(
            process_folder(root, slot),
            max_total_bytes=budget // 2,
            segment_bytes=segment_bytes,
            peers=PeerSegments(peer_folders(root, slot, 2)),
        )
        for slot in (0, 1)
    ]


def test_a_chunk_one_process_computed_is_a_hit_for_the_other(tmp_path):
    a, b = _pair(tmp_path / "chunks")
    chunk = np.arange(4096, dtype=np.uint16).reshape(64, 64)
    calls = []
    got_a = a.get_or_compute(b"k1", lambda: calls.append("a") or chunk)
    got_b = b.get_or_compute(b"k1", lambda: calls.append("b") or chunk)  # the segment is still open
    assert calls == ["a"]
    np.testing.assert_array_equal(got_b, chunk)
    np.testing.assert_array_equal(got_a, chunk)
    stats = b.cache_stats()
    assert stats["misses"] == 0 and stats["pool_stats"]["file"]["peer_hits"] == 1
    assert stats["total_entries"] == 1 and stats["processes"] == 2 and stats["max_bytes"] == 1 << 20
    assert b.contains_all([b"k1"]) and b"k2" not in b
    a.close()  # sealed: read through its sidecar from now on
    b.close()


def test_the_budget_holds_for_the_sum(tmp_path):
    budget = 1 << 20
    a, b = _pair(tmp_path / "chunks", budget)
    rng = np.random.default_rng(0)
    for i in range(64):  # 64 x 32 KiB chunks: 2 MiB offered to a 1 MiB budget
        (a if i % 2 else b).put(f"k{i}".encode(), rng.integers(0, 255, (128, 256), dtype=np.uint8))
    on_disk = sum(p.stat().st_size for p in (tmp_path / "chunks").rglob("seg_*.arrow"))
    assert on_disk <= budget
    assert a.stats["evictions"] > 0 and b.stats["evictions"] > 0
    stats = a.cache_stats()
    assert stats["total_bytes"] <= budget and stats["total_entries"] < 64
    # an evicted peer segment is forgotten, never read: every entry still known verifies
    for i in range(64):
        arr = a.get(f"k{i}".encode())
        assert arr is None or arr.shape == (128, 256)
    a.close()
    b.close()


def test_a_torn_tail_is_never_read(tmp_path):
    a, b = _pair(tmp_path / "chunks")
    chunk = np.full((64, 64), 7, dtype=np.uint16)
    chunk[0, 0] = 1
    a.put(b"whole", chunk)
    torn = np.arange(4096, dtype=np.uint16).reshape(64, 64)
    a.put(b"torn", torn)
    seg = next((tmp_path / "chunks").glob("seg_*.arrow"))
    size = seg.stat().st_size
    a._writer.abandon()  # the writer "dies": its file is cut in the middle of the last batch
    with open(seg, "r+b") as fh:
        fh.truncate(size - 100)
    np.testing.assert_array_equal(b.get(b"whole"), chunk)
    assert b.get(b"torn") is None
    b.close()


def test_folders_of_workers_a_server_no_longer_has_are_removed(tmp_path):
    root = tmp_path / "chunks"
    for slot in (1, 2, 3):
        CacheManager(process_folder(root, slot)).close()
    held = CacheManager(process_folder(root, 3))
    clear_stale_folders(root, 2)
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["worker-1", "worker-3"]  # 3 is held
    held.close()


def test_the_fast_path_offers_a_peers_segment(tmp_path):
    from tensor_server.cache.segment_store import verify_batch
    from tensor_server.core.wire import decode_chunk

    a, b = _pair(tmp_path / "chunks")
    chunk = np.arange(4096, dtype=np.uint16).reshape(64, 64)
    a.put(b"k1", chunk)
    where = b.locate(b"k1")
    assert where is not None and where.segment_path == str(next((tmp_path / "chunks").glob("seg_*.arrow")).resolve())
    assert where.generation_id == os.stat(where.segment_path).st_ino
    with open(where.segment_path, "rb") as fh:  # what a client maps: the batch at that offset
        fh.seek(where.byte_offset)
        message = pa.py_buffer(fh.read(where.byte_length))
    np.testing.assert_array_equal(decode_chunk(verify_batch(message, b"k1")), chunk)
    assert b.locate(b"absent") is None
    a.close()
    b.close()
