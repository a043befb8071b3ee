"""A static HTTP host on loopback that answers range requests, for tests and benches of remote
images (``adapters/url_source.py``): what a bucket website or an nginx serving OME-Zarr does.

Why our own: ``http.server`` answers no ``Range``, and a remote read is about ranges, counts
and delays. This one serves a folder with ETags (from each file's size and mtime), ``HEAD``,
``Range: bytes=a-b`` / ``a-`` / ``-n``, a per-request ``latency``, and a log of every request
(``requests``: method, path, range) so a test counts what reached the host. Faults by path:
``stall`` (a GET: headers and a few bytes, then silence; a HEAD: silence), ``html`` (a 200 login page), ``redirect`` (a path ->
another URL).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = ["RangeHost", "range_host"]


class RangeHost:
    """The host's state: its folder, delay, faults and request log."""

    def __init__(self, root: Path, latency: float = 0.0) -> None:
        self.root = Path(root)
        self.latency = latency
        self.requests: list[tuple[str, str, str]] = []
        self.stall: set[str] = set()
        self.html: set[str] = set()
        self.redirect: dict[str, str] = {}
        self.lock = threading.Lock()
        self.url = ""
        self.released = threading.Event()  # set: stalled requests give up
        self.in_flight = 0
        self.max_in_flight = 0  # the most requests the host answered at once

    def count(self, prefix: str = "", method: str | None = None) -> int:
        """Requests so far whose path starts with ``prefix`` (and of ``method``)."""
        with self.lock:
            return sum(1 for m, p, _ in self.requests if p.startswith(prefix) and method in (None, m))

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.max_in_flight = 0


def _handler(host: RangeHost) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            with host.lock:
                host.requests.append((self.command, path, self.headers.get("Range", "")))
                host.in_flight += 1
                host.max_in_flight = max(host.max_in_flight, host.in_flight)
            try:
                self._serve(path, body)
            finally:
                with host.lock:
                    host.in_flight -= 1

        def _serve(self, path: str, body: bool) -> None:
            if host.latency:
                time.sleep(host.latency)
            if path in host.redirect:
                self._send(302, b"", {"Location": host.redirect[path]}, body)
            elif path in host.html:
                self._send(200, b"<html><body>Please log in</body></html>", {"Content-Type": "text/html"}, body)
            elif path in host.stall:
                self._send_stall()
            else:
                self._file(path, body)

        def _file(self, path: str, body: bool) -> None:
            file = (host.root / path.lstrip("/")).resolve()
            if not file.is_file() or not file.is_relative_to(host.root.resolve()):
                self._send(404, b"not found", {"Content-Type": "text/plain"}, body)
                return
            data = file.read_bytes()
            st = file.stat()
            etag = hashlib.md5(f"{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
            headers = {"ETag": f'"{etag}"', "Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"}
            wanted = self.headers.get("Range", "")
            if not wanted.startswith("bytes="):
                self._send(200, data, headers, body)
                return
            start_text, _, end_text = wanted[6:].partition("-")
            if start_text:
                start, end = int(start_text), min(int(end_text) if end_text else len(data) - 1, len(data) - 1)
            else:
                start, end = max(0, len(data) - int(end_text)), len(data) - 1
            if start >= len(data):
                self._send(416, b"", {**headers, "Content-Range": f"bytes */{len(data)}"}, body)
                return
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            self._send(206, data[start : end + 1], headers, body)

        def _send(self, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def _send_stall(self) -> None:
            if self.command == "HEAD":  # nothing at all
                host.released.wait(30)
                self.close_connection = True
                return
            self.send_response(200)
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            self.wfile.write(b"\0" * 10)
            self.wfile.flush()
            host.released.wait(30)
            self.close_connection = True

    return Handler


@contextmanager
def range_host(root: Path, latency: float = 0.0) -> Iterator[RangeHost]:
    """Serve ``root`` on ``http://127.0.0.1:<port>`` (``host.url``) until the block ends."""
    host = RangeHost(root, latency)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(host))
    server.daemon_threads = True
    host.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="range-host", daemon=True)
    thread.start()
    try:
        yield host
    finally:
        host.released.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
