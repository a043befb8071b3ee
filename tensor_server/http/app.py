"""HTTP door: every served tensor as a virtual OME-Zarr image (Starlette on uvicorn).

URLs (``<id>`` is an array id, ``/`` included; ``http/paths.py`` resolves a path in one step):

* ``/zarr/<id>/…``  — NGFF 0.4 on zarr v2 (``.zgroup``, ``.zattrs``, ``<level>/.zarray``,
  ``<level>/<i>.<j>…``), labels under ``labels/<name>/``;
* ``/zarr3/<id>/…`` — NGFF 0.5 on zarr v3 (``zarr.json``, ``<level>/c/<i>/<j>…``);
* ``/rois/<id>.geojson`` — the annotations as GeoJSON, GET and PUT (``http/rois_door.py``).

A translation only, over the same ``ServingRuntime`` as the Flight door: the runtime decides
who may read what (the server token, per-tensor grants, the upload gate), and reads chunks
through the engine, the cache and the precacher; an error's class gives the status
(``errors.py``: 400, 401, 403, 404, 409, 413, 503 with ``Retry-After``, ...), never a
traceback. In front of the routes, ``http/security.py`` guards the transport against other
web pages (Host names, the access token, CORS, Private Network Access) and hands the
credential it accepted to the runtime. Lookups and reads run in worker threads so the event
loop never blocks. Responses carry an ``ETag`` from the content version and ``Cache-Control:
no-cache`` (clients may keep bytes but must revalidate: the file can change);
``If-None-Match`` answers 304, ``Range`` answers 206, HEAD is answered without a body.
"""

from __future__ import annotations

import copy
import functools
import logging
import threading
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tensor_server.core.ngff import labels_attributes
from tensor_server.errors import TensorNotFound, code_of_http_status
from tensor_server.http.credentials import split_path_token
from tensor_server.http.errors import error_response
from tensor_server.http.paths import resolve_zarr_path
from tensor_server.http.security import CREDENTIAL_KEY, HttpSecurity, SecurityMiddleware
from tensor_server.http.zarr_view import ZarrImage, ZarrLevel, dumps
from tensor_server.service import Caller
from tensor_server.service.metrics import current as current_request
from tensor_server.service.metrics import timing

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.service import ServingRuntime

__all__ = ["HttpFrontEnd", "build_app", "error_response"]

log = logging.getLogger(__name__)

#: URL flavour -> zarr format, and zarr format -> NGFF version
FLAVOURS = {"zarr": 2, "zarr3": 3}
NGFF_OF_FORMAT = {2: "0.4", 3: "0.5"}
_JSON = "application/json"
_OCTET = "application/octet-stream"


class _NotFound(TensorNotFound):
    """A path below a resolved image that names nothing of it."""


def _tag(tensor: Any) -> str:
    """The ETag stem of a tensor's documents: its content version, and the extent's sequence
    once it has grown (``core/growth.py``), so a revalidating client sees the new shape."""
    sequence = tensor.extents.sequence
    return tensor.content_version.hex() + (f"-s{sequence}" if sequence else "")


class _Views:
    """ZarrImage per (array id, content version, extent): built once, dropped when the data
    changes or the tensor grows."""

    def __init__(self, runtime: ServingRuntime, size: int = 256) -> None:
        self.runtime, self.size = runtime, size
        self._views: OrderedDict[tuple[str, bytes, int], ZarrImage] = OrderedDict()
        self._lock = threading.Lock()

    def resolve(self, caller: Caller, segments: list[str], zarr_format: int) -> tuple[ZarrImage, list[str]]:
        """The image a path names and the zarr key after it (``http/paths.py``); the runtime's
        read rules (the token or the tensor's grant, the upload gate) for the tensor chosen.
        A path through ``labels/`` sees the images with the label images the caller may read."""

        def image_of(tensor: Any) -> ZarrImage:
            view = self.image(tensor)
            return self.labelled(view, caller) if "labels" in segments else view

        return self.runtime.tensor_at(
            caller,
            lambda find: resolve_zarr_path(segments, zarr_format, find, image_of),
            lambda found: found[0].tensor,
        )

    def labelled(self, image: ZarrImage, caller: Caller) -> ZarrImage:
        """``image`` with the label images its source serves to ``caller``
        (``ServingRuntime.image_labels``: ``core.ngff``'s rule over ``ServingRuntime.fields``);
        a label image has none."""
        if image.tensor.is_labels:
            return image
        labels = self.runtime.image_labels(caller, image.tensor)
        labelled = copy.copy(image)
        labelled.labels_of = lambda: labels
        return labelled

    def image(self, tensor: Any) -> ZarrImage:
        """The view of ``tensor`` without its labels (they depend on the caller: ``labelled``)."""
        key = (tensor.array_id, tensor.content_version, tensor.extents.sequence)
        with self._lock:
            view = self._views.get(key)
            if view is not None:
                self._views.move_to_end(key)
                return view
        view = ZarrImage(tensor, name=tensor.array_id, policy=self.runtime.policy)
        with self._lock:
            self._views[key] = view
            while len(self._views) > self.size:
                self._views.popitem(last=False)
        return view


