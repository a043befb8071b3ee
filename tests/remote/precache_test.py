"""The precacher over an image opened by URL: after a viewer's read of a tile, the worker
fetches from the host and computes the tile's neighbours and the next coarser level over the
same region, so the viewer's pan and zoom out that follow ask the host nothing."""

from __future__ import annotations

import time

import numpy as np

from tensor_server.adapters.url_source import open_url_source
from tensor_server.cache import CacheManager
from tensor_server.cache.precache import Precacher
from tensor_server.core.bounds import Bounds
from tensor_server.core.engine import ReadEngine
from tensor_server.core.plan import plan_read
from tensor_server.testing.range_host import range_host
from tests.remote.conftest import remote_config


def _write(path, image: np.ndarray, levels: int) -> None:
    """A yx OME-Zarr 0.4 of ``image`` with levels at factors 2, 4, ... (256² chunks)."""
    import zarr

    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    for k in range(levels):
        root.create_array(str(k), data=np.ascontiguousarray(image[:: 2**k, :: 2**k]), chunks=(256, 256))
    root.attrs["multiscales"] = [
        {
            "version": "0.4",
            "axes": [{"name": "y", "type": "space"}, {"name": "x", "type": "space"}],
            "datasets": [
                {"path": str(k), "coordinateTransformations": [{"type": "scale", "scale": [2.0**k, 2.0**k]}]}
                for k in range(levels)
            ],
        }
    ]


def test_a_tiles_neighbours_and_the_coarser_level_are_warmed_from_the_host(tmp_path):
    image = np.random.default_rng(11).integers(0, 60000, (4096, 4096), dtype=np.uint16)
    _write(tmp_path / "img.ome.zarr", image, 3)
    with (
        range_host(tmp_path) as host,
        remote_config(tmp_path / "bytes"),
        CacheManager(tmp_path / "chunks", max_total_bytes=256 << 20) as cache,
    ):
        tensor = open_url_source(f"{host.url}/img.ome.zarr", "img").tensor("image")
        engine = ReadEngine(cache)
        precacher = Precacher(engine, budget_bytes=64 << 20)
        try:
            tile = plan_read(tensor, Bounds((1024, 1024), (1536, 1536))).chunks[0].chunk_id  # one 512² tile
            assert tile.bounds == Bounds((1024, 1024), (1536, 1536))
            engine.chunk(tile, tensor)
            host.reset()
            precacher.after_read(tensor, tile)
            deadline = time.monotonic() + 60
            while not precacher.idle():
                assert time.monotonic() < deadline, "the precacher did not settle"
                time.sleep(0.02)
            assert host.count() > 0 and precacher.stats["warmed"] > 0, precacher.stats
            host.reset()
            pan = plan_read(tensor, Bounds((1024, 1536), (1536, 2048))).chunks
            zoom_out = plan_read(tensor, Bounds((1024, 1024), (1536, 1536)), (2, 2), "precompute").chunks
            assert cache.contains_all([c.chunk_id.encode() for c in (*pan, *zoom_out)])
            got = [engine.chunk(c.chunk_id, tensor)[1] for c in (*pan, *zoom_out)]
            assert host.count() == 0, host.requests
            assert len(pan) == 1 and len(zoom_out) == 1 and pan[0].chunk_id != tile, (pan, tile)
            np.testing.assert_array_equal(got[0], image[pan[0].chunk_id.bounds.to_slices()])
            level = zoom_out[0].chunk_id
            want = image[::2, ::2][level.start[0] : level.stop[0], level.start[1] : level.stop[1]]
            np.testing.assert_array_equal(got[1], want)
        finally:
            precacher.close()
