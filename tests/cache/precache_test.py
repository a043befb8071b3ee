"""The precacher (tensor_server/cache/precache.py): a client's read only notes the chunk; the
worker plans its neighbours (never the client's thread), warms them into the cache, and does
not plan around the same chunk twice."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter
from tensor_server.cache import CacheManager
from tensor_server.cache.precache import Precacher
from tensor_server.core.engine import ReadEngine
from tensor_server.core.plan import plan_read

DATA = np.arange(256 * 256, dtype=np.uint16).reshape(256, 256)


@pytest.fixture
def precacher(tmp_path):
    cache = CacheManager(tmp_path / "cache", max_total_bytes=64 << 20)
    p = Precacher(ReadEngine(cache), budget_bytes=64 << 20)
    yield p, cache
    p.close()
    cache.close()


def _settle(p: Precacher) -> None:
    deadline = time.monotonic() + 30
    while not p.idle():
        assert time.monotonic() < deadline, "the precacher did not settle"
        time.sleep(0.02)


def test_neighbours_are_planned_on_the_worker_and_warmed(precacher, monkeypatch):
    p, cache = precacher
    tensor = ArrayAdapter(DATA, "yx", chunk_shape=(64, 64))
    chunks = [pc.chunk_id for pc in plan_read(tensor).chunks]
    middle = chunks[5]  # row 1, column 1 of the 4x4 grid
    planned_on: list[str] = []
    plan = p._next_reads

    def recording(t, cid):
        planned_on.append(threading.current_thread().name)
        return plan(t, cid)

    monkeypatch.setattr(p, "_next_reads", recording)
    p.after_read(tensor, middle)
    assert planned_on == [], "after_read planned on the client's thread"
    _settle(p)
    assert planned_on == ["precache"]
    around = [
        cid for cid in chunks if abs(cid.start[0] - middle.start[0]) <= 64 and abs(cid.start[1] - middle.start[1]) <= 64
    ]
    assert len(around) == 9 and cache.contains_all([c.encode() for c in around if c != middle])
    assert not cache.contains_all([chunks[15].encode()]), "a chunk two away is not a neighbour"
    p.after_read(tensor, middle)  # read again: its neighbourhood was planned already
    _settle(p)
    assert planned_on == ["precache"]
    hits = p.stats["hits"]
    p.after_read(tensor, chunks[0])  # a chunk the precacher warmed: counted as its hit
    assert p.stats["hits"] == hits + 1


def test_a_read_the_client_made_itself_holds_the_worker_off_too(precacher, monkeypatch):
    """A chunk the fast path offers (``chunk_locate``) is read by the client from the segment,
    outside any ``client_read`` bracket: its ``after_read`` still starts the quiet time, so a
    burst of such reads is not shared with neighbour work (six SDK clients' tiles were)."""
    from tensor_server.cache import precache

    p, _ = precacher
    monkeypatch.setattr(precache, "QUIET_S", 30.0)
    tensor = ArrayAdapter(DATA, "yx", chunk_shape=(64, 64))
    planned: list[object] = []
    monkeypatch.setattr(p, "_next_reads", lambda t, cid: planned.append(cid) or [])
    p.after_read(tensor, plan_read(tensor).chunks[5].chunk_id)
    time.sleep(0.5)  # the worker, idle, would plan at once were the read not counted
    assert planned == [] and not p.idle()
    started = time.monotonic()
    p.close()  # the worker waits out the quiet time, and stopping it ends that wait
    assert time.monotonic() - started < 5 and not p._thread.is_alive()


def test_a_tiles_neighbours_are_tiles(precacher):
    """A viewer reading 512² tiles (the tile grid, core/plan.py) pans to the next tiles: the
    neighbours warmed are those tiles, not the 2048×4096 transfer chunks around them."""
    from tensor_server.core.bounds import Bounds
    from tensor_server.core.plan import grid_of

    p, cache = precacher
    arr = np.arange(8192 * 8192, dtype=np.uint32).astype(np.uint8).reshape(8192, 8192)
    tensor = ArrayAdapter(arr, "yx", chunk_shape=(2048, 4096), read_block_shape=(512, 512))
    tile = plan_read(tensor, Bounds((2048, 2048), (2560, 2560))).chunks[0].chunk_id
    assert tile.bounds == Bounds((2048, 2048), (2560, 2560)) and grid_of(tensor, tile) == "tile"
    assert grid_of(tensor, plan_read(tensor).chunks[0].chunk_id) == "transfer"
    p.after_read(tensor, tile)
    _settle(p)
    for dy in (-512, 0, 512):
        for dx in (-512, 0, 512):
            if dy or dx:
                box = Bounds((2048 + dy, 2048 + dx), (2560 + dy, 2560 + dx))
                assert cache.contains_all([plan_read(tensor, box).chunks[0].chunk_id.encode()]), box
    transfer = plan_read(tensor, Bounds((2048, 2048), (2560, 2560)), grid="transfer").chunks[0].chunk_id
    assert not cache.contains_all([transfer.encode()])


def test_kept_pixels_are_stored_first_and_never_dropped(tmp_path):
    """A door's computed tiles (``keep``) are stored ahead of speculative work, and a full
    neighbour queue never drops them: the tile a viewer saw is the one it asks for again."""
    from tensor_server.core.bounds import Bounds

    cache = CacheManager(tmp_path / "cache", max_total_bytes=256 << 20)
    p = Precacher(ReadEngine(cache), budget_bytes=64 << 20, max_queue=4)
    try:
        arr = np.random.default_rng(1).integers(0, 255, (8192, 8192), dtype=np.uint8)
        tensor = ArrayAdapter(arr, "yx", chunk_shape=(2048, 4096), read_block_shape=(512, 512))
        tiles = [
            plan_read(tensor, Bounds((r * 512, c * 512), ((r + 1) * 512, (c + 1) * 512))).chunks[0].chunk_id
            for r in range(4)
            for c in range(4)
        ]
        with p.client_read():  # a burst: nothing runs until it ends
            for cid in tiles:
                p.keep(tensor, cid, arr[cid.bounds.to_slices()])
        _settle(p)
        assert cache.contains_all([cid.encode() for cid in tiles])
        assert p.stats["dropped"] > 0, "the neighbour queue overflowed, and the kept tiles stayed"
        for cid in tiles:
            np.testing.assert_array_equal(cache.get(cid.encode()), arr[cid.bounds.to_slices()])
    finally:
        p.close()
        cache.close()
