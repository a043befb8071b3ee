"""``ViewerProvider`` (``render.provider``) over a Catalog and a ReadEngine: what the viewer
doors (IIIF, DeepZoom, the catalog page) read through until the service layer provides it."""
from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any

from tensor_server.catalog.tree import CatalogTree
from tensor_server.errors import TensorNotFound, Unauthenticated

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from tensor_server.catalog.catalog import Catalog
    from tensor_server.core.adapter_base import TensorAdapter
    from tensor_server.core.chunk_id import ChunkId
    from tensor_server.core.engine import ReadEngine
    from tensor_server.core.pyramid import PyramidPolicy

__all__ = ["CatalogViewerProvider"]


class CatalogViewerProvider:
    def __init__(self, catalog: Catalog, engine: ReadEngine, *, token: str | None = None,
                 policy: PyramidPolicy | None = None, flight_location: str | None = None) -> None:
        self.catalog, self.engine, self.token, self.policy = catalog, engine, token, policy
        self.flight_location = flight_location
        self._tree: tuple[int, CatalogTree] | None = None

    def authenticate(self, presented: str | None) -> None:
        if self.token and (presented is None or not hmac.compare_digest(presented.encode(), self.token.encode())):
            raise Unauthenticated("a valid 'Authorization: Bearer <token>' header or ?token= is required "
                                  "(the token the server printed at start)")

    def tensor(self, array_id: str) -> TensorAdapter:
        return self.catalog.find_tensor(array_id)[0]

    def chunk(self, tensor: TensorAdapter, chunk_id: ChunkId) -> np.ndarray:
        return self.engine.chunk(chunk_id, tensor)[1]

    def children(self, key: str) -> dict[str, Any]:
        cached = self._tree
        generation = self.catalog.generation
        if cached is None or cached[0] != generation:
            rows = [(r.source_id, r.url, r.source is None or bool(r.source.tensors)) for r in self.catalog.records()]
            cached = self._tree = (generation, CatalogTree(rows))
        return cached[1].children(key)

    def source_tensors(self, source_id: str) -> dict[str, TensorAdapter]:
        try:
            rec = self.catalog.get_record(source_id)
        except TensorNotFound:  # dropped between the listing and this call: nothing to show
            return {}
        return dict(rec.source.tensors) if rec.source is not None else {}
