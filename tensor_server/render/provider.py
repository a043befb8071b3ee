"""What the viewer doors need from the serving runtime: one small Protocol.

``http/viewer_provider.py`` satisfies it over the serving runtime (the caller of the request
is set by ``authenticate``, every other call applies the runtime's rules). Every method
raises ``tensor_server.errors`` classes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from tensor_server.core.adapter_base import TensorAdapter
    from tensor_server.core.chunk_id import ChunkId
    from tensor_server.core.pyramid import PyramidPolicy

__all__ = ["ViewerProvider"]


class ViewerProvider(Protocol):
    #: the pyramid policy the levels are advertised with (None: the default)
    policy: PyramidPolicy | None
    #: the Flight address the catalog page's SDK snippet names (None: the page's host, port 8815)
    flight_location: str | None

    def authenticate(self, presented: str | None, peer: str = "") -> None:
        """Who asks this request: the credential it presented and its address (the calls
        below refuse with ``Unauthenticated`` what that caller may not read)."""

    def tensor(self, array_id: str) -> TensorAdapter:
        """The served tensor ``array_id`` (``TensorNotFound``/``InvalidArgument`` otherwise)."""

    def chunk(self, tensor: TensorAdapter, chunk_id: ChunkId) -> np.ndarray:
        """The pixels of a planned chunk (``ReadEngine.chunk``: cached, computed on a miss)."""

    def children(self, key: str) -> dict[str, Any]:
        """One level of the catalog tree (``CatalogTree.children``)."""

    def source_tensors(self, source_id: str) -> dict[str, TensorAdapter]:
        """The listed tensors of a source, by field (empty when it cannot be opened)."""
