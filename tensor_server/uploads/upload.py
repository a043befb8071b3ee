"""One uploaded tensor's record (``Upload``) and what its states refuse.

A record is live (PENDING, READY) or a DISCARDED tombstone that keeps its name taken until the
reclaim sweep. Its state moves under its own condition (``cond``): writes count themselves in
and out there, and READY and DISCARD wait on it for the writes in flight. The persisted
states are the marker's (``marker.py``); ``SEALING`` is the one that never reaches a disk.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensor_server.core.adapter_base import TensorAdapter
from tensor_server.core.bounds import Bounds
from tensor_server.core.chunk_id import ChunkId
from tensor_server.errors import FailedPrecondition, TensorServerError
from tensor_server.uploads.marker import DISCARDED, READY

__all__ = ["SEALING", "ChunkWrite", "Upload", "UploadClosed", "UploadNotReadable", "forget_rows"]

#: transient: READY is being published (writes refused, discard waits for the outcome)
SEALING = "SEALING"


class UploadClosed(TensorServerError):
    """A write or transition reached an upload that takes no more chunks (READY or DISCARDED).
    Its reason (``upload_sealed`` / ``upload_discarded``) and details are what the biopb SDK
    turns into ``UploadRefused``."""

    code, http_status = "ABORTED", 409

    def __init__(self, array_id: str, state: str, detail: str) -> None:
        state = DISCARDED if state == DISCARDED else READY  # SEALING is READY to a writer
        self.array_id, self.state, self.detail = array_id, state, detail
        word = "was discarded" if state == DISCARDED else "is READY (sealed)"
        super().__init__(
            f"upload {array_id} {word}; it takes no more writes" + (f": {detail}" if detail else ""),
            slug="upload_discarded" if state == DISCARDED else "upload_sealed",
            state=state,
            source_id=array_id,
            detail=detail,
        )


class UploadNotReadable(FailedPrecondition):
    """A read reached an uploaded tensor that is PENDING (or a DISCARDED tombstone)."""

    slug = "upload_not_readable"


@dataclass(frozen=True)
class ChunkWrite:
    """A DoPut's target, checked before its stream is read: the upload, the chunk and the
    most bytes its stream may carry."""

    upload: Upload
    chunk_id: ChunkId
    bounds: Bounds
    expected_bytes: int
    max_stream_bytes: int


@dataclass
class Upload:
    """One uploaded tensor: its store, reader and progress (``adopted`` ones carry none)."""

    array_id: str
    source_id: str
    field: str
    member: Any  # ZarrMember | CacheMember
    tensor: TensorAdapter
    state: str
    expires_at: float | None
    last_activity: float
    adopted: bool = False
    #: the lifetime add_tensor granted (seconds; None = no deadline)
    granted_ttl: float | None = None
    reason: str = ""
    discarded_at: float | None = None
    #: chunks whose write returned (durable as far as the member goes: READY fsyncs them)
    received: set[Bounds] = dataclasses.field(default_factory=set)
    #: chunks whose last write failed (ENOSPC, I/O error): a hole the client did not mean
    failed: set[Bounds] = dataclasses.field(default_factory=set)
    inflight: int = 0
    #: SHA-256 (hex) of its owner's token ("" = the server's): who may write, publish, discard it
    owner: str = ""
    #: SHA-256 (hex) of its read grant ("" = none: read as the catalog is); the service floor
    #: checks callers against both (``service/access.py``)
    grant: str = ""
    cond: threading.Condition = dataclasses.field(default_factory=threading.Condition)

    @property
    def expected_chunks(self) -> int:
        return int(np.prod([-(-n // c) for n, c in zip(self.tensor.shape, self.tensor.chunk_shape)], dtype=object))

    @property
    def declared_bytes(self) -> int:
        return int(np.prod(self.tensor.shape, dtype=object)) * self.tensor.dtype.itemsize

    def status(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "expected_chunks": self.expected_chunks,
            "uploaded_chunks": len(self.received),
            "reason": self.reason,
        }


def forget_rows(catalog: Any, array_id: str) -> None:
    """An upload's annotations and decode rate go with it: once its name is free the id
    may name another owner's upload, and rows no upload record covers would fall under
    the control rule, readable by anyone in local mode (``service/access.py``). Public
    because boot (``adoption.py``) forgets the rows of what it removes, as the manager does
    on discard and reclaim."""
    catalog.rois.forget(array_id)
    catalog.decode_rates.forget(array_id)
