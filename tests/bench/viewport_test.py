"""The viewport bench asks every path for the same tiles: up to 9×7 tiles of 512 level pixels
around the centre, clipped at the image's edge, covering a contiguous block."""
from __future__ import annotations

import pytest

from tensor_server.bench.viewport import TILE, viewport


@pytest.mark.parametrize("side, factor, count", [(32768, 1, 63), (32768, 4, 63), (32768, 8, 56), (32768, 16, 16), (32768, 64, 1),
                                                 (8192, 1, 63), (8192, 4, 16), (8192, 16, 1), (1000, 1, 4)])
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
