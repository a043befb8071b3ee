"""Render specs over HTTP: ``POST /render`` stores a spec (``render.spec``) and answers its id,
which IIIF and DeepZoom identifiers then carry (``<array_id>;r=<id>``), and ``GET
/render/<id>`` answers it back (a viewer restoring a shared view); ``GET
/histogram/<identifier>?c=0,3`` answers the channels' histograms (``render.histogram``), what
a viewer draws under its window sliders.

Only translation lives here: the body is read up to the spec's size limit and handed to the
runtime's viewer verbs (``service/viewer_verbs.py``), which parse, check and store it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from tensor_server.http._request_body import body_within
from tensor_server.http.viewer_door import guarded
from tensor_server.render.spec import MAX_SPEC_BYTES

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.service import Caller, ServingRuntime

__all__ = ["routes", "HISTOGRAM"]

HISTOGRAM = "/histogram/"


def routes(runtime: ServingRuntime, caller_of: Callable[[Any], Caller]) -> list[Any]:
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    viewer = runtime.viewer

    async def store(request: Any, caller: Caller) -> Any:
        return JSONResponse(
            viewer.store_spec(await body_within(request, MAX_SPEC_BYTES)), headers={"Cache-Control": "no-store"}
        )

    async def histograms(request: Any, caller: Caller) -> Any:
        raw = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
        identifier = unquote(raw[raw.find(HISTOGRAM) + len(HISTOGRAM) :])
        doc = await run_in_threadpool(viewer.histograms, identifier, request.query_params.get("c"), caller)
        return JSONResponse(doc, headers={"Cache-Control": "no-cache"})

    async def stored(request: Any, caller: Caller) -> Any:
        doc = await run_in_threadpool(viewer.spec, request.path_params["spec_id"])
        return JSONResponse(doc, headers={"Cache-Control": "no-cache"})

    return [
        Route("/render", guarded(store, caller_of), methods=["POST"]),
        Route("/render/{spec_id}", guarded(stored, caller_of), methods=["GET", "HEAD"]),
        Route(HISTOGRAM + "{rest:path}", guarded(histograms, caller_of), methods=["GET", "HEAD"]),
    ]
