"""The viewer doors' routes in one list, for the app to mount before its catch-all routes:
IIIF Image API 3 (``http/iiif.py``), DeepZoom (``http/deepzoom.py``) and the catalog page
with its OpenSeadragon viewer (``http/catalog_page.py``), all over one ``ViewerProvider``
and one ``Renderer`` (so render settings are measured once per tensor for every door)."""

from __future__ import annotations

from typing import Any

from tensor_server.render.image import Renderer

__all__ = ["routes"]


def routes(provider: Any) -> list[Any]:
    from tensor_server.http import catalog_page, deepzoom, iiif

    renderer = Renderer(provider)
    return [
        *iiif.routes(provider, renderer),
        *deepzoom.routes(provider, renderer),
        *catalog_page.routes(provider, renderer),
    ]
