"""The Flight side of uploads (wire-protocol §8): add_tensor / set_upload_status actions,
write plans and status describes in GetFlightInfo, DoPut of one planned chunk, and the read
gate DoGet and chunk_locate apply to uploaded tensors.

The server calls in through a handful of one-line hooks; everything upload-specific is here
or in ``tensor_server.uploads`` (which is transport-free). A server without a write_dir, or
one whose write verbs are off (``writable`` false: an in-process producer uses the manager
directly), refuses every write verb with a message that says how to turn uploads on.
"""
from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import pyarrow.flight as flight
from biopb.tensor import descriptor_pb2, ticket_pb2

from tensor_server.cache.chunk_columns import wire_dtype
from tensor_server.core.adapter_base import TensorAdapter
from tensor_server.core.chunk_id import UNSCALED, ChunkId
from tensor_server.core.engine import check_chunk_id
from tensor_server.core.bounds import Bounds
from tensor_server.errors import InvalidArgument
from tensor_server.flight.wire import flight_error, plan_flight_info
from tensor_server.uploads import Upload, UploadClosed, UploadManager, UploadNotReadable
from tensor_server.uploads.marker import DISCARDED, READY

__all__ = ["UploadGlue"]

log = logging.getLogger(__name__)
_STATES = descriptor_pb2.UploadStatus.State


def _info(code: str, reason: str) -> bytes:
    return json.dumps({"code": code, "reason": reason}).encode()


def _refused(exc: UploadClosed) -> flight.FlightCancelledError:
    """The SDK turns this (class + ``upload_*`` reason) into ``UploadRefused`` (§8.4)."""
    reason = "upload_discarded" if exc.state == DISCARDED else "upload_sealed"
    payload = {"reason": reason, "state": exc.state, "source_id": exc.array_id, "detail": exc.detail}
    return flight.FlightCancelledError(str(exc), extra_info=json.dumps(payload).encode())


def _not_readable(exc: UploadNotReadable) -> flight.FlightServerError:
    return flight.FlightServerError(str(exc), extra_info=_info("FAILED_PRECONDITION", "upload_not_readable"))


def status_pb(up: Upload) -> descriptor_pb2.UploadStatus:
    st = up.status()
    state = st["state"] if st["state"] in ("PENDING", "READY", "DISCARDED") else "PENDING"
    return descriptor_pb2.UploadStatus(state=_STATES.Value(state), expected_chunks=st["expected_chunks"],
                                       uploaded_chunks=st["uploaded_chunks"], reason=st["reason"])


