"""Uniform chunks in the chunk cache (a value, no segment bytes) and on DoGet (one shared
constant buffer)."""

from __future__ import annotations

import numpy as np

from tensor_server.cache import CacheManager
from tensor_server.core.engine import ReadEngine
from tensor_server.core.plan import plan_read
from tensor_server.core.uniform import uniform_array
from tensor_server.core.wire import chunk_batch

from .conftest import ReadCounter, assert_bit_identical, oracle
from .stats_wire_test import sparse_zarr


def test_cache_keeps_uniform_chunks_as_values(tmp_path) -> None:
    from tensor_server.adapters.zarr import ZarrSource

    a = sparse_zarr(tmp_path / "s.zarr")
    t = ZarrSource(tmp_path / "s.zarr").tensor()
    t.__dict__["chunk_shape"] = (4, 64, 128)  # one transfer chunk per zarr chunk
    with CacheManager(tmp_path / "cache") as cache:
        engine = ReadEngine(cache)
        plan = plan_read(t)
        for pc in plan.chunks:
            _, arr = engine.chunk(pc.chunk_id, t)
            assert np.array_equal(arr, a[pc.chunk_id.bounds.to_slices()])
        stats = cache.cache_stats()
        assert stats["uniform_entries"] == len(plan.chunks) - 1
        assert stats["total_entries"] == 1 and cache.file_bytes < 2 * 4 * 64 * 128 * 2
        counted = ReadCounter(t)
        for pc in plan.chunks:  # every chunk is now a hit: nothing is read
            engine.chunk(pc.chunk_id, t)
        assert counted.regions == []
        # scaled reads over cached uniform chunks keep answering the oracle
        scaled = plan_read(t, None, (2, 4, 4), "area")
        for pc in scaled.chunks:
            cid, arr = engine.chunk(pc.chunk_id, t)
            assert_bit_identical(np.ascontiguousarray(arr), oracle(t, cid.bounds, cid.scale, "area"))


def test_doget_batches_share_one_constant_buffer() -> None:
    one = chunk_batch(uniform_array(np.uint16(7), (64, 128), np.dtype("u2")))
    two = chunk_batch(uniform_array(np.uint16(7), (64, 128), np.dtype("u2")))
    other = chunk_batch(uniform_array(np.uint16(8), (64, 128), np.dtype("u2")))
    buf = lambda b: b.column("data").buffers()[2]  # noqa: E731
    assert buf(one).address == buf(two).address != buf(other).address
    got = np.frombuffer(buf(one), dtype="<u2").reshape(one.column("shape")[0].as_py())
    assert got.shape == (64, 128) and (got == 7).all()
    assert one.column("dtype")[0].as_py() == "<u2"
