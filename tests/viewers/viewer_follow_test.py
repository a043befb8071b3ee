"""The viewer page's "follow" box on the t slider (``http/viewer_panel.js``) in headless
Chromium: over an OME-Zarr image (t, c, y, x) that a writer process grows along t, ticking
it moves the slider to the newest frame as the Server-Sent Events at ``/watch/<id>`` report
each growth, and shows that frame (the IIIF source reopened at it); unticked, the slider
stays where it is while the image grows on."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zarr

from tensor_server.catalog import Catalog
from tensor_server.http.catalog_page import osd_dir
from tensor_server.testing import serving
from tests.http.neuroglancer_test import _browser
from tests.service.live_growth_test import PATIENCE

WRITER = """
import sys
import numpy as np, zarr
z = zarr.open_array(sys.argv[1], mode="r+")
for t in range(int(sys.argv[2]), int(sys.argv[3])):
    z.resize((t + 1,) + z.shape[1:])
    z[t] = np.full(z.shape[1:], 100 * (t + 1), np.uint16)
"""


def _image(path) -> None:
    """An OME-Zarr 0.5 image of 2 time points of 2 channels of 64²; frame t is 100 * (t + 1)."""
    root = zarr.open_group(str(path), mode="w", zarr_format=3)
    axes = [{"name": "t", "type": "time"}, {"name": "c", "type": "channel"}]
    axes += [{"name": n, "type": "space"} for n in "yx"]
    scale = [{"type": "scale", "scale": [1.0, 1.0, 1.0, 1.0]}]
    root.attrs["ome"] = {
        "version": "0.5",
        "multiscales": [{"axes": axes, "datasets": [{"path": "0", "coordinateTransformations": scale}]}],
    }
    z = root.create_array("0", shape=(2, 2, 64, 64), chunks=(1, 1, 64, 64), dtype="uint16")
    for t in range(2):
        z[t] = np.full((2, 64, 64), 100 * (t + 1), np.uint16)


def _until(browser, script: str, *args) -> object:
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        got = browser.execute_script(script, *args)
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"never true: {script} {browser.execute_script('return window.viewerPanel')}")


def _grow(path, first: int, last: int) -> None:
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", WRITER, str(path / "0"), str(first), str(last)], check=True, timeout=PATIENCE)


def test_the_follow_box_moves_the_t_slider_to_the_newest_frame(tmp_path):
    if not (osd_dir() / "openseadragon.min.js").is_file():
        pytest.skip("OpenSeadragon is not installed (`make viewer-assets` installs it from npm)")
    root = tmp_path / "root"
    root.mkdir()
    _image(root / "live.ome.zarr")
    catalog = Catalog([root])
    catalog.scan()
    with serving(catalog, http=True) as served:
        array_id = catalog.records()[0].source.tensor().array_id
        browser = _browser()
        try:
            browser.get(f"{served.http_url}/view/{array_id}")
            _until(browser, "return !!document.querySelector('input.follow-t')")
            slider = "document.querySelector('input.axis-t')"
            assert browser.execute_script(f"return [{slider}.max, {slider}.value]") == ["1", "0"]
            _grow(root / "live.ome.zarr", 2, 3)  # not followed: the slider stays
            time.sleep(1.0)
            assert browser.execute_script("return viewerPanel.plane.t") == 0
            browser.execute_script("document.querySelector('input.follow-t').click()")
            _until(browser, "return viewerPanel.plane.t === 2 && viewerPanel.opened >= 1")
            _grow(root / "live.ome.zarr", 3, 5)
            _until(browser, "return viewerPanel.plane.t === 4")
            assert browser.execute_script(f"return [{slider}.max, {slider}.value]") == ["4", "4"]
            shown = "var s = viewer.world.getItemCount() && viewer.world.getItemAt(0).source;"
            shown += "return s && String(s.id || s['@id'] || s.url || '').indexOf(';t=4') >= 0"
            _until(browser, shown)  # the newest frame is what the viewer opened
            browser.execute_script("document.querySelector('input.follow-t').click()")
            assert browser.execute_script("return viewerPanel.following") is None, "the stream is closed"
        finally:
            browser.quit()
