"""Share links (issue 45) through the real doors: made with the ``share`` action (the server
token or the tensor's owner only), opened as ``/s/<capability>/zarr/<id>/`` by a zarr client,
reading the tensor and its label images and nothing else; revocation, rotation and expiry
refused from the next request on, saying which. ``DoorTests`` asserts the read rule on every
door; here: the actions, the path form, labels, scopes, owners and the kept files."""

from __future__ import annotations

import json
import os
import stat
import time

import httpx
import numpy as np
import pyarrow.flight as flight
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.errors import Unauthenticated
from tensor_server.service.shares import ShareStore, parse_duration
from tensor_server.testing import serving

TOKEN = "server-token-for-shares"
IMAGE = (np.arange(40 * 60, dtype=np.uint16) % 251).reshape(40, 60)
LABELS = (np.arange(40 * 60, dtype=np.uint16) % 3).reshape(40, 60)


@pytest.fixture
def catalog(tmp_path):
    cat = Catalog([], rois_path=str(tmp_path / "rois.duckdb"))
    image = ArrayAdapter(IMAGE, "yx", chunk_shape=IMAGE.shape)
    cells = ArrayAdapter(LABELS, "yx", chunk_shape=LABELS.shape, is_labels=True)
    cat.add_source(MemorySource({"image": image, "labels/cells": cells}, source_id="slide"))
    cat.add_source(MemorySource(ArrayAdapter(IMAGE + 1, "yx"), source_id="other"))
    cat.first_scan_done.set()
    yield cat
    cat.close()


def _action(srv, name, body, token=TOKEN):
    client = flight.FlightClient(srv.location)
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    try:
        results = client.do_action(
            flight.Action(name, json.dumps(body).encode()), flight.FlightCallOptions(headers=headers)
        )
        return [json.loads(r.body.to_pybytes()) for r in results]
    finally:
        client.close()


def _chunk(url: str) -> np.ndarray:
    meta = httpx.get(f"{url}0/.zarray", timeout=30)
    assert meta.status_code == 200, meta.text
    shape = meta.json()["shape"]
    body = httpx.get(f"{url}0/{'.'.join('0' * len(shape))}", timeout=30)
    assert body.status_code == 200, body.text
    return np.frombuffer(body.content, np.dtype(meta.json()["dtype"])).reshape(meta.json()["chunks"])


def test_a_link_opens_its_tensor_and_labels_and_nothing_else_until_revoked(catalog, tmp_path):
    with serving(catalog, http=True, token=TOKEN, shares_dir=str(tmp_path / "shares")) as srv:
        (made,) = _action(srv, "share", {"array_id": "slide", "expires_seconds": 600})
        assert made["url"] == f"{srv.http_url}/s/{made['capability']}/zarr/slide/image/"
        assert made["scope"] == "read" and made["array_id"] == "slide/image"
        np.testing.assert_array_equal(_chunk(made["url"]), IMAGE)
        np.testing.assert_array_equal(_chunk(f"{made['url']}labels/cells/"), LABELS)  # what it contains
        base = f"{srv.http_url}/s/{made['capability']}"
        assert httpx.get(f"{base}/zarr/other/.zattrs", timeout=30).status_code == 401  # a sibling source
        assert httpx.get(f"{base}/api/catalog", timeout=30).status_code == 401  # no listing
        assert httpx.get(f"{base}/iiif/3/slide/info.json", timeout=30).status_code == 200
        assert httpx.get(f"{base}/deepzoom/slide.dzi", timeout=30).status_code == 200
        with pytest.raises(flight.FlightUnauthenticatedError):  # no control verb with it
            _action(srv, "share", {"array_id": "slide"}, token=made["capability"])

        (listed,) = _action(srv, "share_list", {})
        assert [(x["id"], x["state"]) for x in listed["links"]] == [(made["id"], "live")]
        (revoked,) = _action(srv, "share_revoke", {"id": made["id"]})
        assert revoked["state"] == "revoked"
        refused = httpx.get(f"{made['url']}.zattrs", timeout=30)  # the very next request
        assert refused.status_code == 401 and f"share link {made['id']} was revoked" in refused.text
        (listed,) = _action(srv, "share_list", {})
        assert [x["state"] for x in listed["links"]] == ["revoked"]


