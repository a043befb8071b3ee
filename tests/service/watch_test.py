"""The watch rule (service/watch.py) through both doors: the Flight action ``watch`` and the
HTTP Server-Sent Events at ``/watch/<array_id>`` report every growth of a tensor a writer
process appends to, in order and without a gap in ``sequence``, resume from a sequence, and
stop being polled once their client goes. No timing decides a result."""

from __future__ import annotations

import json
import threading
import time

import httpx
import numpy as np
import pyarrow.flight as flight
import pytest

from tensor_server.service.watch import watch_request
from tests.service.live_growth_test import PATIENCE, frame, live_server, writer


def flight_watch(served, body: dict, deadline: float | None = None):
    """A watch call; ``deadline``: seconds before the call fails (a stream that would wait
    for a record forever)."""
    client = flight.FlightClient(served.location)
    options = flight.FlightCallOptions(timeout=deadline)
    return client, client.do_action(flight.Action("watch", json.dumps(body).encode()), options=options)


def leave(client, results) -> None:
    """The client goes: its call is cancelled (closing the stream), then the connection."""
    results.close()
    client.close()


def records_until(results, frames: int) -> list[dict]:
    """Watch records until one reports ``frames`` along T (or the server stops sending)."""
    out = []
    for result in results:
        out.append(json.loads(result.body.to_pybytes()))
        if out[-1]["shape"][0] >= frames:
            break
    return out


def assert_in_order_without_gaps(records: list[dict], first: int) -> None:
    sequences = [r["sequence"] for r in records]
    assert sequences == list(range(first, first + len(records))), sequences
    extents = [r["shape"][0] for r in records]
    assert extents == sorted(set(extents)), f"every record is a growth: {extents}"


def test_the_flight_watch_reports_every_growth_in_order_and_resumes(tmp_path):
    with live_server(tmp_path, 3) as (served, array_id, path):
        client, results = flight_watch(served, {"array_id": array_id})
        proc = writer(path, 2, 12, pause=0.01)
        records = records_until(results, 12)
        leave(client, results)
        assert proc.wait(PATIENCE) == 0
        assert records[0] == {"array_id": array_id, "shape": [2, 32, 32], "sequence": 0}, "the current extent first"
        assert records[-1]["shape"] == [12, 32, 32]
        assert_in_order_without_gaps(records, 0)
        last = records[-1]["sequence"]
        for record in records:  # each extent reported is served: its newest frame reads back
            t = record["shape"][0]
            got = served.client().get_array(array_id, (slice(t - 1, t), slice(None), slice(None)))[0]
            np.testing.assert_array_equal(got, frame(t - 1))
        again, resumed = flight_watch(served, {"array_id": array_id, "since": 1})
        replay = records_until(resumed, 12)
        leave(again, resumed)
        assert replay == records[2:] and replay[-1]["sequence"] == last, "resumed after sequence 1"


def test_the_server_sent_events_report_every_growth_in_order(tmp_path):
    with live_server(tmp_path, 2) as (served, array_id, path):
        records: list[dict] = []
        done = threading.Event()

        def listen() -> None:
            with httpx.stream("GET", f"{served.http_url}/watch/{array_id}", timeout=PATIENCE) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                event: dict[str, str] = {}
                for line in r.iter_lines():
                    if line:
                        key, _, value = line.partition(": ")
                        event[key] = value
                        continue
                    if "data" in event:
                        record = json.loads(event["data"])
                        assert int(event["id"]) == record["sequence"] and event["event"] == "extent"
                        records.append(record)
                        if record["shape"][0] >= 8:
                            break
                    event = {}
            done.set()

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        deadline = time.monotonic() + PATIENCE
        while not records and time.monotonic() < deadline:  # subscribed before the writer starts
            time.sleep(0.01)
        assert writer(path, 2, 8, pause=0.01).wait(PATIENCE) == 0
        assert done.wait(PATIENCE), "the stream reported the final extent"
        assert records[0]["sequence"] == 0 and records[-1]["shape"] == [8, 32, 32]
        assert_in_order_without_gaps(records, 0)
        resumed = httpx.get(f"{served.http_url}/watch/{array_id}?since=x")
        assert resumed.status_code == 400 and "sequence number" in resumed.text


