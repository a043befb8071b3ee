"""A worker's forwarding of annotation requests (``http/forward.py``) against a stand-in primary
on loopback: the request arrives as it came (method, path with its token prefix, query,
headers, body), the primary's answer is returned unchanged, every other route stays the
worker's, a body past the route's limit is refused before anything is sent, and a primary that
does not answer is a 503 to retry, not a hang. The real ``serve --workers 2`` round trip is
``tests/cli_workers_reads_test.py``."""

from __future__ import annotations

import json
import socket
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tensor_server.http import forward
from tensor_server.http.app import HttpFrontEnd
from tensor_server.http.forward import ForwardToPrimary


class _Primary(BaseHTTPRequestHandler):
    """Answers with what it received, as JSON, and a header of its own; ``seen`` logs it."""

    seen: list[str] = []

    def log_message(self, format, *args):
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length).decode()
        doc = {"method": self.command, "path": self.path, "auth": self.headers.get("authorization"), "body": body}
        _Primary.seen.append(self.path)
        payload = json.dumps(doc).encode()
        self.send_response(207)
        self.send_header("Content-Type", "application/geo+json")
        self.send_header("X-Primary", "yes")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_PUT = _answer


@pytest.fixture
def primary():
    _Primary.seen.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Primary)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@contextmanager
def _worker(port: int):
    """A client of a worker's door (uvicorn, as served) forwarding to ``port``."""
    app = Starlette(routes=[Route("/{rest:path}", lambda request: PlainTextResponse("the worker's own"))])
    front = HttpFrontEnd(ForwardToPrimary(app, port), "127.0.0.1", 0)
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
    assert own == "the worker's own" and len(_Primary.seen) == 1


def test_a_body_past_the_limit_is_refused_before_it_is_sent(primary, monkeypatch):
    monkeypatch.setitem(forward.FORWARDED, "/rois/", 10)
    with _worker(primary) as client:
        got = client.put("/rois/img.geojson", content=b"x" * 11)
    assert got.status_code == 413 and "above the limit of 10" in got.text
    assert _Primary.seen == []


def test_a_primary_that_does_not_answer_is_a_503_to_retry(monkeypatch):
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        monkeypatch.setattr(forward, "FORWARD_SECONDS", 0.5)
        with _worker(silent.getsockname()[1]) as client:
            got = client.get("/rois/img.geojson")
    assert got.status_code == 503 and got.headers["retry-after"] == "1"
    assert got.text.startswith("primary_unavailable:") and "did not answer within 0.5 s" in got.text