def test_the_viewer_page_opened_with_a_link_loads_its_script_and_tiles_with_it(catalog, tmp_path, monkeypatch):
    """A link earns no cookie, so the page it opens names it in the URLs of its script, its
    OpenSeadragon and its tile source; the IIIF ``id`` carries it on to every tile."""
    import re

    osd = tmp_path / "osd"
    osd.mkdir()
    (osd / "openseadragon.min.js").write_text("// stand-in")
    monkeypatch.setenv("TENSOR_SERVER_OSD_DIR", str(osd))
    with serving(catalog, http=True, token=TOKEN) as srv:
        (made,) = _action(srv, "share", {"array_id": "slide"})
        prefix = f"/s/{made['capability']}"
        page = httpx.get(f"{srv.http_url}{prefix}/view/slide/image", timeout=30)
        assert page.status_code == 200, page.text
        options = json.loads(re.search(r'id="viewer-options">(.*?)</script>', page.text).group(1))
        assert options["tileSources"] == f"{prefix}/iiif/3/slide/image/info.json"
        for src in re.findall(r'(?:src|href)="([^"]+)"', page.text):
            assert src.startswith(prefix), src
            assert httpx.get(f"{srv.http_url}{src}", timeout=30).status_code == 200, src
        info = httpx.get(f"{srv.http_url}{options['tileSources']}", timeout=30).json()
        tile = httpx.get(f"{info['id']}/full/max/0/default.png", timeout=30)
        assert tile.status_code == 200 and tile.content.startswith(b"\x89PNG")
        plain = httpx.get(f"{srv.http_url}/view/slide/image", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        assert made["capability"] not in plain.text and TOKEN not in plain.text  # a door token is never written


def test_rotating_the_secret_refuses_every_link_made_before(catalog, tmp_path):
    with serving(catalog, http=True, token=TOKEN, shares_dir=str(tmp_path / "shares")) as srv:
        (made,) = _action(srv, "share", {"array_id": "slide"})
        assert httpx.get(f"{made['url']}.zattrs", timeout=30).status_code == 200
        assert _action(srv, "share_rotate", {}) == [{"forgotten": 1}]
        refused = httpx.get(f"{made['url']}.zattrs", timeout=30)
        assert refused.status_code == 401 and "not signed by this server" in refused.text
        (fresh,) = _action(srv, "share", {"array_id": "slide"})
        assert httpx.get(f"{fresh['url']}.zattrs", timeout=30).status_code == 200


def test_a_link_outlives_a_restart_and_its_files_are_private(catalog, tmp_path):
    folder = tmp_path / "shares"
    with serving(catalog, http=True, token=TOKEN, shares_dir=str(folder)) as srv:
        (made,) = _action(srv, "share", {"array_id": "slide"})
    with serving(catalog, http=True, token=TOKEN, shares_dir=str(folder)) as srv:
        url = f"{srv.http_url}/s/{made['capability']}/zarr/slide/image/"
        np.testing.assert_array_equal(_chunk(url), IMAGE)
    for name in ("secret", "links.json"):
        assert stat.S_IMODE(os.stat(folder / name).st_mode) == 0o600
    assert made["capability"] not in (folder / "links.json").read_text()  # the list holds no key


def test_a_revocation_in_one_process_is_seen_by_another_at_once(tmp_path):
    """``serve --workers``: the HTTP workers check links the first process made and revoked."""
    minting, serving_too = ShareStore(tmp_path), ShareStore(tmp_path)
    share, capability = minting.mint("slide/image", "read", 600, "")
    assert serving_too.check(capability).id == share.id
    minting.revoke(share.id)
    with pytest.raises(Unauthenticated, match="was revoked"):
        serving_too.check(capability)
    minting.rotate()  # the other process takes the new secret: old links refused, new ones read
    with pytest.raises(Unauthenticated, match="not signed by this server"):
        serving_too.check(capability)
    fresh, fresh_capability = minting.mint("slide/image", "read", 600, "")
    assert serving_too.check(fresh_capability).id == fresh.id


def test_a_revocation_is_on_disk_before_it_is_answered(tmp_path, monkeypatch):
    """A crash after ``share_revoke`` answered must not bring the link back: the list's bytes
    and its rename are synced before ``revoke`` returns."""
    from tensor_server.service import shares
    from tensor_server.uploads import marker

    store = ShareStore(tmp_path)
    share, _ = store.mint("slide/image", "read", 600, "")
    synced: list[str] = []
    monkeypatch.setattr(shares.os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")))
    monkeypatch.setattr(marker, "sync_path", lambda path: synced.append(f"dir {path}"))
    store.revoke(share.id)
    assert len(synced) == 2 and "links.json" in synced[0] and synced[1] == f"dir {store.folder}"


def test_links_made_by_two_processes_at_once_are_all_kept(tmp_path):
    """``serve --workers``: any process mints (the catalog page's button); each change of the
    list is read, made and written under a lock of the folder, so none is written over."""
    import threading

    stores = [ShareStore(tmp_path), ShareStore(tmp_path)]  # each its own lock: as two processes
    made: list[str] = []

    def mint(store):
        for _ in range(25):
            made.append(store.mint("slide/image", "read", 600, "")[0].id)

    threads = [threading.Thread(target=mint, args=(store,)) for store in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(made) == 50
    assert sorted(s.id for s in ShareStore(tmp_path).links(None)) == sorted(made)


def test_scopes_say_whether_a_link_annotates(catalog, tmp_path):
    with serving(catalog, http=True, token=TOKEN) as srv:
        (reader,) = _action(srv, "share", {"array_id": "slide", "scope": "read"})
        (annotator,) = _action(srv, "share", {"array_id": "slide", "scope": "read+annotate"})
        square = {"type": "Feature", "id": "sq", "geometry": {"type": "Polygon",
                  "coordinates": [[[1, 1], [9, 1], [9, 9], [1, 1]]]}}  # fmt: skip
        body = json.dumps({"type": "FeatureCollection", "features": [square]})
        for made, status in ((reader, 403), (annotator, 200)):
            url = f"{srv.http_url}/s/{made['capability']}/rois/slide/image.geojson"
            assert httpx.put(url, content=body, timeout=30).status_code == status
        other = f"{srv.http_url}/s/{annotator['capability']}/rois/other.geojson"
        assert httpx.put(other, content=body, timeout=30).status_code == 401
        got = httpx.get(f"{srv.http_url}/s/{reader['capability']}/rois/slide/image.geojson", timeout=30)
        assert [f["id"] for f in got.json()["features"]] == ["sq"]


def test_only_the_owner_of_an_upload_or_the_server_token_shares_it(catalog, tmp_path):
    """Local mode: an upload created with alice's token is shared by alice, not by bob."""
    from tensor_server.service.access import grant_digest

    with serving(catalog, write_dir=str(tmp_path / "write"), writable=True) as srv:
        up = srv.runtime.uploads.add_tensor(
            "cache://slide/@fields/result", (4, 4), np.uint8, owner=grant_digest("alice")
        )
        with pytest.raises(flight.FlightUnauthorizedError, match="shared by its owner"):
            _action(srv, "share", {"array_id": up.array_id}, token="bob")
        (made,) = _action(srv, "share", {"array_id": up.array_id}, token="alice")
        assert made["array_id"] == up.array_id
        (bobs,) = _action(srv, "share_list", {}, token="bob")
        assert bobs["links"] == []  # a maker lists its own links
        with pytest.raises(flight.FlightUnauthorizedError, match="revoked by its maker"):
            _action(srv, "share_revoke", {"id": made["id"]}, token="bob")


@pytest.mark.parametrize(
    "body, match",
    [
        ({"array_id": "slide", "scope": "write"}, "scope must be one of"),
        ({"array_id": "slide", "expires_seconds": 0}, "expires_seconds must be in"),
        ({"array_id": "slide", "expires_seconds": 10**9}, "a year"),
        ({"array_id": "slide", "expires_seconds": "7d"}, "whole number"),
        ({}, "share takes"),
    ],
)
def test_a_bad_share_request_is_refused_naming_why(catalog, body, match):
    with serving(catalog, token=TOKEN) as srv:
        with pytest.raises(flight.FlightServerError, match=match):
            _action(srv, "share", body)
        assert srv.runtime.shares.links(None) == []


def test_an_expired_link_is_refused_saying_when(tmp_path):
    store = ShareStore(tmp_path)
    share, capability = store.mint("slide/image", "read", 60, "", now=time.time() - 120)
    with pytest.raises(Unauthenticated, match=f"share link {share.id} expired at "):
        store.check(capability)


def test_durations():
    assert [parse_duration(t) for t in ("7d", "12h", "30m", "45", "2w")] == [604800, 43200, 1800, 45, 1209600]
    with pytest.raises(ValueError, match="a duration"):
        parse_duration("soon")


@pytest.mark.parametrize(
    "bind, host",
    [("127.0.0.1", "127.0.0.1"), ("::1", "[::1]"), ("0.0.0.0", "FQDN"), ("lab-server.example", "lab-server.example")],
)
def test_a_link_names_a_host_its_reader_can_dial(catalog, bind, host):
    import socket

    with serving(catalog) as srv:
        srv.runtime.http_listening("https", bind, 8816)
        (made,) = _action(srv, "share", {"array_id": "slide"}, token=None)
    want = socket.getfqdn() if host == "FQDN" else host
    assert made["url"].startswith(f"https://{want}:8816/s/{made['capability']}/zarr/slide/image/")


def test_the_catalog_page_offers_share_and_its_button_makes_a_link(catalog, tmp_path):
    import re

    with serving(catalog, http=True, token=TOKEN) as srv:
        page = httpx.get(f"{srv.http_url}/t/{TOKEN}/?folder=slide", timeout=30).text
        buttons = re.findall(r'<button class="share" data-endpoint="([^"]+)" data-array-id="([^"]+)">', page)
        assert ("/t/" + TOKEN + "/api/share", "slide/image") in buttons
        made = httpx.post(f"{srv.http_url}{buttons[0][0]}", json={"array_id": buttons[0][1]}, timeout=30)
        assert made.status_code == 200, made.text
        np.testing.assert_array_equal(_chunk(made.json()["url"]), IMAGE if buttons[0][1] == "slide/image" else LABELS)
        by_link = httpx.post(f"{srv.http_url}/s/{made.json()['capability']}/api/share", json={"array_id": "slide"})
        assert by_link.status_code == 403 and "a share link makes no share links" in by_link.text
        assert httpx.post(f"{srv.http_url}/api/share", json={"array_id": "slide"}, timeout=30).status_code == 401


def test_the_catalog_page_offers_share_only_where_the_caller_may(catalog, tmp_path):
    """Local mode: alice's upload has a share button for alice, none for bob; the files (no
    owner: the control surface's) have one for both; a share link opens no catalog page."""
    import re

    from tensor_server.service.access import grant_digest

    with serving(catalog, http=True, write_dir=str(tmp_path / "write"), writable=True) as srv:
        up = srv.runtime.uploads.add_tensor(
            "cache://slide/@fields/result", (4, 4), np.uint8, owner=grant_digest("alice")
        )
        srv.runtime.uploads.set_ready(up.array_id)

        def buttons(token):
            page = httpx.get(f"{srv.http_url}/?folder=slide", headers={"Authorization": f"Bearer {token}"}, timeout=30)
            assert page.status_code == 200, page.text
            return set(re.findall(r'<button class="share" data-endpoint="[^"]+" data-array-id="([^"]+)">', page.text))

        assert {"slide/image", up.array_id} <= buttons("alice")
        assert "slide/image" in buttons("bob") and up.array_id not in buttons("bob")
        (made,) = _action(srv, "share", {"array_id": "slide"}, token=None)
        by_link = httpx.get(f"{srv.http_url}/s/{made['capability']}/?folder=slide", timeout=30)
        assert by_link.status_code == 401 and f"share link {made['id']}" in by_link.text
