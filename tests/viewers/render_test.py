"""The rendering module and the viewer grammars as pure functions: windows (omero block,
percentiles, 8-bit as stored), colours and composites, label colours, the level a region is
read at, IIIF parameters and DeepZoom tile geometry."""

from __future__ import annotations

import numpy as np
import pytest
from tensor_server_kernels import composite_reference

from tensor_server.adapters.memory import ArrayAdapter
from tensor_server.core.pyramid import PyramidPolicy
from tensor_server.errors import InvalidArgument, Unimplemented
from tensor_server.render import deepzoom, iiif
from tensor_server.render.colour import label_colours, settings_for, shown_channels
from tensor_server.render.plane import MAX_LEVEL_READ_PX, READ_PER_OUTPUT_PX, PlaneView, split_identifier


def test_omero_block_sets_window_colour_and_active_channels():
    meta = {
        "omero": {
            "channels": [
                {"color": "FF0000", "window": {"start": 100, "end": 200}},
                {"color": "00FF00", "window": {"start": 0, "end": 10}, "active": False},
            ]
        }
    }
    s = settings_for(meta, np.dtype(np.uint16), False, False, 2, lambda: pytest.fail("no window to measure"))
    planes = np.array([[[100, 150, 250]], [[10, 10, 10]]], np.uint16)
    positions, channels = shown_channels(s, [0, 1])  # the inactive green one is not drawn
    assert positions == [0] and channels == [composite_reference.Channel(100.0, 200.0, (1.0, 0.0, 0.0))]
    rgb = composite_reference.composite(planes[positions], channels)
    assert rgb[0, :, 0].tolist() == [0, 128, 255] and rgb[0, :, 1].tolist() == [0, 0, 0]


def test_percentile_window_from_the_coarse_level_and_default_colours():
    coarse = np.concatenate([np.arange(1000, dtype=np.float32), [1e9]])[None].repeat(2, 0)
    s = settings_for({}, np.dtype(np.float32), False, False, 2, lambda: coarse)
    assert s.channels[0].start == pytest.approx(np.percentile(coarse[0], 0.1))
    assert s.channels[0].end == pytest.approx(np.percentile(coarse[0], 99.9))
    assert [c.colour for c in s.channels] == [(0, 255, 0), (255, 0, 255)]
    grey = settings_for({}, np.dtype(np.uint8), False, False, 1, lambda: pytest.fail("8-bit is shown as stored"))
    positions, channels = shown_channels(grey, [0])
    grey_rgb = composite_reference.composite(np.array([[[0, 77, 255]]], np.uint8)[positions], channels)
    assert grey_rgb[..., 0].tolist() == grey_rgb[..., 2].tolist() == [[0, 77, 255]]


def test_label_colours_are_stable_and_background_is_black():
    ids = np.array([[0, 5, 5, 7]], np.uint32)
    rgb = label_colours(ids)
    assert rgb[0, 0].tolist() == [0, 0, 0] and rgb[0, 1].tolist() == rgb[0, 2].tolist()
    assert rgb[0, 1].tolist() != rgb[0, 3].tolist() and rgb[0, 1].min() >= 64


def test_a_region_is_read_at_the_level_that_serves_its_size():
    t = ArrayAdapter(np.zeros((2, 4096, 4096), np.uint16), "zyx", chunk_shape=(1, 256, 256))
    t.array_id = "t"
    view = PlaneView.of(t, {"z": 1}, PyramidPolicy(coarsest_tile=256))
    assert [lv.scale[1] for lv in view.levels] == [1, 2, 4, 8, 16]  # published down to one 256² plane
    assert view.level_for(0, 0, 4096, 4096, 256, 256).scale == (1, 16, 16)
    assert view.level_for(0, 0, 590, 590, 100, 100).scale == (1, 4, 4)
    assert view.level_for(0, 0, 4096, 4096, 4096, 4096).scale == (1, 1, 1)
    assert view.fixed == {0: 1}
    # by default past Flight's pyramid (4 Mpx), factors of 2 until the plane fits one 512² tile
    wide = PlaneView.of(t, {}, None)
    assert [lv.scale[2] for lv in wide.levels] == [1, 2, 4, 8] and wide.levels[-1].shape[1:] == (512, 512)
    assert wide.levels[2].shape[1:] == (1024, 1024) and wide.levels[-1].method == "area"
    with pytest.raises(InvalidArgument, match="outside"):
        PlaneView.of(t, {"z": 2}, None)
    assert split_identifier("a/b;z=3;c=1") == ("a/b", {"z": 3, "c": 1})
    for bad in ("a;z=x", "a;z=\u00b2", "a;z=\u0661\u0662", "a;z=" + "9" * 10, "a;z=", "a;=3"):
        with pytest.raises(InvalidArgument):
            split_identifier(bad)


