"""``ViewerProvider`` (``render.provider``) over the serving runtime: what the viewer doors
(IIIF, DeepZoom, the catalog page) read through, so every rule of the runtime — the token,
per-tensor grants, the upload gate, admission, the precacher — holds on them as on every door.

The renderer calls the provider without a caller (it renders for whoever asked); the caller of
the request being served is a context variable, set by ``authenticate`` at the start of each
request (``http/viewer_door.guarded``) and carried into worker threads with the context.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tensor_server.service import Caller

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from tensor_server.core.adapter_base import TensorAdapter
    from tensor_server.core.bounds import Bounds
    from tensor_server.core.level_grid import GridLevel
    from tensor_server.service import ServingRuntime

__all__ = ["RuntimeViewerProvider"]

_CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("viewer_caller", default=Caller(door="http"))


class RuntimeViewerProvider:
    def __init__(self, runtime: ServingRuntime, *, door_requires_credential: bool = False) -> None:
        """``door_requires_credential``: the HTTP door asks every request for its token
        (``Caller.door_requires_credential``)."""
        self.runtime = runtime
        self.policy = runtime.policy
        self.door_requires_credential = door_requires_credential

    def authenticate(self, presented: str | None, peer: str = "") -> None:
        """The caller of this request (what it presented); each call below applies the rules."""
        _CALLER.set(
            Caller(token=presented, peer=peer, door="http", door_requires_credential=self.door_requires_credential)
        )

    def tensor(self, array_id: str) -> TensorAdapter:
        return self.runtime.tensor(array_id, _CALLER.get())[0]

    def level_region(
        self, tensor: TensorAdapter, level: GridLevel, region: Bounds, cancelled: Callable[[], bool] | None = None
    ) -> np.ndarray:
        return self.runtime.level_region(tensor, level, region, _CALLER.get(), cancelled)

    def flight_location(self, client_host: str) -> str | None:
        return self.runtime.flight_location(client_host)

    def catalog_level(self, key: str) -> dict[str, Any]:
        """One level of the catalog with each source's tensors for this caller
        (``CatalogVerbs.catalog_level``, over ``ServingRuntime.fields``)."""
        return self.runtime.catalog_verbs.catalog_level(key, _CALLER.get())
