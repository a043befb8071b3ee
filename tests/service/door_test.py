"""The door conformance suite through the in-process API: the runtime's verbs called directly
with a ``Caller`` (what every door builds its answers from)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tensor_server.errors import TensorServerError, internal_message
from tensor_server.service import Caller
from tensor_server.testing.door_tests import DoorTests, Refusal


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

        return list(self.runtime.do_action("add_source", AddSourceRequest(url=path).SerializeToString(),
                                           Caller(token=token)))

    @staticmethod
    def refusal(exc):
        if isinstance(exc, TensorServerError):
            return Refusal(exc.code, exc.http_status, str(exc))
        return Refusal("INTERNAL", 500, internal_message(exc))  # what every door says of one not ours


class TestInProcessDoor(DoorTests):
    @pytest.fixture
    def door(self, world):
        return InProcessDoor(world.served.runtime)
