"""The ``warm`` action: fill the chunk cache with what a client is about to read, sending none
of the pixels (issue 43's prefetch verb; the reference designed it and deferred it).

Body (JSON), one of:

* ``{"chunk_ids": ["<base64 chunk id>", ...]}``: the chunks of a plan the client holds (each
  endpoint's ticket ``chunk_id``, base64 in JSON);
* ``{"array_id": "...", "region": [[start, stop], ...], "scale": [...], "method": "...",
  "grid": "read" | "tiles"}``: the chunks of that read's plan, the region in level-0 pixels
  (``scale`` and ``method`` optional, as in a read). ``grid``: ``read`` (the default) warms
  what one read of the region would fetch; ``tiles`` warms the tile grid over the region,
  which is what a viewer reading it tile by tile fetches (a large region read at once is
  planned on the coarser transfer grid, whose chunks a tile's read would not find).

Answered as a stream of progress records ``{"done", "total", "cached", "computed"}``, one per
``_PROGRESS_EVERY`` chunks and one at the end, so a client sees it move and can stop it.

The rules every door gets here:

* it is a read of each tensor named (the server token or that tensor's grant), checked before
  a chunk is looked at; a chunk id of a changed file is refused as stale, as a read is;
* at most ``MAX_CHUNKS`` chunks a request, and no more output bytes than the cache holds
  (``RequestTooLarge`` naming both): warming past the budget evicts what it warmed;
* the chunks are computed one at a time, under the engine's admission bound, with the
  precacher paused (a client's own request); cached chunks are skipped; a client that goes
  stops it before the next chunk.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from tensor_server.core.bounds import Bounds
from tensor_server.core.chunk_id import ChunkId
from tensor_server.core.json_body import decode_json
from tensor_server.core.plan import plan_read
from tensor_server.errors import InvalidArgument, RequestTooLarge, Unimplemented

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.core.adapter_base import TensorAdapter
    from tensor_server.service.caller import Caller
    from tensor_server.service.runtime import ServingRuntime

__all__ = ["warm_action", "MAX_CHUNKS"]

#: chunks one request may warm: a 63-tile viewport and the next level around it are a few
#: hundred; base64 ids of this many fit the 1 MiB JSON body bound
MAX_CHUNKS = 2048
_PROGRESS_EVERY = 32
#: ``grid``'s values: the plan a read makes (its own choice), or the tile grid's (plan.py)
_GRIDS: dict[str, str | None] = {"read": None, "tiles": "tile"}
_USAGE = (
    'warm takes {"chunk_ids": ["<base64 chunk id>", ...]} or '
    '{"array_id": "...", "region": [[start, stop], ...], "scale": [...], "method": "...", "grid": "read"|"tiles"}'
)


def warm_action(rt: ServingRuntime, caller: Caller, body: bytes, cancelled: Callable[[], bool]) -> Iterator[bytes]:
    if rt.cache is None:
        raise Unimplemented("warm: this server has no chunk cache to fill (started with --no-cache)")
    request = decode_json(body, "warm body")
    if not isinstance(request, dict):
        raise InvalidArgument(_USAGE)
    work = _planned(rt, caller, request) if "array_id" in request else _named(rt, caller, request)
    _check_budget(rt, work)
    return _run(rt, work, cancelled)


def _named(rt: ServingRuntime, caller: Caller, request: dict[str, Any]) -> list[tuple[TensorAdapter, ChunkId]]:
    ids = request.get("chunk_ids")
    if not isinstance(ids, list) or set(request) != {"chunk_ids"}:
        raise InvalidArgument(_USAGE)
    _check_count(len(ids))
    tensors: dict[str, TensorAdapter] = {}
    work = []
    for i, text in enumerate(ids):
        if not isinstance(text, str):
            raise InvalidArgument(f"warm: chunk_ids[{i}] is not a base64 string")
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgument(f"warm: chunk_ids[{i}] is not base64") from None
        cid = ChunkId.decode(raw)
        if cid.array_id not in tensors:
            tensors[cid.array_id] = rt.chunk_tensor(cid, caller)
        work.append((tensors[cid.array_id], cid))
    return work


def _planned(rt: ServingRuntime, caller: Caller, request: dict[str, Any]) -> list[tuple[TensorAdapter, ChunkId]]:
    unknown = set(request) - {"array_id", "region", "scale", "method", "grid"}
    if unknown or not isinstance(request["array_id"], str):
        raise InvalidArgument(f"{_USAGE}; unknown keys {sorted(unknown)}" if unknown else _USAGE)
    region = _region(request.get("region"))
    scale = request.get("scale")
    if scale is not None and not (isinstance(scale, list) and all(type(s) is int for s in scale)):
        raise InvalidArgument("warm: scale must be a list of integers")
    method = request.get("method", "")
    if not isinstance(method, str):
        raise InvalidArgument("warm: method must be a string")
    grid = request.get("grid", "read")
    if grid not in _GRIDS:
        raise InvalidArgument(f"warm: grid must be one of {sorted(_GRIDS)}, not {str(grid)[:40]!r}")
    described = rt.describe(
        caller, request["array_id"], region=region, scale=scale, method=method, fields=["endpoints"]
    )
    plan, tensor = described.plan, described.tensor
    assert plan is not None and tensor is not None  # endpoints asked: a plan
    on = _GRIDS[grid]
    if on is not None:  # the same region, scale and method, on the grid asked for
        plan = plan_read(tensor, region, scale, method, grid=on)
    _check_count(len(plan.chunks))
    return [(tensor, c.chunk_id) for c in plan.chunks]


def _region(value: object) -> Bounds | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(r, list) and len(r) == 2 and all(type(v) is int for v in r) for r in value
    ):
        raise InvalidArgument("warm: region must be [[start, stop], ...], integers, one pair per axis")
    return Bounds(tuple(r[0] for r in value), tuple(r[1] for r in value))


def _check_count(n: int) -> None:
    if n > MAX_CHUNKS:
        raise RequestTooLarge(f"warm: {n} chunks asked, at most {MAX_CHUNKS} a request; warm a smaller region")


def _check_budget(rt: ServingRuntime, work: list[tuple[TensorAdapter, ChunkId]]) -> None:
    assert rt.cache is not None
    need = sum(math.prod(cid.output_shape) * tensor.dtype.itemsize for tensor, cid in work)
    if need > rt.cache.max_total_bytes:
        raise RequestTooLarge(
            f"warm: the chunks asked hold {need} bytes, more than the chunk cache's budget of "
            f"{rt.cache.max_total_bytes}; warm a smaller region"
        )


def _run(
    rt: ServingRuntime, work: list[tuple[TensorAdapter, ChunkId]], cancelled: Callable[[], bool]
) -> Iterator[bytes]:
    assert rt.cache is not None
    counts = {"done": 0, "total": len(work), "cached": 0, "computed": 0}
    paused = rt.precacher.client_read() if rt.precacher is not None else nullcontext()
    with paused:
        for tensor, cid in work:
            if cancelled():
                return
            if cid.encode() in rt.cache:
                rt.engine.refuse_changed(tensor, cid)  # a stale id is refused, cached or not
                counts["cached"] += 1
            else:
                rt.engine.chunk(cid, tensor, cancelled=cancelled)
                counts["computed"] += 1
            counts["done"] += 1
            if counts["done"] % _PROGRESS_EVERY == 0 and counts["done"] < counts["total"]:
                yield json.dumps(counts).encode()
    yield json.dumps(counts).encode()
