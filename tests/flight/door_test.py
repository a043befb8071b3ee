"""The door conformance suite through the Flight door: reads by the real biopb SDK, actions
and chunk tickets by a plain pyarrow Flight client (what any Flight client sends)."""

from __future__ import annotations

import functools
import json

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from tensor_server import errors
from tensor_server.testing.door_tests import DoorTests, Refusal, control_actions, point_roi


def _flight_error(exc):
    """The FlightError behind ``exc`` (the SDK re-raises refusals as its own types, from it)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, flight.FlightError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


class FlightDoor:
    def __init__(self, location) -> None:
        self.location = location

    def _options(self, token):
        headers = [] if token is None else [(b"authorization", f"Bearer {token}".encode())]
        return flight.FlightCallOptions(headers=headers)

    def _sdk(self, token):
        from biopb.tensor import TensorFlightClient

        return TensorFlightClient(self.location, token=token, cache_bytes=0)

    def read(self, array_id, token):
        return self._sdk(token).get_array(array_id)

    def _action(self, name, body, token):
        with flight.FlightClient(self.location) as c:
            return [r.body.to_pybytes() for r in c.do_action(flight.Action(name, body), self._options(token))]

    def stats(self, array_id, token):
        return json.loads(self._action("tensor_stats", json.dumps({"array_id": array_id}).encode(), token)[0])

    def add_source(self, path, token):
        from biopb.tensor.descriptor_pb2 import AddSourceRequest

        return self._action("add_source", AddSourceRequest(url=path).SerializeToString(), token)

    def query(self, sql, token):
        return self._sdk(token).query(sql, format="records")

    def listed(self, source_id, token):
        return [
            r["array_id"]
            for r in self.query(
                f"SELECT unnest(tensors).array_id AS array_id FROM sources WHERE source_id = '{source_id}'", token
            )
        ]

    def resolve(self, source_id, token):
        return self._sdk(token).resolve_source(source_id)

    def roi_put(self, array_id, token):
        return len(self._sdk(token).put_rois(array_id, [point_roi()]).stored)

    def add_tensor(self, request_id, shape, token):
        from biopb.tensor.descriptor_pb2 import TensorDescriptor

        body = TensorDescriptor(array_id=request_id, shape=list(shape), dtype="<u2").SerializeToString()
        return TensorDescriptor.FromString(self._action("add_tensor", body, token)[0]).array_id

    def read_chunk(self, chunk_id, token):
        from biopb.tensor import ticket_pb2

        ticket = flight.Ticket(ticket_pb2.TensorTicket(chunk_id=chunk_id).SerializeToString())
        with flight.FlightClient(self.location) as c:
            return c.do_get(ticket, self._options(token)).read_all()

    def control_calls(self, world):
        """Every control action, SQL, the listings, an upload's chunk and writes of annotations."""
        unauthenticated, denied = errors.Unauthenticated, errors.PermissionDenied
        calls = [
            (f"action {name}", functools.partial(self._action, name, body), unauthenticated)
            for name, body in control_actions(world.served.runtime)
        ]
        geojson = b'{"array_id": "img"}\n{"type": "FeatureCollection", "features": []}'
        calls += [
            ("list_actions", self._list_actions, unauthenticated),
            ("list_flights", self._list_flights, unauthenticated),
            ("SQL", functools.partial(self.query, "SELECT source_id FROM sources"), unauthenticated),
            ("tensor_stats of another tensor", functools.partial(self.stats, world.ready), unauthenticated),
            ("put_rois onto its tensor (scope read)", functools.partial(self.roi_put, "img"), denied),
            ("put_rois onto another tensor", functools.partial(self.roi_put, world.ready), denied),
            ("put_rois_geojson onto its tensor", functools.partial(self._action, "put_rois_geojson", geojson), denied),
            ("a chunk of an upload", functools.partial(self._put_chunk, world), unauthenticated),
        ]
        return calls

    def _list_actions(self, token):
        with flight.FlightClient(self.location) as c:
            return list(c.list_actions(self._options(token)))

    def _list_flights(self, token):
        with flight.FlightClient(self.location) as c:
            return list(c.list_flights(options=self._options(token)))

    def _put_chunk(self, world, token):
        """The pending upload's one chunk, as its write plan names it."""
        from biopb.tensor import ticket_pb2

        from tensor_server.core.bounds import Bounds
        from tensor_server.core.chunk_id import ChunkId

        up = world.served.runtime.uploads.get(world.pending)
        cid = ChunkId.for_extent(
            up.array_id, Bounds((0, 0), up.tensor.shape), (1, 1), "none", up.tensor.content_version
        )
        ticket = ticket_pb2.TensorTicket(chunk_id=cid.encode()).SerializeToString()
        descriptor = flight.FlightDescriptor.for_command(ticket_pb2.PutCommand(chunk_ticket=ticket).SerializeToString())
        data = pa.record_batch([pa.array([b"\0" * 8], pa.binary())], names=["data"])
        with flight.FlightClient(self.location) as c:
            writer, _ = c.do_put(descriptor, data.schema, self._options(token))
            writer.write_batch(data)
            writer.close()

    @staticmethod
    def refusal(exc):
        err = _flight_error(exc)
        if err is None:
            return None
        info = json.loads(bytes(err.extra_info).decode()) if err.extra_info else {}
        code = info.get("code")
        if code is None and isinstance(err, flight.FlightUnauthenticatedError):
            code = "UNAUTHENTICATED"
        return Refusal(code, None, str(err).split(". Detail:")[0])


class TestFlightDoor(DoorTests):
    def door_on(self, world):
        return FlightDoor(world.served.location)

    @pytest.fixture
    def door(self, world):
        return self.door_on(world)
