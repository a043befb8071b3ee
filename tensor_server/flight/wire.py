"""Wire encodings of wire-protocol.md: plans to FlightInfo, chunks to record batches, errors.

Message classes come from the biopb SDK's generated modules, never redefined here, so the
bytes are the SDK's own.
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
from biopb.tensor import descriptor_pb2, ticket_pb2

from tensor_server.cache.chunk_columns import encode_chunk_columns, wire_dtype
from tensor_server.core.adapter_base import TensorAdapter
from tensor_server.core.bounds import Bounds
from tensor_server.core.plan import ReadPlan
from tensor_server.core.pyramid import PyramidPolicy, advertised_levels
from tensor_server.core.uniform import constant_value
from tensor_server.errors import InvalidArgument, InvalidBounds

__all__ = [
    "CHUNK_SCHEMA",
    "PLAN_SCHEMA",
    "chunk_batch",
    "flight_error",
    "plan_flight_info",
    "describe_descriptor",
    "READ_MASK_PATHS",
    "read_mask",
    "check_read_request",
]

PROTOCOL_METADATA = {b"chunk_wire_protocol": b"2", b"flight_protocol": b"3"}
_CHUNK_FIELDS = [pa.field("data", pa.binary()), pa.field("shape", pa.list_(pa.int64())), pa.field("dtype", pa.string())]
CHUNK_SCHEMA = pa.schema(_CHUNK_FIELDS, metadata={b"chunk_wire_protocol": b"2"})
PLAN_SCHEMA = pa.schema(_CHUNK_FIELDS, metadata=PROTOCOL_METADATA)


def chunk_batch(arr: np.ndarray) -> pa.RecordBatch:
    """One-row batch of the unified chunk schema; the data buffer wraps ``arr`` without a
    copy (little-endian, C-order), at offset 0 as the client requires. A uniform chunk (a
    broadcast array, ``core/uniform.py``) is sent from one shared constant buffer per
    (dtype, value, size), filled once, not materialised per request."""
    value = constant_value(arr)
    if value is not None:
        arr = _shared_constant(arr.dtype.str, np.asarray(value).tobytes(), arr.size).reshape(arr.shape)
    return pa.RecordBatch.from_arrays(list(encode_chunk_columns(arr)), schema=CHUNK_SCHEMA)


@lru_cache(maxsize=16)
def _shared_constant(dtype: str, value: bytes, size: int) -> np.ndarray:
    """A read-only C-contiguous array of ``size`` copies of ``value``, shared by every batch
    that sends it (Flight only reads the buffer)."""
    out = np.full(size, np.frombuffer(value, dtype=dtype)[0], dtype=dtype)
    out.flags.writeable = False
    return out


from tensor_server.flight.errors import bounded_message, flight_error  # noqa: E402,F401 - re-exported


#: GetFlightInfo field-mask paths this server answers. ``upload_status`` is answered by
#: omission (no upload backs a catalog source); ``ticket_stub`` is not served (health says
#: ``ticket_stubs: false``), so asking for it is refused like any unknown path.
READ_MASK_PATHS = frozenset({"endpoints", "metadata_json", "pyramid", "is_resident", "upload_status"})


def read_mask(option: Any) -> set[str]:
    """The mask paths a TensorReadOption asks for; an unknown one is refused by name, since
    a client that asked for it planned around receiving it."""
    paths = set(option.fields.paths)
    unknown = sorted(paths - READ_MASK_PATHS)
    if unknown:
        raise InvalidArgument(f"tensor_read: unknown field mask path(s) {unknown}; known: {sorted(READ_MASK_PATHS)}",
                              slug="unknown_field_mask")
    return paths


def check_read_request(region: Bounds | None, scale: Sequence[int] | None, shape: Sequence[int]) -> None:
    """Refuse a malformed slice or scale with the reference's slug. A stop past the end is
    *not* refused: it is clamped (NumPy semantics; a deliberate difference from the
    reference, which refuses it as ``slice_out_of_range``); only a start at or past the end
    of an axis, which leaves nothing to read, is ``slice_out_of_range``."""
    ndim = len(shape)
    if region is not None:
        if region.ndim != ndim:
            raise InvalidBounds(f"slice_hint has {region.ndim} axes but the tensor has {ndim}", slug="slice_rank")
        for axis, (a, b, n) in enumerate(zip(region.start, region.stop, shape)):
            if a < 0 or b < 0:
                raise InvalidBounds(f"slice_hint axis {axis}: bounds [{a}, {b}) are negative", slug="slice_negative")
            if a >= b:
                raise InvalidBounds(f"slice_hint axis {axis}: empty or reversed interval [{a}, {b})", slug="slice_inverted")
            if a >= n:
                raise InvalidBounds(f"slice_hint axis {axis}: start {a} is past the axis length {n}",
                                    slug="slice_out_of_range")
    if scale:
        if len(scale) != ndim:
            raise InvalidArgument(f"scale_hint has {len(scale)} axes but the tensor has {ndim}", slug="scale_rank")
        bad = [axis for axis, s in enumerate(scale) if s <= 0]
        if bad:
            raise InvalidArgument(f"scale_hint must be positive integers, got {list(scale)} (axis {bad[0]})",
                                  slug="scale_not_positive")


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
    endpoints = []
    if plan is not None:
        for pc in plan.chunks:
            ticket = ticket_pb2.TensorTicket(chunk_id=pc.chunk_id.encode()).SerializeToString()
            ob = pc.out_bounds
            bounds = ticket_pb2.ChunkBounds(start=list(ob.start), stop=list(ob.stop)).SerializeToString()
            endpoints.append(flight.FlightEndpoint(ticket, [], app_metadata=bounds))
    return flight.FlightInfo(
        PLAN_SCHEMA,
        flight.FlightDescriptor.for_command(descriptor.SerializeToString()),
        endpoints,
        total_records=-1,
        total_bytes=-1,
        app_metadata=request_bytes,
    )


def request_region(option: Any, ndim: int) -> Bounds | None:
    """The request's slice_hint as Bounds (None when absent); rank checked later by plan."""
    if not option.HasField("slice_hint"):
        return None
    sh = option.slice_hint
    if len(sh.start) == 0 and len(sh.stop) == 0:
        return None
    if len(sh.start) != len(sh.stop):
        raise InvalidArgument(f"slice_hint has {len(sh.start)} starts but {len(sh.stop)} stops")
    return Bounds(tuple(sh.start), tuple(sh.stop))
