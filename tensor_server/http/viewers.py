"""The viewer doors' routes in one list, for the app to mount before its catch-all routes:
IIIF Image API 3 (``http/iiif.py``), DeepZoom (``http/deepzoom.py``), render specs
(``http/render_door.py``) and the catalog page
with its OpenSeadragon viewer (``http/catalog_page.py``), all over the runtime's viewer verbs
(``service/viewer_verbs.py``: one renderer, so render settings are measured once per tensor
for every door), each request's caller made by ``caller_of``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.service import Caller, ServingRuntime

__all__ = ["routes"]


def routes(runtime: ServingRuntime, caller_of: Callable[[Any], Caller]) -> list[Any]:
    from tensor_server.http import catalog_page, deepzoom, iiif, render_door

    return [
        *iiif.routes(runtime, caller_of),
        *render_door.routes(runtime, caller_of),
        *deepzoom.routes(runtime, caller_of),
        *catalog_page.routes(runtime, caller_of),
    ]