def build_app(runtime: ServingRuntime, security: HttpSecurity | None = None):
    """The Starlette application over ``runtime``: the OME-Zarr view, and the viewer doors
    (IIIF, DeepZoom, the catalog page). ``security`` is what the browser-safety middleware enforces (default:
    loopback Host names, the server's token if it has one, no cross-origin reads); whatever
    credential it accepts, the runtime judges. Its tokens must be full-access credentials of
    the runtime (``ServingRuntime(access_tokens=...)``): a door that asks for a token lets a
    grant read only its own tensor."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    from tensor_server.http import watch_door
    from tensor_server.http.rois_door import routes as roi_routes
    from tensor_server.http.viewers import routes as viewer_routes

    views = _Views(runtime)

    security = _door_security(runtime, security)
    requires_credential = bool(security.tokens)

    def caller_of(request: Request) -> Caller:
        """The credential the security middleware checked (nothing else of the request), and
        whether this door asked for one (then a grant reads its own tensor only)."""
        peer = request.client.host if request.client else ""
        return Caller(
            token=request.scope.get(CREDENTIAL_KEY),
            peer=peer,
            door="http",
            door_requires_credential=requires_credential,
        )

    def respond(request: Request, body: bytes | memoryview, media_type: str, etag: str) -> Response:
        headers = {"ETag": etag, "Cache-Control": "no-cache", "Accept-Ranges": "bytes"}
        if etag in [t.strip() for t in request.headers.get("if-none-match", "").split(",")]:
            return Response(status_code=304, headers=headers)
        rng = request.headers.get("range")
        if rng:
            part = _byte_range(rng, len(body))
            if part is None:
                return Response(status_code=416, headers={**headers, "Content-Range": f"bytes */{len(body)}"})
            a, b = part
            headers["Content-Range"] = f"bytes {a}-{b - 1}/{len(body)}"
            return Response(body[a:b], status_code=206, media_type=media_type, headers=headers)
        return Response(body, media_type=media_type, headers=headers)

    async def serve(request: Request) -> Response:
        zarr_format = FLAVOURS.get(request.path_params["flavour"])
        if zarr_format is None:
            return PlainTextResponse(
                "not found: use /zarr/<array_id>/ (NGFF 0.4) or /zarr3/<array_id>/ (NGFF 0.5)", status_code=404
            )
        segments = [s for s in request.path_params["rest"].split("/") if s != ""]
        caller = caller_of(request)
        try:
            image, rest, chunk = await run_in_threadpool(_resolved, caller, segments, zarr_format)
            if chunk is not None:
                return _chunk_response(request, image, *chunk)
            return await _dispatch(request, caller, image, rest, zarr_format)
        except Exception as exc:  # the one boundary: every error is an answer
            rq = current_request()
            if rq is not None:
                rq.failed(exc)
            return error_response(exc, rq.id if rq is not None else None)

    def _resolved(caller: Caller, segments: list[str], zarr_format: int) -> tuple[ZarrImage, list[str], Any]:
        """The path resolved and, when it names a chunk of a level, the chunk's bytes: one
        worker-thread hop for a chunk request (a hop costs 0.5-0.8 ms on 2 cores, a warm
        chunk about as much)."""
        image, rest = views.resolve(caller, segments, zarr_format)
        level, key, cid = _chunk_of(image, rest, zarr_format)
        if cid is None:  # not a chunk (metadata, labels, an index) or none there: _dispatch says which
            return image, rest, None
        return image, rest, (level, key, cid, _chunk_bytes(caller, image, level, cid, zarr_format))

    def _chunk_response(
        request: Request, image: ZarrImage, level: ZarrLevel, key: tuple[int, ...], cid: Any, body: memoryview
    ) -> Response:
        """A chunk at the live edge of a growing tensor changes as frames arrive: its tag
        carries the extent's sequence; a settled chunk keeps its tag across growth."""
        settled = runtime.engine.settled(image.tensor, cid)
        tag = image.tensor.content_version.hex() if settled else _tag(image.tensor)
        return respond(request, body, _OCTET, f'"{tag}-{level.path}-{".".join(map(str, key))}"')

    async def _dispatch(
        request: Request, caller: Caller, image: ZarrImage, rest: list[str], zarr_format: int
    ) -> Response:
        version = NGFF_OF_FORMAT[zarr_format]
        tag = _tag(image.tensor)
        if rest and rest[0] == "labels" and not image.is_label_of:
            return await _labels(request, caller, image, rest[1:], zarr_format)
        if not rest:
            image = await run_in_threadpool(views.labelled, image, caller)
            doc = {
                "ngff": version,
                "array_id": image.tensor.array_id,
                "levels": [lv.path for lv in image.levels],
                "labels": sorted(image.labels),
            }
            return respond(request, dumps(doc), _JSON, f'"{tag}-index"')
        meta = _metadata(image, rest, zarr_format, version)
        if meta is not None:
            return respond(request, dumps(meta), _JSON, f'"{tag}-{"/".join(rest)}"')
        level, key, cid = _chunk_of(image, rest, zarr_format)
        if level is None:
            raise _NotFound(f"{'/'.join(rest)[:200]} is not a level, metadata or chunk of {image.tensor.array_id}")
        if key is None or cid is None:
            raise _NotFound(f"no chunk {'/'.join(rest[1:])[:200]} in level {level.path} (grid {level.grid()})")
        body = await run_in_threadpool(_chunk_bytes, caller, image, level, cid, zarr_format)  # a label's chunk
        return _chunk_response(request, image, level, key, cid, body)

    def _chunk_bytes(caller: Caller, image: ZarrImage, level: ZarrLevel, cid: Any, zarr_format: int) -> memoryview:
        data = runtime.chunk_of(image.tensor, cid, caller)  # the tensor resolve() gated
        with timing("encode"):
            return image.encode_chunk(level, data, zarr_format)

    async def _labels(
        request: Request, caller: Caller, image: ZarrImage, rest: list[str], zarr_format: int
    ) -> Response:
        version = NGFF_OF_FORMAT[zarr_format]
        tag = _tag(image.tensor)
        if rest in ([".zattrs"], []) and zarr_format == 2 or rest == ["zarr.json"] and zarr_format == 3:
            attrs = labels_attributes(list(image.labels), version)  # the caller's (``_Views.labelled``)
            doc = attrs if zarr_format == 2 else {"zarr_format": 3, "node_type": "group", "attributes": attrs}
            return respond(request, dumps(doc), _JSON, f'"{tag}-labels"')
        if rest == [".zgroup"] and zarr_format == 2:
            return respond(request, dumps({"zarr_format": 2}), _JSON, f'"{tag}-labels-zgroup"')
        label = image.labels.get(rest[0]) if rest else None
        if label is None:
            raise _NotFound(f"{image.tensor.array_id} has no label image {rest[0][:100] if rest else ''!r}")
        runtime.authorize(caller, label)
        label_view = ZarrImage(label, name=rest[0], policy=image.policy, label_of=image)
        return await _dispatch(request, caller, label_view, rest[1:], zarr_format)

    routes = [
        *viewer_routes(runtime, caller_of),
        *roi_routes(runtime, caller_of),
        *watch_door.routes(runtime, caller_of),
        Route("/{flavour:str}/{rest:path}", serve, methods=["GET", "HEAD"]),
        Route("/healthz", lambda request: PlainTextResponse("ok"), methods=["GET"]),
    ]
    middleware = [
        Middleware(Observed, metrics=runtime.metrics),
        Middleware(SecurityMiddleware, security=security, refused=functools.partial(runtime.metrics.refused, "http")),
    ]
    app = Starlette(routes=routes, middleware=middleware)
    return app


