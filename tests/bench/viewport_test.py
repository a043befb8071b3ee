"""The viewport bench asks every path for the same tiles: up to 9×7 tiles of 512 level pixels
around the centre, clipped at the image's edge, covering a contiguous block."""

from __future__ import annotations

import pytest

from tensor_server.bench.viewport import TILE, viewport


@pytest.mark.parametrize(
    "side, factor, count",
    [
        (32768, 1, 63),
        (32768, 4, 63),
        (32768, 8, 56),
        (32768, 16, 16),
        (32768, 64, 1),
        (8192, 1, 63),
        (8192, 4, 16),
        (8192, 16, 1),
        (1000, 1, 4),
    ],
)
def test_the_viewport_is_a_centred_block_of_tiles_clipped_to_the_image(side, factor, count):
    tiles = viewport(side, factor)
    assert len(tiles) == count
    region = TILE * factor
    for y, x, h, w in tiles:
        assert y % region == 0 and x % region == 0
        assert (h, w) == (min(region, side - y), min(region, side - x)) and h > 0 and w > 0
    ys, xs = sorted({t[0] for t in tiles}), sorted({t[1] for t in tiles})
    assert len(ys) * len(xs) == count  # a full block: every row has every column
    assert all(b - a == region for a, b in zip(ys, ys[1:])) and all(b - a == region for a, b in zip(xs, xs[1:]))
    n = -(-side // region)
    assert xs[0] // region in (max(0, n // 2 - 4),) and ys[0] // region == max(0, n // 2 - 3)


def test_ours_runs_against_a_server_process_of_its_own(tmp_path):
    """The bench's measured paths run end to end (the ``http`` bench once crashed before
    timing anything, unnoticed): a ``serve`` process over the fixtures, the SDK's tile reads
    and the IIIF tiles, cold then warm; and the server process answers the fixture's pixels."""
    import math

    import numpy as np
    import zarr
    from biopb.tensor import TensorFlightClient

    from tensor_server.bench.server_process import server_process
    from tensor_server.bench.viewport import _ours, write_fixtures

    write_fixtures(tmp_path, 1024)
    got = _ours(tmp_path, "zarr", viewport(1024, 1), 1, 2)
    assert set(got) == {"cold_total", "cold_p50", "warm_total", "warm_p50", "iiif_total", "iiif_p50"}
    assert all(math.isfinite(v) and v > 0 for v in got.values())
    with server_process([tmp_path / "big.tif"], tmp_path / "cache") as srv:
        client = TensorFlightClient(srv.location)
        aid = client.query("SELECT source_id FROM sources").to_pylist()[0]["source_id"]
        tile = client.get_array(aid, slice_hint=(slice(512, 1024), slice(0, 512)))
        np.testing.assert_array_equal(tile, zarr.open_array(str(tmp_path / "big.zarr"), mode="r")[512:1024, 0:512])
