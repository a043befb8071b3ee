"""The catalog page's SDK snippet, pasted, reads: it names the location the Flight door really
listens on (its port, not 8815; ``grpcs://`` with TLS; the page's host name when the door
listens on every address), and executing its text with the real biopb SDK returns the tensor."""

from __future__ import annotations

import html
import re
import ssl

import httpx
import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.testing import serving

ARR = (np.arange(48 * 40, dtype=np.uint16) * 7).reshape(48, 40)


@pytest.fixture(scope="module")
def catalog():
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(ARR, "yx", chunk_shape=(16, 16)), source_id="cells"))
    cat.first_scan_done.set()
    yield cat
    cat.close()


def _snippet(page: str) -> str:
    """The one SDK snippet of the page, as the user copies it (the text of its ``<pre>``)."""
    blocks = re.findall(r"<pre>(.*?)</pre>", page, re.S)
    assert len(blocks) == 1, page
    return html.unescape(blocks[0])


def _run(snippet: str) -> np.ndarray:
    scope: dict = {}
    exec(snippet, scope)
    return np.asarray(scope["data"])


def test_the_snippet_names_the_flight_port_and_reads(catalog):
    with serving(catalog, http=True) as srv:
        page = httpx.get(f"{srv.http_url}/").text
        snippet = _snippet(page)
        port = srv.flight.port
        assert port != 8815
        assert f"TensorFlightClient('grpc://127.0.0.1:{port}')" in snippet
        np.testing.assert_array_equal(_run(snippet), ARR)


def test_with_tls_on_every_address_it_names_grpcs_and_the_pages_host(catalog, tmp_path, monkeypatch):
    from biopb.tensor._tls import clear_pin_cache

    from tensor_server.service.tls import server_tls

    monkeypatch.setenv("BIOPB_STATE_HOME", str(tmp_path / "biopb-state"))  # the SDK pins into tmp
    clear_pin_cache()
    tls = server_tls(tmp_path / "home")
    try:
        with serving(catalog, http=True, tls=tls, host="0.0.0.0", token="page-token") as srv:
            url = srv.http_url.replace("://127.0.0.1:", "://localhost:")
            verify = ssl.create_default_context(cadata=tls.cert_pem.decode())
            page = httpx.get(f"{url}/", params={"token": "page-token"}, verify=verify).text
            snippet = _snippet(page)
            assert f"TensorFlightClient('grpcs://localhost:{srv.flight.port}', token='page-token')" in snippet
            np.testing.assert_array_equal(_run(snippet), ARR)
    finally:
        clear_pin_cache()
