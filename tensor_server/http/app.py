"""HTTP front end: every served tensor as a virtual OME-Zarr image (Starlette on uvicorn).

URLs (``<id>`` is an array id, ``/`` included; the longest prefix that names a tensor wins):

* ``/zarr/<id>/…``  — NGFF 0.4 on zarr v2 (``.zgroup``, ``.zattrs``, ``<level>/.zarray``,
  ``<level>/<i>.<j>…``), labels under ``labels/<name>/``;
* ``/zarr3/<id>/…`` — NGFF 0.5 on zarr v3 (``zarr.json``, ``<level>/c/<i>/<j>…``).

The same process, catalog, read engine, chunk cache and token as the Flight server: a chunk
is produced by ``engine.chunk`` (hits are cache entries), in a worker thread so the event
loop never blocks on a decode. Responses carry an ``ETag`` from the content version and
``Cache-Control: no-cache`` (clients may keep bytes but must revalidate: the file can
change); ``If-None-Match`` answers 304, ``Range`` answers 206, HEAD is answered without a
body, CORS allows any origin (browser viewers), unknown ids and chunks off the grid are 404,
a wrong or missing token is 401 (``Authorization: Bearer`` or ``?token=`` for viewers that
cannot set headers).
"""
from __future__ import annotations

import hmac
import logging
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable

from tensor_server.errors import InvalidArgument, TensorNotFound, TensorServerError
from tensor_server.http.zarr_view import ZarrImage, ZarrLevel, dumps

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.catalog.catalog import Catalog
    from tensor_server.core.engine import ReadEngine
    from tensor_server.core.pyramid import PyramidPolicy

__all__ = ["HttpFrontEnd", "build_app"]

log = logging.getLogger(__name__)

FLAVOURS = {"zarr": "0.4", "zarr3": "0.5"}
_JSON = "application/json"
_OCTET = "application/octet-stream"


class _NotFound(Exception):
    pass


class _Views:
    """ZarrImage per (array id, content version): built once, dropped when the data changes."""

    def __init__(self, catalog: Catalog, policy: PyramidPolicy | None, size: int = 256) -> None:
        self.catalog, self.policy, self.size = catalog, policy, size
        self._views: OrderedDict[tuple[str, bytes], ZarrImage] = OrderedDict()
        self._lock = threading.Lock()

    def resolve(self, segments: list[str]) -> tuple[ZarrImage, list[str]]:
        """The image named by the longest prefix of ``segments``, and the rest of the path."""
        first_error: Exception | None = None
        for k in range(len(segments), 0, -1):
            candidate = "/".join(segments[:k])
            try:
                tensor, _ = self.catalog.find_tensor(candidate)
            except (TensorNotFound, InvalidArgument) as exc:
                first_error = first_error or exc
                continue
            return self._image(tensor), segments[k:]
        raise _NotFound(str(first_error) if first_error else "no array id in the path")

    def _image(self, tensor: Any) -> ZarrImage:
        key = (tensor.array_id, tensor.content_version)
        with self._lock:
            view = self._views.get(key)
            if view is not None:
                self._views.move_to_end(key)
                return view
        source_id = tensor.array_id.split("/", 1)[0]
        source = self.catalog.get_record(source_id).source
        labels = {}
        if source is not None and not tensor.is_labels:
            for field, other in source.tensors.items():
                if other.is_labels and other is not tensor:
                    labels[field.rsplit("/", 1)[-1]] = other
        view = ZarrImage(tensor, name=tensor.array_id, labels=labels, policy=self.policy)
        with self._lock:
            self._views[key] = view
            while len(self._views) > self.size:
                self._views.popitem(last=False)
        return view


