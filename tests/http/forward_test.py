"""A worker's forwarding of annotation requests (``http/forward.py``) against a stand-in primary
on loopback (uvicorn, as the real one): the request arrives as it came (method, path with its
token prefix, query, headers, body), the primary's answer is returned unchanged, every other
route stays the worker's, a caller the primary refuses is answered without its body being
read, a body past the route's limit is refused and never reaches the primary, and a primary
that does not answer is a 503 to retry, not a hang. The real ``serve --workers 2`` round trip
is ``tests/cli_workers_reads_test.py``."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from tensor_server.http import forward
from tensor_server.http.app import HttpFrontEnd
from tensor_server.http.forward import ForwardToPrimary


async def _echo(request: Request) -> Response:
    """What the primary received, as JSON, with a header of its own; a request without an
    ``Authorization`` is refused before its body is read, as the annotations route does."""
    if "authorization" not in request.headers:
        return PlainTextResponse("unauthorized: no access token came with it", status_code=401)
    body = await request.body()
    raw = request.scope["raw_path"] + (b"?" + request.scope["query_string"] if request.scope["query_string"] else b"")
    doc = {
        "method": request.method,
        "path": raw.decode(),
        "auth": request.headers["authorization"],
        "body": body.decode(),
    }
    SEEN.append(doc["path"])
    return Response(json.dumps(doc), status_code=207, media_type="application/geo+json", headers={"X-Primary": "yes"})


#: the paths of the requests the primary read whole
SEEN: list[str] = []


def _primary(tls=None) -> HttpFrontEnd:
    SEEN.clear()
    app = Starlette(routes=[Route("/{rest:path}", _echo, methods=["GET", "PUT"])])
    front = HttpFrontEnd(app, "127.0.0.1", 0, tls=tls)
    front.start()
    return front


@pytest.fixture
def primary() -> Iterator[int]:
    front = _primary()
    yield front.port
    front.stop()


@contextmanager
def _worker(port: int, tls=None) -> Iterator[httpx.Client]:
    """A client of a worker's door (uvicorn, as served) forwarding to ``port`` (over HTTPS,
    verified against the certificate ``tls``, when given)."""
    app = Starlette(routes=[Route("/{rest:path}", lambda request: PlainTextResponse("the worker's own"))])
    scheme, cafile = ("http", None) if tls is None else ("https", str(tls.cert_path))
    front = HttpFrontEnd(ForwardToPrimary(app, port, scheme=scheme, cafile=cafile), "127.0.0.1", 0)
    front.start()
    try:
        with httpx.Client(base_url=front.url, timeout=30) as client:
            yield client
    finally:
        front.stop()


def test_annotation_requests_reach_the_primary_as_they_came(primary):
    with _worker(primary) as client:
        got = client.put(
            "/t/secret-token/rois/img%2Fa.geojson?set=mine", content=b'{"type": "FeatureCollection"}',
            headers={"Authorization": "Bearer abc"},
        )  # fmt: skip
        own = client.get("/zarr/img/.zattrs").text
    assert got.status_code == 207 and got.headers["x-primary"] == "yes"
    assert got.headers["content-type"] == "application/geo+json"
    assert got.json() == {
        "method": "PUT",
        "path": "/t/secret-token/rois/img%2Fa.geojson?set=mine",  # raw: the id's escape kept
        "auth": "Bearer abc",
        "body": '{"type": "FeatureCollection"}',
    }
    assert own == "the worker's own" and len(SEEN) == 1


def test_over_tls_the_primary_is_verified_and_answers_as_in_the_clear(tmp_path):
    from tensor_server.service.tls import server_tls

    tls = server_tls(tmp_path)
    front = _primary(tls)
    try:
        with _worker(front.port, tls) as client:
            got = client.put("/rois/img.geojson", content=b"{}", headers={"Authorization": "Bearer abc"})
        with _worker(front.port, server_tls(tmp_path / "another")) as client:  # not the primary's certificate
            refused = client.get("/rois/img.geojson", headers={"Authorization": "Bearer abc"})
    finally:
        front.stop()
    assert got.status_code == 207 and got.json()["body"] == "{}"
    assert refused.status_code == 503 and "SSLCertVerificationError" in refused.text


def test_a_refused_caller_is_answered_without_its_body_being_read(primary):
    """The head alone reaches the primary, which refuses it; the worker answers that refusal
    without waiting for a byte of the 60 MB the client announced and never sends."""
    with _worker(primary) as client:
        host, port = client.base_url.host, client.base_url.port
        with socket.create_connection((host, port), timeout=10) as sock:
            head = f"PUT /rois/img.geojson HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: 60000000\r\n\r\n"
            sock.sendall(head.encode())
            answer = sock.recv(65536)  # a timeout (10 s) here: the worker waited for the body
    assert answer.startswith(b"HTTP/1.1 401 ") and b"no access token came with it" in answer
    assert SEEN == []


def test_a_body_past_the_limit_is_refused_before_it_is_sent(primary, monkeypatch):
    monkeypatch.setitem(forward.FORWARDED, "/rois/", 10)
    with _worker(primary) as client:
        got = client.put("/rois/img.geojson", content=b"x" * 11, headers={"Authorization": "Bearer abc"})
    assert got.status_code == 413 and "above the limit of 10" in got.text
    assert SEEN == []


def test_a_primary_that_does_not_answer_is_a_503_to_retry(monkeypatch):
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        monkeypatch.setattr(forward, "FORWARD_SECONDS", 0.5)
        with _worker(silent.getsockname()[1]) as client:
            got = client.get("/rois/img.geojson")
    assert got.status_code == 503 and got.headers["retry-after"] == "1"
    assert got.text.startswith("primary_unavailable:") and "did not answer within 0.5 s" in got.text
