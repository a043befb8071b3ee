"""Render specs through the HTTP door over a 60-channel OME-Zarr written by ome-zarr-py: a spec
posted to ``/render`` shows 4 of the 60 channels in an IIIF tile equal to the NumPy composite
(the kernels' oracle) of the stored level that serves the tile; DeepZoom takes the same
``;r=``; every bad input is a 400 naming its field, an evicted id a 404 saying to post again."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import pytest
from tensor_server_kernels import composite_reference as R

from tensor_server.catalog import Catalog
from tensor_server.render.luts import colour_value, normalised_colour
from tensor_server.testing import serving

CHANNELS, HEIGHT, WIDTH = 60, 300, 400
SPEC = {
    "channels": [
        {"index": 3, "color": "#FF0000", "window": {"start": 500, "end": 3000}},
        {"index": 17, "color": "green", "window": {"start": 0, "end": 4000}, "gamma": 0.7},
        {"index": 42, "color": "#0080FF", "window": {"start": 1000, "end": 2000}, "invert": True},
        {"index": 59, "color": "magma", "window": {"start": 200, "end": 3800}},
        {"index": 8, "visible": False},
    ]
}


@pytest.fixture(scope="module")
def multiplex(tmp_path_factory):
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    root = tmp_path_factory.mktemp("multiplex")
    rng = np.random.default_rng(44)
    img = rng.integers(0, 4096, (CHANNELS, HEIGHT, WIDTH), dtype=np.uint16)
    group = zarr.group(store=parse_url(str(root / "multiplex.zarr"), mode="w").store)
    write_image(img, group, axes="cyx", scale_factors=(2,), storage_options={"chunks": (1, 128, 128)})
    attrs = zarr.open_group(str(root / "multiplex.zarr"), mode="r").attrs.asdict()
    datasets = (attrs.get("multiscales") or attrs["ome"]["multiscales"])[0]["datasets"]
    level1 = zarr.open_array(str(root / "multiplex.zarr" / datasets[1]["path"]), mode="r")[...]
    cat = Catalog([root])
    cat.scan()
    with serving(cat, http=True) as srv:
        rec = next(r for r in cat.records() if r.source is not None)
        array_id = next(iter(rec.source.tensors.values())).array_id
        yield srv, array_id, level1
    cat.close()


def _post(srv, body: bytes) -> httpx.Response:
    return httpx.post(f"{srv.http_url}/render", content=body, timeout=60)


def _png(response: httpx.Response) -> np.ndarray:
    from PIL import Image

    assert response.status_code == 200, response.text
    return np.asarray(Image.open(io.BytesIO(response.content)))


def test_an_iiif_tile_of_4_of_60_channels_is_the_composite_of_its_level(multiplex):
    srv, array_id, level1 = multiplex
    posted = _post(srv, json.dumps(SPEC).encode())
    assert posted.status_code == 200, posted.text
    spec_id = posted.json()["id"]
    assert posted.json()["suffix"] == f";r={spec_id}" and len(spec_id) == 16
    assert _post(srv, json.dumps(SPEC, indent=2).encode()).json()["id"] == spec_id  # stable
    url = f"{srv.http_url}/iiif/3/{array_id};r={spec_id}/0,0,{WIDTH},{HEIGHT}/{WIDTH // 2},{HEIGHT // 2}/0/default.png"
    got = _png(httpx.get(url, timeout=60))
    visible = [c for c in SPEC["channels"] if c.get("visible", True)]
    channels = [
        R.Channel(
            c["window"]["start"],
            c["window"]["end"],
            colour_value(normalised_colour(c["color"], "color")),
            c.get("gamma", 1.0),
            c.get("invert", False),
        )
        for c in visible
    ]
    assert level1.shape == (CHANNELS, HEIGHT // 2, WIDTH // 2)
    want = R.composite(level1[[c["index"] for c in visible]], channels)
    assert got.shape == want.shape and np.array_equal(got, want)
    assert len(np.unique(got.reshape(-1, 3), axis=0)) > 1000  # four channels of noise: many colours


def test_a_tiles_visible_channels_are_read_in_one_call_in_the_specs_order(multiplex):
    srv, array_id, level1 = multiplex
    order = [12, 10, 11, 30]  # read together, composited in the order given
    spec = {"channels": [{"index": i, "color": "#FF00FF", "window": {"start": 0, "end": 16000}} for i in order]}
    spec_id = _post(srv, json.dumps(spec).encode()).json()["id"]
    calls = []
    runtime = srv.runtime
    read = runtime.level_channels

    def counted(tensor, level, region, axis, indices, *args, **kwargs):
        calls.append((axis, list(indices)))
        return read(tensor, level, region, axis, indices, *args, **kwargs)

    runtime.level_channels = counted
    try:
        url = f"{srv.http_url}/iiif/3/{array_id};r={spec_id}/0,0,{WIDTH},{HEIGHT}/{WIDTH // 2},{HEIGHT // 2}/0/default.png"
        got = _png(httpx.get(url, timeout=60))
    finally:
        runtime.level_channels = read
    assert calls == [(0, order)]
    want = R.composite(level1[order], [R.Channel(0, 16000, (1.0, 0.0, 1.0))] * 4)
    assert np.array_equal(got, want) and got[..., 0].max() > 0


def test_deepzoom_takes_the_spec_and_differs_from_the_default_rendering(multiplex):
    srv, array_id, _ = multiplex
    spec_id = _post(srv, json.dumps(SPEC).encode()).json()["id"]
    tile = "_files/9/0_0.png"
    with_spec = _png(httpx.get(f"{srv.http_url}/deepzoom/{array_id};r={spec_id}{tile}", timeout=60))
    default = _png(httpx.get(f"{srv.http_url}/deepzoom/{array_id}{tile}", timeout=60))
    assert with_spec.shape == default.shape == (255, 255, 3)
    assert not np.array_equal(with_spec, default)


@pytest.mark.parametrize(
    "doc,field",
    [
        ({"channels": [{"index": 0, "color": "#GG0000"}]}, "channels[0].color"),
        ({"channels": [{"index": 0, "window": {"start": 9, "end": 1}}]}, "channels[0].window"),
        ({"channels": [{"index": i} for i in range(10_000)]}, "channels: 10000 entries"),
    ],
)
def test_a_bad_spec_is_a_400_naming_the_field(multiplex, doc, field):
    srv, _, _ = multiplex
    answer = _post(srv, json.dumps(doc).encode())
    assert answer.status_code == 400 and field in answer.text, answer.text


def test_a_channel_the_tensor_lacks_and_an_unknown_id_are_400s(multiplex):
    srv, array_id, _ = multiplex
    spec_id = _post(srv, json.dumps({"channels": [{"index": 75}]}).encode()).json()["id"]
    answer = httpx.get(f"{srv.http_url}/iiif/3/{array_id};r={spec_id}/full/64,/0/default.png", timeout=60)
    assert answer.status_code == 400 and "channels[0].index" in answer.text and "no channel 75" in answer.text
    answer = httpx.get(f"{srv.http_url}/iiif/3/{array_id};r=0123456789abcdef/info.json", timeout=60)
    assert answer.status_code == 400 and "r: render spec 0123456789abcdef is not stored" in answer.text


def test_an_evicted_id_is_a_404_saying_to_post_again(multiplex):
    srv, array_id, _ = multiplex
    store = srv.runtime.viewer.specs
    kept = store.max_specs
    store.max_specs = 1
    try:
        first = _post(srv, json.dumps({"channels": [{"index": 1}]}).encode()).json()["id"]
        _post(srv, json.dumps({"channels": [{"index": 2}]}).encode())
        answer = httpx.get(f"{srv.http_url}/iiif/3/{array_id};r={first}/info.json", timeout=60)
        assert answer.status_code == 404 and "POST the spec to /render again" in answer.text
    finally:
        store.max_specs = kept


def test_histograms_of_named_channels_from_the_coarsest_level(multiplex):
    srv, array_id, level1 = multiplex
    answer = httpx.get(f"{srv.http_url}/histogram/{array_id}?c=3,17", timeout=60)
    assert answer.status_code == 200, answer.text
    doc = answer.json()
    assert doc["array_id"] == array_id and doc["dtype"] == "uint16"
    assert [c["index"] for c in doc["channels"]] == [3, 17]
    for entry in doc["channels"]:
        values = level1[entry["index"]]  # the stored coarsest level
        assert sum(entry["counts"]) == values.size and len(entry["counts"]) == 1024 and not entry["exact"]
        assert entry["min"] == values.min()
        # the default window of a channel without omero settings: 0.1-99.9 percentiles of that level
        assert entry["window"] == pytest.approx(list(np.percentile(values, (0.1, 99.9))))
    every = httpx.get(f"{srv.http_url}/histogram/{array_id}", timeout=60).json()
    assert len(every["channels"]) == CHANNELS
    answer = httpx.get(f"{srv.http_url}/histogram/{array_id}?c=3,60", timeout=60)
    assert answer.status_code == 400 and "c: there is no channel 60" in answer.text


def test_a_percentile_window_is_measured_on_the_coarsest_level(multiplex):
    srv, array_id, level1 = multiplex
    spec = {"channels": [{"index": 7, "color": "grey", "window": {"percentiles": [5, 95]}}]}
    spec_id = _post(srv, json.dumps(spec).encode()).json()["id"]
    url = f"{srv.http_url}/iiif/3/{array_id};r={spec_id}/0,0,{WIDTH},{HEIGHT}/{WIDTH // 2},{HEIGHT // 2}/0/default.png"
    got = _png(httpx.get(url, timeout=60))
    start, end = np.percentile(level1[7].astype(np.float64), (5, 95))
    want = R.composite(level1[[7]], [R.Channel(start, end, (1.0, 1.0, 1.0))])
    assert np.array_equal(got, want)
    assert 0.04 < np.mean(got[..., 0] == 0) < 0.06  # 5 % of the pixels are below the window


def test_a_stored_spec_reads_back_and_histograms_carry_the_panels_defaults(multiplex):
    srv, array_id, _ = multiplex
    spec_id = _post(srv, json.dumps(SPEC).encode()).json()["id"]
    back = httpx.get(f"{srv.http_url}/render/{spec_id}", timeout=60).json()
    assert back["id"] == spec_id and [c["index"] for c in back["channels"]] == [3, 17, 42, 59, 8]
    assert back["channels"][0]["window"] == {"start": 500.0, "end": 3000.0} and back["channels"][4]["visible"] is False
    assert back["channels"][1]["color"] == "green" and back["channels"][3]["color"] == "magma"
    assert httpx.get(f"{srv.http_url}/render/0123456789abcdef", timeout=60).status_code == 400
    entry = httpx.get(f"{srv.http_url}/histogram/{array_id}?c=3", timeout=60).json()["channels"][0]
    # no omero block: the default table's 4th colour, shown, named by its index
    assert (entry["label"], entry["color"], entry["active"]) == ("channel 3", "#FFFF00", True)


def test_a_tensors_own_settings_draw_what_a_spec_of_the_same_draws(tmp_path):
    """The default rendering (the ``omero`` block's colours and windows) and a spec naming the
    same are one composite: the viewer page's picture does not change when a panel posts it."""
    rng = np.random.default_rng(441)
    img = rng.integers(0, 4096, (3, 64, 96), dtype=np.uint16)
    omero = [
        {"color": "FF0000", "window": {"start": 500, "end": 3000}, "active": True},
        {"color": "00FF00", "window": {"start": 0, "end": 4000}, "active": True},
        {"color": "0080FF", "window": {"start": 1000, "end": 2000}, "active": False},
    ]
    _write_with_omero(tmp_path / "three.zarr", img, omero, storage_options={"chunks": (1, 64, 96)})
    with _served_image(tmp_path) as (srv, array_id):
        spec = {
            "channels": [
                {"index": i, "color": "#" + c["color"], "window": c["window"]}
                for i, c in enumerate(omero)
                if c["active"]
            ]
        }
        spec_id = _post(srv, json.dumps(spec).encode()).json()["id"]
        region = "/full/max/0/default.png"
        default = _png(httpx.get(f"{srv.http_url}/iiif/3/{array_id}{region}", timeout=60))
        with_spec = _png(httpx.get(f"{srv.http_url}/iiif/3/{array_id};r={spec_id}{region}", timeout=60))
    channels = [R.Channel(c["window"]["start"], c["window"]["end"], colour_value(c["color"])) for c in omero[:2]]
    assert np.array_equal(default, with_spec)
    assert np.array_equal(default, R.composite(img[:2], channels))  # red over green adds as light
    assert default[..., 2].max() == 0  # the inactive blue channel is not drawn


@pytest.mark.parametrize(
    ("dtype", "window"),
    [("uint8", (0, 255)), ("uint8", (20, 200)), ("uint16", (500, 3000))],
    ids=["8-bit full window", "8-bit window", "16-bit window"],
)
def test_one_grey_channel_is_drawn_as_the_compositing_kernel_draws_it(tmp_path, dtype, window):
    """A one-channel image is a grey image looked up in the kernel's own answer for every value
    (8-bit at its full window: the pixels themselves): bit for bit the oracle's composite."""
    top = np.iinfo(dtype).max if dtype == "uint8" else 4095
    img = np.random.default_rng(442).integers(0, top + 1, (1, 64, 96), dtype=dtype)
    white = {"color": "FFFFFF", "window": {"start": window[0], "end": window[1]}, "active": True}
    _write_with_omero(tmp_path / "grey.zarr", img, [white])
    with _served_image(tmp_path) as (srv, array_id):
        drawn = _png(httpx.get(f"{srv.http_url}/iiif/3/{array_id}/full/max/0/default.png", timeout=60))
    expected = R.composite(img, [R.Channel(window[0], window[1], (1.0, 1.0, 1.0))])[..., 0]
    assert drawn.shape == (64, 96) and np.array_equal(drawn, expected)
    if window == (0, 255):
        assert np.array_equal(drawn, img[0])


def _write_with_omero(path, img: np.ndarray, channels: list[dict], **options) -> None:
    """A (c, y, x) OME-Zarr of ``img`` at ``path`` with ``channels`` as its ``omero`` block."""
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    write_image(img, zarr.group(store=parse_url(str(path), mode="w").store), axes="cyx", scale_factors=(), **options)
    root = zarr.open_group(str(path), mode="r+")
    ome, omero = root.attrs.get("ome"), {"channels": channels}
    root.attrs.update(
        {"ome": {**ome, "omero": omero}} if isinstance(ome, dict) else {"omero": omero}
    )  # NGFF 0.5: under "ome"


@contextmanager
def _served_image(root) -> Iterator[tuple[Any, str]]:
    """(the serving, the array id) of the one image under ``root``, with its HTTP door."""
    cat = Catalog([root])
    cat.scan()
    try:
        with serving(cat, http=True) as srv:
            rec = next(r for r in cat.records() if r.source is not None)
            yield srv, next(iter(rec.source.tensors.values())).array_id
    finally:
        cat.close()
