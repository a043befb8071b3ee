"""Annotations as GeoJSON over HTTP: ``GET /rois/<array_id>.geojson`` exports a tensor's
annotations, ``PUT`` of the same URL imports a FeatureCollection (QuPath's drag-and-drop
format; ``catalog/roi_geojson.py``). ``?set=<name>``: the set to export (default: every
client set), or the set imported features that name none go to (default ``default``).

A translation of the runtime's verbs (``CatalogVerbs.rois_geojson`` / ``geojson_import``):
a PUT is checked (the caller, a writable server, the tensor's read rule) before its body is
read, and the body is read within ``MAX_GEOJSON_BYTES`` (a larger ``Content-Length`` is
refused before a byte is read, and so is a stream that runs past it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from tensor_server.catalog.roi_geojson import MAX_GEOJSON_BYTES, MEDIA_TYPE
from tensor_server.errors import InvalidArgument
from tensor_server.http._request_body import body_within
from tensor_server.http.viewer_door import guarded

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.service import Caller, ServingRuntime

__all__ = ["routes", "PREFIX"]

PREFIX = "/rois/"
_SUFFIX = ".geojson"


def _array_id(request: Any) -> str:
    raw = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
    rest = unquote(raw[raw.find(PREFIX) + len(PREFIX) :])
    if not rest.endswith(_SUFFIX) or len(rest) == len(_SUFFIX):
        raise InvalidArgument(f"use {PREFIX}<array_id>{_SUFFIX} (the annotations of one tensor as GeoJSON)")
    return rest[: -len(_SUFFIX)]


def routes(runtime: ServingRuntime, caller_of: Callable[[Any], Caller]) -> list[Any]:
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import Response
    from starlette.routing import Route

    verbs = runtime.catalog_verbs

    async def serve(request: Any, caller: Caller) -> Any:
        array_id, set_name = _array_id(request), request.query_params.get("set", "")
        if request.method == "PUT":
            target = await run_in_threadpool(verbs.geojson_import, array_id, caller, set_name)
            body = await body_within(request, MAX_GEOJSON_BYTES)
            result = await run_in_threadpool(target.store, body)
            return Response(json.dumps(result), media_type="application/json")
        doc = await run_in_threadpool(verbs.rois_geojson, array_id, set_name, caller)
        return Response(doc, media_type=MEDIA_TYPE, headers={"Cache-Control": "no-cache"})

    return [Route(PREFIX + "{rest:path}", guarded(serve, caller_of), methods=["GET", "HEAD", "PUT"])]
