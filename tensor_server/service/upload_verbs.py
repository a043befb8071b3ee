"""The upload write verbs (wire-protocol §8): ``add_tensor``, ``set_upload_status`` and the
values of one chunk write. Write plans and status describes are ``ServingRuntime.describe``;
the read gate is ``ServingRuntime.tensor``.

A server without a write_dir, or one whose write verbs are off (``writable`` false: an
in-process producer uses the manager directly), refuses every write verb with a message that
says how to turn uploads on.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tensor_server.core.wire import status_message, wire_dtype
from tensor_server.errors import InvalidArgument, ReadOnly, TensorServerError
from tensor_server.service.bodies import decode_message
from tensor_server.uploads.names import parse_upload_id

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.service.caller import Caller
    from tensor_server.service.runtime import ServingRuntime
    from tensor_server.uploads import UploadManager

__all__ = ["require_writable", "add_tensor", "set_upload_status"]


def require_writable(runtime: ServingRuntime) -> UploadManager:
    if runtime.uploads is None:
        raise ReadOnly("this server is read-only: start it with --write-dir DIR to accept uploads")
    if not runtime.writable:
        raise ReadOnly(
            "this server takes no uploads over the wire: start it with --writable (its --write-dir "
            "serves in-process producers only)"
        )
    return runtime.uploads


def add_tensor(runtime: ServingRuntime, caller: Caller, body: bytes, cancelled: Any = None) -> Iterator[bytes]:
    """A PENDING tensor; its owner is the caller, and it carries no read grant (the SDK asks
    for none: ``service/access.py``). A refusal that would describe another tensor (a label
    set's image, an upload holding the name) is the read refusal when the caller may not read
    that tensor. The name of a PENDING upload declared again the same way answers that upload
    (a crashed uploader re-plans and resumes), to its owner only: a re-plan is a write of it."""
    from biopb.tensor import descriptor_pb2

    manager = require_writable(runtime)
    req = decode_message(descriptor_pb2.TensorDescriptor, body, "add_tensor")
    runtime.access.folder_write(caller, parse_upload_id(req.array_id).source_id)  # before a refusal names it
    up = manager.add_tensor(
        req.array_id,
        req.shape,
        req.dtype,
        chunk_shape=req.chunk_shape,
        dim_labels=req.dim_labels,
        metadata_json=req.metadata_json,
        ttl_seconds=req.ttl_seconds if req.HasField("ttl_seconds") else None,
        owner=runtime.access.owner_for(caller),
        authorize=functools.partial(runtime.access.read, caller),
        may_write=functools.partial(runtime.access.write, caller),
    )
    t = up.tensor
    out = descriptor_pb2.TensorDescriptor(
        array_id=up.array_id,
        shape=list(t.shape),
        dtype=wire_dtype(t.dtype),
        chunk_shape=list(t.chunk_shape),
        dim_labels=list(t.dim_labels),
        content_version=t.content_version,
    )
    out.upload_status.CopyFrom(status_message(up))
    if up.granted_ttl is not None:
        out.ttl_seconds = int(-(-up.granted_ttl // 1))
    yield out.SerializeToString()


def set_upload_status(runtime: ServingRuntime, caller: Caller, body: bytes, cancelled: Any = None) -> Iterator[bytes]:
    """READY or DISCARDED, by the upload's owner only (anyone else: PERMISSION_DENIED, ``Access.write``)."""
    from biopb.tensor import descriptor_pb2, ticket_pb2

    manager = require_writable(runtime)
    states = descriptor_pb2.UploadStatus.State
    req = decode_message(ticket_pb2.SetUploadStatus, body, "set_upload_status")
    up = manager.get(req.array_id)
    if up is not None:
        runtime.access.write(caller, up)
    if req.state == states.DISCARDED:
        up = manager.discard(req.array_id, req.reason)
        if up is None:
            _refuse_native(runtime, req.array_id)
            yield descriptor_pb2.UploadStatus().SerializeToString()  # no upload record: the SDK reports UNKNOWN
            return
        yield status_message(up).SerializeToString()
        return
    if req.state != states.READY:
        raise InvalidArgument(
            f"set_upload_status: {states.Name(req.state)} is not a state an upload can be "
            "moved to; use READY or DISCARDED"
        )
    if manager.get(req.array_id) is None:
        raise InvalidArgument(f"set_upload_status: {req.array_id!r} is not an upload in progress")
    yield status_message(manager.set_ready(req.array_id)).SerializeToString()


def _refuse_native(runtime: ServingRuntime, array_id: str) -> None:
    try:
        runtime.catalog.find_tensor(array_id)
    except TensorServerError:  # not a served tensor: nothing to refuse
        return
    raise InvalidArgument(
        f"set_upload_status: {array_id!r} is a tensor of its source's own files, not an upload; it cannot be discarded"
    )