def _plane(width: int, height: int, tile: int = 256) -> PlaneView:
    """A view of a ``width × height`` plane that holds no memory (every pixel one stride-0
    zero), its levels down to one ``tile``² plane."""
    t = ArrayAdapter(np.broadcast_to(np.uint8(0), (height, width)), "yx", chunk_shape=(512, 512))
    t.array_id = "t"
    return PlaneView.of(t, {}, PyramidPolicy(coarsest_tile=tile))


def _iiif_tiles(view: PlaneView):
    """(x, y, w, h, out_w, out_h) of every tile a IIIF viewer reads from ``info_json``."""
    tile, width, height = iiif.TILE, view.width, view.height
    for s, _, _ in view.square_levels():
        for y in range(0, height, tile * s):
            for x in range(0, width, tile * s):
                w, h = min(tile * s, width - x), min(tile * s, height - y)
                yield x, y, w, h, -(-w // s), -(-h // s)


def _deepzoom_tiles(width: int, height: int):
    top = deepzoom.max_level(width, height)
    for level in range(top + 1):
        f = 2 ** (top - level)
        level_w, level_h = -(-width // f), -(-height // f)
        for row in range(-(-level_h // deepzoom.TILE_SIZE)):
            for col in range(-(-level_w // deepzoom.TILE_SIZE)):
                t = deepzoom.tile_region(width, height, level, col, row)
                yield t.x, t.y, t.w, t.h, t.out_w, t.out_h


@pytest.mark.parametrize("width, height", [(32768, 32768), (20001, 9999), (1000, 700), (70001, 300)])
def test_every_viewer_tile_is_read_at_its_sharp_level(width, height):
    """The read bound changes no tile a IIIF or DeepZoom viewer (OpenSeadragon) asks for:
    each is read at the coarsest level that upsamples neither axis (edge tiles included,
    whose reductions are a little under their level's), within 4 level pixels per output
    pixel (the DeepZoom levels smaller than the coarsest level read it whole). The one
    exception: a DeepZoom level of a sliver image one pixel high (70001×300 at 1/256..1/2048)
    is read at the coarsest level, which reads a quarter of the sharp one's pixels."""
    view = _plane(width, height)
    coarsest = view.levels[-1].shape[0] * view.levels[-1].shape[1]
    for x, y, w, h, ow, oh in [*_iiif_tiles(view), *_deepzoom_tiles(width, height)]:
        level = view.level_for(x, y, w, h, ow, oh)
        sharp = [lv for lv in view.levels if max(lv.scale) <= min(w / ow, h / oh) + 1e-9][-1]
        read = view._read_px(level, x, y, w, h)
        assert read <= max(4 * (ow + 1) * (oh + 1), coarsest)
        if level != sharp:
            assert min(ow, oh) == 1 and level == view.levels[-1] and read < view._read_px(sharp, x, y, w, h)


def test_a_distorted_size_is_read_at_a_level_within_the_bound():
    """``full/8192,64`` of an 8192² image reduces y 128 times and x not at all: the sharp
    level (full resolution, 64 Mpx for 0.5 Mpx) is over the bound, the finest level within it
    (1024², x upscaled 8×) is read instead; a size that shows every pixel reads them all."""
    view = _plane(8192, 8192)
    for out, scale in [((8192, 64), 8), ((64, 8192), 8), ((8192, 1), 32), ((4096, 4096), 2), ((16383, 1024), 1)]:
        level = view.level_for(0, 0, 8192, 8192, *out)
        assert level.scale == (scale, scale), (out, level.scale)
        assert view._read_px(level, 0, 0, 8192, 8192) <= READ_PER_OUTPUT_PX * (out[0] + 1) * (out[1] + 1)
    strip = view.level_for(0, 4000, 8192, 2, 8192, 1)  # a 2-row strip: its two rows at full width
    assert strip.scale == (1, 1)


def test_a_stored_pyramid_too_large_to_read_within_the_bound_is_refused():
    """A file whose coarsest stored level is 100 Mpx: a thumbnail of it would read all of it
    (it has no coarser level to read): a 400 naming the limit, while a tile reads as ever."""
    from tensor_server.core.adapter_base import NativeLevel

    t = ArrayAdapter(np.broadcast_to(np.uint8(0), (20000, 20000)), "yx", chunk_shape=(512, 512))
    t.native_levels.append(
        NativeLevel((2, 2), ArrayAdapter(np.broadcast_to(np.uint8(0), (10000, 10000)), "yx", chunk_shape=(512, 512)))
    )
    t.array_id = "t"
    view = PlaneView.of(t, {}, None)
    with pytest.raises(InvalidArgument, match=f"would read 100000000 pixels.*limit {MAX_LEVEL_READ_PX}"):
        view.level_for(0, 0, 20000, 20000, 160, 160)
    assert view.level_for(0, 0, 1024, 1024, 512, 512).scale == (2, 2)


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
    assert (r.x, r.y, r.w, r.h, r.out_w, r.out_h, r.mirror, r.rotation, r.quality) == (
        500,
        0,
        500,
        600,
        83,
        100,
        True,
        90,
        "gray",
    )

    def geometry(*params, w=1000, h=600):
        r = iiif.parse_request(*params, w, h, fmts)
        return r.x, r.y, r.w, r.h, r.out_w, r.out_h

    assert geometry("square", ",300", "0", "default.jpg") == (200, 0, 600, 600, 300, 300)
    assert geometry("900,500,400,400", "max", "0", "default.jpg") == (900, 500, 100, 100, 100, 100)
    assert geometry("full", "^pct:200", "0", "default.jpg", w=10, h=6) == (0, 0, 10, 6, 20, 12)
    assert geometry("full", "!1,1000", "0", "default.jpg") == (0, 0, 1000, 600, 1, 1)  # a computed 0 is 1
    assert geometry("full", "max", "360", "default.jpg", w=40000, h=100)[4:] == (iiif.MAX_SIDE, 40)
    for bad in [
        ("full", "2000,", "0", "default.jpg"),
        ("full", "pct:150", "0", "default.jpg"),
        ("0,0,0,10", "max", "0", "default.jpg"),
        ("full", "max", "0", "fancy.jpg"),
        ("full", "max", "0", "default.gif"),
        ("full", "max", "-90", "default.jpg"),
        ("full", "!0,0", "0", "default.jpg"),
        ("full", "0,", "0", "default.jpg"),
        ("full", "^1,16777216", "0", "default.jpg"),
        ("full", "^pct:0", "0", "default.jpg"),
        ("full", ",", "0", "default.jpg"),
        ("full", "!5,", "0", "default.jpg"),
        ("0,0,10", "max", "0", "default.jpg"),
        ("0,0,10,10,10", "max", "0", "default.jpg"),
        ("pct:10.,0,10,10", "max", "0", "default.jpg"),
        ("full", "max", "90.", "default.jpg"),
    ]:
        with pytest.raises(InvalidArgument):
            iiif.parse_request(*bad, 1000, 600, fmts)
    with pytest.raises(Unimplemented):
        iiif.parse_request("full", "max", "45", "default.jpg", 1000, 600, fmts)
    big = _plane(32768, 32768, tile=512)
    info = iiif.info_json("http://h/iiif/3/x", 32768, 32768, ["jpg", "png", "webp"], big.square_levels())
    assert info["tiles"][0]["scaleFactors"] == [1, 2, 4, 8, 16, 32, 64] and info["extraFormats"] == ["webp"]
    assert (info["maxWidth"], info["maxHeight"], info["maxArea"]) == (16383, 16383, 4096 * 4096)
    assert info["sizes"][0] == {"width": 512, "height": 512} and info["sizes"][-1] == {"width": 4096, "height": 4096}
    wide = iiif.info_json("http://h/iiif/3/x", 20000, 600, ["jpg"], _plane(20000, 600, tile=512).square_levels())[
        "sizes"
    ]
    assert wide[-1] == {"width": 10000, "height": 300}  # 20000x600 is under maxArea, over maxWidth


def test_deepzoom_tiles_overlap_their_neighbours():
    assert deepzoom.max_level(1000, 700) == 10
    t = deepzoom.tile_region(1000, 700, 10, 1, 0)
    assert (t.x, t.y, t.w, t.h, t.out_w, t.out_h) == (253, 0, 256, 255, 256, 255)
    t = deepzoom.tile_region(1000, 700, 9, 1, 1)  # level 9 is 500x350
    assert (t.x, t.y, t.out_w, t.out_h) == (506, 506, 247, 97) and (t.w, t.h) == (494, 194)
    with pytest.raises(InvalidArgument):
        deepzoom.tile_region(1000, 700, 10, 4, 0)


def test_deepzoom_tile_paths():
    assert deepzoom.parse_tile_path("a_files/b;z=1_files/12/3_45.jpeg") == deepzoom.TilePath(
        "a_files/b;z=1", 12, 3, 45, "jpeg"
    )
    for bad in [
        "a_files/1/2_3",
        "a_files/1/2.jpg",
        "_files/1/2_3.jpg",
        "a_files/1/2_3/4.jpg",
        "a/1/2_3.jpg",
        "a_files/\u0661/2_3.jpg",
        "a_files/1/\u00b2_3.jpg",
        "a_files/1/2_" + "9" * 31 + ".jpg",
        "a_files/1/2_-3.jpg",
        "a_files/1/2_+3.jpg",
        "a_files/1/2_ 3.jpg",
    ]:
        with pytest.raises(InvalidArgument):
            deepzoom.parse_tile_path(bad)
