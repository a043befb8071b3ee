"""A render spec's label image over its composite, through the HTTP door, over an OME-Zarr with
a label image written by ome-zarr-py: an IIIF tile equals the oracles' composite of the level
that serves it with the label level of the same scale drawn over it (``overlay_reference``);
bad label settings are a 400 naming the field."""

from __future__ import annotations

import io
import json

import httpx
import numpy as np
import pytest
from tensor_server_kernels import composite_reference as C
from tensor_server_kernels import overlay_reference as O

from tensor_server.catalog import Catalog
from tensor_server.testing import serving

HEIGHT, WIDTH = 300, 400
WINDOWS = [(0, 4096), (500, 3000), (1000, 4000)]
COLOURS = ["#FF0000", "#00FF00", "#0000FF"]
SPEC = {
    "channels": [
        {"index": i, "color": c, "window": {"start": s, "end": e}}
        for i, (c, (s, e)) in enumerate(zip(COLOURS, WINDOWS))
    ],
    "labels": {"name": "cells", "opacity": 0.6, "colors": {"7": "#FFFF00"}},
}


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image, write_labels

    root = tmp_path_factory.mktemp("labelled")
    rng = np.random.default_rng(7)
    img = rng.integers(0, 4096, (3, HEIGHT, WIDTH), dtype=np.uint16)
    cells = np.zeros((HEIGHT, WIDTH), np.uint32)
    cells[50:150, 100:250] = 7
    cells[200:281, 21:91] = 12
    cells[10:30, 300:390] = 3_000_000_000
    group = zarr.group(store=parse_url(str(root / "img.zarr"), mode="w").store)
    write_image(img, group, axes="cyx", scale_factors=(2,), storage_options={"chunks": (1, 128, 128)})
    write_labels(cells, group, name="cells", axes="yx", scale_factors=(2,))
    store = root / "img.zarr"
    levels, label_levels = _levels(store), _levels(store / "labels" / "cells")
    cat = Catalog([root])
    cat.scan()
    with serving(cat, http=True) as srv:
        rec = next(r for r in cat.records() if r.source is not None)
        array_id = next(t.array_id for t in rec.source.tensors.values() if not t.is_labels)
        yield srv, array_id, levels, label_levels
    cat.close()


def _levels(group):
    """The arrays of the multiscale at ``group``, finest first, as its writer wrote them."""
    import zarr

    attrs = zarr.open_group(str(group), mode="r").attrs.asdict()
    datasets = (attrs.get("multiscales") or attrs["ome"]["multiscales"])[0]["datasets"]
    return [zarr.open_array(str(group / d["path"]), mode="r")[...] for d in datasets]


def _spec_id(srv, spec: dict) -> str:
    posted = httpx.post(f"{srv.http_url}/render", content=json.dumps(spec).encode(), timeout=60)
    assert posted.status_code == 200, posted.text
    return str(posted.json()["id"])


def _png(response: httpx.Response) -> np.ndarray:
    from PIL import Image

    assert response.status_code == 200, response.text
    return np.asarray(Image.open(io.BytesIO(response.content)).convert("RGB"))


def _expected(planes: np.ndarray, ids: np.ndarray, opacity: float) -> np.ndarray:
    channels = [
        C.Channel(s, e, (int(c[1:3], 16) / 255, int(c[3:5], 16) / 255, int(c[5:], 16) / 255))
        for c, (s, e) in zip(COLOURS, WINDOWS)
    ]
    return O.overlay(C.composite(planes, channels), ids, opacity, np.array([7]), np.array([[255, 255, 0]]))


@pytest.mark.parametrize(
    "region,size,level,box",
    [
        (f"0,0,{WIDTH},{HEIGHT}", f"{WIDTH // 2},{HEIGHT // 2}", 1, np.s_[:, :]),
        ("96,40,200,120", "200,120", 0, np.s_[40:160, 96:296]),
    ],
    ids=["level 1", "level 0"],
)
def test_a_tile_is_the_composite_with_the_label_level_of_its_scale_over_it(labelled, region, size, level, box):
    srv, array_id, levels, label_levels = labelled
    spec_id = _spec_id(srv, SPEC)
    got = _png(httpx.get(f"{srv.http_url}/iiif/3/{array_id};r={spec_id}/{region}/{size}/0/default.png", timeout=60))
    want = _expected(levels[level][(slice(None), *box)], label_levels[level][box], 0.6)
    assert np.array_equal(got, want), f"{np.count_nonzero(got != want)} components differ"
    without = dict(SPEC)
    del without["labels"]
    plain = _png(
        httpx.get(f"{srv.http_url}/iiif/3/{array_id};r={_spec_id(srv, without)}/{region}/{size}/0/default.png")
    )
    drawn = label_levels[level][box] != 0
    assert drawn.any() and np.array_equal(plain[~drawn], got[~drawn]) and not np.array_equal(plain[drawn], got[drawn])


def test_the_override_colour_and_opacity_show_inside_a_label(labelled):
    srv, array_id, levels, _ = labelled
    opaque = {**SPEC, "labels": {"name": "cells", "opacity": 1.0, "colors": {"7": "#FFFF00", "12": "cyan"}}}
    got = _png(
        httpx.get(f"{srv.http_url}/iiif/3/{array_id};r={_spec_id(srv, opaque)}/0,0,{WIDTH},{HEIGHT}/max/0/default.png")
    )
    assert got[100, 175].tolist() == [255, 255, 0] and got[240, 50].tolist() == [0, 255, 255]
    assert got[20, 350].tolist() == O.label_colours(np.array([3_000_000_000]))[0].tolist()  # its stable colour


@pytest.mark.parametrize(
    "labels,field",
    [
        ({"name": "cells", "opacity": 1.5}, "labels.opacity"),
        ({"name": "cells", "opacity": "half"}, "labels.opacity"),
        ({"name": "cells", "colors": {"7": "#GG0000"}}, "labels.colors.7"),
        ({"name": "cells", "colors": {"7": "viridis"}}, "labels.colors.7"),
        ({"name": "cells", "colors": {"seven": "#FF0000"}}, "labels.colors.seven"),
        ({"opacity": 0.5}, "labels.name"),
        ({"name": "cells", "alpha": 0.5}, "labels.alpha"),
        ("cells", "labels"),
    ],
)
def test_bad_label_settings_are_a_400_naming_the_field(labelled, labels, field):
    srv, _, _, _ = labelled
    bad = {**SPEC, "labels": labels}
    posted = httpx.post(f"{srv.http_url}/render", content=json.dumps(bad).encode(), timeout=60)
    assert posted.status_code == 400 and field in posted.text, posted.text


def test_a_label_image_the_source_does_not_have_is_a_400_naming_it(labelled):
    srv, array_id, _, _ = labelled
    spec_id = _spec_id(srv, {**SPEC, "labels": {"name": "nuclei"}})
    got = httpx.get(f"{srv.http_url}/iiif/3/{array_id};r={spec_id}/0,0,64,64/64,64/0/default.png", timeout=60)
    assert got.status_code == 400 and "labels.name" in got.text and "'cells'" in got.text, got.text
