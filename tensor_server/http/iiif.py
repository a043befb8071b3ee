"""IIIF Image API 3.0 (compliance level 2) door: ``/iiif/3/<identifier>/…``.

* ``/iiif/3/<identifier>/info.json`` — the image service description (``render.iiif.info_json``);
* ``/iiif/3/<identifier>/<region>/<size>/<rotation>/<quality>.<format>`` — an image;
* ``/iiif/3/<identifier>`` — 303 to its ``info.json``.

``<identifier>`` is an array id (its ``/`` may be sent as ``%2F`` or as is) with an optional
plane selection (``;z=3;t=0;c=1``, ``render.plane``). Only translation lives here: the verbs
are the runtime's (``service/viewer_verbs.py``: parsing by ``render.iiif``, the read with the
caller's rules, rendering by ``render.image``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from tensor_server.errors import InvalidArgument
from tensor_server.http.viewer_door import guarded, token_path, while_connected
from tensor_server.render import iiif
from tensor_server.render.image import FORMATS

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.service import Caller, ServingRuntime

__all__ = ["routes", "PREFIX"]

PREFIX = "/iiif/3/"


def _segments(request: Any) -> list[str]:
    raw = request.scope.get("raw_path") or request.url.path.encode()
    path = raw.decode("latin-1")
    at = path.find(PREFIX)
    return [unquote(s) for s in path[at + len(PREFIX) :].split("/")] if at >= 0 else []


def routes(runtime: ServingRuntime, caller_of: Callable[[Any], Caller]) -> list[Any]:
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse, RedirectResponse, Response
    from starlette.routing import Route

    viewer = runtime.viewer

    async def serve(request: Any, caller: Caller) -> Any:
        parts = _segments(request)
        if len(parts) >= 2 and parts[-1] == "info.json":
            # the id carries the credential the request came with: a viewer on another origin
            # (no cookie there) fetches every tile from it
            base = str(request.url.replace(query="")).split(PREFIX, 1)[0] + token_path(request) + PREFIX
            service_id = base + request.url.path.split(PREFIX, 1)[1].rsplit("/", 1)[0]
            doc = await run_in_threadpool(viewer.iiif_info, "/".join(parts[:-1]), caller, service_id)
            ld = "application/ld+json" in request.headers.get("accept", "")
            media = (
                'application/ld+json;profile="http://iiif.io/api/image/3/context.json"' if ld else "application/json"
            )
            return JSONResponse(doc, media_type=media, headers=_headers())
        if len(parts) >= 5:  # {identifier}/{region}/{size}/{rotation}/{quality}.{format}: one worker-thread hop
            fmt, body = await while_connected(
                request, lambda cancelled: viewer.iiif_image("/".join(parts[:-4]), parts[-4:], caller, cancelled)
            )
            return Response(body, media_type=FORMATS[fmt][1], headers=_headers())
        identifier = "/".join(p for p in parts if p)
        if not identifier:
            raise InvalidArgument("name an image: /iiif/3/<identifier>/info.json")
        await run_in_threadpool(viewer.plane, identifier, caller)
        return RedirectResponse(request.url.path.rstrip("/") + "/info.json", status_code=303)

    return [Route(PREFIX + "{rest:path}", guarded(serve, caller_of), methods=["GET", "HEAD"])]


def _headers() -> dict[str, str]:
    """The profile link (IIIF ``profileLinkHeader``); no-cache: the file behind may change."""
    return {"Link": f'<{iiif.PROFILE_URI}>;rel="profile"', "Cache-Control": "no-cache"}
