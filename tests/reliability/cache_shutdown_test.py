"""SIGTERM stops a real server like Ctrl-C does (the open segment is sealed), and a restart
finds its cache intact beside a stray directory named like a segment (issue 12, medium)."""

from __future__ import annotations

import signal

import numpy as np
import pytest

from tensor_server.cache.segment_index import read_index
from tests.reliability.server_process import serve_process

EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


@pytest.fixture()
def root(tmp_path):
    folder = tmp_path / "root"
    folder.mkdir()
    arr = np.random.default_rng(12).integers(0, 2**32, (2048, 1536), dtype=np.uint32)
    np.save(folder / "img.npy", arr)
    return folder, arr


def array_id_of(folder) -> str:
    from tensor_server.catalog import Catalog

    cat = Catalog([folder])
    cat.scan()
    try:
        return next(t.array_id for rec in cat.records() for t in rec.source.tensors.values())
    finally:
        cat.close()


def read_all(server, array_id):
    """The whole array through a fresh SDK client (no client-side chunk cache), and the
    server's cache statistics after it."""
    from biopb.tensor import TensorFlightClient

    client = TensorFlightClient(server.location)
    return np.asarray(client.get_array(array_id)), server.action("cache_stats")


def test_sigterm_seals_the_open_segment_and_a_restart_serves_it(root, tmp_path):
    folder, truth = root
    array_id = array_id_of(folder)
    cache_dir = tmp_path / "cache"
    with serve_process([folder], cache_dir) as server:
        got, stats = read_all(server, array_id)
        np.testing.assert_array_equal(got, truth)
        chunks = stats["total_entries"]
        assert chunks >= 2 and stats["pool_stats"]["file"]["segments"] == 1, "all chunks in one open segment"
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0, f"SIGTERM is a clean stop, like Ctrl-C\n{server.stderr[-3000:]}"
    segments = sorted(cache_dir.glob("seg_*.arrow"))
    assert len(segments) == 1
    assert segments[0].read_bytes()[-8:] == EOS, "the open segment was sealed (end-of-stream marker)"
    entries = read_index(segments[0])
    assert entries is not None and len(entries) == chunks, "and its sidecar written"

    (cache_dir / "seg_0100.arrow").mkdir()  # a stray directory named like a segment
    with serve_process([folder], cache_dir) as server:
        got, stats = read_all(server, array_id)
        np.testing.assert_array_equal(got, truth)
        assert stats["misses"] == 0 and stats["total_entries"] == chunks, "every chunk came from the sealed segment"
        assert stats["pool_stats"]["file"]["segments"] == 1, "the stray directory is not counted as a segment"
        assert stats["total_bytes"] == segments[0].stat().st_size
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0
    assert (cache_dir / "seg_0100.arrow").is_dir(), "left alone"


def test_a_restart_recomputes_a_damaged_batch_instead_of_crashing(root, tmp_path):
    folder, truth = root
    array_id = array_id_of(folder)
    cache_dir = tmp_path / "cache"
    with serve_process([folder], cache_dir) as server:
        read_all(server, array_id)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0
    segment = next(cache_dir.glob("seg_*.arrow"))
    entries = read_index(segment)
    damaged = bytearray(segment.read_bytes())
    damaged[entries[0].byte_offset + 4] ^= 0x40  # the first batch's metadata length
    second = entries[1].byte_offset
    body = second + 8 + int.from_bytes(damaged[second + 4 : second + 8], "little")  # pixels lead the body
    damaged[body + 1000] ^= 0x01  # one bit of one pixel of the second
    segment.write_bytes(bytes(damaged))  # same size: the sidecar still looks current
    with serve_process([folder], cache_dir) as server:
        got, stats = read_all(server, array_id)
        np.testing.assert_array_equal(got, truth)
        assert stats["corrupt_entries"] == 2 and stats["misses"] == 2, "exactly the two damaged chunks recomputed"
        got, _ = read_all(server, array_id)  # and served right from the cache afterwards
        np.testing.assert_array_equal(got, truth)
        assert server.proc.poll() is None
