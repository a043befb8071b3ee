"""The metrics door: Prometheus ``/metrics`` of one runtime, on a listener of its own.

It runs on the HTTP door's stack (a Starlette app on ``app.HttpFrontEnd``'s uvicorn), not on
a thread-per-connection server of its own, for what that stack already bounds: each
request's headers must arrive within ``HEADER_SECONDS`` (a connection that sends nothing, or
half a header, is closed), a TLS handshake runs in the event loop under asyncio's handshake
timeout instead of inside ``accept()`` (where one idle TCP connection froze the listener and
a stop waited on it for ever), and an open connection costs a protocol object, not a thread.

The rules are the service's: ``service.tls.require_safe_transport`` refuses to listen off
loopback without the server token (the metrics say who reads what how often, which is the
server's business only) or, there, without TLS; ``runtime.authenticate`` takes the token on
every scrape when the server has one, read as the HTTP door reads it (``http/credentials.py``:
``Authorization: Bearer`` as Prometheus' ``authorization`` scrape setting sends it,
``?token=``, a ``/t/<token>/`` prefix; every token presented must be right). The HTTP door's
cookie is its browser pages' and is not read here. The listener serves HTTPS with the server's
certificate when the server has one, as every door does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensor_server.errors import TensorServerError
from tensor_server.http.app import HEADER_SECONDS, HttpFrontEnd
from tensor_server.http.credentials import Presented, presented_tokens
from tensor_server.service import Caller
from tensor_server.service.tls import require_safe_transport

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.service import ServingRuntime

__all__ = ["MetricsDoor", "build_metrics_app"]

#: the paths that answer the scrape (Prometheus' default ``metrics_path`` and the root)
SCRAPE_PATHS = ("/metrics", "/")
#: bind addresses that are no address to dial, and the loopback address that reaches them
_WILDCARD_NAMES = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "localhost": "127.0.0.1", "::": "::1"}


def build_metrics_app(runtime: ServingRuntime):  # -> starlette.applications.Starlette
    """The Starlette app: the caller checked first (``runtime.authenticate``, a 401 names
    why), then ``/metrics`` in the exposition format the scrape's ``Accept`` asks for
    (gzip when it accepts that), 404 for any other path."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.middleware import Middleware
    from starlette.middleware.gzip import GZipMiddleware
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def scrape(request: Request) -> Response:
        given = presented_tokens(
            request.url.path, request.scope.get("query_string", b""), request.headers.get("authorization", "")
        )
        peer = request.client.host if request.client else ""
        # the collectors read the catalog, the cache and /proc: off the event loop
        status, headers, body = await run_in_threadpool(_answer, runtime, given, peer, request.headers.get("accept"))
        return Response(body, status_code=status, headers=headers)

    return Starlette(
        routes=[Route("/{path:path}", scrape, methods=["GET", "HEAD"])],
        middleware=[Middleware(GZipMiddleware, minimum_size=1024)],
    )


def _answer(
    runtime: ServingRuntime, given: Presented, peer: str, accept: str | None
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one scrape: each token it presents must pass (one wrong
    token is a refusal, as on the HTTP door), or the absence of one when none is asked."""
    from prometheus_client.exposition import choose_encoder

    path = given.path
    try:
        for token in given.explicit or (None,):
            runtime.authenticate(Caller(token=token, peer=peer, door="metrics"))
    except TensorServerError as exc:
        return (
            exc.http_status,
            {"Content-Type": "text/plain; charset=utf-8", "WWW-Authenticate": "Bearer"},
            f"{exc.slug}: {exc}".encode(),
        )
    registry = runtime.metrics.registry
    if path not in SCRAPE_PATHS or registry is None:
        return (
            404,
            {"Content-Type": "text/plain; charset=utf-8"},
            b"not found: the metrics are at /metrics" if registry is not None else b"not found: metrics are off",
        )
    encode, content_type = choose_encoder(accept or "")
    return 200, {"Content-Type": content_type}, encode(registry)


class MetricsDoor:
    """``/metrics`` of ``runtime.metrics`` on ``host:port`` (default: the settings'
    ``metrics_host``/``metrics_port``; port 0 picks a free one, see ``.port``), listening
    once constructed; ``stop()`` ends it. Refused (``InvalidArgument``, or
    ``FailedPrecondition`` without TLS) off loopback without the server token;
    ``header_seconds``: the deadline on each request's headers."""

    def __init__(
        self,
        runtime: ServingRuntime,
        host: str | None = None,
        port: int | None = None,
        *,
        header_seconds: float = HEADER_SECONDS,
    ) -> None:
        s = runtime.settings
        host = s.metrics_host if host is None else host
        port = s.metrics_port if port is None else port
        require_safe_transport(host, s, runtime.tls)
        if runtime.metrics.registry is None or port is None:
            raise RuntimeError("metrics are off: build the runtime with Settings(metrics_port=...)")
        self.host = host
        self._front = HttpFrontEnd(
            build_metrics_app(runtime), host, port, tls=runtime.tls, header_seconds=header_seconds
        )
        self._front.start()

    @property
    def scheme(self) -> str:
        return self._front.scheme

    @property
    def port(self) -> int:
        return self._front.port

    @property
    def url(self) -> str:
        """The scrape URL (a wildcard bind is named by the loopback address)."""
        host = _WILDCARD_NAMES.get(self.host, self.host)
        host = f"[{host}]" if ":" in host else host
        return f"{self.scheme}://{host}:{self.port}/metrics"

    def stop(self) -> None:
        self._front.stop()
