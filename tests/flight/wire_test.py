"""The Flight encoding of plans (``flight/wire.py``)."""

from __future__ import annotations

import numpy as np
from biopb.tensor import ticket_pb2

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.core import Bounds, ChunkId, plan_read
from tensor_server.flight import wire


def test_a_kept_plans_endpoints_are_built_once_and_a_bulk_plans_are_not_kept():
    t = ArrayAdapter(np.zeros((256, 256), np.uint8), chunk_shape=(16, 16))
    MemorySource(t, source_id="ends")
    tile = plan_read(t, Bounds((0, 0), (32, 32)))
    endpoints = wire._endpoints(tile)
    assert [ChunkId.decode(ticket_pb2.TensorTicket.FromString(e.ticket.ticket).chunk_id) for e in endpoints] == [
        pc.chunk_id for pc in tile.chunks
    ]
    bounds = [ticket_pb2.ChunkBounds.FromString(e.app_metadata) for e in endpoints]
    assert [(tuple(b.start), tuple(b.stop)) for b in bounds] == [
        (pc.out_bounds.start, pc.out_bounds.stop) for pc in tile.chunks
    ]
    assert wire._endpoints(tile) is endpoints
    whole = plan_read(t)
    assert len(whole.chunks) == 256 and wire._endpoints(whole) is not wire._endpoints(whole)
