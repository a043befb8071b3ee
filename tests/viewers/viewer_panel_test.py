"""The viewer page's channel panel (``http/viewer_panel.js``) in headless Chromium, over a
2-plane, 3-channel image whose channels are known shapes: channel 0 lights the left half,
channel 1 the top half and a quarter of that in the bottom right (all of plane z=1), channel 2
nothing. Toggling a channel, moving a
window and the z slider change the drawn pixels as the render spec says; the shared URL
(its hash: the spec id, the plane, the viewport) restores the view in a new page. Each
channel's histogram is drawn under its window sliders, the bars as ``GET /histogram`` counts
them, coloured inside the window and grey outside it."""

from __future__ import annotations

import io
import time

import httpx
import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter
from tensor_server.http.catalog_page import osd_dir
from tests.http.neuroglancer_test import _browser
from tests.viewers.conftest import serving_arrays

SIDE = 512
LEFT_BOTTOM, RIGHT_TOP, RIGHT_BOTTOM = (128, 384), (384, 128), (384, 384)
GREEN, MAGENTA, BLACK = (0, 255, 0), (255, 0, 255), (0, 0, 0)
#: magenta at a quarter and at half of its window (a single channel is shown as its window says)
QUARTER, HALF = (64, 0, 64), (128, 0, 128)


