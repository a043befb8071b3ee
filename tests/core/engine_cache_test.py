"""The read engine with a chunk cache: keys are the served tensor's chunk ids, hits decode
nothing, and scaled extents assembled from cached full-resolution chunks are bit-identical
to the source path — also for a tensor whose axes the server reorders."""

from __future__ import annotations

import numpy as np
import pytest
from tensor_server_kernels import reference

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.cache import CacheManager
from tensor_server.core import Bounds, normalize_axes, plan_read
from tensor_server.core.chunk_store import ChunkStore, cache_sourced_units
from tensor_server.core.engine import ReadEngine
from tensor_server.core.methods import CANONICAL_METHODS

METHODS = CANONICAL_METHODS


def assemble(engine, tensor, plan):
    out = np.empty(plan.shape, tensor.dtype)
    for pc in plan.chunks:
        out[pc.out_bounds.to_slices()] = engine.chunk(pc.chunk_id.encode(), tensor)[1]
    return out


def test_the_cache_manager_is_a_chunk_store(tmp_path):
    with CacheManager(tmp_path) as c:
        assert isinstance(c, ChunkStore)


def test_a_hit_decodes_nothing_and_entries_are_read_only(tmp_path):
    arr = np.random.default_rng(0).integers(0, 1000, (100, 120), dtype=np.uint16)
    t = ArrayAdapter(arr, chunk_shape=(32, 32))
    MemorySource(t, source_id="c")
    with CacheManager(tmp_path) as c:
        engine = ReadEngine(c)
        cid = plan_read(t).chunks[3].chunk_id
        _, a = engine.chunk(cid.encode(), t)
        reads = t.reads
        _, b = engine.chunk(cid.encode(), t)
        assert t.reads == reads, "a hit decodes nothing"
        assert not b.flags.writeable
        np.testing.assert_array_equal(b, arr[cid.bounds.to_slices()])


@pytest.mark.parametrize("method", METHODS)
def test_issue_11_reproduction_transposed_source_zoomed_out_after_full_resolution(tmp_path, method):
    """A viewer reads full resolution first, then zooms out: the scaled chunks of an x-first
    tensor (served y, x) must equal the oracle over the served pixels."""
    arr = np.random.default_rng(0).integers(0, 60000, size=(64, 64), dtype=np.uint16)
    inner = ArrayAdapter(arr, dim_labels=("x", "y"), chunk_shape=(32, 32))
    inner.array_id = "t"
    t = normalize_axes(inner)
    served = arr.T
    with CacheManager(tmp_path) as cache:
        engine = ReadEngine(cache)
        np.testing.assert_array_equal(assemble(engine, t, plan_read(t)), served)
        plan = plan_read(t, scale=(2, 2), method=method)
        want = reference.downsample(served, (2, 2), method)
        np.testing.assert_array_equal(assemble(engine, t, plan), want)
        np.testing.assert_array_equal(assemble(ReadEngine(), t, plan), want)


@pytest.mark.parametrize("method", METHODS)
def test_nd_transposed_source_cached_and_uncached_equal_the_oracle(tmp_path, method):
    """An HDF5-like volume stored z, x, y (served z, y, x), read full then at 2 scales."""
    arr = np.random.default_rng(3).integers(0, 255, size=(6, 40, 56), dtype=np.uint8)  # z x y
    inner = ArrayAdapter(arr, dim_labels="zxy", chunk_shape=(2, 16, 16))
    inner.array_id = "vol"
    t = normalize_axes(inner)
    served = np.transpose(arr, (0, 2, 1))
    with CacheManager(tmp_path) as cache:
        engine = ReadEngine(cache)
        assemble(engine, t, plan_read(t))
        for scale in [(1, 2, 2), (2, 4, 2), (3, 3, 3)]:
            plan = plan_read(t, scale=scale, method=method)
            want = reference.downsample(served[plan.realized.to_slices()], scale, method)
            np.testing.assert_array_equal(assemble(engine, t, plan), want, err_msg=f"cached {scale}")
            np.testing.assert_array_equal(assemble(ReadEngine(), t, plan), want, err_msg=f"uncached {scale}")


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", ["uint16", "float32"])
def test_cache_sourced_scaled_reads_are_bit_identical(tmp_path, method, dtype):
    rng = np.random.default_rng(1)
    arr = (
        (rng.standard_normal((130, 250)) * 1000).astype(dtype)
        if dtype == "float32"
        else rng.integers(0, 60000, (130, 250), dtype=dtype)
    )
    t = ArrayAdapter(arr, chunk_shape=(32, 48))
    MemorySource(t, source_id="s")
    with CacheManager(tmp_path) as c:
        engine = ReadEngine(c)
        for pc in plan_read(t).chunks:  # warm every full-resolution chunk
            engine.chunk(pc.chunk_id, t)
        for scale in [(2, 2), (4, 3), (8, 8)]:
            plan = plan_read(t, None, scale, method)
            for pc in plan.chunks:
                before = t.reads
                got = engine.read(t, pc.chunk_id.bounds, scale, method)
                assert t.reads == before, "every unit came from the cache, not the source"
                want = reference.downsample(arr[pc.chunk_id.bounds.to_slices()], scale, method)
                np.testing.assert_array_equal(got, want)
                assert got.flags.owndata and got.flags.writeable


def test_cache_sourcing_can_be_switched_off(tmp_path):
    arr = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64)
    t = ArrayAdapter(arr, chunk_shape=(16, 16))
    MemorySource(t, source_id="off")
    with CacheManager(tmp_path) as c:
        on, off = ReadEngine(c), ReadEngine(c, source_scaled_reads=False)
        for pc in plan_read(t).chunks:
            on.chunk(pc.chunk_id, t)
        before = t.reads
        on.read(t, Bounds((0, 0), (32, 32)), (2, 2), "area")
        assert t.reads == before
        off.read(t, Bounds((0, 0), (32, 32)), (2, 2), "area")
        assert t.reads > before


def test_cache_sourced_declines_cold_and_off_grid_extents(tmp_path):
    arr = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64)
    t = ArrayAdapter(arr, chunk_shape=(16, 16))
    MemorySource(t, source_id="d")
    with CacheManager(tmp_path) as c:
        assert cache_sourced_units(c, t, Bounds((0, 0), (32, 32)), (16, 16), (2, 2), "area") is None  # cold
        for pc in plan_read(t).chunks:
            ReadEngine(c).chunk(pc.chunk_id, t)
        assert cache_sourced_units(c, t, Bounds((0, 0), (32, 32)), (16, 16), (2, 2), "area") is not None
        assert cache_sourced_units(c, t, Bounds((8, 0), (32, 32)), (16, 16), (2, 2), "area") is None  # off grid


def test_evicted_between_probe_and_read_falls_back_to_source(tmp_path):
    arr = np.random.default_rng(2).integers(0, 9, (64, 64), dtype=np.uint8)
    t = ArrayAdapter(arr, chunk_shape=(16, 16))
    MemorySource(t, source_id="e")
    with CacheManager(tmp_path, memory_bytes=0) as c:
        for pc in plan_read(t).chunks:
            ReadEngine(c).chunk(pc.chunk_id, t)
        offer = cache_sourced_units(c, t, Bounds((0, 0), (64, 64)), (32, 32), (2, 2), "area")
        assert offer.serial and offer.unit == (32, 32)
        c.clear()  # everything evicted after the probe
        before = t.reads
        np.testing.assert_array_equal(offer.fetch(Bounds((0, 0), (32, 32))), arr[:32, :32])
        assert t.reads == before + 1
