"""Flight encodings of wire-protocol.md: described tensors and plans to FlightInfo.

The vocabulary they are spelled in (chunk schema, wire dtype, upload status) is
``core/wire.py``'s. Message classes come from the biopb SDK's generated modules, never
redefined here, so the bytes are the SDK's own.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import pyarrow.flight as flight
from biopb.tensor import descriptor_pb2, ticket_pb2

from tensor_server.core.adapter_base import TensorAdapter
from tensor_server.core.bounds import Bounds
from tensor_server.core.plan import REMEMBERED_PLAN_CHUNKS, ReadPlan
from tensor_server.core.pyramid import PyramidPolicy, advertised_levels
from tensor_server.core.wire import PLAN_SCHEMA, status_message, wire_dtype
from tensor_server.errors import InvalidArgument

__all__ = [
    "described_flight_info",
    "request_region",
    "plan_flight_info",
    "describe_descriptor",
]


def _physical(tensor: TensorAdapter, scale: Sequence[int]) -> tuple[list[float], list[str]] | None:
    if tensor.physical_scale is None:
        return None
    values = [float(v) * s if v is not None else 0.0 for v, s in zip(tensor.physical_scale, scale)]
    units = [str(u) if u is not None else "" for u in (tensor.physical_unit or [None] * tensor.ndim)]
    return values, units


def describe_descriptor(
    tensor: TensorAdapter,
    echo_id: str,
    fields: set[str],
    plan: ReadPlan | None,
    had_slice: bool,
    metadata_json: str | None,
    pyramid_policy: PyramidPolicy | None = None,
    is_resident: bool | None = None,
) -> descriptor_pb2.TensorDescriptor:
    """The realized TensorDescriptor (§3.3) for a plan, or a describe when plan is None.
    ``is_resident`` is set when the ``is_resident`` mask path asked for it."""
    d = descriptor_pb2.TensorDescriptor()
    d.array_id = echo_id
    d.dim_labels.extend(tensor.dim_labels)
    d.dtype = wire_dtype(tensor.dtype)
    d.content_version = tensor.content_version
    scale = plan.scale if plan is not None else (1,) * tensor.ndim
    if plan is None:
        d.shape.extend(tensor.shape)
        d.chunk_shape.extend(tensor.chunk_shape)
    else:
        d.shape.extend(plan.shape)
        d.chunk_shape.extend(plan.chunk_shape)
        r = plan.realized
        if had_slice or any(r.start):
            d.slice_hint.start.extend(r.start)
            d.slice_hint.stop.extend(r.stop)
        # scale and method are not echoed: protocol v3 carries the request in the
        # FlightInfo's app_metadata (§3.2), the descriptor describes the result
    phys = _physical(tensor, scale)
    if phys is not None:
        d.physical_scale.extend(phys[0])
        d.physical_unit.extend(phys[1])
    if "pyramid" in fields:
        for lv in advertised_levels(tensor, pyramid_policy):
            d.pyramid.add(scale_hint=list(lv.scale), reduction_method=lv.method, shape=list(lv.shape), native=lv.native)
    if "metadata_json" in fields and metadata_json is not None:
        d.metadata_json = metadata_json
    if "is_resident" in fields and is_resident is not None:
        d.is_resident = is_resident
    return d


def plan_flight_info(
    descriptor: descriptor_pb2.TensorDescriptor,
    plan: ReadPlan | None,
    request_bytes: bytes,
) -> flight.FlightInfo:
    """FlightInfo: CMD descriptor = realized TensorDescriptor, one endpoint per chunk with
    ChunkBounds app_metadata, schema stamped with the protocol versions, app_metadata = the
    echoed TensorReadOption (§3.2)."""
    endpoints = _endpoints(plan) if plan is not None else []
    return flight.FlightInfo(
        PLAN_SCHEMA,
        flight.FlightDescriptor.for_command(descriptor.SerializeToString()),
        endpoints,
        total_records=-1,
        total_bytes=-1,
        app_metadata=request_bytes,
    )


#: the endpoints of this many recent plans are kept: ``plan_read`` hands the same plan object
#: to every request for the same tile, and its endpoints cost 50 us of Python a tile to build
REMEMBERED_ENDPOINTS = 1024
_ENDPOINTS: OrderedDict[int, tuple[ReadPlan, list[flight.FlightEndpoint]]] = OrderedDict()
_ENDPOINTS_LOCK = threading.Lock()


def _endpoints(plan: ReadPlan) -> list[flight.FlightEndpoint]:
    """One endpoint per planned chunk: its ticket, and its ChunkBounds as app_metadata.
    Kept per plan object (the entry holds the plan, so its id is not reused meanwhile)."""
    with _ENDPOINTS_LOCK:
        kept = _ENDPOINTS.get(id(plan))
        if kept is not None and kept[0] is plan:
            _ENDPOINTS.move_to_end(id(plan))
            return kept[1]
    endpoints = []
    for pc in plan.chunks:
        ticket = ticket_pb2.TensorTicket(chunk_id=pc.chunk_id.encode()).SerializeToString()
        ob = pc.out_bounds
        bounds = ticket_pb2.ChunkBounds(start=list(ob.start), stop=list(ob.stop)).SerializeToString()
        endpoints.append(flight.FlightEndpoint(ticket, [], app_metadata=bounds))
    if len(endpoints) > REMEMBERED_PLAN_CHUNKS:  # a bulk read's plan is not kept either
        return endpoints
    with _ENDPOINTS_LOCK:
        _ENDPOINTS[id(plan)] = (plan, endpoints)
        while len(_ENDPOINTS) > REMEMBERED_ENDPOINTS:
            _ENDPOINTS.popitem(last=False)
    return endpoints


def request_region(option: Any) -> Bounds | None:
    """The request's slice_hint as Bounds (None when absent); rank checked later by plan."""
    if not option.HasField("slice_hint"):
        return None
    sh = option.slice_hint
    if len(sh.start) == 0 and len(sh.stop) == 0:
        return None
    if len(sh.start) != len(sh.stop):
        raise InvalidArgument(f"slice_hint has {len(sh.start)} starts but {len(sh.stop)} stops")
    return Bounds(tuple(sh.start), tuple(sh.stop))


def described_flight_info(described: Any, policy: PyramidPolicy | None, request_bytes: bytes) -> flight.FlightInfo:
    """The FlightInfo answering a ``ServingRuntime.describe`` (a ``Described``): a plan's
    endpoints when they were asked for, the upload's status when it was, and for a DISCARDED
    upload (a tombstone: no tensor to describe) its declared shape and status only."""
    up = described.upload
    if described.tensor is None:
        t = up.tensor
        desc = descriptor_pb2.TensorDescriptor(
            array_id=up.array_id,
            shape=list(t.shape),
            dtype=wire_dtype(t.dtype),
            dim_labels=list(t.dim_labels),
            chunk_shape=list(t.chunk_shape),
        )
        desc.upload_status.CopyFrom(status_message(up))
        return plan_flight_info(desc, None, request_bytes)
    desc = describe_descriptor(
        described.tensor,
        described.echo,
        set(described.fields),
        described.plan,
        described.had_slice,
        described.metadata_json,
        policy,
        described.is_resident,
    )
    if up is not None:
        desc.upload_status.CopyFrom(status_message(up))
    return plan_flight_info(desc, described.plan if described.wants_endpoints else None, request_bytes)