def test_a_watch_ends_when_its_client_goes(tmp_path):
    with live_server(tmp_path, 3) as (served, array_id, path):
        client, results = flight_watch(served, {"array_id": array_id})
        assert json.loads(next(iter(results)).body.to_pybytes())["sequence"] == 0
        watches = served.runtime.watches
        assert watches._watched[array_id] == 1
        leave(client, results)
        deadline = time.monotonic() + PATIENCE
        while array_id in watches._watched and time.monotonic() < deadline:
            time.sleep(0.05)
        assert array_id not in watches._watched, "no longer polled once the client went"


def test_an_unknown_tensor_or_a_bad_body_is_refused_before_streaming(tmp_path):
    with live_server(tmp_path, 3) as (served, array_id, path):
        client, results = flight_watch(served, {"array_id": "no-such-array"})
        with pytest.raises(flight.FlightError, match="no-such-array"):
            list(results)
        client.close()
        assert httpx.get(f"{served.http_url}/watch/no-such-array").status_code == 404
    for body, why in [(b"", "watch takes"), (b'{"array_id": "a", "since": -1}', "non-negative")]:
        with pytest.raises(Exception, match=why):
            watch_request(body)
    assert watch_request(b'{"array_id": "a", "since": 3}') == ("a", 3)


@pytest.mark.parametrize("events", [True, False])
def test_growth_is_seen_from_file_system_events_or_by_polling_without_them(tmp_path, monkeypatch, events):
    """With events, the fallback look is an hour away, so every record the writer's growth
    makes came from an event; without watchfiles (or a failed watcher), the tick polls."""
    from tensor_server.service import watch

    pytest.importorskip("watchfiles") if events else monkeypatch.setattr(watch, "watchfiles", None)
    monkeypatch.setattr(watch, "FALLBACK_TICK", 3600.0)
    with live_server(tmp_path, 3) as (served, array_id, path):
        client, results = flight_watch(served, {"array_id": array_id}, deadline=PATIENCE)
        assert served.runtime.watches._events is events
        proc = writer(path, 2, 8, pause=0.01)
        records = records_until(results, 8)
        leave(client, results)
        assert proc.wait(PATIENCE) == 0
        assert records[-1]["shape"] == [8, 32, 32]
        assert_in_order_without_gaps(records, 0)
        assert served.runtime.watches._events is events, "the event watcher never failed over to polling"


def test_the_event_watcher_begins_again_when_a_watched_tensor_is_replaced(tmp_path, monkeypatch):
    """A source reopened under a watch (a file replaced by a new acquisition under its name,
    an inode the old inotify watch does not see, and which the old watch may never report
    gone while a handle holds it open) restarts the event watcher over the new tensor's
    paths. ``watchfiles.watch`` is replaced by one that reports nothing and ends only on its
    stop event, so nothing but the replacement can restart it."""
    from tensor_server.service import watch

    pytest.importorskip("watchfiles")
    began = []

    def silent(*paths, stop_event, **_):
        began.append(paths)
        while not stop_event.is_set():
            time.sleep(0.005)
        return
        yield  # a generator, as watchfiles.watch is

    monkeypatch.setattr(watch.watchfiles, "watch", silent)
    with live_server(tmp_path, 3) as (served, array_id, path):
        client, results = flight_watch(served, {"array_id": array_id}, deadline=PATIENCE)
        assert json.loads(next(iter(results)).body.to_pybytes())["sequence"] == 0
        deadline = time.monotonic() + PATIENCE
        while not began and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(began) == 1
        catalog = served.runtime.catalog
        catalog.reopen_changed(catalog.find_tensor(array_id)[0], "replaced (test)")
        while len(began) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        leave(client, results)
        assert len(began) >= 2, "the watcher began again over the reopened tensor's paths"
        assert began[1] == began[0]
