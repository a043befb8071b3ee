"""``/api/catalog?folder=…``: the catalog page's level as JSON, from the same service call
(``CatalogVerbs.catalog_level``), under the same auth; links that work where they are pasted
(the page's ``/t/<token>/`` links, IIIF ``info.json`` ids that carry the request's credential);
an unreadable source shows its reason, escaped, on the page and in the JSON."""

from __future__ import annotations

import html

import httpx
import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tests.http.conftest import http_serving

TOKEN = "api-token"
PLANE = np.arange(60 * 80, dtype=np.uint16).reshape(60, 80)
#: a file no reader opens, its name markup: the page must show it as text
BAD = "<i>bad&.tif"


@pytest.fixture(scope="module")
def api_server(tmp_path_factory):
    import tifffile

    root = tmp_path_factory.mktemp("api-root")
    (root / "lab").mkdir()
    tifffile.imwrite(root / "lab" / "plane.tif", PLANE)
    (root / "lab" / BAD).write_bytes(b"II*\x00 not a tiff at all")
    cat = Catalog([root])
    cat.scan()
    cat.add_source(
        MemorySource(
            ArrayAdapter(PLANE, "yx", physical_scale=(0.5, 0.25), physical_unit=("micrometer", "micrometer")),
            source_id="mem",
        )
    )
    with http_serving(cat, tmp_path_factory.mktemp("api-cache"), token=TOKEN) as (srv, http):
        yield cat, srv, http
    cat.close()


def _get(http, path, token=TOKEN, **kw):
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return httpx.get(f"{http.url}{path}", headers=headers, timeout=60, **kw)


def _folder(doc, name):
    return next(f["key"] for f in doc["folders"] if f["name"].endswith(name))


def test_the_json_catalog_lists_each_level_with_its_tensors(api_server):
    cat, srv, http = api_server
    top = _get(http, "/api/catalog").json()
    assert top["key"] == "" and not top["truncated"]
    mem = next(s for s in top["sources"] if s["source_id"] == "mem")
    assert mem["unresolved_reason"] is None
    (tensor,) = mem["tensors"]
    assert tensor["array_id"] == "mem" and tensor["shape"] == [60, 80] and tensor["dtype"] == "<u2"
    assert tensor["dim_labels"] == ["y", "x"] and tensor["is_labels"] is False
    assert tensor["physical_scale"] == [0.5, 0.25] and tensor["physical_unit"] == ["µm", "µm"]
    assert tensor["urls"]["OME-Zarr v3 (NGFF 0.5)"] == f"/t/{TOKEN}/zarr3/mem/"
    lab = _get(http, f"/api/catalog?folder={_folder(top, 'lab')}").json()
    by_name = {s["name"]: s for s in lab["sources"]}
    assert set(by_name) == {"plane.tif", BAD}
    assert by_name["plane.tif"]["tensors"][0]["shape"] == [60, 80]
    plane_id = by_name["plane.tif"]["source_id"]
    assert by_name["plane.tif"]["tensors"][0]["array_id"] == plane_id
    bad = by_name[BAD]
    assert bad["tensors"] == [] and bad["unresolved_reason"]  # the reason SQL gives
    sql = srv.client(TOKEN).query(
        f"SELECT unresolved_reason FROM sources WHERE source_id = '{bad['source_id']}'", format="records"
    )
    assert sql == [{"unresolved_reason": bad["unresolved_reason"]}]
    # the page shows the same level, from the same call
    page = _get(http, f"/?folder={_folder(top, 'lab')}").text
    assert f"<b>{plane_id}</b>" in page


@pytest.mark.parametrize("token", [None, "wrong"])
def test_the_json_catalog_is_refused_without_the_token(api_server, token):
    _, _, http = api_server
    r = _get(http, "/api/catalog", token)
    assert r.status_code == 401 and "mem" not in r.text


def test_an_unreadable_source_shows_its_reason_escaped(api_server):
    cat, _, http = api_server
    top = _get(http, "/api/catalog").json()
    lab = _get(http, f"/api/catalog?folder={_folder(top, 'lab')}").json()
    reason = next(s for s in lab["sources"] if s["name"] == BAD)["unresolved_reason"]
    page = _get(http, f"/?folder={_folder(top, 'lab')}").text
    assert f'<p class="unresolved">cannot be read: {html.escape(reason)}</p>' in page
    assert BAD not in page and html.escape(BAD) in page  # the name is text, never markup


def test_page_links_carry_the_token_in_their_path_and_work_pasted(api_server):
    _, _, http = api_server
    page = _get(http, f"/?token={TOKEN}").text
    assert f'href="/t/{TOKEN}/zarr/mem/"' in page and "?token=" not in page
    meta = httpx.get(f"{http.url}/t/{TOKEN}/zarr/mem/0/.zarray").json()  # pasted: no cookie, no header
    assert meta["shape"] == [60, 80]


@pytest.mark.parametrize("how", ["path", "query", "header"])
def test_an_iiif_id_carries_the_credential_the_request_came_with(api_server, how):
    _, _, http = api_server
    if how == "path":
        info = httpx.get(f"{http.url}/t/{TOKEN}/iiif/3/mem/info.json").json()
    elif how == "query":
        info = httpx.get(f"{http.url}/iiif/3/mem/info.json?token={TOKEN}").json()
    else:
        info = _get(http, "/iiif/3/mem/info.json").json()
    assert info["id"] == f"{http.url}/t/{TOKEN}/iiif/3/mem"
    # a viewer on another origin fetches tiles from the id alone
    tile = httpx.get(f"{info['id']}/full/max/0/default.png", headers={"Origin": "http://viewer.example"})
    assert tile.status_code == 200 and tile.content[:4] == b"\x89PNG"
