"""The wire vocabulary (``core/wire.py``): one chunk schema for DoGet, plans and cache
segments; the wire dtype string; an upload's status as the SDK's message."""

from __future__ import annotations

import numpy as np
import pytest
from biopb.tensor import descriptor_pb2

from tensor_server.cache.segment_store import SEGMENT_SCHEMA
from tensor_server.core.wire import (
    CHUNK_FIELDS,
    CHUNK_SCHEMA,
    PLAN_SCHEMA,
    chunk_batch,
    decode_chunk,
    status_message,
    wire_dtype,
)


def test_every_chunk_schema_starts_with_the_same_columns() -> None:
    names = ["data", "shape", "dtype"]
    assert [f.name for f in CHUNK_FIELDS] == names
    assert CHUNK_SCHEMA.names == PLAN_SCHEMA.names == names
    assert SEGMENT_SCHEMA.names[:3] == names
    assert all(SEGMENT_SCHEMA.field(n).type == CHUNK_SCHEMA.field(n).type for n in names)
    assert CHUNK_SCHEMA.metadata == {b"chunk_wire_protocol": b"2"}
    assert PLAN_SCHEMA.metadata == {b"chunk_wire_protocol": b"2", b"flight_protocol": b"3"}


@pytest.mark.parametrize(
    "dtype, expected",
    [("u2", "<u2"), (">u2", "<u2"), ("u1", "|u1"), ("?", "|b1"), (">f8", "<f8"), ("<i4", "<i4")],
)
def test_wire_dtype_is_explicit_little_endian(dtype: str, expected: str) -> None:
    assert wire_dtype(np.dtype(dtype)) == expected


def test_a_big_endian_chunk_goes_out_little_endian_and_comes_back_equal() -> None:
    arr = np.arange(12, dtype=">u2").reshape(3, 4)
    batch = chunk_batch(arr)
    assert batch.schema == CHUNK_SCHEMA
    assert batch.column("dtype")[0].as_py() == "<u2"
    assert batch.column("shape")[0].as_py() == [3, 4]
    np.testing.assert_array_equal(decode_chunk(batch), arr)


class _Upload:
    def __init__(self, state: str) -> None:
        self.state = state

    def status(self) -> dict[str, object]:
        return {"state": self.state, "expected_chunks": 4, "uploaded_chunks": 3, "reason": "r"}


@pytest.mark.parametrize("state", ["PENDING", "READY", "DISCARDED"])
def test_status_message_carries_the_upload_state_and_counts(state: str) -> None:
    msg = status_message(_Upload(state))
    assert descriptor_pb2.UploadStatus.State.Name(msg.state) == state
    assert (msg.expected_chunks, msg.uploaded_chunks, msg.reason) == (4, 3, "r")


def test_a_state_the_sdk_does_not_know_is_reported_pending() -> None:
    assert status_message(_Upload("WRITING")).state == descriptor_pb2.UploadStatus.State.Value("PENDING")
