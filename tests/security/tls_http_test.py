"""HTTPS on the HTTP door: zarr-python reads the virtual OME-Zarr over fsspec, trusting the
server's self-signed certificate; a client that does not trust it gets no bytes."""

from __future__ import annotations

import ssl

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.http.security import HttpSecurity, cookie_name
from tests.http.conftest import http_serving

TOKEN = "https-token"
IMG = np.random.default_rng(5).integers(0, 60000, (200, 150), dtype=np.uint16)


@pytest.fixture(scope="module")
def https_door(tmp_path_factory, server_cert):
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(IMG, "yx", chunk_shape=(64, 64)), source_id="img"))
    cat.first_scan_done.set()
    with http_serving(
        cat, tmp_path_factory.mktemp("https"), security=HttpSecurity.build(tokens=[TOKEN]), tls=server_cert
    ) as (srv, http):
        yield http
    cat.close()


def trusting(server_cert) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=server_cert.cert_pem.decode())


def test_zarr_python_reads_over_https(https_door, server_cert):
    import zarr

    assert https_door.url.startswith("https://127.0.0.1:")
    url = f"{https_door.url}/t/{TOKEN}/zarr/img/"
    group = zarr.open_group(url, mode="r", storage_options={"ssl": trusting(server_cert)})
    assert group.attrs["multiscales"][0]["datasets"][0]["path"] == "0"
    np.testing.assert_array_equal(group["0"][...], IMG)
    np.testing.assert_array_equal(group["0"][100:140, 20:90], IMG[100:140, 20:90])


def test_an_untrusting_client_is_refused_and_plaintext_gets_nothing(https_door, server_cert):
    import httpx

    url = f"{https_door.url}/t/{TOKEN}/zarr/img/.zattrs"
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(url)  # the system store does not hold a self-signed leaf
    with pytest.raises(httpx.HTTPError):
        httpx.get(url.replace("https://", "http://"))
    ok = httpx.get(url, verify=trusting(server_cert))
    assert ok.status_code == 200 and ok.json()["multiscales"][0]["datasets"][0]["path"] == "0"
    cookie = ok.headers["set-cookie"]
    assert cookie.startswith(f"{cookie_name(https_door.port)}={TOKEN};") and "; Secure" in cookie