def _door_security(runtime: ServingRuntime, security: HttpSecurity | None) -> HttpSecurity:
    """``security`` (default: the server's token, if any) with the runtime judging every other
    credential (a grant); its tokens must be full-access credentials of the runtime."""
    security = security or HttpSecurity.build(tokens=[runtime.settings.token])
    if security.recognizes is None:
        security = replace(security, recognizes=runtime.access.recognizes)
    if any(not runtime.access.full(Caller(token=t)) for t in security.tokens):
        raise ValueError(
            "the HTTP door's tokens must be full-access credentials of its runtime "
            "(the server token, or ServingRuntime(access_tokens=...))"
        )
    return security


class Observed:
    """ASGI middleware around the whole app: each HTTP request is one request of the
    metrics (its route class, never its path, as the label), and every response carries
    ``Server-Timing`` (lookup, cache, decode, reduce, encode, total; ``Timing-Allow-Origin``
    lets a browser viewer's devtools show it) and ``X-Request-Id`` (a client's valid one is
    kept)."""

    def __init__(self, app: Any, metrics: Any) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"x-request-id"), None)
        path, _ = split_path_token(scope.get("path", ""))
        rq = self.metrics.begin("http", route_class(path), incoming)
        client = scope.get("client")
        rq.peer = client[0] if client else ""
        rq.target = path[:200]

        async def timed_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                rq.status = message["status"]
                if rq.code == "OK":  # a refusal made without raising (the security middleware's)
                    rq.code = code_of_http_status(rq.status)
                message = {
                    **message,
                    "headers": [
                        *message.get("headers", ()),
                        (b"server-timing", rq.server_timing().encode()),
                        (b"timing-allow-origin", b"*"),
                        (b"x-request-id", rq.id.encode()),
                    ],
                }
            elif message["type"] == "http.response.body":
                rq.nbytes += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            self.metrics.end(rq)


