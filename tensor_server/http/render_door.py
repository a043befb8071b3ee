"""Render specs over HTTP: ``POST /render`` stores a spec (``render.spec``) and answers its id,
which IIIF and DeepZoom identifiers then carry (``<array_id>;r=<id>``).

Only translation lives here: the body is read up to the spec's size limit and handed to the
runtime's viewer verbs (``service/viewer_verbs.py``), which parse, check and store it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tensor_server.errors import InvalidArgument
from tensor_server.http.viewer_door import guarded
from tensor_server.render.spec import MAX_SPEC_BYTES

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.service import Caller, ServingRuntime

__all__ = ["routes"]


async def _body(request: Any) -> bytes:
    """The request body, refused once it passes ``MAX_SPEC_BYTES`` (never held whole)."""
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > MAX_SPEC_BYTES:
            raise InvalidArgument(f"the spec is over {MAX_SPEC_BYTES} bytes (the limit)")
        parts.append(part)
    return b"".join(parts)


def routes(runtime: ServingRuntime, caller_of: Callable[[Any], Caller]) -> list[Any]:
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    viewer = runtime.viewer

    async def store(request: Any, caller: Caller) -> Any:
        return JSONResponse(viewer.store_spec(await _body(request)), headers={"Cache-Control": "no-store"})

    return [Route("/render", guarded(store, caller_of), methods=["POST"])]
