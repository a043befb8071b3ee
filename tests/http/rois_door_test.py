"""GeoJSON annotations through the real doors (issue 45): ``GET``/``PUT /rois/<id>.geojson``
on HTTP and the ``rois_geojson`` / ``put_rois_geojson`` Flight actions, with the rules of
``roi_put``: the caller checked before the body is read, a writer updates only its own
annotations, a read-only server imports nothing, a refused import stores nothing."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pyarrow.flight as flight
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.testing import serving

TOKEN = "server-token-for-geojson"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: one image 600 wide and 400 high, with 3 z planes
IMAGE = np.zeros((3, 400, 600), np.uint8)


@pytest.fixture
def catalog(tmp_path):
    cat = Catalog([], rois_path=str(tmp_path / "rois.duckdb"))
    cat.add_source(MemorySource(ArrayAdapter(IMAGE, "zyx", chunk_shape=(1, 200, 200)), source_id="slide"))
    cat.first_scan_done.set()
    yield cat
    cat.close()


def _array_id(catalog) -> str:
    return catalog.find_tensor("slide")[0].array_id


def _fc(*features) -> bytes:
    return json.dumps({"type": "FeatureCollection", "features": list(features)}).encode()


def _square(fid, x0, y0, size=20, **props):
    ring = [[x0, y0], [x0 + size, y0], [x0 + size, y0 + size], [x0, y0 + size], [x0, y0]]
    return {"type": "Feature", "id": fid, "geometry": {"type": "Polygon", "coordinates": [ring]}, "properties": props}


def _action(srv, name, body, token=TOKEN):
    client = flight.FlightClient(srv.location)
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    try:
        return [
            r.body.to_pybytes()
            for r in client.do_action(flight.Action(name, body), flight.FlightCallOptions(headers=headers))
        ]
    finally:
        client.close()


def test_http_put_then_get_round_trips_and_flight_sees_the_same(catalog):
    aid = _array_id(catalog)
    with serving(catalog, http=True, token=TOKEN) as srv:
        url = f"{srv.http_url}/rois/{aid}.geojson"
        body = _fc(_square("a", 10, 10, name="first", classification={"name": "Tumor", "color": [200, 0, 0]}),
                   _square("b", 100, 50, plane={"0": 2}))  # fmt: skip
        put = httpx.put(url, content=body, headers=AUTH, params={"set": "imported"}, timeout=30)
        assert put.status_code == 200, put.text
        assert put.json()["stored"] == 2 and sorted(put.json()["roi_ids"]) == ["a", "b"]
        got = httpx.get(url, headers=AUTH, timeout=30)
        assert got.status_code == 200 and got.headers["content-type"].startswith("application/geo+json")
        features = {f["id"]: f for f in got.json()["features"]}
        assert features["a"]["properties"]["classification"] == {"name": "Tumor", "color": [200, 0, 0]}
        assert features["a"]["properties"]["set_name"] == "imported" and features["a"]["properties"]["name"] == "first"
        assert features["b"]["geometry"]["plane"] == {"c": -1, "z": 2, "t": 0}
        (flight_doc,) = _action(srv, "rois_geojson", json.dumps({"array_id": aid}).encode())
        assert json.loads(flight_doc) == got.json()
        header = json.dumps({"array_id": aid, "set_name": "viaflight"}).encode()
        (answer,) = _action(srv, "put_rois_geojson", header + b"\n" + _fc(_square("c", 300, 300)))
        assert json.loads(answer) == {"array_id": aid, "stored": 1, "roi_ids": ["c"]}
        (only,) = _action(srv, "rois_geojson", json.dumps({"array_id": aid, "set_name": "viaflight"}).encode())
        assert [f["id"] for f in json.loads(only)["features"]] == ["c"]


def test_a_refused_import_stores_nothing_and_says_why(catalog):
    aid = _array_id(catalog)
    with serving(catalog, http=True, token=TOKEN) as srv:
        url = f"{srv.http_url}/rois/{aid}.geojson"
        crossed = {"type": "Feature", "geometry": {"type": "Polygon",
                   "coordinates": [[[0, 0], [10, 10], [10, 0], [0, 10], [0, 0]]]}}  # fmt: skip
        for body, status, reason in (
            (_fc(_square("ok", 1, 1), crossed), 400, "Self-intersection"),
            (_fc(_square("ok", 1, 1), _square("far", 590, 10)), 400, "outside the image"),
            (b"{not json", 400, "not JSON"),
        ):
            r = httpx.put(url, content=body, headers=AUTH, timeout=30)
            assert (r.status_code, reason in r.text) == (status, True), r.text
        assert catalog.rois.list(aid)[0] == []
        assert "413" in _declared_put(srv, f"/rois/{aid}.geojson", 1 << 30).split("\r\n")[0]  # 1 GB: not read


def _declared_put(srv, path: str, length: int) -> str:
    """The status line and head of a PUT that declares ``length`` bytes and sends none: the
    refusal must come from the declared length, before a byte is read."""
    import socket
    from urllib.parse import urlsplit

    host, port = urlsplit(srv.http_url).hostname, urlsplit(srv.http_url).port
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(
            f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Length: {length}\r\n\r\n".encode()
        )
        return sock.recv(4096).decode("latin-1")


def test_a_streamed_body_is_cut_off_at_the_bound():
    """A body with no declared length is refused as soon as it runs past the bound; the
    pieces after it are never taken."""
    import asyncio

    from tensor_server.errors import RequestTooLarge
    from tensor_server.http._request_body import body_within

    taken = []

    class Streaming:
        headers: dict = {}

        async def stream(self):
            for k in range(100):
                taken.append(k)
                yield b"x" * 1024

    with pytest.raises(RequestTooLarge, match="more than 10000 bytes"):
        asyncio.run(body_within(Streaming(), 10_000))
    assert len(taken) == 10  # the tenth KiB passed the bound; nothing more was read


def test_the_caller_is_checked_before_the_body_is_read(catalog):
    """A stranger's import is refused before a byte of the body is parsed: a body the parser
    would refuse still hears 401 (the refusal of the caller, not of the body)."""
    aid = _array_id(catalog)
    with serving(catalog, http=True, token=TOKEN) as srv:
        url = f"{srv.http_url}/rois/{aid}.geojson"
        assert httpx.put(url, content=b"{not json", timeout=30).status_code == 401
        assert httpx.get(url, timeout=30).status_code == 401
        with pytest.raises(flight.FlightUnauthenticatedError):
            _action(srv, "put_rois_geojson", json.dumps({"array_id": aid}).encode() + b"\n{not json", token="wrong")
        with pytest.raises(flight.FlightUnauthenticatedError):
            _action(srv, "rois_geojson", json.dumps({"array_id": aid}).encode(), token="wrong")


def test_a_writer_updates_only_its_own_annotations(catalog):
    """Local mode: each client's token makes it the writer of what it imports."""
    aid = _array_id(catalog)
    with serving(catalog, http=True) as srv:
        body = json.dumps({"array_id": aid}).encode() + b"\n"
        _action(srv, "put_rois_geojson", body + _fc(_square("mine", 5, 5)), token="alice")
        with pytest.raises(flight.FlightUnauthorizedError, match="stored by another client"):
            _action(srv, "put_rois_geojson", body + _fc(_square("mine", 50, 50)), token="bob")
        (doc,) = _action(srv, "rois_geojson", json.dumps({"array_id": aid}).encode(), token=None)
        ring = json.loads(doc)["features"][0]["geometry"]["coordinates"][0]
        assert ring[0] == [5, 5]  # bob changed nothing


def test_a_read_only_server_imports_nothing(catalog):
    aid = _array_id(catalog)
    with serving(catalog, http=True, token=TOKEN, read_only=True) as srv:
        r = httpx.put(f"{srv.http_url}/rois/{aid}.geojson", content=_fc(_square("x", 1, 1)), headers=AUTH, timeout=30)
        assert r.status_code in (409, 412) and "--read-only" in r.text
        assert catalog.rois.list(aid)[0] == []