#: the zarr keys that are metadata documents
_ZARR_METADATA = frozenset({".zarray", ".zattrs", ".zgroup", "zarr.json"})


#: the viewer doors' route classes by their path's first segment (``http/viewers.py``)
_VIEWER_CLASSES = {"iiif": "iiif_image", "deepzoom": "dzi_tile", "view": "viewer_page", "assets": "viewer_assets"}


def route_class(path: str) -> str:
    """The metrics' label of a URL path (without its ``/t/<token>`` prefix), from its shape
    alone (bounded: ``CALLS["http"]``)."""
    if path == "/healthz":
        return "healthz"
    if path == "/":
        return "catalog_page"
    flavour, _, rest = path.lstrip("/").partition("/")
    if flavour in _VIEWER_CLASSES:
        if flavour == "iiif" and rest.endswith("/info.json"):
            return "iiif_info"
        if flavour == "deepzoom" and rest.endswith(".dzi"):
            return "dzi"
        return _VIEWER_CLASSES[flavour]
    if flavour not in FLAVOURS:
        return "other"
    segments = [s for s in rest.split("/") if s]
    if len(segments) <= 1:
        return "zarr_index"
    last = segments[-1]
    if last in _ZARR_METADATA:
        return "zarr_metadata"
    if (
        flavour == "zarr"
        and last.replace(".", "").isdigit()
        or flavour == "zarr3"
        and "c" in segments
        and last.isdigit()
    ):
        return "zarr_chunk"
    return "zarr_other"


def _metadata(image: ZarrImage, rest: list[str], zarr_format: int, version: str) -> dict[str, Any] | None:
    if zarr_format == 2:
        if rest == [".zgroup"]:
            return {"zarr_format": 2}
        if rest == [".zattrs"]:
            return image.group_attributes(version)
        if len(rest) == 2 and rest[1] in (".zarray", ".zattrs"):
            level = image.level(rest[0])
            if level is None:
                return None
            return image.zarray(level) if rest[1] == ".zarray" else {}
        return None
    if rest == ["zarr.json"]:
        return {"zarr_format": 3, "node_type": "group", "attributes": image.group_attributes(version)}
    if len(rest) == 2 and rest[1] == "zarr.json":
        level = image.level(rest[0])
        return None if level is None else image.array_json_v3(level)
    return None


def _chunk_of(image: ZarrImage, rest: list[str], zarr_format: int) -> tuple[Any, tuple[int, ...] | None, Any]:
    """(level, chunk key, engine chunk id) that ``rest`` names, each None from where it does not."""
    level = image.level(rest[0]) if rest else None
    key = _chunk_key(rest[1:], zarr_format) if level is not None else None
    return level, key, (image.chunk_id(level, key) if level is not None and key is not None else None)


def _chunk_key(parts: list[str], zarr_format: int) -> tuple[int, ...] | None:
    """v2: ``i.j.k`` (dimension separator "."); v3: ``c/i/j/k``."""
    if zarr_format == 2:
        if len(parts) != 1:
            return None
        fields = parts[0].split(".")
    else:
        if not parts or parts[0] != "c":
            return None
        fields = parts[1:]
    if not fields or not all(f.isascii() and f.isdigit() for f in fields):
        return None
    return tuple(int(f) for f in fields)


