"""ListActions requires the token like every call but the health action (issue 12, medium)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.flight as flight
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.testing import serving


class _Bearer(flight.ClientMiddlewareFactory):
    def __init__(self, token):
        self.token = token

    def start_call(self, info):
        token = self.token

        class _M(flight.ClientMiddleware):
            def sending_headers(self):
                return {"authorization": f"Bearer {token}"}

        return _M()


def test_list_actions_needs_the_token_and_health_does_not():
    cat = Catalog()
    cat.add_source(MemorySource(ArrayAdapter(np.zeros((2, 2))), source_id="a"))
    with serving(cat, token="s3cret") as srv:
        for bad in [
            flight.FlightClient(srv.location),
            flight.FlightClient(srv.location, middleware=[_Bearer("wrong")]),
        ]:
            with pytest.raises(flight.FlightUnauthenticatedError):
                list(bad.list_actions())
            health = json.loads(next(iter(bad.do_action(flight.Action("health", b"")))).body.to_pybytes())
            assert health["protocol"] == 3
        good = flight.FlightClient(srv.location, middleware=[_Bearer("s3cret")])
        types = [a.type for a in good.list_actions()]
        assert types[0] == "health" and "chunk_locate" not in types  # no cache here
    cat.close()