def _image() -> np.ndarray:
    img = np.zeros((2, 3, SIDE, SIDE), np.uint16)
    img[:, 0, :, : SIDE // 2] = 1000
    img[0, 1, : SIDE // 2, :] = 1000
    img[0, 1, SIDE // 2 :, SIDE // 2 :] = 250
    img[1, 1] = 1000
    return img


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    if not (osd_dir() / "openseadragon.min.js").is_file():
        pytest.skip("OpenSeadragon is not installed (`make viewer-assets` installs it from npm)")
    adapter = ArrayAdapter(_image(), "zcyx", chunk_shape=(1, 1, 256, 256))
    with serving_arrays(tmp_path_factory.mktemp("panel"), stack=adapter) as (cat, http):
        (array_id,) = [t.array_id for r in cat.records() for t in r.source.tensors.values()]
        browser = _browser()
        try:
            yield browser, f"{http.url}/view/{array_id}", f"{http.url}/histogram/{array_id};z=0"
        finally:
            browser.quit()


def _settled(browser, opened: int, seconds: float = 60) -> None:
    """Wait until the panel has (re)opened the source ``opened`` times and every tile is drawn."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if browser.execute_script(
            "return !!(window.viewerPanel && viewerPanel.channels.length && viewerPanel.opened >= arguments[0]"
            " && viewer.world.getItemCount() && viewer.world.getItemAt(0).getFullyLoaded())",
            opened,
        ):
            time.sleep(0.5)
            return
        time.sleep(0.2)
    raise AssertionError(f"the viewer did not settle: {browser.execute_script('return window.viewerPanel')}")


def _colour(browser, point) -> np.ndarray:
    from PIL import Image

    shot = np.asarray(Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("RGB"), np.float64)
    px, py = browser.execute_script(
        "var p = viewer.viewport.imageToViewerElementCoordinates(new OpenSeadragon.Point(arguments[0], arguments[1]));"
        "return [Math.round(p.x), Math.round(p.y)];",
        *point,
    )
    return shot[py - 2 : py + 3, px - 2 : px + 3].reshape(-1, 3).mean(axis=0)


def _near(got: np.ndarray, want) -> bool:
    return bool(np.all(np.abs(got - np.asarray(want, np.float64)) < 30))


def _set(browser, selector: str, value) -> None:
    """Set an input of the panel as a user does: its value, then the event it listens to."""
    browser.execute_script(
        "var i = document.querySelector(arguments[0]);"
        "if (i.type === 'checkbox') { i.checked = arguments[1]; i.dispatchEvent(new Event('change')); }"
        "else { i.value = arguments[1]; i.dispatchEvent(new Event('input')); }",
        selector,
        value,
    )


def test_the_panel_toggles_windows_moves_z_and_shares_the_view(page):
    browser, url, _ = page
    browser.get(url)
    _settled(browser, 0)
    assert browser.execute_script("return viewerPanel.channels.map(function (c) { return c.visible; })") == [True] * 3
    assert _near(_colour(browser, LEFT_BOTTOM), GREEN) and _near(_colour(browser, RIGHT_TOP), MAGENTA)
    assert _near(_colour(browser, RIGHT_BOTTOM), QUARTER)

    _set(browser, '.channel[data-index="0"] .visible', False)  # channel 0 off
    _settled(browser, 1)
    assert _near(_colour(browser, LEFT_BOTTOM), BLACK) and _near(_colour(browser, RIGHT_TOP), MAGENTA)

    _set(browser, '.channel[data-index="1"] .end', 500)  # 250 is now half the window
    _settled(browser, 2)
    assert _near(_colour(browser, RIGHT_BOTTOM), HALF) and _near(_colour(browser, RIGHT_TOP), MAGENTA)

    _set(browser, ".axis-z", 1)  # plane 1: channel 1 lights everything
    _settled(browser, 3)
    assert _near(_colour(browser, RIGHT_BOTTOM), MAGENTA) and _near(_colour(browser, LEFT_BOTTOM), MAGENTA)

    shared = browser.current_url
    assert "#r=" in shared and "z=1" in shared and "view=" in shared
    browser.get("about:blank")
    browser.get(shared)
    _settled(browser, 1)
    shown = "return viewerPanel.channels.map(function (c) { return [c.visible, c.end]; })"
    assert browser.execute_script(shown)[:2] == [[False, 1000], [True, 500]]  # channel 2 (dark) stays on
    assert browser.execute_script("return document.querySelector('.axis-z').value") == "1"
    assert _near(_colour(browser, RIGHT_BOTTOM), MAGENTA) and _near(_colour(browser, LEFT_BOTTOM), MAGENTA)
    browser.execute_script(
        "viewer.viewport.zoomTo(1, null, true); viewer.viewport.panTo(new OpenSeadragon.Point(0.5, 0.5), true);"
    )
    _set(browser, ".axis-z", 0)  # the restored spec holds the moved window: 250 is half of it
    _settled(browser, 2)
    assert _near(_colour(browser, RIGHT_BOTTOM), HALF) and _near(_colour(browser, LEFT_BOTTOM), BLACK)


HIST_W, HIST_H = 150, 30
GREY = (153, 153, 153)


def _histogram_canvas(browser, index: int) -> np.ndarray:
    """The RGBA pixels drawn on channel ``index``'s histogram canvas, ``(HIST_H, HIST_W, 4)``."""
    data = browser.execute_script(
        "var c = document.querySelector('.channel[data-index=\"' + arguments[0] + '\"] canvas.histogram');"
        "return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data);",
        index,
    )
    return np.array(data, np.uint8).reshape(HIST_H, HIST_W, 4)


def _bar_heights(counts: list[int]) -> np.ndarray:
    """The bars the panel draws of ``counts``: bins summed per canvas column, log-scaled heights."""
    n = len(counts)
    cols = np.zeros(HIST_W)
    np.add.at(cols, np.minimum(HIST_W - 1, np.arange(n) * HIST_W // n), counts)
    heights = np.floor(HIST_H * np.log1p(cols) / np.log1p(cols.max()) + 0.5)
    return np.where(cols > 0, np.maximum(1, heights), 0).astype(int)


def test_each_channel_draws_its_histogram_under_its_window_sliders(page):
    browser, url, histogram = page
    browser.get(url)
    _settled(browser, 0)
    hist = httpx.get(histogram, params={"c": "1"}, timeout=30).json()["channels"][0]
    assert hist["exact"] and hist["min"] == 0 and len(hist["counts"]) == 1001  # values 0, 250 and 1000
    want = _bar_heights(hist["counts"])
    assert [x for x in range(HIST_W) if want[x]] == [0, 37, 149] and want[149] == HIST_H and 0 < want[37] < HIST_H

    drawn = _histogram_canvas(browser, 1)
    bars = drawn[..., 3] == 255
    assert bars.sum(axis=0).tolist() == want.tolist()  # each column's bar, as tall as its count says
    assert all(bars[HIST_H - want[x] :, x].all() for x in (0, 37, 149))  # standing on the bottom
    assert (drawn[bars][:, :3] == MAGENTA).all()  # the window is 0-1000: every bar is inside it
    assert (drawn[~bars][:, 3] == 26).all()  # the window shaded behind them
    below = browser.execute_script(
        "var r = document.querySelector('.channel[data-index=\"1\"]');"
        "return r.querySelector('canvas.histogram').getBoundingClientRect().top"
        " >= r.querySelector('.end').getBoundingClientRect().bottom;"
    )
    assert below

    _set(browser, '.channel[data-index="1"] .end', 500)  # the window ends at column 74.9
    drawn = _histogram_canvas(browser, 1)
    assert drawn[HIST_H - 1, 0, :3].tolist() == list(MAGENTA) and drawn[HIST_H - 1, 37, :3].tolist() == list(MAGENTA)
    assert drawn[HIST_H - 1, 149, :3].tolist() == list(GREY)  # the value 1000 is now past the window's end
    assert drawn[HIST_H - 1, 60, 3] == 26 and drawn[HIST_H - 1, 100, 3] == 0  # shaded inside, clear outside
    assert (drawn[..., 3] == 255).sum(axis=0).tolist() == want.tolist()  # the same bars
    _settled(browser, 1)
    assert _histogram_canvas(browser, 0)[HIST_H - 1, 0, :3].tolist() == list(GREEN)  # channel 0: its own colour
