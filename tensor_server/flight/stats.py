"""The ``tensor_stats`` Flight action: min, max, sum, mean and non-zero count of a tensor or
a region, computed in closed form over uniform blocks (``core/stats.py``).

Body (JSON): ``{"array_id": "...", "slice": {"start": [...], "stop": [...]}}``; ``slice`` is
optional (the whole tensor). The result is one JSON document (``tensor_stats``'s fields).
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tensor_server.core.bounds import Bounds
from tensor_server.core.stats import tensor_stats
from tensor_server.errors import InvalidArgument

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.flight.server import TensorFlightServer

__all__ = ["ACTION", "tensor_stats_action"]

ACTION = ("tensor_stats", "min/max/sum/mean/count_nonzero of a tensor or region (JSON body: array_id, slice)")


def tensor_stats_action(server: TensorFlightServer, body: bytes) -> dict[str, Any]:
    """Parse the body, find the tensor in the server's catalog, compute through its engine."""
    try:
        request = json.loads(body or b"{}")
    except ValueError:
        raise InvalidArgument("tensor_stats body is not JSON") from None
    if not isinstance(request, dict) or not isinstance(request.get("array_id"), str):
        raise InvalidArgument('tensor_stats body must be {"array_id": "...", "slice": {"start": [...], "stop": [...]}}')
    tensor, _ = server.catalog.find_tensor(request["array_id"])
    region = request.get("slice")
    bounds = None
    if region is not None:
        if not isinstance(region, dict) or not isinstance(region.get("start"), list) or not isinstance(region.get("stop"), list):
            raise InvalidArgument("tensor_stats slice must be {\"start\": [...], \"stop\": [...]}")
        bounds = Bounds(tuple(region["start"]), tuple(region["stop"])).clamp(tensor.shape)
    return tensor_stats(tensor, bounds, server.engine)
