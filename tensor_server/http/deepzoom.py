"""DeepZoom door: ``/deepzoom/<identifier>.dzi`` and
``/deepzoom/<identifier>_files/<level>/<col>_<row>.<format>`` (jpg, png, webp where offered).

``<identifier>`` is an array id with an optional plane selection, as for IIIF
(``render.plane``). The geometry is ``render.deepzoom``, the pixels ``render.image``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from tensor_server.errors import InvalidArgument
from tensor_server.http.viewer_door import guarded, while_connected
from tensor_server.render import deepzoom
from tensor_server.render.image import FORMATS, Renderer, available_formats, encode
from tensor_server.render.plane import split_identifier

__all__ = ["routes", "PREFIX"]

PREFIX = "/deepzoom/"


def routes(provider: Any, renderer: Renderer | None = None) -> list[Any]:
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import Response
    from starlette.routing import Route

    renderer = renderer or Renderer(provider)
    formats = available_formats()

    async def serve(request: Any) -> Any:
        raw = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
        rest = unquote(raw[raw.find(PREFIX) + len(PREFIX) :])
        headers = {"Cache-Control": "no-cache"}
        if rest.endswith(".dzi"):
            view = await run_in_threadpool(renderer.view, *split_identifier(rest[: -len(".dzi")]))
            fmt = request.query_params.get("format", "jpg")
            if fmt not in formats:
                raise InvalidArgument(f"format {fmt[:20]!r} is not offered; use one of {formats}")
            return Response(
                deepzoom.dzi_xml(view.width, view.height, fmt), media_type="application/xml", headers=headers
            )
        path = deepzoom.parse_tile_path(rest)
        if path.format not in formats:
            raise InvalidArgument(f"format {path.format[:20]!r} is not offered; use one of {formats}")

        def render(cancelled: Any) -> bytes:  # one worker-thread hop for the whole tile (see iiif._image)
            view = renderer.view(*split_identifier(path.identifier))
            tile = deepzoom.tile_region(view.width, view.height, path.level, path.col, path.row)
            image = renderer.region(view, tile.x, tile.y, tile.w, tile.h, tile.out_w, tile.out_h, cancelled)
            return encode(image, path.format)

        return Response(await while_connected(request, render), media_type=FORMATS[path.format][1], headers=headers)

    return [Route(PREFIX + "{rest:path}", guarded(provider, serve), methods=["GET", "HEAD"])]
