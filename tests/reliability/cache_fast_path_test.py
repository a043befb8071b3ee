"""The localhost fast path (wire-protocol §7) only offers batches that verify: the SDK maps
the segment and reads the batch itself, checking nothing, so the server verifies the batch
(key, Arrow structure, checksum) at ``chunk_locate`` time and answers ``available: false``
for a damaged one. In practice ``chunk_locate`` resolves the chunk first (as DoGet would), so
the damaged entry is caught there, recomputed into a fresh batch, and that one is offered."""

from __future__ import annotations

import numpy as np

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.cache import CacheManager
from tensor_server.catalog import Catalog
from tensor_server.testing import serving


def test_a_damaged_batch_is_never_offered_to_the_fast_path(tmp_path):
    from biopb.tensor import TensorFlightClient

    arr = np.random.default_rng(7).integers(0, 60000, (128, 128), dtype=np.uint16)
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(arr, chunk_shape=(64, 64)), source_id="fp"))
    cat.first_scan_done.set()
    cache = CacheManager(tmp_path / "cache", memory_bytes=0)  # every hit goes to the segment
    try:
        with serving(cat, cache=cache) as srv:
            np.testing.assert_array_equal(TensorFlightClient(srv.location).get_array("fp"), arr)  # 4 chunks cached
            assert len(cache) == 4
            # flip one pixel byte of one cached batch under the running server (same size, same inode)
            segment = next((tmp_path / "cache").glob("seg_*.arrow"))
            raw = bytearray(segment.read_bytes())
            at = raw.find(np.ascontiguousarray(arr[64:, :64]).tobytes())
            assert at > 0
            with open(segment, "r+b") as fh:
                fh.seek(at + 777)
                fh.write(bytes([raw[at + 777] ^ 0x10]))
            before_doget = srv.runtime.metrics.calls()["flight"]["DoGet"]
            got = TensorFlightClient(srv.location).get_array("fp")  # a fresh client: no client-side cache
            np.testing.assert_array_equal(got, arr)
            assert cache.stats["corrupt_entries"] == 1, "the damaged batch was caught at chunk_locate"
            assert cache.stats["misses"] == 4 + 1, "exactly that chunk was recomputed"
            assert srv.runtime.metrics.calls()["flight"]["DoGet"] == before_doget, (
                "and offered from its fresh batch through the fast path"
            )
            assert len(list((tmp_path / "cache").glob("seg_*.arrow"))) == 1, "in the same (open) segment"
            np.testing.assert_array_equal(TensorFlightClient(srv.location).get_array("fp"), arr)
            assert (
                cache.stats["corrupt_entries"] == 1 and srv.runtime.metrics.calls()["flight"]["DoGet"] == before_doget
            )
    finally:
        cache.close()


def test_locate_verifies_even_when_the_memory_tier_answers(tmp_path):
    """A memory-tier hit never reads the segment, so ``locate`` checks the batch itself; a
    damaged one is dropped from both tiers (a memory-tier array may view the same bytes)."""
    arr = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64)
    with CacheManager(tmp_path) as cache:
        cache.put(b"k", arr)
        loc = cache.locate(b"k")
        assert loc is not None
        with open(loc.segment_path, "r+b") as fh:
            fh.seek(loc.byte_offset + loc.byte_length - 600)  # inside the pixels: they lead the body
            byte = fh.read(1)
            fh.seek(-1, 1)
            fh.write(bytes([byte[0] ^ 0x01]))
        assert cache.get(b"k") is not None and cache.stats["memory_hits"] == 1  # memory tier: not re-read
        assert cache.locate(b"k") is None, "a damaged batch is not offered to a client"
        assert cache.stats["corrupt_entries"] == 1
        assert b"k" not in cache, "dropped from both tiers"
        out = cache.get_or_compute(b"k", lambda: arr.copy())
        np.testing.assert_array_equal(out, arr)
        assert cache.locate(b"k") is not None and cache.locate(b"k").byte_offset > loc.byte_offset
