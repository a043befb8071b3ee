"""OpenSeadragon (the server's own viewer page, ``/view/<id>``) in headless Chromium draws a
whole HCS plate as one image: a 2 × 3 plate written with ome-zarr-py, one 256² field per well,
each known well a flat value of its own, one well listed but never written. After the viewer
has loaded its tiles, the pixels of its drawing canvas, at points inside each well's box as
the plate image publishes it (``metadata.montage``), are that well's value; where the missing
well and the never-listed wells would sit they are the fill, drawn (opaque black, not a
tile that never came: the canvas is transparent where nothing was drawn).
"""

from __future__ import annotations

import numpy as np
import pytest

from tensor_server.catalog import Catalog
from tensor_server.http.catalog_page import osd_dir
from tests.http.conftest import http_serving
from tests.http.neuroglancer_test import _browser
from tests.viewers.openseadragon_test import _WATCH_FAILURES, _failures, _wait_loaded
from tests.viewers.plate_page_test import write_plate

#: each written well's flat value (uint8 and one channel: drawn as stored, grey)
KNOWN = {"A/1": 90, "A/3": 160, "B/2": 230}
MISSING = "B/3"  # listed in the plate, never written
SIDE = 256

#: the canvas's RGBA at viewer-element points (scaled by the pixel density), a 5 × 5 mean each
_READ_CANVAS = """
var canvas = viewer.drawer.canvas, ratio = OpenSeadragon.pixelDensityRatio;
var ctx = canvas.getContext('2d');
return arguments[0].map(function (p) {
  var v = viewer.viewport.imageToViewerElementCoordinates(new OpenSeadragon.Point(p[0], p[1]));
  var x = Math.round(v.x * ratio), y = Math.round(v.y * ratio);
  var d = ctx.getImageData(x - 2, y - 2, 5, 5).data, sum = [0, 0, 0, 0];
  for (var i = 0; i < d.length; i++) { sum[i % 4] += d[i]; }
  return sum.map(function (s) { return s / 25; });
});
"""


@pytest.fixture(scope="module")
def plate_server(tmp_path_factory):
    if not (osd_dir() / "openseadragon.min.js").is_file():
        pytest.skip("OpenSeadragon is not installed (`make viewer-assets` installs it from npm)")
    root = tmp_path_factory.mktemp("osd-plate")
    wells = {well: [np.full((SIDE, SIDE), value, np.uint8)] for well, value in KNOWN.items()}
    write_plate(root / "plate.ome.zarr", ["A", "B"], ["1", "2", "3"], wells, listed=(MISSING,))
    cat = Catalog([root])
    cat.scan()
    (rec,) = cat.records()
    with http_serving(cat, tmp_path_factory.mktemp("osd-plate-cache")) as (srv, http):
        yield http, rec.source.tensor("plate")
    cat.close()


def _inside(y0: int, x0: int, y1: int, x1: int) -> list[tuple[float, float]]:
    """Nine (x, y) image points well inside a box, clear of its edges (a tile's resampling)."""
    return [(x0 + (x1 - x0) * fx, y0 + (y1 - y0) * fy) for fy in (0.25, 0.5, 0.75) for fx in (0.25, 0.5, 0.75)]


@pytest.mark.parametrize("source", ["iiif", "dzi"])
def test_openseadragon_draws_the_plate_overview(plate_server, source):
    http, plate = plate_server
    layout = plate.metadata["montage"]
    boxes = {w["path"]: w["fields"][0]["box"] for w in layout["wells"]}
    assert sorted(boxes) == sorted(KNOWN) and plate.shape == (2 * (SIDE + 16) - 16, 3 * (SIDE + 16) - 16)
    pitch = [c + g for c, g in zip(layout["cell"], layout["gap"])]
    empty = {  # where a well's only field would sit: the missing well and the never-listed ones
        well: (r * pitch[0], c * pitch[1], r * pitch[0] + SIDE, c * pitch[1] + SIDE)
        for well, (r, c) in {MISSING: (1, 2), "A/2": (0, 1), "B/1": (1, 0)}.items()
    }
    browser = _browser()
    try:
        browser.get(f"{http.url}/view/{plate.array_id}?source={source}")
        browser.execute_script(_WATCH_FAILURES)
        _wait_loaded(browser, seconds=120)
        for well, ((y0, x0), (y1, x1)) in boxes.items():
            for point, rgba in zip(*_read(browser, _inside(y0, x0, y1, x1))):
                want = [KNOWN[well]] * 3 + [255]
                assert np.abs(np.subtract(rgba, want)).max() < 12, f"{well} at {point}: {rgba}; {_failures(browser)}"
        for well, (y0, x0, y1, x1) in empty.items():
            for point, rgba in zip(*_read(browser, _inside(y0, x0, y1, x1))):
                assert max(rgba[:3]) < 12 and rgba[3] == 255, f"{well} at {point}: {rgba}; {_failures(browser)}"
    finally:
        browser.quit()


def _read(browser, points: list[tuple[float, float]]) -> tuple[list[tuple[float, float]], list[list[float]]]:
    """(the image points, the canvas's RGBA drawn at each)."""
    return points, browser.execute_script(_READ_CANVAS, [list(p) for p in points])
