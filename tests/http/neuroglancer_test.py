"""A real browser viewer: neuroglancer (the web client its PyPI package ships) in headless
Chromium opens ``zarr://http://127.0.0.1:PORT/t/<token>/zarr/<id>/`` (from another origin) and renders the served pixels.

The data is two flat halves along x (dark for x < 256, bright from 256), so the screenshot can
be checked against it. Neuroglancer's "xy" panel shows the first two dimensions of its
coordinate space (here y, x) across and down the screen, so x runs down: the top of the image
area must be dark, the bottom bright, in about equal measure — a blank, black or wrongly
oriented view fails. Skips (with
the reason) only where Chromium or its driver cannot be had; ``make test`` installs them.
"""

from __future__ import annotations

import io
import shutil
import tempfile
import time

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tests.http.conftest import http_serving


def _browser():
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip(
            "Chromium and chromedriver are not installed (Debian packages chromium, chromium-driver; "
            "`make test` installs them where apt works)"
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (the test extra has it)")
    opts = webdriver.ChromeOptions()
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--use-angle=swiftshader",
        "--enable-unsafe-swiftshader",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-quic",
        "--disable-dev-shm-usage",
        "--window-size=800,600",
        f"--user-data-dir={tempfile.mkdtemp(prefix='ts-chromium-')}",
    ):
        opts.add_argument(arg)
    opts.binary_location = chromium
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console lines for a failure's message
    return webdriver.Chrome(service=Service(driver), options=opts)


def test_neuroglancer_renders_the_served_tensor(tmp_path):
    import neuroglancer
    from PIL import Image

    halves = np.full((512, 512), 2000, np.uint16)
    halves[:, 256:] = 60000
    cat = Catalog([])
    cat.add_source(
        MemorySource(
            ArrayAdapter(
                halves,
                "yx",
                chunk_shape=(256, 256),
                physical_scale=(1.0, 1.0),
                physical_unit=("micrometer", "micrometer"),
            ),
            source_id="halves",
        )
    )
    cat.first_scan_done.set()
    from tensor_server.http.security import HttpSecurity

    token = "neuroglancer-token"  # in the URL path, as the server prints it: every sub-request keeps it
    with http_serving(cat, tmp_path, security=HttpSecurity.build(tokens=[token])) as (srv, http):
        neuroglancer.set_server_bind_address("127.0.0.1")
        viewer = neuroglancer.Viewer()
        with viewer.txn() as state:
            state.layers["halves"] = neuroglancer.ImageLayer(
                source=f"zarr://{http.url}/t/{token}/zarr/halves/",
                shader="void main() { emitGrayscale(float(getDataValue().value) / 65535.0); }",
            )
            state.layout = "xy"
        png = screenshot_after_chunks(viewer, srv)
        (tmp_path / "neuroglancer.png").write_bytes(png)
    assert served_chunks(srv) >= 4, "neuroglancer fetched no chunks"
    shot = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.float64)
    h, w = shot.shape
    rows = shot[:, w // 3 : 2 * w // 3].mean(axis=1)  # the middle third, inside the image area
    dark = rows < 40
    bright = rows > 200
    assert dark.sum() > h * 0.1 and bright.sum() > h * 0.1, f"dark {dark.sum()}, bright {bright.sum()} of {h} rows"
    assert np.flatnonzero(dark).mean() < np.flatnonzero(bright).mean(), "the halves are in the wrong order"
    ratio = bright.sum() / dark.sum()
    assert 0.5 < ratio < 2.0, f"halves rendered unequally: {ratio:.2f}"


def served_chunks(srv) -> int:
    """The zarr chunks the HTTP door of ``srv`` answered (the metrics' count)."""
    return srv.runtime.metrics.calls(code="OK")["http"]["zarr_chunk"]


def screenshot_after_chunks(viewer, srv=None, chunks: int = 4, *, served=None) -> bytes:
    """Open ``viewer`` in headless Chromium, wait (60 s at most) until the HTTP door of
    ``srv`` (or whatever ``served()`` counts) served ``chunks`` chunks, let them draw, and take
    a screenshot (PNG bytes)."""
    served = served or (lambda: served_chunks(srv))
    browser = _browser()
    try:
        browser.get(viewer.get_viewer_url())
        deadline = time.monotonic() + 60
        while served() < chunks and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(3)  # let the last chunks upload to the GPU and draw
        return browser.get_screenshot_as_png()
    finally:
        browser.quit()