class UploadGlue:
    """Owns the server's UploadManager (None without a write_dir) and the write verbs."""

    def __init__(self, server: Any, manager: UploadManager | None = None) -> None:
        cfg = server.config
        self.server = server
        if manager is None and cfg.write_dir:
            manager = UploadManager(server.catalog, cfg.write_dir, upload_ttl=cfg.upload_ttl,
                                    scratch_ttl=cfg.scratch_ttl)
            manager.start_sweeps()
        self.manager = manager
        self.writable = bool(cfg.writable and manager is not None)

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()

    def _require_writable(self) -> UploadManager:
        if self.manager is None:
            raise flight.FlightServerError("this server is read-only: start it with --write-dir DIR to accept uploads",
                                           extra_info=_info("FAILED_PRECONDITION", "read_only"))
        if not self.writable:
            raise flight.FlightServerError(
                "this server takes no uploads over the wire: start it with --writable (its --write-dir "
                "serves in-process producers only)", extra_info=_info("FAILED_PRECONDITION", "read_only"))
        return self.manager

    # ---- actions -----------------------------------------------------------------------------
    def do_action(self, kind: str, body: bytes) -> list[flight.Result] | None:
        """Results for an upload action, or None when ``kind`` is not one."""
        if kind not in ("add_tensor", "set_upload_status"):
            return None
        manager = self._require_writable()
        with _wire_errors():
            if kind == "add_tensor":
                reply = self._add_tensor(manager, body)
            else:
                reply = self._set_status(manager, body)
        return [flight.Result(reply.SerializeToString())]

    def _add_tensor(self, manager: UploadManager, body: bytes) -> descriptor_pb2.TensorDescriptor:
        req = descriptor_pb2.TensorDescriptor()
        try:
            req.ParseFromString(body)
        except Exception:
            raise InvalidArgument("add_tensor: the body is not a TensorDescriptor") from None
        up = manager.add_tensor(req.array_id, req.shape, req.dtype, chunk_shape=req.chunk_shape,
                                dim_labels=req.dim_labels, metadata_json=req.metadata_json,
                                ttl_seconds=req.ttl_seconds if req.HasField("ttl_seconds") else None)
        t = up.tensor
        out = descriptor_pb2.TensorDescriptor(array_id=up.array_id, shape=list(t.shape), dtype=wire_dtype(t.dtype),
                                              chunk_shape=list(t.chunk_shape), dim_labels=list(t.dim_labels),
                                              content_version=t.content_version)
        out.upload_status.CopyFrom(status_pb(up))
        if up.granted_ttl is not None:
            out.ttl_seconds = int(-(-up.granted_ttl // 1))
        return out

    def _set_status(self, manager: UploadManager, body: bytes) -> descriptor_pb2.UploadStatus:
        req = ticket_pb2.SetUploadStatus()
        try:
            req.ParseFromString(body)
        except Exception:
            raise InvalidArgument("set_upload_status: the body is not a SetUploadStatus") from None
        if req.state == _STATES.DISCARDED:
            up = manager.discard(req.array_id, req.reason)
            if up is None:
                self._refuse_native(req.array_id)
                return descriptor_pb2.UploadStatus()  # no upload record: the SDK reports UNKNOWN
            return status_pb(up)
        if req.state != _STATES.READY:
            raise InvalidArgument(f"set_upload_status: {_STATES.Name(req.state)} is not a state an upload can be "
                                  "moved to; use READY or DISCARDED")
        if manager.get(req.array_id) is None:
            raise InvalidArgument(f"set_upload_status: {req.array_id!r} is not an upload in progress")
        return status_pb(manager.set_ready(req.array_id))

    def _refuse_native(self, array_id: str) -> None:
        try:
            self.server.catalog.find_tensor(array_id)
        except Exception:
            return
        raise InvalidArgument(f"set_upload_status: {array_id!r} is a tensor of its source's own files, not an "
                              "upload; it cannot be discarded")

    # ---- GetFlightInfo -----------------------------------------------------------------------
    def tensor_info(self, option: Any) -> flight.FlightInfo | None:
        """The answer for an uploaded tensor's id (write plan, describe, status poll, or read
        plan once READY); None when the id is not an upload's."""
        if self.manager is None:
            return None
        up = self.manager.get(option.array_id)
        if up is None:
            return None
        fields = set(option.fields.paths)
        scaled = any(s != 1 for s in option.scale_hint)
        if up.state == DISCARDED:  # a tombstone: only its status is served
            if "endpoints" in fields or scaled:  # a writer (or reader) hears what a DoPut would
                raise _refused(UploadClosed(up.array_id, DISCARDED, up.reason))
            t = up.tensor
            desc = descriptor_pb2.TensorDescriptor(array_id=up.array_id, shape=list(t.shape),
                                                   dtype=wire_dtype(t.dtype), dim_labels=list(t.dim_labels),
                                                   chunk_shape=list(t.chunk_shape))
            desc.upload_status.CopyFrom(status_pb(up))
            return plan_flight_info(desc, None, option.SerializeToString())
        if scaled and up.state != READY:  # an unscaled plan while PENDING is the write plan
            try:
                self.manager.check_readable(up)
            except UploadNotReadable as exc:
                raise _not_readable(exc) from None
        tensor, echo = self.server.catalog.find_tensor(option.array_id)  # an orphan (source gone) is not served
        return self.server.describe_tensor(tensor, echo, option,
                                           upload_status=status_pb(up) if "upload_status" in fields else None)

    # ---- the read gate (DoGet, chunk_locate) -------------------------------------------------
    def check_readable(self, tensor: TensorAdapter) -> None:
        if self.manager is None:
            return
        up = self.manager.upload_of(tensor)
        if up is not None:
            try:
                self.manager.check_readable(up)
            except UploadNotReadable as exc:
                raise _not_readable(exc) from None

    def locate(self, ticket: Any) -> dict[str, Any] | None:
        """chunk_locate for a cache:// member's stored chunk: its own sealed segment, no copy
        into the chunk cache. None = not such a chunk (the server's default path answers)."""
        if self.manager is None or ticket.WhichOneof("payload") != "chunk_id":
            return None
        cid = ChunkId.decode(ticket.chunk_id)
        up = self.manager.get(cid.array_id)
        if up is None:
            return None
        self.check_readable(up.tensor)
        if up.state == DISCARDED:
            return None
        cid = check_chunk_id(up.tensor, cid)
        if cid.method != UNSCALED:
            return None
        loc = up.member.locate(Bounds(cid.start, cid.stop))
        if loc is None:
            return None
        path, offset, length, inode = loc
        return {"available": True, "segment_path": path, "byte_offset": offset, "byte_length": length,
                "generation_id": inode}

    # ---- DoPut ---------------------------------------------------------------------------------
    def do_put(self, descriptor: Any, reader: Any) -> None:
        manager = self._require_writable()
        with _wire_errors():
            cmd = ticket_pb2.PutCommand()
            try:
                cmd.ParseFromString(descriptor.command)
            except Exception:
                raise InvalidArgument("DoPut: the descriptor command is not a PutCommand") from None
            if cmd.WhichOneof("command") != "chunk_ticket":
                raise InvalidArgument(f"DoPut: unsupported command {cmd.WhichOneof('command')!r}")
            tt = ticket_pb2.TensorTicket()
            try:
                tt.ParseFromString(cmd.chunk_ticket)
            except Exception:
                raise InvalidArgument("DoPut: chunk_ticket is not a TensorTicket") from None
            if tt.WhichOneof("payload") != "chunk_id":
                raise InvalidArgument("DoPut: chunk_ticket carries no chunk id (use a ticket of the write plan)")
            manager.write_chunk(tt.chunk_id, _chunk_values(reader.read_all()))


@contextmanager
def _wire_errors() -> Iterator[None]:
    """Errors of a write verb as the SDK reads them: Flight errors as they are, a closed
    upload as the SDK's refusal, anything else through ``flight_error``."""
    try:
        yield
    except flight.FlightError:
        raise
    except UploadClosed as exc:
        raise _refused(exc) from None
    except Exception as exc:
        raise flight_error(exc) from None


def _chunk_values(table: Any) -> np.ndarray:
    """The DoPut stream's ``data`` column as a flat array (zero-copy for numeric types; bool
    arrives bit-packed and is unpacked with a copy)."""
    if "data" not in table.column_names:
        raise InvalidArgument(f"DoPut: the stream has no 'data' column (columns: {table.column_names})")
    col = table.column("data")
    arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    if arr.null_count:
        raise InvalidArgument("DoPut: the 'data' column holds nulls")
    try:
        return arr.to_numpy(zero_copy_only=not str(arr.type) == "bool")
    except Exception as exc:
        raise InvalidArgument(f"DoPut: the 'data' column of type {arr.type} is not a numeric array: {exc}") from None
