"""``ServingRuntime.level_region``: a cold tile is computed from its own extent and its chunks
are queued on the precacher; a warm one is assembled from the cached chunks. Both are the
pixels the level's chunks hold (the NumPy oracle: the chunks, computed by the engine)."""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.cache import CacheManager
from tensor_server.catalog import Catalog
from tensor_server.config import Settings
from tensor_server.core.bounds import Bounds
from tensor_server.core.chunk_id import ChunkId
from tensor_server.core.level_grid import grid_levels, level_chunk_id, read_level_region
from tensor_server.service import Caller, ServingRuntime

DATA = np.random.default_rng(7).integers(0, 60000, (700, 900), dtype=np.uint16)
#: level regions (y0, x0, y1, x1) as fractions of the level: interior, unaligned, the far edge
REGIONS = [(0.0, 0.0, 0.2, 0.3), (0.31, 0.17, 0.52, 0.61), (0.7, 0.8, 1.0, 1.0)]


@pytest.fixture
def runtime(tmp_path):
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(DATA, "yx", chunk_shape=(350, 450)), source_id="img"))
    cat.first_scan_done.set()
    cache = CacheManager(tmp_path / "cache", max_total_bytes=64 << 20)
    rt = ServingRuntime(cat, Settings(coarsest_tile=64), cache=cache)  # levels down to 64²
    yield rt
    rt.close()
    cache.close()
    cat.close()


def _settle(rt):
    deadline = time.monotonic() + 60
    while not rt.precacher.idle():
        assert time.monotonic() < deadline, "the precacher did not settle"
        time.sleep(0.02)


def _region(level, frac):
    h, w = level.shape
    y0, x0, y1, x1 = frac
    return Bounds((int(y0 * h), int(x0 * w)), (max(int(y1 * h), int(y0 * h) + 1), max(int(x1 * w), int(x0 * w) + 1)))


def test_cold_and_warm_regions_are_the_chunks_pixels(runtime, monkeypatch):
    caller = Caller()
    direct, read = [], runtime.read
    monkeypatch.setattr(runtime, "read", lambda *a, **k: direct.append(a[1]) or read(*a, **k))
    tensor, _ = runtime.tensor("img", caller)
    levels = grid_levels(tensor, runtime.policy)
    assert len(levels) > 2 and any(lv.shape != lv.chunks for lv in levels)
    for level in levels:
        for frac in REGIONS:
            region = _region(level, frac)
            want = read_level_region(tensor, level, region, lambda cid: runtime.engine.chunk(cid, tensor)[1])
            runtime.cache.clear()
            cold = runtime.level_region(tensor, level, region, caller)
            np.testing.assert_array_equal(cold, want, err_msg=f"cold, level {level.path}, {region}")
            _settle(runtime)
            warm = runtime.level_region(tensor, level, region, caller)
            np.testing.assert_array_equal(warm, want, err_msg=f"warm, level {level.path}, {region}")
    assert len(direct) >= 2 * len(REGIONS), "most cold regions are computed from their own extent"


def test_a_cold_tile_reads_its_extent_and_queues_its_chunks(runtime, monkeypatch):
    caller = Caller()
    tensor, _ = runtime.tensor("img", caller)
    level = grid_levels(tensor, runtime.policy)[0]
    assert level.chunks[0] >= 256 and level.chunks[1] >= 256  # one chunk ≫ a 64² tile
    region = Bounds((0, 0), (64, 64))
    chunk_reads = []
    monkeypatch.setattr(runtime, "chunk", lambda *a, **k: chunk_reads.append(a) or pytest.fail("read a chunk"))
    runtime.level_region(tensor, level, region, caller)  # cold: no chunk read, the chunk queued
    assert runtime.precacher.stats["scheduled"] >= 1
    _settle(runtime)
    monkeypatch.undo()
    assert runtime.cache.contains_all([level_chunk_id(tensor, level, (0, 0)).encode()])
    np.testing.assert_array_equal(runtime.level_region(tensor, level, region, caller), DATA[:64, :64])


