"""Headless Chromium: a page on one loopback origin cannot read the server on another without
the access token, even after the user opened the token URL (the cookie it set is never enough
for another origin); with the token in the URL it can. Skips (with the reason) only where
Chromium or its driver cannot be had, like tests/http/neuroglancer_test.py."""

from __future__ import annotations

import functools
import http.server
import threading

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.http.security import HttpSecurity
from tests.http.conftest import http_serving

TOKEN = "browser-token"
FETCH = """const [url, credentials, done] = arguments;
fetch(url, {credentials}).then(r => r.text().then(t => done(r.status + ':' + t.slice(0, 60))))
                         .catch(e => done('blocked:' + e.name));"""


@pytest.fixture
def other_origin(tmp_path):
    """A static page server on another loopback port: the 'web page the user visits'."""
    (tmp_path / "page").mkdir()
    (tmp_path / "page" / "index.html").write_text("<!doctype html><title>another origin</title>")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:  # no access log on the test's stderr
            pass

    handler = functools.partial(Quiet, directory=str(tmp_path / "page"))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/index.html"
    httpd.shutdown()
    httpd.server_close()


def test_a_cross_origin_page_reads_only_with_the_token(tmp_path, other_origin):
    from tests.http.neuroglancer_test import _browser

    browser = _browser()  # skips without Chromium
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(np.ones((64, 64), np.uint16), "yx"), source_id="img"))
    cat.first_scan_done.set()
    try:
        with http_serving(cat, tmp_path, security=HttpSecurity.build(tokens=[TOKEN])) as (srv, http):
            plain, bearing = f"{http.url}/zarr/img/.zattrs", f"{http.url}/t/{TOKEN}/zarr/img/.zattrs"
            browser.set_script_timeout(30)
            browser.get(other_origin)
            assert browser.execute_async_script(FETCH, plain, "same-origin") == "blocked:TypeError"
            assert srv.runtime.metrics.refusals()["http"]["cross_origin"] == 1
            read = browser.execute_async_script(FETCH, bearing, "same-origin")
            assert read.startswith("200:") and '"multiscales"' in read, read
            browser.get(f"{http.url}/t/{TOKEN}/zarr/img/")  # the user opens the printed URL: the cookie
            browser.get(plain)  # the server's own pages, token-free now
            assert '"multiscales"' in browser.page_source
            browser.get(other_origin)  # and another page the user visits tries the cookie
            assert browser.execute_async_script(FETCH, plain, "include") == "blocked:TypeError"
            assert srv.runtime.metrics.refusals()["http"]["cross_origin"] == 2
    finally:
        browser.quit()
        cat.close()
