"""The remote bench runs end to end at a tiny size: every contender answers the same pixels,
the second sessions ask the host nothing, the peers read tile by tile as ours does, and the zoom after ``warm`` is a cache hit (counts,
not timings); a view read as one region is the union of its tiles."""

from __future__ import annotations

from tensor_server.bench.remote import _views, measure, tiles_of


def test_a_tiny_run_reads_equal_pixels_and_the_second_session_asks_nothing():
    """64² tiles, 3 levels (1792 × 2304): the coarsest level is the 7 × 9 tiles, the zoom
    after the warm is level 1's bottom-right corner, which the first view never read."""
    result = measure(64, 3, latency=0.0, concurrency=4, reads="tiles")
    assert result["shape"] == (1792, 2304)
    rows = {(r["format"], r["contender"]): r for r in result["rows"]}
    ours = ("ours, cold", "ours, second", "ours, second, bytes only", "ours, local file, second (floor)")
    peers = {"zarr": "zarr-python + fsspec", "tiff": "tifffile + fsspec"}
    assert sorted(rows) == sorted([(k, c) for k in peers for c in ours] + list(peers.items()))
    for kind in peers:
        assert all(rows[kind, c]["equal"] is True for c in ours), kind
        assert rows[kind, "ours, cold"]["view requests"] > 0 and rows[kind, "ours, cold"]["open requests"] > 0
        for again in ours[1:]:
            assert (rows[kind, again]["open requests"], rows[kind, again]["view requests"]) == (0, 0)
        assert rows[kind, peers[kind]]["open requests"] > 0
        assert rows[kind, "ours, local file, second (floor)"]["vs floor"] == "1.00x"
        assert rows[kind, "ours, second"]["target"] == "<= 0.05x" and rows[kind, "ours, cold"]["target"] == "<= 1.0x"
        warm = result["warm"][kind]
        assert warm["chunks"] == 63 and warm["computed"] > 0 and warm["warm_requests"] > 0, warm
        assert (warm["zoom_requests"], warm["zoom_misses"]) == (0, 0), warm
    # the peer reads tile by tile too: zarr-python asks for the shard index and the chunk a tile
    assert rows["zarr", peers["zarr"]]["view requests"] == 2 * 2 * 63


def test_a_view_is_its_tiles_or_their_union():
    tiles = tiles_of(256, 2, (1792, 2304), "top-left")
    assert len(tiles) == 63 and tiles[0] == (0, 0, 512, 512) and tiles[-1] == (6 * 512, 8 * 512, 512, 512)
    corner = tiles_of(256, 1, (3584, 4608), "bottom-right")
    assert corner[0] == (7 * 256, 9 * 256, 256, 256) and corner[-1] == (13 * 256, 17 * 256, 256, 256)
    views = _views(256, 2, (3584, 4608), "views")
    assert views["first"]["coarsest"] == (2, [(0, 0, 3584, 4608)])
    assert views["first"]["level-0 corner"] == (1, [(0, 0, 1792, 2304)])
    assert views["next"] == (1, [(1792, 2304, 1792, 2304)])
    assert _views(256, 2, (3584, 4608), "tiles")["first"]["coarsest"] == (2, tiles)
