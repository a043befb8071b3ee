"""The seam: chunk ids route to get_data / get_scaled_data; results are owned (§1, §8)."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.core import Bounds, ChunkId, plan_read
from tensor_server.core.downsample import downsample_block
from tensor_server.errors import InvalidArgument, InvalidChunkId, StaleChunkId


class Recording(ArrayAdapter):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls = []

    def get_data(self, bounds=None):
        self.calls.append(("get_data", bounds))
        return super().get_data(bounds)

    def get_scaled_data(self, bounds, scale_hint, reduction_method, cache_manager=None):
        self.calls.append(("get_scaled_data", bounds, tuple(scale_hint), reduction_method))
        return super().get_scaled_data(bounds, scale_hint, reduction_method, cache_manager)


@pytest.fixture
def tensor():
    arr = np.arange(40 * 50, dtype=np.uint16).reshape(40, 50)
    t = Recording(arr, chunk_shape=(16, 16))
    MemorySource(t, source_id="seam")
    return t


def test_unscaled_chunk_routes_to_get_data(tensor):
    plan = plan_read(tensor, None, (1, 1))
    cid = plan.chunks[0].chunk_id
    assert cid.method == "none"
    out = tensor.resolve_chunk_data(cid.encode())
    assert tensor.calls[0][0] == "get_data"
    assert not any(c[0] == "get_scaled_data" for c in tensor.calls)
    np.testing.assert_array_equal(out, tensor.array[cid.bounds.to_slices()])


def test_scaled_chunk_routes_to_get_scaled_data(tensor):
    plan = plan_read(tensor, None, (2, 4), "mean")
    cid = plan.chunks[-1].chunk_id
    out = tensor.resolve_chunk_data(cid.encode())
    first = tensor.calls[0]
    assert first[0] == "get_scaled_data" and first[2] == (2, 4) and first[3] == "area"
    want = downsample_block(tensor.array[cid.bounds.to_slices()], (2, 4), "area")
    np.testing.assert_array_equal(out, want)
    assert out.shape == plan.chunks[-1].out_bounds.shape


def test_results_are_owned(tensor):
    a = tensor.get_data(Bounds((0, 0), (8, 8)))
    a[:] = 0
    b = tensor.get_data(Bounds((0, 0), (8, 8)))
    assert b[1, 1] == 51 and not np.shares_memory(b, tensor.array)
    s = tensor.get_scaled_data(Bounds((0, 0), (8, 8)), (2, 2), "nearest")
    assert s.flags.owndata and s.flags.writeable and not np.shares_memory(s, tensor.array)
    s[:] = 0
    np.testing.assert_array_equal(tensor.get_scaled_data(Bounds((0, 0), (8, 8)), (2, 2), "nearest"),
                                  tensor.array[0:8:2, 0:8:2])


def test_scaled_read_default_matches_contract_for_every_method(tensor):
    b = Bounds((3, 7), (40, 50))
    for method in ["nearest", "area", "min", "max", "mode", "median", "stride", "mean", ""]:
        got = tensor.get_scaled_data(b, (3, 5), method)
        canonical = {"stride": "nearest", "mean": "area", "": "area"}.get(method, method)
        np.testing.assert_array_equal(got, downsample_block(tensor.array[3:, 7:], (3, 5), canonical))


def test_foreign_stale_and_bad_ids_refused(tensor):
    cid = plan_read(tensor, None, (2, 2), "area").chunks[0].chunk_id
    with pytest.raises(InvalidChunkId):
        tensor.resolve_chunk_data(b"not-an-id")
    other = ChunkId(**{**cid.__dict__, "array_id": "someone-else"})
    with pytest.raises(InvalidChunkId, match="someone-else"):
        tensor.resolve_chunk_data(other)
    stale = ChunkId(**{**cid.__dict__, "content_version": b"old"})
    with pytest.raises(StaleChunkId, match="re-plan"):
        tensor.resolve_chunk_data(stale)
    outside = ChunkId(**{**cid.__dict__, "stop": (41, 16)})
    with pytest.raises(InvalidChunkId, match="does not fit"):
        tensor.resolve_chunk_data(outside)


def test_precompute_without_levels_is_invalid(tensor):
    with pytest.raises(InvalidArgument, match="no level"):
        plan_read(tensor, None, (2, 2), "precompute")


def test_scaled_read_memory_is_bounded_by_units():
    """An extent 16 units large keeps peak extra memory within the pipeline's bound: the output
    plus (read-ahead workers + 1) units (tracemalloc)."""
    from tensor_server.core.downsample import warm_up
    from tensor_server.core.stream_reduce import default_workers

    arr = np.random.default_rng(0).integers(0, 60000, (2048, 2048), dtype=np.uint16)
    t = ArrayAdapter(arr, chunk_shape=(512, 512))
    unit_bytes = 512 * 512 * 2
    b = Bounds.full(arr.shape)
    t.get_scaled_data(Bounds((0, 0), (1024, 1024)), (4, 4), "area")  # compile outside the window
    warm_up()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = t.get_scaled_data(b, (4, 4), "area")
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert out.shape == (512, 512)
    extent_bytes = arr.nbytes
    assert extent_bytes == 16 * unit_bytes
    bound = (default_workers() + 1) * unit_bytes + out.nbytes + (64 << 10)
    assert peak <= bound, f"peak {peak / unit_bytes:.2f} units"
    # and the naive whole-extent read would not have passed: the check can fail
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        downsample_block(t.get_data(b), (4, 4), "area")
        naive = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert naive > bound
