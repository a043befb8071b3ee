"""The wire vocabulary (wire-protocol.md): the unified chunk schema and its columns
(``data``, ``shape``, ``dtype``), the wire dtype string, and an upload's status message.

One owner below the cache, the service floor and the doors, because each speaks it: a chunk
served over DoGet and a chunk stored in a segment (and mapped by a client through the fast
path) are the same bytes (C-order, little-endian, the data buffer at offset 0 of its binary
array, an explicit-byte-order numpy dtype string), and a status a write verb answers is the
status a describe carries.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from tensor_server.core.uniform import constant_value

__all__ = [
    "CHUNK_FIELDS",
    "CHUNK_SCHEMA",
    "PLAN_SCHEMA",
    "chunk_batch",
    "status_message",
    "encode_chunk_columns",
    "decode_chunk",
    "one_value_column",
    "binary_column",
    "int64_column",
    "int64_values",
    "wire_dtype",
]


PROTOCOL_METADATA = {b"chunk_wire_protocol": b"2", b"flight_protocol": b"3"}
#: the unified chunk columns, in order: DoGet batches, plan schemas and cache segments start with them
CHUNK_FIELDS = [pa.field("data", pa.binary()), pa.field("shape", pa.list_(pa.int64())), pa.field("dtype", pa.string())]
CHUNK_SCHEMA = pa.schema(CHUNK_FIELDS, metadata={b"chunk_wire_protocol": b"2"})
#: a FlightInfo's schema: the chunk schema stamped with both protocol versions
PLAN_SCHEMA = pa.schema(CHUNK_FIELDS, metadata=PROTOCOL_METADATA)


def wire_dtype(dtype: np.dtype) -> str:
    """Explicit little-endian numpy dtype string (``"<u2"``, ``"|u1"``, ``"|b1"``)."""
    dt = np.dtype(dtype)
    if dt.byteorder == "=" or (dt.byteorder == ">" and dt.itemsize > 1):
        dt = dt.newbyteorder("<")
    return dt.str


def encode_chunk_columns(arr: np.ndarray) -> tuple[pa.Array, pa.Array, pa.Array]:
    """(data, shape, dtype) one-row arrays; ``data`` wraps ``arr``'s bytes without a copy
    when ``arr`` is C-contiguous little-endian."""
    arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and not np.little_endian):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    dtype_str = wire_dtype(arr.dtype)
    raw = arr.reshape(-1).view(np.uint8) if arr.size else np.zeros(0, np.uint8)
    data = pa.py_buffer(raw)
    offsets = pa.py_buffer(np.array([0, data.size], dtype=np.int32))
    data_col = pa.Array.from_buffers(pa.binary(), 1, [None, offsets, data])
    # built from buffers, not ``pa.array([...])``: converting Python objects makes pyarrow
    # import pandas on first use (1.2-2 s on this machine), which would land on a client's
    # first chunk
    shape_values = pa.Array.from_buffers(pa.int64(), arr.ndim, [None, pa.py_buffer(np.asarray(arr.shape, np.int64))])
    shape_offsets = pa.py_buffer(np.array([0, arr.ndim], dtype=np.int32))
    shape_col = pa.Array.from_buffers(pa.list_(pa.int64()), 1, [None, shape_offsets], children=[shape_values])
    return data_col, shape_col, one_value_column(dtype_str.encode(), pa.string())


def one_value_column(value: bytes, type_: pa.DataType) -> pa.Array:
    """A one-row binary or string array holding ``value``, built from buffers (see above)."""
    return binary_column([value], type_)


def binary_column(values: list[bytes], type_: pa.DataType = pa.binary()) -> pa.Array:
    """A binary (or string) array of ``values``, built from buffers (see above)."""
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum(np.fromiter(map(len, values), np.int64, len(values)), out=offsets[1:])
    return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))])


def int64_column(values: list[int]) -> pa.Array:
    """An int64 array of ``values``, built from buffers (see above)."""
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(np.asarray(values, np.int64))])


def int64_values(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """The values of a null-free int64 column as a read-only array: from its buffer, since
    ``to_numpy()`` imports pandas too."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return np.frombuffer(arr.buffers()[1], np.int64, count=len(arr), offset=arr.offset * 8)


def decode_chunk(batch: pa.RecordBatch) -> np.ndarray:
    """A read-only array view of a one-row chunk batch (no copy; keeps the batch's buffer,
    e.g. a segment mapping, alive)."""
    dtype = np.dtype(batch.column("dtype")[0].as_py())
    shape = tuple(batch.column("shape")[0].as_py())
    count = int(np.prod(shape)) if shape else 1
    data = batch.column("data").buffers()[2]
    arr = np.frombuffer(data, dtype=dtype, count=count).reshape(shape)
    arr.flags.writeable = False
    return arr


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


class _HasStatus(Protocol):
    """An upload as this module sees it (``uploads.Upload``; typed structurally, since
    uploads sit above core)."""

    def status(self) -> dict[str, Any]: ...


def status_message(up: _HasStatus) -> Any:
    """The upload's status as the SDK's ``UploadStatus`` message."""
    from biopb.tensor import descriptor_pb2

    states = descriptor_pb2.UploadStatus.State
    st = up.status()
    state = st["state"] if st["state"] in ("PENDING", "READY", "DISCARDED") else "PENDING"
    return descriptor_pb2.UploadStatus(
        state=states.Value(state),
        expected_chunks=st["expected_chunks"],
        uploaded_chunks=st["uploaded_chunks"],
        reason=st["reason"],
    )
