"""The viewer page's label overlay (``http/viewer_panel.js``'s labels row) in headless Chromium,
over a one-channel image (white left half, black right half) whose source has a label image
``cells`` of two squares: label 5 on the black half, label 9 on the white one. Switching the
overlay on draws each square in its label colour blended at the opacity
(``overlay_reference``), the opacity slider moves the blend, switching it off restores the
image, and the shared URL restores the overlay."""

from __future__ import annotations

import numpy as np
import pytest
from tensor_server_kernels import overlay_reference as O

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.http.catalog_page import osd_dir
from tests.http.conftest import http_serving
from tests.http.neuroglancer_test import _browser
from tests.viewers.viewer_panel_test import _colour, _near, _set, _settled

SIDE = 512
ON_BLACK, ON_WHITE, BLACK_PX = (384, 128), (128, 384), (384, 384)


def _source() -> MemorySource:
    img = np.zeros((1, SIDE, SIDE), np.uint16)
    img[0, :, : SIDE // 2] = 1000
    cells = np.zeros((SIDE, SIDE), np.uint16)
    cells[64:192, 320:448] = 5
    cells[320:448, 64:192] = 9
    image = ArrayAdapter(img, "cyx", chunk_shape=(1, 256, 256), physical_scale=(1.0, 0.5, 0.5))
    label = ArrayAdapter(cells, "yx", chunk_shape=(256, 256), is_labels=True)
    return MemorySource({"image": image, "image/labels/cells": label}, source_id="cells")


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    if not (osd_dir() / "openseadragon.min.js").is_file():
        pytest.skip("OpenSeadragon is not installed (`make viewer-assets` installs it from npm)")
    cat = Catalog([])
    cat.add_source(_source())
    cat.first_scan_done.set()
    with http_serving(cat, tmp_path_factory.mktemp("labels")) as (_, http):
        (array_id,) = [t.array_id for r in cat.records() for t in r.source.tensors.values() if not t.is_labels]
        browser = _browser()
        try:
            yield browser, f"{http.url}/view/{array_id}"
        finally:
            browser.quit()


def _blend(under: int, label: int, opacity: float) -> list[int]:
    colour = O.label_colours(np.array([label]))[0].astype(int)
    a = O.alpha_of(opacity)
    return [(under * (255 - a) + int(c) * a + 127) // 255 for c in colour]


def test_the_label_overlay_toggles_blends_at_its_opacity_and_is_shared(page):
    browser, url = page
    browser.get(url)
    _settled(browser, 0)
    assert browser.execute_script(
        "return Array.from(document.querySelectorAll('.labels-name option')).map(function (o) { return o.value; })"
    ) == ["cells"]
    assert _near(_colour(browser, ON_BLACK), (0, 0, 0)) and _near(_colour(browser, ON_WHITE), (255, 255, 255))

    _set(browser, ".labels-shown", True)  # at the default opacity, 0.5
    _settled(browser, 1)
    assert _near(_colour(browser, ON_BLACK), _blend(0, 5, 0.5)) and _near(
        _colour(browser, ON_WHITE), _blend(255, 9, 0.5)
    )
    assert _near(_colour(browser, BLACK_PX), (0, 0, 0))  # background (0) is never drawn

    _set(browser, ".labels-opacity", 1)
    _settled(browser, 2)
    assert _near(_colour(browser, ON_BLACK), _blend(0, 5, 1.0)) and _near(
        _colour(browser, ON_WHITE), _blend(255, 9, 1.0)
    )

    shared = browser.current_url
    browser.get("about:blank")
    browser.get(shared)
    _settled(browser, 1)
    assert browser.execute_script("return [viewerPanel.labels.shown, viewerPanel.labels.opacity]") == [True, 1]
    assert _near(_colour(browser, ON_BLACK), _blend(0, 5, 1.0))

    _set(browser, ".labels-shown", False)
    _settled(browser, 2)
    assert _near(_colour(browser, ON_BLACK), (0, 0, 0)) and _near(_colour(browser, ON_WHITE), (255, 255, 255))
