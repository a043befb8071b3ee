"""The read engine's seam: chunk ids route to get_data, decimated reads or streamed units;
validation happens once and refuses foreign, stale, out-of-range and oversized ids; results
are owned (core/engine.py)."""

from __future__ import annotations

import dataclasses
import tracemalloc

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.core import Bounds, plan_read
from tensor_server.core.downsample import downsample_block
from tensor_server.core.engine import ReadCancelled, ReadEngine
from tensor_server.errors import InvalidArgument, InvalidChunkId, StaleChunkId


class Recording(ArrayAdapter):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls = []

    def get_data(self, bounds=None):
        self.calls.append(("get_data", bounds))
        return super().get_data(bounds)


class Decimating(Recording):
    decimates = True

    def get_decimated_data(self, bounds, step):
        self.calls.append(("get_decimated_data", bounds, tuple(step)))
        return self.array[bounds.to_slices()][tuple(slice(None, None, s) for s in step)].copy()


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
    got_cid, out = ReadEngine().chunk(cid.encode(), tensor)
    assert got_cid == cid
    assert tensor.calls == [("get_data", cid.bounds)]
    np.testing.assert_array_equal(out, tensor.array[cid.bounds.to_slices()])


def test_scaled_chunk_streams_units_through_get_data(tensor):
    plan = plan_read(tensor, None, (2, 4), "mean")
    cid = plan.chunks[-1].chunk_id
    _, out = ReadEngine().chunk(cid.encode(), tensor)
    assert tensor.calls and all(c[0] == "get_data" for c in tensor.calls)
    want = downsample_block(tensor.array[cid.bounds.to_slices()], (2, 4), "area")
    np.testing.assert_array_equal(out, want)
    assert out.shape == plan.chunks[-1].out_bounds.shape


def test_nearest_asks_a_decimating_reader_first():
    arr = np.arange(40 * 50, dtype=np.uint16).reshape(40, 50)
    t = Decimating(arr, chunk_shape=(16, 16))
    MemorySource(t, source_id="dec")
    out = ReadEngine().read(t, Bounds((3, 1), (40, 50)), (3, 4), "stride")
    assert [c[0] for c in t.calls] == ["get_decimated_data"]
    np.testing.assert_array_equal(out, arr[3:40:3, 1:50:4])
    t.calls.clear()
    ReadEngine().read(t, Bounds((3, 1), (40, 50)), (3, 4), "max")
    assert all(c[0] == "get_data" for c in t.calls), "only nearest may be decimated"


def test_results_are_owned(tensor):
    a = tensor.get_data(Bounds((0, 0), (8, 8)))
    a[:] = 0
    b = tensor.get_data(Bounds((0, 0), (8, 8)))
    assert b[1, 1] == 51 and not np.shares_memory(b, tensor.array)
    s = tensor.get_scaled_data(Bounds((0, 0), (8, 8)), (2, 2), "nearest")
    assert s.flags.owndata and s.flags.writeable and not np.shares_memory(s, tensor.array)
    s[:] = 0
    np.testing.assert_array_equal(
        tensor.get_scaled_data(Bounds((0, 0), (8, 8)), (2, 2), "nearest"), tensor.array[0:8:2, 0:8:2]
    )


def test_scaled_read_default_matches_contract_for_every_method(tensor):
    b = Bounds((3, 7), (40, 50))
    for method in ["nearest", "area", "min", "max", "mode", "median", "stride", "mean", ""]:
        got = tensor.get_scaled_data(b, (3, 5), method)
        canonical = {"stride": "nearest", "mean": "area", "": "area"}.get(method, method)
        np.testing.assert_array_equal(got, downsample_block(tensor.array[3:, 7:], (3, 5), canonical))