def _byte_range(header: str, size: int) -> tuple[int, int] | None:
    """One ``bytes=a-b`` / ``a-`` / ``-n`` range as [start, stop), or None if unsatisfiable."""
    unit, _, spec = header.partition("=")
    if unit.strip() != "bytes" or "," in spec:
        return None
    first, _, last = spec.strip().partition("-")
    try:
        if first == "":
            n = int(last)
            return (max(size - n, 0), size) if n > 0 else None
        a = int(first)
        b = int(last) + 1 if last else size
    except ValueError:
        return None
    b = min(b, size)
    return (a, b) if 0 <= a < b else None


#: seconds a connection may take to send a request's headers (from its opening, or from the
#: end of its previous response): a client trickling a byte a minute (slowloris) would
#: otherwise hold a connection, and its memory, for ever
HEADER_SECONDS = 10.0


#: seconds a stop waits for requests in flight: a TLS client that never answers the server's
#: close would otherwise hold ``stop()`` (and SIGTERM) until the thread join gives up
SHUTDOWN_SECONDS = 5  # uvicorn's timeout_graceful_shutdown is whole seconds


#: HTTP/1.1 parsers uvicorn can run the door on, measured in ``bench http`` (issue 25)
PARSERS = ("httptools", "h11")


def _header_deadline_protocol(seconds: float, parser: str = "httptools") -> type:
    """uvicorn's protocol for ``parser`` with a deadline on each request's headers."""
    Protocol: Any  # the parser's protocol class, chosen here at run time
    if parser == "h11":
        from uvicorn.protocols.http.h11_impl import H11Protocol as Protocol
    elif parser == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Protocol
    else:
        raise ValueError(f"unknown HTTP parser {parser!r} (one of {', '.join(PARSERS)})")

    class HeaderDeadline(Protocol):
        _deadline = None

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            # abort, not close, unless a response is still draining: over TLS a close waits for
            # the client's close_notify (up to the loop's 30 s shutdown timeout), and a client
            # that stopped mid-header sends none, so the connection, and a stop, would wait
            if self.transport.get_write_buffer_size():
                self.transport.close()
            else:
                self.transport.abort()

        def connection_made(self, transport):  # asyncio protocol
            super().connection_made(transport)
            self._arm()

        def on_headers_complete(self) -> None:  # httptools: the headers are in
            self._disarm()
            super().on_headers_complete()

        def handle_events(self) -> None:  # h11: a request cycle starts once its headers are in
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

    return HeaderDeadline


class HttpFrontEnd:
    """uvicorn serving ``build_app(...)`` on ``host:port`` in a background thread; each
    request's headers must arrive within ``header_seconds``."""

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        *,
        tls: Any = None,
        header_seconds: float = HEADER_SECONDS,
        parser: str | None = None,
        reuse_port: bool = False,
    ) -> None:
        """``tls``: a ``service.tls.ServerTls`` to serve HTTPS with (its files on disk);
        ``parser``: one of ``PARSERS`` (default httptools, the faster in ``bench http``);
        ``reuse_port``: bind with ``SO_REUSEPORT`` (now: an ``OSError`` says the port is taken),
        so the processes of ``serve --workers`` listen on one port."""
        import uvicorn

        self.app = app
        self._server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                log_level="warning",
                log_config=None,  # the process's logging is the command line's: uvicorn's dictConfig would close its handlers
                lifespan="off",
                access_log=False,
                ssl_certfile=None if tls is None else str(tls.cert_path),
                ssl_keyfile=None if tls is None else str(tls.key_path),
                timeout_graceful_shutdown=SHUTDOWN_SECONDS,
                http=_header_deadline_protocol(header_seconds, parser or "httptools"),
            )
        )
        self.scheme = "https" if tls is not None else "http"
        sockets = [_reuse_port_socket(host, port)] if reuse_port else None
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": sockets}, name="http-front-end", daemon=True
        )
        self.host = host

    def start(self, timeout: float = 30.0) -> None:
        import time

        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the HTTP front end failed to start (is the port in use?)")
            if time.monotonic() > deadline:
                raise RuntimeError("the HTTP front end did not start in time")
            time.sleep(0.02)

    @property
    def port(self) -> int:
        for server in self._server.servers:
            for sock in server.sockets:
                return sock.getsockname()[1]
        raise RuntimeError("not listening")

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "localhost") else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def _reuse_port_socket(host: str, port: int) -> Any:  # socket.socket
    """A listening socket on ``host:port`` that other processes of this user may bind too."""
    import socket

    family, _, _, _, addr = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock
