"""OpenSeadragon (npm ``openseadragon``, installed by ``make viewer-assets``) in headless
Chromium opens a DeepZoom and an IIIF source of a generated 32768² TIFF with no pyramid;
screenshots at two zoom levels show the known content of the image at the points
OpenSeadragon itself says those image pixels are drawn.

The image: x < 16384 is 40, the rest 200, except its top-left 4096² which is a checkerboard
of 512² squares (255 where (col + row) is even, else 0). Tiles are constant, so the 1 GiB
image compresses to a few MB and is written once for the module."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest

from tensor_server.catalog import Catalog
from tensor_server.http.catalog_page import osd_dir
from tests.http.conftest import http_serving
from tests.http.neuroglancer_test import _browser

SIDE, TILE = 32768, 512


def _tiles():
    for row in range(SIDE // TILE):
        for col in range(SIDE // TILE):
            if row < 8 and col < 8:
                value = 255 if (row + col) % 2 == 0 else 0
            else:
                value = 40 if col * TILE < SIDE // 2 else 200
            yield np.full((TILE, TILE), value, np.uint8)


def expected(x: int, y: int) -> int:
    if x < 4096 and y < 4096:
        return 255 if (x // TILE + y // TILE) % 2 == 0 else 0
    return 40 if x < SIDE // 2 else 200


@pytest.fixture(scope="module")
def big_server(tmp_path_factory):
    import tifffile

    if not (osd_dir() / "openseadragon.min.js").is_file():
        pytest.skip("OpenSeadragon is not installed (`make viewer-assets` installs it from npm)")
    root = tmp_path_factory.mktemp("big")
    tifffile.imwrite(
        root / "big.tif",
        _tiles(),
        shape=(SIDE, SIDE),
        dtype=np.uint8,
        tile=(TILE, TILE),
        compression="zlib",
        photometric="minisblack",
    )
    cat = Catalog([root])
    cat.scan()
    (array_id,) = [t.array_id for r in cat.records() for t in r.source.tensors.values()]
    with http_serving(cat, tmp_path_factory.mktemp("big-cache")) as (srv, http):
        yield http, array_id
    cat.close()


def _wait_loaded(browser, seconds=240):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if browser.execute_script(
            "return !!(window.viewer && viewer.world.getItemCount() && viewer.world.getItemAt(0).getFullyLoaded())"
        ):
            time.sleep(0.5)  # the last tiles drawn
            return
        time.sleep(0.3)
    raise AssertionError(f"OpenSeadragon did not finish loading its tiles; {_failures(browser)}")


_WATCH_FAILURES = (
    "window.tileFailures = [];"
    "viewer.addHandler('tile-load-failed', function (e) {"
    " window.tileFailures.push((e.tile && e.tile.getUrl ? e.tile.getUrl() : '?') + ': ' + e.message); });"
)


def _failures(browser) -> str:
    """What OpenSeadragon reported failing (a failed tile stays black: the likeliest flake)."""
    return f"tiles that failed to load: {browser.execute_script('return window.tileFailures || null')}"


def _check(browser, points):
    from PIL import Image

    shot = np.asarray(Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("L"), np.float64)
    for x, y in points:
        px, py = browser.execute_script(
            "var p = viewer.viewport.imageToViewerElementCoordinates(new OpenSeadragon.Point(arguments[0], arguments[1]));"
            "return [Math.round(p.x), Math.round(p.y)];",
            x,
            y,
        )
        assert 3 <= px < shot.shape[1] - 3 and 3 <= py < shot.shape[0] - 3, f"image point {(x, y)} is off screen"
        got = shot[py - 2 : py + 3, px - 2 : px + 3].mean()
        assert abs(got - expected(x, y)) < 25, (
            f"image point {(x, y)} drawn as {got:.0f}, expected {expected(x, y)}; {_failures(browser)}"
        )


@pytest.mark.parametrize("source", ["dzi", "iiif"])
def test_openseadragon_shows_the_image_at_two_zoom_levels(big_server, source):
    http, array_id = big_server
    browser = _browser()
    try:
        browser.get(f"{http.url}/view/{array_id}?source={source}")
        browser.execute_script(_WATCH_FAILURES)
        # a cold coarse tile here reduces the whole 1 GiB image: OpenSeadragon must wait for it
        # (its default gives up after 30 s, never to retry, which a loaded CI machine exceeded)
        assert browser.execute_script("return [viewer.timeout, viewer.tileRetryMax]") == [300_000, 2]
        _wait_loaded(browser)
        _check(browser, [(8000, 16000), (24000, 16000), (8000, 30000), (30000, 6000)])
        browser.execute_script(
            "viewer.viewport.fitBounds(new OpenSeadragon.Rect(0, 0, 2048 / 32768, 2048 / 32768), true);"
        )
        _wait_loaded(browser)
        zoom = browser.execute_script("return viewer.viewport.viewportToImageZoom(viewer.viewport.getZoom(true));")
        assert zoom > 0.2, f"the zoomed view is at image zoom {zoom}"
        _check(browser, [(256, 256), (768, 256), (256, 768), (768, 768), (1280, 1792), (1792, 1792)])
    finally:
        browser.quit()
