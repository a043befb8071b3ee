"""``chunk_locate`` (wire-protocol §7): where a chunk's batch lives in a segment file, for a
client on this machine to map instead of receiving the bytes.

The chunk goes through the same checks as a chunk read (the gate, the id, a stale id refused),
is resolved into the cache when missing, and is offered to loopback peers only: a path is
useless, and revealing, to a client on another machine. A warm SDK tile is a describe and
this, so the warm path reads no pixels (``_cached_location``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tensor_server.core.bounds import Bounds
from tensor_server.core.chunk_id import UNSCALED, ChunkId
from tensor_server.core.engine import check_chunk_id

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.cache import Location
    from tensor_server.service.caller import Caller
    from tensor_server.service.runtime import ServingRuntime

__all__ = ["chunk_location"]


def chunk_location(rt: ServingRuntime, chunk_id: bytes, caller: Caller) -> dict[str, Any]:
    """The location ``chunk_locate`` answers (``available: false`` when there is none to offer)."""
    if not caller.is_loopback or rt.cache is None:
        return {"available": False}
    cid = ChunkId.decode(chunk_id)
    own = _member_location(rt, cid, caller)  # a cache:// member chunk: its own sealed segment
    if own is not None:
        return own
    loc = _cached_location(rt, cid, caller)
    if loc is None:
        cid, _ = rt.chunk(cid, caller)
        loc = rt.cache.locate(cid.encode())
    if loc is None:  # e.g. larger than the whole cache budget, or evicted just now
        return {"available": False}
    return _offered(loc.segment_path, loc.byte_offset, loc.byte_length, loc.generation_id)


def _offered(path: str, offset: int, length: int, generation: int) -> dict[str, Any]:
    return {
        "available": True,
        "segment_path": path,
        "byte_offset": offset,
        "byte_length": length,
        "generation_id": generation,
    }


def _cached_location(rt: ServingRuntime, cid: ChunkId, caller: Caller) -> Location | None:
    """A chunk read that finds ``cid`` in the file tier: the gate and the checks of
    ``rt.chunk``, then the chunk's location instead of its pixels. Going through ``chunk``
    mapped and wrapped the pixels nobody looked at and cost 0.3 ms of server CPU a warm SDK
    tile (more than the replay floor's whole call)."""
    assert rt.cache is not None
    tensor = rt.chunk_tensor(cid, caller)
    cid = rt.engine.checked(tensor, cid)
    loc = rt.cache.locate(cid.encode(), read=True)
    if loc is not None:
        rt.count_peer(caller)
        if rt.precacher is not None:
            rt.precacher.after_read(tensor, cid)
    return loc


def _member_location(rt: ServingRuntime, cid: ChunkId, caller: Caller) -> dict[str, Any] | None:
    """An upload's chunk in its own sealed segment, unscaled only."""
    up = rt.upload(cid.array_id)
    if up is None:
        return None
    rt.chunk_tensor(cid, caller)  # the gate (and the token) first
    cid = check_chunk_id(up.tensor, cid)
    if cid.method != UNSCALED:
        return None
    loc = up.member.locate(Bounds(cid.start, cid.stop))
    if loc is None:
        return None
    return _offered(*loc)
