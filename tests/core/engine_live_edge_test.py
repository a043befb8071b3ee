"""Computed levels of a growing tensor (issue 46, core/engine.py ``ReadEngine.settled``): a
chunk reaching the live edge (the storage cell of the newest frame), at level 0 or a coarse
level, is served but never cached, so an overview read after the acquisition equals the
reduction of the final data; chunks of frames before it are cached and stay hits."""

from __future__ import annotations

import numpy as np
import zarr

from tensor_server.adapters.zarr import ZarrSource
from tensor_server.cache import CacheManager
from tensor_server.core.bounds import Bounds
from tensor_server.core.downsample import downsample_block
from tensor_server.core.engine import ReadEngine
from tensor_server.core.plan import plan_read

SCALE = (2, 4, 4)


def frame(i: int) -> np.ndarray:
    rng = np.random.default_rng(i)
    return rng.integers(0, 60000, (32, 32), dtype=np.uint16)


def read_plan(engine: ReadEngine, tensor, scale=None, method=None) -> tuple[list, np.ndarray]:
    """(the plan's chunks, their pixels assembled)."""
    plan = plan_read(tensor, None, scale, method)
    out = np.zeros(plan.shape, tensor.dtype)
    for pc in plan.chunks:
        _, data = engine.chunk(pc.chunk_id, tensor)
        out[pc.out_bounds.to_slices()] = data
    return plan.chunks, out


def test_a_coarse_chunk_over_frames_being_written_is_never_cached(tmp_path):
    z = zarr.create_array(str(tmp_path / "a.zarr"), shape=(3, 32, 32), chunks=(1, 32, 32), dtype="uint16")
    for i in range(3):
        z[i] = frame(i)
    tensor = ZarrSource(tmp_path / "a.zarr").tensor()
    tensor.__dict__["chunk_shape"] = (1, 32, 32)  # a coarse chunk covers 2 frames
    with CacheManager(tmp_path / "cache") as cache:
        engine = ReadEngine(cache)
        for n in range(4, 10):  # the writer appends frames; the overview is read after each
            z.resize((n, 32, 32))
            z[n - 1] = frame(n - 1)
            assert tensor.refresh_extent() is None and tensor.shape[0] == n
            chunks, coarse = read_plan(engine, tensor, SCALE, "area")
            final_so_far = np.stack([frame(i) for i in range(n)])
            np.testing.assert_array_equal(coarse, downsample_block(final_so_far, SCALE, "area"))
            assert len(chunks) == -(-n // 2)
            for pc in chunks:
                cached = cache.contains_all([pc.chunk_id.encode()])
                at_edge = pc.chunk_id.bounds.stop[0] == n  # reaches the newest frame's cell
                assert cached == (not at_edge), (n, pc.chunk_id.bounds)
        hits = cache.cache_stats()["hits"]
        _, level0 = read_plan(engine, tensor)  # level 0 after the acquisition
        np.testing.assert_array_equal(level0, np.stack([frame(i) for i in range(9)]))
        _, again = read_plan(engine, tensor, SCALE, "area")
        assert cache.cache_stats()["hits"] > hits, "the settled coarse chunks are hits"
        np.testing.assert_array_equal(again, downsample_block(np.stack([frame(i) for i in range(9)]), SCALE, "area"))


def test_the_newest_frame_is_not_cached_at_level_0_and_earlier_frames_stay_hits(tmp_path):
    z = zarr.create_array(str(tmp_path / "a.zarr"), shape=(2, 32, 32), chunks=(1, 32, 32), dtype="uint16")
    z[0], z[1] = frame(0), frame(1)
    tensor = ZarrSource(tmp_path / "a.zarr").tensor()
    tensor.__dict__["chunk_shape"] = (1, 32, 32)  # one transfer chunk per frame
    with CacheManager(tmp_path / "cache") as cache:
        engine = ReadEngine(cache)
        first, _ = read_plan(engine, tensor)
        z.resize((3, 32, 32))
        z[2] = frame(2)
        tensor.refresh_extent()
        chunks, pixels = read_plan(engine, tensor)
        np.testing.assert_array_equal(pixels[2], frame(2))
        assert [pc.chunk_id for pc in chunks[:2]] == [pc.chunk_id for pc in first], "earlier frames keep their ids"
        assert cache.contains_all([pc.chunk_id.encode() for pc in chunks[:2]])
        assert not cache.contains_all([chunks[2].chunk_id.encode()]), "the newest frame's chunk is not stored"
        assert not tensor.settled(Bounds((2, 0, 0), (3, 32, 32)))
