"""The crowd bench runs end to end: every door it times (ours over HTTP and Flight, the HTTP
and Flight floors, replicas behind nginx) answers every tile, warm and cold, for each client count, and the floor
servers answer what they stand for (a JPEG of a 512² tile; a plan and a location)."""

from __future__ import annotations

import argparse
import io
import json
import math

from pyarrow import flight

from tensor_server.bench import crowd
from tensor_server.bench.crowd import _flight_floor_fetch, _floor_process, _http_fetch, _measure, _served_id
from tensor_server.bench.server_process import wait_idle
from tensor_server.bench.viewport import viewport, write_fixtures
from tensor_server.deploy.nginx_process import nginx_binary


def test_every_door_answers_every_tile_warm_and_cold(tmp_path, monkeypatch):
    """The bench waits for each server to idle 0.5 s before a measurement (24 waits, 15 of this
    test's 46 s); this test asks for answers, not settled timings, so 50 ms of idleness do."""
    waited: list[int] = []

    def settle(pid: int) -> None:
        waited.append(pid)
        wait_idle(pid, quiet_s=0.05)

    monkeypatch.setattr(crowd, "wait_idle", settle)
    write_fixtures(tmp_path, 1024)
    replicas = "2" if nginx_binary() else ""  # make test installs nginx; without it, no rows through it
    ns = argparse.Namespace(clients="1,2", repeats=1, cold=True, serve_args=[], replicas=replicas)
    rows = _measure(ns, tmp_path / "big.zarr", 1, viewport(1024, 1))
    seen = {(r["door"], r["state"], r["clients"]) for r in rows}
    doors = ("http", "flight", "floor", "floor-static", "flight-replay", "flight-floor")
    doors += ("nginx-2", "nginx-2-flight") if replicas else ()
    warm = {(d, "warm", c) for d in doors for c in (1, 2)}
    cold = {(d, "cold", c) for d in ("http", "flight") for c in (1, 2)}
    assert seen == warm | cold
    # every row waited for its server to idle; the four nginx rows for each of the two replicas
    assert len(waited) == len(rows) + (4 if replicas else 0)
    for r in rows:
        assert all(math.isfinite(r[k]) and r[k] > 0 for k in ("wall_ms", "tiles_per_s", "p50_ms", "p99_ms")), r


def test_the_floors_answer_what_they_stand_for():
    import http.client

    from PIL import Image

    with _floor_process("serve_floor") as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for path in ("/tile", "/static"):
            conn.request("GET", path)
            r = conn.getresponse()
            body = r.read()
            assert r.status == 200 and r.getheader("content-type") == "image/jpeg"
            assert Image.open(io.BytesIO(body)).size == (512, 512)
        _http_fetch(f"http://127.0.0.1:{port}", lambda t: "/tile")()((0, 0, 512, 512))
    with _floor_process("serve_flight_floor") as port:
        from pyarrow import flight

        client = flight.FlightClient(f"grpc://127.0.0.1:{port}")
        info = client.get_flight_info(flight.FlightDescriptor.for_command(b"c"))
        assert len(info.endpoints) == 1
        assert [bytes(r.body) for r in client.do_action(flight.Action("chunk_locate", b"k"))] == [b"x" * 200]
        _flight_floor_fetch(f"grpc://127.0.0.1:{port}")()((0, 0, 512, 512))


def test_the_replay_floor_answers_the_sdk_as_our_server_does(tmp_path):
    """The SDK reads the same pixels through the replaying floor as from the server it
    recorded, and the floor asks the server once per distinct request."""
    import numpy as np
    from biopb.tensor import TensorFlightClient

    from tensor_server.bench.server_process import server_process

    write_fixtures(tmp_path, 1024)
    with (
        server_process([tmp_path / "big.zarr"], tmp_path / "cache") as srv,
        _floor_process("serve_flight_replay", srv.location) as port,
    ):
        aid = _served_id(srv.location)
        ours, replay = (TensorFlightClient(loc, cache_bytes=0) for loc in (srv.location, f"grpc://127.0.0.1:{port}"))
        region = (slice(512, 1024), slice(0, 512))
        want = ours.get_array(aid, slice_hint=region)
        np.testing.assert_array_equal(replay.get_array(aid, slice_hint=region), want)  # recorded
        before = _flight_calls(ours)
        for _ in range(2):
            np.testing.assert_array_equal(replay.get_array(aid, slice_hint=region), want)
        after = _flight_calls(ours)
        assert {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)} == {
            "DoAction": 1,
            "action:server_stats": 1,
        }, "replayed: the server was asked nothing but the stats (no plan, no location, no DoGet)"


def _flight_calls(client) -> dict[str, int]:
    stats = json.loads(list(client._client.do_action(flight.Action("server_stats", b"")))[0].body.to_pybytes())
    return stats["calls"]["flight"]