def test_foreign_stale_and_bad_ids_refused(tensor):
    engine = ReadEngine()
    cid = plan_read(tensor, None, (2, 2), "area").chunks[0].chunk_id
    with pytest.raises(InvalidChunkId):
        engine.chunk(b"not-an-id", tensor)
    other = dataclasses.replace(cid, array_id="someone-else")
    with pytest.raises(InvalidChunkId, match="someone-else"):
        engine.chunk(other, tensor)
    stale = dataclasses.replace(cid, content_version=b"old")
    with pytest.raises(StaleChunkId, match="re-plan"):
        engine.chunk(stale, tensor)
    outside = dataclasses.replace(cid, stop=(41, 16))
    with pytest.raises(InvalidChunkId, match="does not fit"):
        engine.chunk(outside, tensor)
    assert tensor.calls == [], "nothing was read for a refused id"


def test_forged_whole_tensor_and_huge_scale_ids_are_refused():
    """Chunk ids are not secret (the checksum is public): an id whose extent is larger than
    any plan mints, or whose scale is beyond the tensor, is refused before any read."""
    arr = np.zeros((4096, 4096), np.uint8)
    t = Recording(arr, chunk_shape=(256, 256))
    MemorySource(t, source_id="forged")
    engine = ReadEngine()
    real = plan_read(t).chunks[0].chunk_id
    whole = dataclasses.replace(real, start=(0, 0), stop=(4096, 4096))
    with pytest.raises(InvalidChunkId, match="larger than one chunk"):
        engine.chunk(whole.encode(), t)
    scaled = plan_read(t, None, (4, 4), "area").chunks[0].chunk_id
    engine.chunk(scaled, t)  # a real scaled id is served
    t.calls.clear()
    too_wide = dataclasses.replace(scaled, stop=(4096, 4096))
    with pytest.raises(InvalidChunkId, match="larger than one chunk"):
        engine.chunk(too_wide, t)
    huge = dataclasses.replace(scaled, scale=(1 << 28, 1 << 28))
    with pytest.raises(InvalidChunkId, match="scale"):
        engine.chunk(huge, t)
    with pytest.raises(InvalidArgument, match="exceeds the axis extent"):
        plan_read(t, None, (1 << 20, 1), "area")
    with pytest.raises(InvalidArgument, match="exceeds the axis extent"):
        engine.read(t, None, (1, 1 << 20), "area")
    assert t.calls == []
    # a halving ladder past a short axis stays valid: 5 planes at scale 8
    short = ArrayAdapter(np.ones((5, 64, 64), np.uint8), dim_labels="zyx")
    assert engine.read(short, None, (8, 8, 8), "area").shape == (1, 8, 8)


def test_malformed_ids_are_invalid_argument_not_internal(tensor):
    import json
    import zlib

    def forge(body: bytes) -> bytes:
        return b"tsc\x01" + zlib.crc32(body).to_bytes(4, "little") + body

    infinite = json.dumps(
        {"a": "seam", "s": [0, 0], "e": [1e999, 1], "k": [1, 1], "m": "none", "v": "00", "p": 1}
    ).encode()
    deep = b"[" * 100_000 + b"]" * 100_000
    for raw in (forge(infinite), forge(deep), forge(b"{}"), b"x" * (1 << 20)):
        with pytest.raises(InvalidChunkId) as info:
            ReadEngine().chunk(raw, tensor)
        assert len(str(info.value)) < 300, "a refused id is not echoed back whole"


def test_a_cancelled_read_stops_between_units():
    arr = np.zeros((512, 512), np.uint16)
    t = Recording(arr, chunk_shape=(64, 64))
    MemorySource(t, source_id="cancel")
    calls = {"n": 0}

    def cancelled():
        calls["n"] += 1
        return calls["n"] > 2

    cid = plan_read(t, None, (8, 8), "area").chunks[0].chunk_id
    with pytest.raises(ReadCancelled):
        ReadEngine(workers=1).chunk(cid, t, cancelled=cancelled)
    assert len(t.calls) == 2, "two units were read, then the read stopped"
    t.calls.clear()
    _, out = ReadEngine(workers=1).chunk(cid, t, cancelled=lambda: False)
    assert len(t.calls) == 64 and out.shape == (64, 64)


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
