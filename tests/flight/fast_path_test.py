"""The localhost mmap fast path (wire-protocol §7) and cache_stats, through the real SDK."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow.flight as flight

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.cache import CacheManager
from tensor_server.catalog import Catalog
from tensor_server.testing import serving


def test_warm_reads_of_16_cached_chunks_do_no_doget(tmp_path):
    from biopb.tensor import TensorFlightClient

    arr = np.random.default_rng(0).integers(0, 60000, (256, 256), dtype=np.uint16)
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(arr, chunk_shape=(64, 64)), source_id="fast"))
    cat.first_scan_done.set()
    cache = CacheManager(tmp_path / "cache")
    try:
        with serving(cat, cache=cache) as srv:
            warm = TensorFlightClient(srv.location)
            np.testing.assert_array_equal(warm.get_array("fast"), arr)  # resolves 16 chunks into the cache
            assert len(cache) == 16
            before = srv.runtime.metrics.calls()["flight"]["DoGet"]
            fresh = TensorFlightClient(srv.location)  # no client-side chunk cache yet
            got = fresh.get_array("fast")
            np.testing.assert_array_equal(got, arr)
            assert srv.runtime.metrics.calls()["flight"]["DoGet"] == before, (
                "every chunk came through chunk_locate + mmap"
            )
            assert srv.runtime.metrics.calls()["flight"]["action:chunk_locate"] >= 16
            stats = fresh.cache_stats()
            assert stats["total_entries"] == 16 and stats["hits"] >= 16 and stats["max_bytes"] == cache.max_total_bytes
    finally:
        cache.close()


def test_locate_refuses_stale_ids_and_scaled_chunks_locate_too(tmp_path):
    from biopb.tensor import ticket_pb2

    from tensor_server.core import plan_read

    arr = np.arange(128 * 128, dtype=np.uint16).reshape(128, 128)
    t = ArrayAdapter(arr, chunk_shape=(64, 64))
    cat = Catalog([])
    cat.add_source(MemorySource(t, source_id="loc"))
    cat.first_scan_done.set()
    cache = CacheManager(tmp_path / "cache")
    try:
        with serving(cat, cache=cache) as srv:
            c = flight.FlightClient(srv.location)
            cid = plan_read(t, None, (2, 2), "area").chunks[0].chunk_id
            body = ticket_pb2.TensorTicket(chunk_id=cid.encode()).SerializeToString()
            info = json.loads(next(iter(c.do_action(flight.Action("chunk_locate", body)))).body.to_pybytes())
            assert info["available"] and info["segment_path"].startswith(str(tmp_path))
            import os

            import pyarrow as pa

            assert os.stat(info["segment_path"]).st_ino == info["generation_id"]
            with pa.memory_map(info["segment_path"]) as mm:
                schema = pa.ipc.open_stream(mm).schema
                mm.seek(info["byte_offset"])
                batch = pa.ipc.read_record_batch(pa.ipc.read_message(mm), schema)
            got = np.frombuffer(batch.column("data").buffers()[2], dtype=batch.column("dtype")[0].as_py()).reshape(
                batch.column("shape")[0].as_py()
            )
            from tensor_server_kernels import reference

            np.testing.assert_array_equal(got, reference.downsample(arr, (2, 2), "area")[:64, :64])
            stale = dataclasses.replace(cid, content_version=b"old")
            body = ticket_pb2.TensorTicket(chunk_id=stale.encode()).SerializeToString()
            import pytest

            with pytest.raises(flight.FlightError, match="stale"):
                list(c.do_action(flight.Action("chunk_locate", body)))
    finally:
        cache.close()


def test_without_cache_locate_is_unknown_and_stats_empty(tmp_path):
    cat = Catalog([])
    cat.add_source(MemorySource(np.zeros((4, 4), np.uint8), source_id="x"))
    with serving(cat) as srv:
        c = flight.FlightClient(srv.location)
        import pytest

        with pytest.raises(flight.FlightError, match="Unknown action: chunk_locate"):
            list(c.do_action(flight.Action("chunk_locate", b"")))
        assert list(c.do_action(flight.Action("cache_stats", b""))) == []


def test_a_warm_locate_checks_like_a_read_but_reads_no_pixels(tmp_path, zarr_folder, monkeypatch):
    """A cached chunk is offered after the gate and the id checks alone (a warm SDK tile is a
    describe and this), counted as a file hit; bytes rewritten under it are still refused."""
    import os

    import pytest

    from tensor_server.core import plan_read
    from tensor_server.errors import StaleChunkId
    from tensor_server.service import Caller

    root, cat = zarr_folder
    cache = CacheManager(tmp_path / "cache")
    try:
        with serving(cat, cache=cache) as srv:
            rt, caller = srv.runtime, Caller()
            tensor = next(iter(cat.records())).source.tensor()
            raw = plan_read(tensor, None, (1, 1), "").chunks[0].chunk_id.encode()
            first = rt.locate(raw, caller)  # cold: read into the cache, then offered
            assert first["available"] and cache.stats["misses"] == 1

            def no_reads(*args, **kwargs):
                raise AssertionError("a warm locate read the chunk")

            monkeypatch.setattr(rt.engine, "chunk", no_reads)
            hits, file_hits = cache.stats["hits"], cache.stats["file_hits"]
            again = rt.locate(raw, caller)
            assert again == first
            assert (cache.stats["hits"], cache.stats["file_hits"]) == (hits + 1, file_hits + 1)

            chunk_file = root / "img.zarr" / "0.0"
            chunk_file.write_bytes(chunk_file.read_bytes())  # same bytes, a new stamp: a rewrite
            st = os.stat(chunk_file)
            os.utime(chunk_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
            with pytest.raises(StaleChunkId, match="re-plan"):
                rt.locate(raw, caller)
    finally:
        cache.close()
