"""Scaled reads assembled from cached full-resolution chunks (scaled-read-path.md §6).

``cache_sourced_units`` is the seam the default ``get_scaled_data`` offers each extent to. It
returns a fetch function that assembles units from cache entries, or ``None`` to leave the
read on the source. Until the chunk cache exists it always declines; the cache supplies the
real implementation through ``cache_manager.sourced_units``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from tensor_server.core.bounds import Bounds

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.core.adapter_base import TensorAdapter

__all__ = ["cache_sourced_units"]


def cache_sourced_units(
    tensor: TensorAdapter,
    bounds: Bounds,
    unit: Sequence[int],
    scale: Sequence[int],
    method: str,
    cache_manager: Any | None,
) -> tuple[Callable[[Bounds], np.ndarray], tuple[int, ...]] | None:
    """(fetch, unit) that reads units from the cache, or None to read the source.

    Declines when there is no cache manager or it offers no ``sourced_units`` hook; the
    cache decides the rest (every chunk under the extent cached, extent on the chunk grid).
    """
    if cache_manager is None:
        return None
    hook = getattr(cache_manager, "sourced_units", None)
    if hook is None:
        return None
    return hook(tensor, bounds, tuple(unit), tuple(scale), method)
