"""What the viewer doors need from the serving runtime: one small Protocol.

``http/viewer_provider.py`` satisfies it over the serving runtime (the caller of the request
is set by ``authenticate``, every other call applies the runtime's rules). Every method
raises ``tensor_server.errors`` classes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from tensor_server.core.adapter_base import TensorAdapter
    from tensor_server.core.bounds import Bounds
    from tensor_server.core.level_grid import GridLevel
    from tensor_server.core.pyramid import PyramidPolicy

__all__ = ["ViewerProvider"]


class ViewerProvider(Protocol):
    #: the pyramid policy the levels are advertised with (None: the default)
    policy: PyramidPolicy | None

    def authenticate(self, presented: str | None, peer: str = "") -> None:
        """Who asks this request: the credential it presented and its address (the calls
        below refuse with ``Unauthenticated`` what that caller may not read)."""

    def tensor(self, array_id: str) -> TensorAdapter:
        """The served tensor ``array_id`` (``TensorNotFound``/``InvalidArgument`` otherwise)."""

    def level_region(
        self, tensor: TensorAdapter, level: GridLevel, region: Bounds, cancelled: Callable[[], bool] | None = None
    ) -> np.ndarray:
        """The pixels of ``region`` of a served level (``ServingRuntime.level_region``: from
        the level's cached chunks, or computed from the region's own extent when cold)."""

    def flight_location(self, client_host: str) -> str | None:
        """The Flight location the catalog page's SDK snippet names, for a client that reached
        the page as ``client_host`` (``ServingRuntime.flight_location``; None: no Flight door)."""

    def catalog_level(self, key: str) -> dict[str, Any]:
        """One level of the catalog tree (``CatalogTree.children``, with its ``trail``), each source with the
        ``ServedTensor``s it serves to the caller and its ``unresolved_reason``."""
