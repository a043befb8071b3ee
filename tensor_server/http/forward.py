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

Bounded: the body is read within the route's own limit (``MAX_GEOJSON_BYTES``, refused as the
primary refuses it) and the primary's answer must come within ``FORWARD_SECONDS``; a primary
that does not answer is ``PrimaryUnavailable`` (503, retry), never a hang. This wrapper sits
outside the worker's app, so a forwarded request is counted and logged once, by the primary.
"""

from __future__ import annotations

import http.client
import ssl
from typing import Any

from tensor_server.catalog.roi_geojson import MAX_GEOJSON_BYTES
from tensor_server.errors import PrimaryUnavailable, TensorServerError
from tensor_server.http._request_body import body_within
from tensor_server.http.credentials import split_path_token
from tensor_server.http.errors import error_response
from tensor_server.http.rois_door import PREFIX as ROIS_PREFIX

__all__ = ["ForwardToPrimary", "FORWARD_SECONDS", "FORWARDED"]

#: how long a worker waits for its primary's whole answer
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

        try:
            body = await body_within(Request(scope, receive), limit)
            status, headers, payload = await run_in_threadpool(self._forward, scope, body)
        except TensorServerError as exc:
            await error_response(exc)(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    def _forward(self, scope: dict, body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """The primary's (status, headers, body) for the request ``scope`` with ``body``."""
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        conn: http.client.HTTPConnection = (
            http.client.HTTPConnection("127.0.0.1", self.port, timeout=FORWARD_SECONDS)
            if self._tls is None
            else http.client.HTTPSConnection("127.0.0.1", self.port, timeout=FORWARD_SECONDS, context=self._tls)
        )
        try:
            conn.putrequest(scope["method"], target.decode("latin-1"), skip_host=True, skip_accept_encoding=True)
            for name, value in scope.get("headers", ()):
                if name.lower() not in _HOP:
                    conn.putheader(name.decode("latin-1"), value.decode("latin-1"))
            if body or scope["method"] not in ("GET", "HEAD"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body or None)
            response = conn.getresponse()
            payload = response.read()
            headers = [
                (k.lower().encode("latin-1"), v.encode("latin-1"))
                for k, v in response.getheaders()
                if k.lower().encode("latin-1") not in _HOP
            ]
            if scope["method"] != "HEAD":
                headers.append((b"content-length", str(len(payload)).encode()))
            elif response.getheader("content-length") is not None:
                headers.append((b"content-length", response.getheader("content-length", "").encode()))
            return response.status, headers, payload
        except (OSError, http.client.HTTPException) as exc:  # refused, reset, or past the deadline
            raise PrimaryUnavailable(
                f"this process hands annotation requests to the server's first process, which did not answer "
                f"within {FORWARD_SECONDS:g} s ({type(exc).__name__}); retry"
            ) from None
        finally:
            conn.close()


def _limit(scope: dict) -> int | None:
    """The body limit of the forwarded route ``scope`` names (past a token prefix), else None."""
    if scope["type"] != "http":
        return None
    path, _ = split_path_token(scope.get("path", ""))
    return next((limit for prefix, limit in FORWARDED.items() if path.startswith(prefix)), None)
