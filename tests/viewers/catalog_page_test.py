"""The catalog page in headless Chromium, with the per-run token: every source is listed
(folder by folder), every thumbnail decodes, every link carries the token in its path form
(``/t/<token>/``, never ``?token=``) and answers 200 pasted into a client with no cookie and
no header; without the token the page is refused."""

from __future__ import annotations

from urllib.parse import urljoin

import httpx
import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tests.http.conftest import http_serving
from tests.http.neuroglancer_test import _browser

TOKEN = "page-token"


@pytest.fixture(scope="module")
def page_server(tmp_path_factory):
    import tifffile

    root = tmp_path_factory.mktemp("page-root")
    rng = np.random.default_rng(3)
    for rel in ("lab/a/plane.tif", "lab/a/other.tif", "lab/b/deep/vol.tif", "top.tif"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shape = (3, 200, 300) if rel.endswith("vol.tif") else (300, 400)
        rgb = {"photometric": "rgb", "planarconfig": "separate"} if len(shape) == 3 else {}
        tifffile.imwrite(root / rel, rng.integers(0, 4000, shape, dtype=np.uint16), **rgb)
    cat = Catalog([root])
    cat.scan()
    cat.add_source(
        MemorySource(ArrayAdapter(rng.integers(0, 255, (2, 64, 80), dtype=np.uint8), "cyx"), source_id="inmemory")
    )
    with http_serving(cat, tmp_path_factory.mktemp("page-cache"), token=TOKEN) as (srv, http):
        yield cat, http
    cat.close()


def test_the_page_lists_every_source_with_working_thumbnails_and_links(page_server):
    from selenium.webdriver.common.by import By

    cat, http = page_server
    want = {r.source_id for r in cat.records()}
    assert httpx.get(f"{http.url}/").status_code == 401
    browser = _browser()
    seen, links, pending = set(), set(), [f"{http.url}/?token={TOKEN}"]
    try:
        while pending:
            browser.get(pending.pop())
            for h2 in browser.find_elements(By.CSS_SELECTOR, "h2.source small"):
                seen.add(h2.text.strip("()"))
            pending += [a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "a.folder")]
            images = browser.find_elements(By.CSS_SELECTOR, "img.thumb")
            browser.execute_script(
                "return Promise.all(Array.from(document.images).map(i => i.decode().catch(() => null)))"
            )
            for img in images:
                ok = browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", img)
                assert ok, f"thumbnail {img.get_attribute('src')} did not decode"
            links |= {a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "td.urls a")}
    finally:
        browser.quit()
    assert seen == want, f"listed {sorted(seen)}, served {sorted(want)}"
    assert len(links) >= 5 * len(want)
    assert all(urljoin(http.url, u).startswith(f"{http.url}/t/{TOKEN}/") for u in links), sorted(links)[:3]
    assert not [u for u in links if "token=" in u]  # zarr clients would mangle a query
    with httpx.Client() as client:  # pasted elsewhere: no cookie, no header
        for url in sorted(links):
            r = client.get(urljoin(http.url, url))
            assert r.status_code == 200, f"{url}: {r.status_code} {r.text[:200]}"


def test_viewer_doors_need_the_token_and_refuse_bad_requests_plainly(page_server):
    cat, http = page_server
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for path in ("/iiif/3/inmemory/info.json", "/deepzoom/inmemory.dzi", "/view/inmemory"):
        assert httpx.get(f"{http.url}{path}").status_code == 401
        assert httpx.get(f"{http.url}{path}", headers=auth).status_code == 200
    cases = {
        "/iiif/3/inmemory/0,0,0,0/max/0/default.jpg": 400,
        "/iiif/3/inmemory/full/max/45/default.jpg": 501,
        "/iiif/3/nothing-here/info.json": 404,
        "/iiif/3/inmemory;z=1/info.json": 400,
        "/deepzoom/inmemory_files/99/0_0.jpg": 400,
        "/iiif/3/" + "x" * 5000 + "/info.json": 400,
    }
    for path, status in cases.items():
        r = httpx.get(f"{http.url}{path}", headers=auth)
        assert r.status_code == status, f"{path[:80]}: {r.status_code} {r.text[:200]}"
        assert "Traceback" not in r.text and len(r.text) < 1200
    redirect = httpx.get(f"{http.url}/iiif/3/inmemory", headers=auth)
    assert redirect.status_code == 303 and redirect.headers["location"].endswith("/iiif/3/inmemory/info.json")
