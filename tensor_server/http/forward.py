"""A worker of ``serve --workers N`` hands the requests only its primary can answer to the
primary, as they came: the annotations (``/rois/<array_id>.geojson``, GET and PUT).

Why forward rather than read: annotations live in the primary's DuckDB file
(``catalog/rois.py``), and DuckDB lets one process open a file that another process holds
open for writing in no mode at all, read-only included; a copy kept beside it would be a
second owner of rows that change with every edit. So a worker answers an annotation request
with the primary's answer, status, headers and body unchanged, and the primary's door judges
the request exactly as it would have judged it coming straight from the client: the path
(with a ``/t/<token>/`` or ``/s/<capability>/`` prefix), the query, and every header (the
``Authorization``, the cookie, ``Host``, ``Origin``) travel as they came. The primary listens
for these on a loopback port of its own (``cli_workers.open_forward_door``), because the shared
HTTP port would hand the request to any process, this one included.

The caller is checked before a body is read, as on the primary: a request with a body goes
to the primary with ``Expect: 100-continue`` and its head only; the primary's door judges it
and either refuses it (that answer is returned, and the client's body never read) or asks for
the body (uvicorn's ``100 Continue`` when the route first reads it), which is then read within
the route's own limit (``MAX_GEOJSON_BYTES``) and sent. h11 speaks HTTP/1.1 to the primary:
``http.client`` skips a ``100`` while it waits for the final answer, so it cannot wait for it.
Every wait for the primary (to connect, to take bytes, to answer them) is bounded by
``FORWARD_SECONDS``; a primary that does not answer is ``PrimaryUnavailable`` (503, retry),
never a hang. This wrapper sits outside the worker's app, so a forwarded request is counted
and logged once, by the primary.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

import h11

from tensor_server.catalog.roi_geojson import MAX_GEOJSON_BYTES
from tensor_server.errors import PrimaryUnavailable, TensorServerError
from tensor_server.http._request_body import body_within
from tensor_server.http.credentials import split_path_token
from tensor_server.http.errors import error_response
from tensor_server.http.rois_door import PREFIX as ROIS_PREFIX

__all__ = ["ForwardToPrimary", "FORWARD_SECONDS", "FORWARDED"]

#: how long a worker waits for its primary at each step
FORWARD_SECONDS = 30.0
#: the routes only the primary answers, and the body limit of each
FORWARDED = {ROIS_PREFIX: MAX_GEOJSON_BYTES}
#: headers of one connection, not of the request or the answer (RFC 9110 §7.6.1), and the ones
#: each hop sets itself (the length of the body it sends, its own date and name)
_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"content-length",
        b"date",
        b"server",
    }
)


class ForwardToPrimary:
    """ASGI wrapper of a worker's app: a request to a ``FORWARDED`` route is answered by the
    primary's forward door at ``127.0.0.1:port`` (``scheme`` https: verified with ``cafile``,
    the server's certificate); every other request goes to ``app``."""

    def __init__(self, app: Any, port: int, *, scheme: str = "http", cafile: str | None = None) -> None:
        self.app, self.port = app, port
        self._tls = ssl.create_default_context(cafile=cafile) if scheme == "https" else None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        limit = _limit(scope)
        if limit is None:
            await self.app(scope, receive, send)
            return
        from starlette.concurrency import run_in_threadpool
        from starlette.requests import Request

        exchange = _Exchange(self.port, self._tls)
        try:
            answer = await run_in_threadpool(exchange.begin, scope)
            if answer is None:  # the primary admitted the caller and asks for the body
                body = await body_within(Request(scope, receive), limit)
                answer = await run_in_threadpool(exchange.finish, body)
        except TensorServerError as exc:
            await error_response(exc)(scope, receive, send)
            return
        finally:
            exchange.close()
        status, headers, payload = answer
        if scope["method"] != "HEAD":
            headers = [*headers, (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


#: (status, headers, body) of the primary's answer
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


class _Exchange:
    """One request to the primary and its answer, over a connection of its own (h11, blocking
    socket, every wait bounded by ``FORWARD_SECONDS``)."""

    def __init__(self, port: int, tls: ssl.SSLContext | None) -> None:
        self.port, self.tls = port, tls
        self.conn = h11.Connection(h11.CLIENT)
        self.sock: socket.socket | None = None
        self.head = False

    def begin(self, scope: dict) -> Answer | None:
        """Send the request's head: the primary's answer, or None when it asks for the body
        (a request with one waits for ``100 Continue``; one without has no body to ask for)."""
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        headers = [(name, value) for name, value in scope.get("headers", ()) if name.lower() not in _HOP]
        if not any(name.lower() == b"host" for name, _ in headers):
            headers.append((b"host", b"127.0.0.1"))
        self.head, with_body = scope["method"] == "HEAD", scope["method"] not in ("GET", "HEAD")
        if with_body:
            headers += [(b"transfer-encoding", b"chunked"), (b"expect", b"100-continue")]
        self._call(self._connect)
        self._send(h11.Request(method=scope["method"], target=target, headers=headers))
        if not with_body:
            self._send(h11.EndOfMessage())
        first = self._call(self._next_event, (h11.InformationalResponse, h11.Response))
        return None if isinstance(first, h11.InformationalResponse) else self._answer(first)

    def finish(self, body: bytes) -> Answer:
        """Send the body the primary asked for: its answer."""
        if body:
            self._send(h11.Data(data=body))
        self._send(h11.EndOfMessage())
        return self._answer(self._call(self._next_event, (h11.Response,)))

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()

    def _answer(self, response: Any) -> Answer:
        parts = []
        while not isinstance(event := self._call(self._next_event, (h11.Data, h11.EndOfMessage)), h11.EndOfMessage):
            parts.append(bytes(event.data))
        headers = [(k, v) for k, v in response.headers if k not in _HOP]
        if self.head:  # the length of the body a GET would have had
            headers += [(k, v) for k, v in response.headers if k == b"content-length"]
        return response.status_code, headers, b"".join(parts)

    def _connect(self) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=FORWARD_SECONDS)
        self.sock = sock if self.tls is None else self.tls.wrap_socket(sock, server_hostname="127.0.0.1")

    def _send(self, event: Any) -> None:
        data = self.conn.send(event)
        if data:
            self._call(self._require_sock().sendall, data)

    def _next_event(self, kinds: tuple[type, ...]) -> Any:
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(self._require_sock().recv(65536))
            elif isinstance(event, kinds):
                return event
            elif not isinstance(event, h11.InformationalResponse):  # a 1xx other than the one awaited
                raise OSError(f"the primary answered {type(event).__name__} where {kinds[0].__name__} was due")

    def _require_sock(self) -> socket.socket:
        assert self.sock is not None, "connected first"
        return self.sock

    def _call(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, with a failure of the primary or of its answer as ``PrimaryUnavailable``."""
        try:
            return fn(*args)
        except (OSError, h11.ProtocolError) as exc:  # refused, reset, past the deadline, garbled
            raise PrimaryUnavailable(
                f"this process hands annotation requests to the server's first process, which did not answer "
                f"within {FORWARD_SECONDS:g} s ({type(exc).__name__}); retry"
            ) from None


def _limit(scope: dict) -> int | None:
    """The body limit of the forwarded route ``scope`` names (past a token prefix), else None."""
    if scope["type"] != "http":
        return None
    path, _ = split_path_token(scope.get("path", ""))
    return next((limit for prefix, limit in FORWARDED.items() if path.startswith(prefix)), None)
