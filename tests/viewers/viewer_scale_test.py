"""The viewer page's scale bar (``http/viewer_scale.js``) in headless Chromium, over an image of
0.5 µm pixels: at one screen pixel per image pixel the bar is 50 µm (the longest 1-2-5 length
within 120 screen pixels: 60 µm) over 100 pixels; zoomed to 4 screen pixels per image pixel,
10 µm over 80; zoomed out to 1/8, 200 µm (of 480 µm) over 50; a length of 1000 µm or more is
given in mm. An image without a physical size has no bar."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter
from tensor_server.http.catalog_page import osd_dir
from tests.http.neuroglancer_test import _browser
from tests.viewers.conftest import serving_arrays


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    if not (osd_dir() / "openseadragon.min.js").is_file():
        pytest.skip("OpenSeadragon is not installed (`make viewer-assets` installs it from npm)")
    img = np.zeros((1024, 1024), np.uint8)
    sized = ArrayAdapter(img, "yx", chunk_shape=(256, 256), physical_scale=(0.5, 0.5), physical_unit=("µm", "µm"))
    bare = ArrayAdapter(img, "yx", chunk_shape=(256, 256))
    with serving_arrays(tmp_path_factory.mktemp("scale"), sized=sized, bare=bare) as (cat, http):
        ids = {r.source.source_id: t.array_id for r in cat.records() for t in r.source.tensors.values()}
        browser = _browser()
        try:
            yield browser, {name: f"{http.url}/view/{aid}" for name, aid in ids.items()}
        finally:
            browser.quit()


def _opened(browser) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if browser.execute_script("return !!(window.viewer && viewer.world.getItemCount())"):
            return
        time.sleep(0.2)
    raise AssertionError("the viewer did not open its image")


def _at(browser, screen_per_image_px: float) -> list:
    return browser.execute_script(
        "var item = viewer.world.getItemAt(0);"
        "viewer.viewport.zoomTo(item.imageToViewportZoom(arguments[0]), null, true);"
        "viewer.forceRedraw(); viewer.viewport.update(); viewer.raiseEvent('animation');"
        "var bar = document.querySelector('#scale-bar div');"
        "return [document.querySelector('#scale-bar span').textContent, bar.getBoundingClientRect().width,"
        " viewerScale.width];",
        screen_per_image_px,
    )


def test_the_scale_bar_follows_the_zoom(pages):
    browser, urls = pages
    browser.get(urls["sized"])
    _opened(browser)
    label, drawn, width = _at(browser, 1)
    assert (label, width) == ("50 µm", 100) and abs(drawn - 102) <= 1  # 100 px and its 1 px border each side
    assert _at(browser, 4)[::2] == ["10 µm", 80]
    assert _at(browser, 1 / 8)[::2] == ["200 µm", 50]
    assert _at(browser, 1 / 16)[::2] == ["500 µm", 63]  # of 960 µm within 120 px: 62.5 px
    assert _at(browser, 1 / 32)[::2] == ["1 mm", 63]  # 1000 µm: 62.5 px


def test_an_image_without_a_physical_size_has_no_scale_bar(pages):
    browser, urls = pages
    browser.get(urls["bare"])
    _opened(browser)
    assert browser.execute_script("return document.getElementById('scale-bar')") is None