def test_a_cold_tile_that_is_its_chunk_is_stored_not_recomputed(tmp_path):
    """On the tile grid a 512² tile is exactly one chunk: it is computed from its extent, and
    the precacher stores those pixels when idle instead of computing the chunk again."""
    from tensor_server.render.plane import PlaneView

    data = np.random.default_rng(3).integers(0, 255, (4096, 4096), dtype=np.uint8)
    source = ArrayAdapter(data, "yx", chunk_shape=(2048, 4096), read_block_shape=(512, 512))
    cat = Catalog([])
    cat.add_source(MemorySource(source, source_id="tiles"))
    cat.first_scan_done.set()
    cache = CacheManager(tmp_path / "cache", max_total_bytes=64 << 20)
    rt = ServingRuntime(cat, Settings(), cache=cache)
    try:
        caller = Caller()
        tensor, _ = rt.tensor("tiles", caller)
        level = next(lv for lv in PlaneView.of(tensor, {}, rt.policy).levels if lv.scale == (2, 2))
        assert level.chunks == (512, 512)
        cid = level_chunk_id(tensor, level, (1, 2))
        computed, chunk = [], rt.engine.chunk

        def recording(c, t, **k):
            computed.append(ChunkId.decode(c) if isinstance(c, bytes) else c)
            return chunk(c, t, **k)

        rt.engine.chunk = recording
        tile = rt.level_region(tensor, level, Bounds((512, 1024), (1024, 1536)), caller)
        want = data[1024:2048, 2048:3072].reshape(512, 2, 512, 2).astype(np.float64).mean(axis=(1, 3))
        np.testing.assert_array_equal(tile, np.round(want).astype(np.uint8))  # area: round half to even
        _settle(rt)
        assert rt.cache.contains_all([cid.encode()]), "the tile's chunk is stored"
        assert cid not in computed and len(computed) > 0, "its neighbours were computed, the tile was not again"
        np.testing.assert_array_equal(rt.cache.get(cid.encode()), tile)
    finally:
        rt.close()
        cache.close()
        cat.close()


def _recorded(read, starts, tensor, level, region, *args):
    """``read`` (``level_region``) noting each region's first channel in ``starts``."""
    starts.append(region.start[0])
    return read(tensor, level, region, *args)


def test_level_channels_are_the_channels_level_regions_in_the_order_asked(tmp_path, monkeypatch):
    """A render spec's tile: the channels asked, in that order (not sorted, one repeated), the
    pixels ``level_region`` gives each alone, cold (one ``level_region`` per run of neighbouring
    channels) and warm (every chunk cached: read straight into the answer, no ``level_region``)."""
    data = np.random.default_rng(5).integers(0, 60000, (6, 300, 400), dtype=np.uint16)
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(data, "cyx", chunk_shape=(1, 128, 128)), source_id="chans"))
    cat.first_scan_done.set()
    cache = CacheManager(tmp_path / "cache", max_total_bytes=64 << 20)
    rt = ServingRuntime(cat, Settings(coarsest_tile=64), cache=cache)
    try:
        caller = Caller()
        tensor, _ = rt.tensor("chans", caller)
        order = [4, 1, 2, 1]
        for level in grid_levels(tensor, rt.policy)[:2]:
            region = Bounds((0, 10, 20), (level.shape[0], level.shape[1] - 5, level.shape[2] - 7))
            want = np.stack([rt.level_region(tensor, level, region.with_axis(0, i, i + 1), caller)[0] for i in order])
            rt.cache.clear()
            runs: list[int] = []
            monkeypatch.setattr(rt, "level_region", functools.partial(_recorded, rt.level_region, runs))
            cold = rt.level_channels(tensor, level, region, 0, order, caller)
            monkeypatch.undo()
            np.testing.assert_array_equal(cold, want, err_msg=f"cold, level {level.path}")
            assert sorted(runs) == [1, 4]  # channels 1-2 in one read, 4 in another
            _settle(rt)
            monkeypatch.setattr(rt, "level_region", lambda *a, **k: pytest.fail("a warm channel was read apart"))
            warm = rt.level_channels(tensor, level, region, 0, order, caller)
            monkeypatch.undo()
            np.testing.assert_array_equal(warm, want, err_msg=f"warm, level {level.path}")
            assert warm.shape == (4, *region.shape[1:]) and len(np.unique(warm[0])) > 100
    finally:
        rt.close()
        cache.close()
        cat.close()
