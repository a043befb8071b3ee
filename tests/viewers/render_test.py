"""The rendering module and the viewer grammars as pure functions: windows (omero block,
percentiles, 8-bit as stored), colours and composites, label colours, the level a region is
read at, IIIF parameters and DeepZoom tile geometry."""
from __future__ import annotations

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter
from tensor_server.core.pyramid import PyramidPolicy
from tensor_server.errors import InvalidArgument, Unimplemented
from tensor_server.render import deepzoom, iiif
from tensor_server.render.colour import label_colours, settings_for, to_rgb8
from tensor_server.render.plane import PlaneView, split_identifier


def test_omero_block_sets_window_colour_and_active_channels():
    meta = {"omero": {"channels": [{"color": "FF0000", "window": {"start": 100, "end": 200}},
                                   {"color": "00FF00", "window": {"start": 0, "end": 10}, "active": False}]}}
    s = settings_for(meta, np.dtype(np.uint16), False, False, 2, lambda: pytest.fail("no window to measure"))
    planes = np.array([[[100, 150, 250]], [[10, 10, 10]]], np.uint16)
    rgb = to_rgb8(planes, s, [0, 1])
    assert rgb[0, :, 0].tolist() == [0, 127, 255] and rgb[0, :, 1].tolist() == [0, 0, 0]


def test_percentile_window_from_the_coarse_level_and_default_colours():
    coarse = np.concatenate([np.arange(1000, dtype=np.float32), [1e9]])[None].repeat(2, 0)
    s = settings_for({}, np.dtype(np.float32), False, False, 2, lambda: coarse)
    assert s.channels[0].start == pytest.approx(np.percentile(coarse[0], 0.1))
    assert s.channels[0].end == pytest.approx(np.percentile(coarse[0], 99.9))
    assert [c.colour for c in s.channels] == [(0, 255, 0), (255, 0, 255)]
    grey = settings_for({}, np.dtype(np.uint8), False, False, 1, lambda: pytest.fail("8-bit is shown as stored"))
    assert to_rgb8(np.array([[[0, 77, 255]]], np.uint8), grey, [0]).tolist() == [[0, 77, 255]]


def test_label_colours_are_stable_and_background_is_black():
    ids = np.array([[0, 5, 5, 7]], np.uint32)
    rgb = label_colours(ids)
    assert rgb[0, 0].tolist() == [0, 0, 0] and rgb[0, 1].tolist() == rgb[0, 2].tolist()
    assert rgb[0, 1].tolist() != rgb[0, 3].tolist() and rgb[0, 1].min() >= 64


def test_a_region_is_read_at_the_level_that_serves_its_size():
    t = ArrayAdapter(np.zeros((2, 4096, 4096), np.uint16), "zyx", chunk_shape=(1, 256, 256))
    t.array_id = "t"
    view = PlaneView.of(t, {"z": 1}, PyramidPolicy(plane_budget_px=256 * 256))
    assert [lv.scale[1] for lv in view.levels] == [1, 2, 4, 8, 16]  # advertised to 256², then none needed
    assert view.level_for(4096 / 256).scale == (1, 16, 16)
    assert view.level_for(5.9).scale == (1, 4, 4) and view.level_for(1.0).scale == (1, 1, 1)
    assert view.fixed == {0: 1}
    # past the advertised pyramid (4 Mpx by default), factors of 2 until the plane fits 256²
    wide = PlaneView.of(t, {}, None)
    assert [lv.scale[2] for lv in wide.levels] == [1, 2, 4, 8, 16] and wide.levels[-1].shape[1:] == (256, 256)
    assert wide.levels[2].shape[1:] == (1024, 1024) and wide.levels[-1].method == "area"
    with pytest.raises(InvalidArgument, match="outside"):
        PlaneView.of(t, {"z": 2}, None)
    assert split_identifier("a/b;z=3;c=1") == ("a/b", {"z": 3, "c": 1})
    with pytest.raises(InvalidArgument):
        split_identifier("a;z=x")


def test_tile_doors_address_the_tile_grid():
    """IIIF and DeepZoom read a level's chunks on the tile grid, the cells a viewer's Flight
    tile reads plan too (core/plan.py), so both doors fill and hit the same cache entries."""
    from tensor_server.core.bounds import Bounds
    from tensor_server.core.level_grid import level_chunk_id
    from tensor_server.core.plan import plan_read

    t = ArrayAdapter(np.zeros((8192, 8192), np.uint8), "yx", chunk_shape=(2048, 4096), read_block_shape=(512, 512))
    t.array_id = "t"
    view = PlaneView.of(t, {}, None)
    assert all(lv.chunks == (512, 512) for lv in view.levels if lv.shape[0] >= 512)
    level = next(lv for lv in view.levels if lv.scale == (4, 4))
    cid = level_chunk_id(t, level, (1, 2))
    assert cid == plan_read(t, Bounds((2048, 4096), (4096, 6144)), (4, 4), level.method).chunks[0].chunk_id


def test_iiif_parameters():
    fmts = ["jpg", "png"]
    r = iiif.parse_request("pct:50,0,50,100", "!100,100", "!90", "gray.png", 1000, 600, fmts)
    assert (r.x, r.y, r.w, r.h, r.out_w, r.out_h, r.mirror, r.rotation, r.quality) == \
        (500, 0, 500, 600, 83, 100, True, 90, "gray")
    def geometry(*params, w=1000, h=600):
        r = iiif.parse_request(*params, w, h, fmts)
        return r.x, r.y, r.w, r.h, r.out_w, r.out_h

    assert geometry("square", ",300", "0", "default.jpg") == (200, 0, 600, 600, 300, 300)
    assert geometry("900,500,400,400", "max", "0", "default.jpg") == (900, 500, 100, 100, 100, 100)
    assert geometry("full", "^pct:200", "0", "default.jpg", w=10, h=6) == (0, 0, 10, 6, 20, 12)
    for bad in [("full", "2000,", "0", "default.jpg"), ("full", "pct:150", "0", "default.jpg"),
                ("0,0,0,10", "max", "0", "default.jpg"), ("full", "max", "0", "fancy.jpg"),
                ("full", "max", "0", "default.gif"), ("full", "max", "-90", "default.jpg")]:
        with pytest.raises(InvalidArgument):
            iiif.parse_request(*bad, 1000, 600, fmts)
    with pytest.raises(Unimplemented):
        iiif.parse_request("full", "max", "45", "default.jpg", 1000, 600, fmts)
    info = iiif.info_json("http://h/iiif/3/x", 32768, 32768, ["jpg", "png", "webp"])
    assert info["tiles"][0]["scaleFactors"] == [1, 2, 4, 8, 16, 32, 64] and info["extraFormats"] == ["webp"]


def test_deepzoom_tiles_overlap_their_neighbours():
    assert deepzoom.max_level(1000, 700) == 10
    t = deepzoom.tile_region(1000, 700, 10, 1, 0)
    assert (t.x, t.y, t.w, t.h, t.out_w, t.out_h) == (253, 0, 256, 255, 256, 255)
    t = deepzoom.tile_region(1000, 700, 9, 1, 1)  # level 9 is 500x350
    assert (t.x, t.y, t.out_w, t.out_h) == (506, 506, 247, 97) and (t.w, t.h) == (494, 194)
    with pytest.raises(InvalidArgument):
        deepzoom.tile_region(1000, 700, 10, 4, 0)
