"""One reading of the token on every HTTP listener: the HTTP door and the metrics door accept
and refuse the same forms (``http/credentials.py``; compared in ``service/access.py``). The
HTTP door's cookie is its browser pages' (``http_security_test.py``) and not a form here."""

from __future__ import annotations

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.config import Settings
from tensor_server.http.metrics_door import MetricsDoor
from tensor_server.http.security import HttpSecurity
from tensor_server.service import ServingRuntime
from tests.http.conftest import http_serving

TOKEN = "per-run-token"

#: (form, path prefix, query, Authorization header, admitted)
FORMS = [
    ("nothing", "", "", None, False),
    ("bearer header", "", "", f"Bearer {TOKEN}", True),
    ("bearer scheme in lower case", "", "", f"bearer {TOKEN}", True),
    ("wrong bearer", "", "", "Bearer wrong", False),
    ("another scheme", "", "", f"Basic {TOKEN}", False),
    ("query", "", f"token={TOKEN}", None, True),
    ("wrong query", "", "token=wrong", None, False),
    ("path prefix", f"/t/{TOKEN}", "", None, True),
    ("wrong path prefix", "/t/wrong", "", None, False),
    ("right path, wrong query", f"/t/{TOKEN}", "token=wrong", None, False),
    ("right query, wrong bearer", "", f"token={TOKEN}", "Bearer wrong", False),
]


def _catalog() -> Catalog:
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(np.zeros((8, 8), np.uint8), "yx"), source_id="img"))
    cat.first_scan_done.set()
    return cat


@pytest.fixture(scope="module")
def http_door(tmp_path_factory):
    cat = _catalog()
    with http_serving(cat, tmp_path_factory.mktemp("forms"), security=HttpSecurity.build(tokens=[TOKEN])) as (_, http):
        yield http.url, "/zarr/img/.zattrs"
    cat.close()


@pytest.fixture(scope="module")
def metrics_door():
    cat = _catalog()
    rt = ServingRuntime(cat, Settings(token=TOKEN, metrics_port=0))
    door = MetricsDoor(rt, "127.0.0.1", 0)
    try:
        yield door.url.removesuffix("/metrics"), "/metrics"
    finally:
        door.stop()
        rt.close()
        cat.close()


@pytest.mark.parametrize("door", ["http_door", "metrics_door"])
@pytest.mark.parametrize("form, prefix, query, authorization, admitted", FORMS, ids=[f[0] for f in FORMS])
def test_both_doors_read_the_same_token_forms(request, door, form, prefix, query, authorization, admitted) -> None:
    import httpx

    base, path = request.getfixturevalue(door)
    headers = {} if authorization is None else {"Authorization": authorization}
    resp = httpx.get(f"{base}{prefix}{path}{'?' + query if query else ''}", headers=headers, timeout=10)
    assert resp.status_code == (200 if admitted else 401), (door, form, resp.text)
    if admitted:
        expected = "multiscales" if door == "http_door" else "tensor_server_catalog_sources"
        assert expected in resp.text
    else:
        assert resp.headers["www-authenticate"] == "Bearer"
