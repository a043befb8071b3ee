"""DeepZoom door: ``/deepzoom/<identifier>.dzi`` and
``/deepzoom/<identifier>_files/<level>/<col>_<row>.<format>`` (jpg, png, webp where offered).

``<identifier>`` is an array id with an optional plane selection, as for IIIF
(``render.plane``). The verbs are the runtime's (``service/viewer_verbs.py``: the geometry
``render.deepzoom``, the read with the caller's rules, the pixels ``render.image``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from tensor_server.http.viewer_door import guarded, while_connected
from tensor_server.render.image import FORMATS

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.service import Caller, ServingRuntime

__all__ = ["routes", "PREFIX"]

PREFIX = "/deepzoom/"


def routes(runtime: ServingRuntime, caller_of: Callable[[Any], Caller]) -> list[Any]:
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import Response
    from starlette.routing import Route

    viewer = runtime.viewer

    async def serve(request: Any, caller: Caller) -> Any:
        raw = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
        rest = unquote(raw[raw.find(PREFIX) + len(PREFIX) :])
        headers = {"Cache-Control": "no-cache"}
        if rest.endswith(".dzi"):
            fmt = request.query_params.get("format", "jpg")
            xml = await run_in_threadpool(viewer.dzi, rest[: -len(".dzi")], fmt, caller)
            return Response(xml, media_type="application/xml", headers=headers)
        fmt, body = await while_connected(  # one worker-thread hop for the whole tile
            request, lambda cancelled: viewer.deepzoom_tile(rest, caller, cancelled)
        )
        return Response(body, media_type=FORMATS[fmt][1], headers=headers)

    return [Route(PREFIX + "{rest:path}", guarded(serve, caller_of), methods=["GET", "HEAD"])]
