"""The door conformance suite through the in-process API: the runtime's verbs called directly
with a ``Caller`` (what every door builds its answers from)."""

from __future__ import annotations

import functools
import json

import numpy as np
import pyarrow as pa
import pytest

from tensor_server import errors
from tensor_server.errors import TensorServerError, internal_message
from tensor_server.service import Caller
from tensor_server.testing.door_tests import DoorTests, Refusal, control_actions, point_roi


class InProcessDoor:
    def __init__(self, runtime) -> None:
        self.runtime = runtime

    def read(self, array_id, token):
        caller = Caller(token=token)
        described = self.runtime.describe(caller, array_id, fields=["endpoints"])
        out = np.empty(described.plan.shape, described.tensor.dtype)
        for pc in described.plan.chunks:
            _, data = self.runtime.chunk(pc.chunk_id.encode(), caller)
            out[pc.out_bounds.to_slices()] = data
        return out

    def read_chunk(self, chunk_id, token):
        return self.runtime.chunk(chunk_id, Caller(token=token))[1]

    def stats(self, array_id, token):
        body = json.dumps({"array_id": array_id}).encode()
        return json.loads(b"".join(self.runtime.do_action("tensor_stats", body, Caller(token=token))))

    def add_source(self, path, token):
        from biopb.tensor.descriptor_pb2 import AddSourceRequest

        return list(
            self.runtime.do_action("add_source", AddSourceRequest(url=path).SerializeToString(), Caller(token=token))
        )

    def query(self, sql, token):
        return self.runtime.query(sql, Caller(token=token)).to_pylist()

    def listed(self, source_id, token):
        return [
            r["array_id"]
            for r in self.query(
                f"SELECT unnest(tensors).array_id AS array_id FROM sources WHERE source_id = '{source_id}'", token
            )
        ]

    def resolve(self, source_id, token):
        from biopb.tensor.descriptor_pb2 import ResolveStreamMessage

        reply = b"".join(self.runtime.do_action("resolve", source_id.encode(), Caller(token=token)))
        return pa.ipc.open_stream(ResolveStreamMessage.FromString(reply).source_row).read_all().to_pylist()[0]

    def roi_put(self, array_id, token):
        from biopb.image.annotation_pb2 import RoiPutResult
        from biopb.tensor import ticket_pb2
        from biopb.tensor._roi_rows import rois_to_table

        cmd = ticket_pb2.PutCommand(roi_put=ticket_pb2.RoiPut(array_id=array_id))
        reply = self.runtime.catalog_verbs.roi_write(
            cmd, rois_to_table([point_roi()]).to_batches(), Caller(token=token), lambda: False
        )
        return len(RoiPutResult.FromString(reply).stored)

    def add_tensor(self, request_id, shape, token):
        from biopb.tensor.descriptor_pb2 import TensorDescriptor

        body = TensorDescriptor(array_id=request_id, shape=list(shape), dtype="<u2").SerializeToString()
        return TensorDescriptor.FromString(
            b"".join(self.runtime.do_action("add_tensor", body, Caller(token=token)))
        ).array_id

    def control_calls(self, world):
        """Every control action and SQL, as a door would call them."""
        unauthenticated = errors.Unauthenticated
        calls = [
            (f"action {name}", functools.partial(self._action, name, body), unauthenticated)
            for name, body in control_actions(self.runtime)
        ]
        calls.append(("SQL", functools.partial(self.query, "SELECT source_id FROM sources"), unauthenticated))
        calls.append(
            ("put_rois onto its tensor (scope read)", functools.partial(self.roi_put, "img"), errors.PermissionDenied)
        )
        return calls

    def _action(self, name, body, token):
        return list(self.runtime.do_action(name, body, Caller(token=token)))

    @staticmethod
    def refusal(exc):
        if isinstance(exc, TensorServerError):
            return Refusal(exc.code, exc.http_status, str(exc))
        return Refusal("INTERNAL", 500, internal_message(exc))  # what every door says of one not ours


class TestInProcessDoor(DoorTests):
    def door_on(self, world):
        return InProcessDoor(world.served.runtime)

    @pytest.fixture
    def door(self, world):
        return self.door_on(world)