def build_app(
    catalog: Catalog,
    engine: ReadEngine,
    *,
    token: str | None = None,
    policy: PyramidPolicy | None = None,
    on_chunk: Callable[[Any, Any], None] | None = None,
):
    """The Starlette application. ``on_chunk(tensor, chunk_id)`` is called after a chunk is
    served (the precacher's trigger)."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.middleware import Middleware
    from starlette.middleware.cors import CORSMiddleware
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    from tensor_server.http.viewer_provider import CatalogViewerProvider
    from tensor_server.http.viewers import routes as viewer_routes

    views = _Views(catalog, policy)
    calls: dict[str, int] = {"metadata": 0, "chunks": 0, "not_found": 0, "unauthorized": 0, "not_modified": 0}

    def authorized(request: Request) -> bool:
        if not token:
            return True
        presented = request.query_params.get("token")
        header = request.headers.get("authorization", "")
        if header.startswith("Bearer "):
            presented = header[len("Bearer "):]
        return presented is not None and hmac.compare_digest(presented.encode(), token.encode())

    def respond(request: Request, body: bytes | memoryview, media_type: str, etag: str) -> Response:
        headers = {"ETag": etag, "Cache-Control": "no-cache", "Accept-Ranges": "bytes"}
        if etag in [t.strip() for t in request.headers.get("if-none-match", "").split(",")]:
            calls["not_modified"] += 1
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
        if not authorized(request):
            calls["unauthorized"] += 1
            return PlainTextResponse("unauthorized: a valid 'Authorization: Bearer <token>' header or ?token= is required",
                                     status_code=401, headers={"WWW-Authenticate": "Bearer"})
        version = FLAVOURS.get(request.path_params["flavour"])
        if version is None:
            calls["not_found"] += 1
            return PlainTextResponse("not found: use /zarr/<array_id>/ (NGFF 0.4) or /zarr3/<array_id>/ (NGFF 0.5)",
                                     status_code=404)
        segments = [s for s in request.path_params["rest"].split("/") if s != ""]
        try:
            image, rest = views.resolve(segments)
            return await _dispatch(request, image, rest, version)
        except _NotFound as exc:
            calls["not_found"] += 1
            return PlainTextResponse(f"not found: {str(exc)[:300]}", status_code=404)
        except TensorServerError as exc:
            calls["not_found"] += 1
            return PlainTextResponse(f"{type(exc).__name__}: {str(exc)[:300]}", status_code=404)

    async def _dispatch(request: Request, image: ZarrImage, rest: list[str], version: str) -> Response:
        zarr_format = 2 if version == "0.4" else 3
        tag = image.tensor.content_version.hex()
        if rest and rest[0] == "labels" and not image.is_label_of:
            return await _labels(request, image, rest[1:], version)
        if not rest:
            doc = {"ngff": version, "array_id": image.tensor.array_id, "levels": [lv.path for lv in image.levels],
                   "labels": sorted(image.labels)}
            return respond(request, dumps(doc), _JSON, f'"{tag}-index"')
        meta = _metadata(image, rest, zarr_format, version)
        if meta is not None:
            calls["metadata"] += 1
            return respond(request, dumps(meta), _JSON, f'"{tag}-{"/".join(rest)}"')
        level = image.level(rest[0])
        if level is None:
            raise _NotFound(f"{'/'.join(rest)} is not a level, metadata or chunk of {image.tensor.array_id}")
        key = _chunk_key(rest[1:], zarr_format)
        cid = image.chunk_id(level, key) if key is not None else None
        if cid is None:
            raise _NotFound(f"no chunk {'/'.join(rest[1:])} in level {level.path} (grid {level.grid()})")
        body = await run_in_threadpool(_chunk_bytes, image, level, cid, zarr_format)
        calls["chunks"] += 1
        if on_chunk is not None:
            on_chunk(image.tensor, cid)
        return respond(request, body, _OCTET, f'"{tag}-{level.path}-{".".join(map(str, key))}"')

    def _chunk_bytes(image: ZarrImage, level: ZarrLevel, cid: Any, zarr_format: int) -> memoryview:
        _, data = engine.chunk(cid, image.tensor)
        return image.encode_chunk(level, data, zarr_format)

    async def _labels(request: Request, image: ZarrImage, rest: list[str], version: str) -> Response:
        zarr_format = 2 if version == "0.4" else 3
        tag = image.tensor.content_version.hex()
        if rest in ([".zattrs"], []) and zarr_format == 2 or rest == ["zarr.json"] and zarr_format == 3:
            attrs = image.labels_attributes(version)
            doc = attrs if zarr_format == 2 else {"zarr_format": 3, "node_type": "group", "attributes": attrs}
            return respond(request, dumps(doc), _JSON, f'"{tag}-labels"')
        if rest == [".zgroup"] and zarr_format == 2:
            return respond(request, dumps({"zarr_format": 2}), _JSON, f'"{tag}-labels-zgroup"')
        if not rest or rest[0] not in image.labels:
            raise _NotFound(f"{image.tensor.array_id} has no label image {rest[0] if rest else ''!r}")
        label = image.labels[rest[0]]
        label_view = ZarrImage(label, name=rest[0], policy=image.policy, is_label_of=True)
        return await _dispatch(request, label_view, rest[1:], version)

    routes = [*viewer_routes(CatalogViewerProvider(catalog, engine, token=token, policy=policy)),
              Route("/{flavour:str}/{rest:path}", serve, methods=["GET", "HEAD"]),
              Route("/healthz", lambda request: PlainTextResponse("ok"), methods=["GET"])]
    middleware = [Middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["GET", "HEAD"],
                             allow_headers=["Authorization", "Range", "If-None-Match"],
                             expose_headers=["ETag", "Content-Range", "Content-Length", "Accept-Ranges"])]
    app = Starlette(routes=routes, middleware=middleware)
    app.state.calls = calls

    return app


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
    if not fields or not all(f.isdigit() for f in fields):
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


class HttpFrontEnd:
    """uvicorn serving ``build_app(...)`` on ``host:port`` in a background thread."""

    def __init__(self, app: Any, host: str, port: int) -> None:
        import uvicorn

        self.app = app
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                     lifespan="off", access_log=False))
        self._thread = threading.Thread(target=self._server.run, name="http-front-end", daemon=True)
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
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
