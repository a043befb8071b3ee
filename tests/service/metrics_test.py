"""The metrics: a scrape before and after a known sequence moves each counter by exactly what
the sequence implies; labels stay bounded under ids and paths a client makes up; the
listener's bind rule; the request id a client's error names is the request log's; the
decode_rates table the SDK reads is filled by full-resolution decodes."""

from __future__ import annotations

import json
import logging
import re
import urllib.request

import numpy as np
import pyarrow.flight as flight
import pytest
from biopb.tensor import ticket_pb2
from prometheus_client.parser import text_string_to_metric_families

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.cache import CacheManager
from tensor_server.catalog import Catalog
from tensor_server.config import Settings
from tensor_server.errors import InvalidArgument
from tensor_server.http.metrics_door import MetricsDoor
from tensor_server.service import IN_PROCESS, Caller, ServingRuntime
from tensor_server.service.request_log import ACCESS_LOG, REQUEST_LINES
from tensor_server.testing import serving

SHAPE, CHUNK = (128, 128), (64, 64)


@pytest.fixture
def catalog():
    cat = Catalog([])
    rng = np.random.default_rng(3)
    cat.add_source(
        MemorySource(
            ArrayAdapter(rng.integers(0, 60000, SHAPE, dtype=np.uint16), "yx", chunk_shape=CHUNK), source_id="img"
        )
    )
    cat.first_scan_done.set()
    cat.decode_rates_refresh = 0.0  # publish every sample (the default debounces a snapshot rewrite)
    yield cat
    cat.close()


@pytest.fixture
def served(catalog, tmp_path):
    with (
        CacheManager(tmp_path / "cache") as cache,
        serving(
            catalog,
            cache=cache,
            http=True,
            metrics_port=0,
            precache_bytes=0,
            write_dir=str(tmp_path / "w"),
            writable=True,
        ) as srv,
    ):
        yield srv


def scrape(srv, token=None) -> dict[tuple[str, frozenset], float]:
    request = urllib.request.Request(srv.metrics_url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def moved(before, after, name, **labels) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def chunk_tickets(runtime, scale=None, method=""):
    described = runtime.describe(IN_PROCESS, "img", scale=scale, method=method, fields=["endpoints"])
    return [
        flight.Ticket(ticket_pb2.TensorTicket(chunk_id=c.chunk_id.encode()).SerializeToString())
        for c in described.plan.chunks
    ]


def test_each_counter_moves_by_what_the_sequence_implies(served):
    client = flight.FlightClient(served.location)
    tickets = chunk_tickets(served.runtime)  # 4 full-resolution chunks
    assert len(tickets) == 4
    before = scrape(served)
    for t in tickets:  # 4 misses: decoded from the source ("direct")
        client.do_get(t).read_all()
    for t in tickets[:3]:  # 3 hits
        client.do_get(t).read_all()
    with pytest.raises(flight.FlightError):  # a stale / garbage ticket: INVALID_ARGUMENT
        client.do_get(flight.Ticket(ticket_pb2.TensorTicket(chunk_id=b"garbage").SerializeToString())).read_all()
    [scaled] = chunk_tickets(served.runtime, scale=[2, 2], method="area")  # from the 4 cached chunks
    client.do_get(scaled).read_all()
    after = scrape(served)

    assert moved(before, after, "tensor_server_requests_total", door="flight", call="DoGet", code="OK") == 8
    assert (
        moved(before, after, "tensor_server_requests_total", door="flight", call="DoGet", code="INVALID_ARGUMENT") == 1
    )
    assert moved(before, after, "tensor_server_request_seconds_count", door="flight", call="DoGet") == 9
    assert moved(before, after, "tensor_server_verb_calls_total", verb="chunk", code="OK") == 8
    assert moved(before, after, "tensor_server_verb_calls_total", verb="chunk", code="INVALID_ARGUMENT") == 1
    assert moved(before, after, "tensor_server_reads_total", path="direct") == 4
    assert moved(before, after, "tensor_server_reads_total", path="cache") == 3
    assert moved(before, after, "tensor_server_reads_total", path="cache_sourced") == 1
    assert moved(before, after, "tensor_server_read_bytes_total", path="direct") == 4 * 64 * 64 * 2
    assert moved(before, after, "tensor_server_decode_bytes_total", format="memory") == 4 * 64 * 64 * 2
    assert moved(before, after, "tensor_server_decode_seconds_total", format="memory") > 0
    assert moved(before, after, "tensor_server_cache_misses_total") == 5  # 4 + the scaled chunk
    hits = sum(moved(before, after, "tensor_server_cache_hits_total", tier=t) for t in ("memory", "file", "uniform"))
    assert hits == 3 + 4  # the 3 repeated reads, and the scaled read's 4 source units
    assert after[("tensor_server_catalog_sources", frozenset())] == 2  # img and the scratch source


def test_uploads_and_actions_count_what_they_did(served):
    sdk = served.client()
    before = scrape(served)
    arr = np.arange(32 * 48, dtype=np.uint16).reshape(32, 48)
    desc = sdk.setup_array_upload("zarr://scratch/@fields/metrics-up", arr, chunk_shape=(16, 24))
    during = scrape(served)
    status = sdk.upload_array(desc, arr)
    after = scrape(served)
    sdk.close()
    puts = status["uploaded_chunks"]  # the write plan's chunks, one DoPut each
    assert puts >= 1

    assert during[("tensor_server_uploads_pending", frozenset())] == 1
    assert after[("tensor_server_uploads_pending", frozenset())] == 0
    assert moved(before, after, "tensor_server_upload_bytes_total") == arr.nbytes
    assert moved(before, after, "tensor_server_verb_calls_total", verb="put_chunk", code="OK") == puts
    assert moved(before, after, "tensor_server_requests_total", door="flight", call="DoPut", code="OK") == puts
    assert moved(before, after, "tensor_server_verb_calls_total", verb="action:add_tensor", code="OK") == 1
    assert moved(before, after, "tensor_server_verb_calls_total", verb="action:set_upload_status", code="OK") == 1


def test_calls_and_refusals_are_one_record_the_scrape_and_server_stats_read(served):
    import httpx

    client = flight.FlightClient(served.location)
    tickets = chunk_tickets(served.runtime)
    before = scrape(served)
    for t in tickets:
        client.do_get(t).read_all()
    list(client.do_action(flight.Action("health", b"")))
    with pytest.raises(flight.FlightError):
        list(client.do_action(flight.Action("no_such_action", b"")))
    with httpx.Client(base_url=served.http_url) as http:
        assert http.get("/zarr/img/0/.zarray", headers={"Host": "evil.example"}).status_code == 403
        assert http.get("/zarr/img/0/.zarray", headers={"Origin": "http://evil.example"}).status_code == 403
        assert http.get("/zarr/img/0/0.0").status_code == 200
    after = scrape(served)

    assert moved(before, after, "tensor_server_actions_total", door="flight", action="health", code="OK") == 1
    assert (
        moved(before, after, "tensor_server_actions_total", door="flight", action="unknown", code="UNIMPLEMENTED") == 1
    )
    assert moved(before, after, "tensor_server_refusals_total", door="http", kind="bad_host") == 1
    assert moved(before, after, "tensor_server_refusals_total", door="http", kind="cross_origin") == 1
    assert (
        moved(
            before, after, "tensor_server_requests_total", door="http", call="zarr_metadata", code="PERMISSION_DENIED"
        )
        == 2
    )
    calls, stats = served.runtime.metrics.calls(), served.runtime.server_stats()
    assert calls["flight"]["DoGet"] == len(tickets) and calls["http"]["zarr_chunk"] == 1
    assert calls["flight"]["action:health"] == 1 and calls["flight"]["action:unknown"] == 1
    assert served.runtime.metrics.refusals() == {"http": {"bad_host": 1, "cross_origin": 1}}
    assert stats["refusals"] == {"http": {"bad_host": 1, "cross_origin": 1}}

    def scraped(door, call):  # summed over outcomes
        family, label = ("actions", "action") if call.startswith("action:") else ("requests", "call")
        want = {("door", door), (label, call.removeprefix("action:"))}
        return sum(
            v for (name, labels), v in after.items() if name == f"tensor_server_{family}_total" and want <= labels
        )

    assert stats["calls"] == {
        door: {call: scraped(door, call) for call in calls} for door, calls in stats["calls"].items()
    }


def test_metrics_off_still_counts_calls_actions_and_refusals(catalog):
    import httpx

    with serving(catalog, http=True) as srv:
        client = flight.FlightClient(srv.location)
        tickets = chunk_tickets(srv.runtime)
        for t in tickets:
            client.do_get(t).read_all()
        list(srv.runtime.do_action("health", b"", Caller()))  # in-process: no door
        with httpx.Client(base_url=srv.http_url) as http:
            assert http.get("/healthz", headers={"Host": "evil.example"}).status_code == 403
        assert srv.runtime.metrics.registry is None
        stats = srv.runtime.server_stats()
    assert stats["calls"]["flight"] == {"DoGet": len(tickets)}
    assert stats["calls"]["in-process"] == {"action:health": 1}
    assert stats["calls"]["http"] == {"healthz": 1}
    assert stats["refusals"] == {"http": {"bad_host": 1}}


def test_labels_stay_bounded_under_made_up_ids_and_paths(served):
    import httpx

    client = flight.FlightClient(served.location)
    rng = np.random.default_rng(0)
    made_up = [f"src{rng.integers(1 << 30)}/{'x' * int(rng.integers(1, 40))}" for _ in range(40)]
    with httpx.Client(base_url=served.http_url) as http:
        for i, name in enumerate(made_up):
            http.get(f"/zarr/{name}/0/.zarray")
            http.get(f"/zarr3/{name}/c/{i}/0")
            http.get(f"/{name}/{i}")
            with pytest.raises(flight.FlightError):
                list(client.do_action(flight.Action(name, b"")))
            with pytest.raises(flight.FlightError):
                client.do_get(flight.Ticket(ticket_pb2.TensorTicket(chunk_id=name.encode()).SerializeToString()))
    samples = scrape(served)
    for name, labels in samples:
        for key, value in labels:
            assert not any(m in value for m in made_up), (name, key, value)
    calls = {
        dict(labels)["call"]
        for name, labels in samples
        if name == "tensor_server_requests_total" and dict(labels)["door"] == "http"
    }
    assert calls == {"zarr_metadata", "zarr_chunk", "other"}
    verbs = {dict(labels)["verb"] for name, labels in samples if name == "tensor_server_verb_calls_total"}
    assert "action:unknown" in verbs and len(verbs) <= 4


def test_a_clients_error_names_the_request_the_log_holds(served, caplog):
    import httpx

    caplog.set_level(logging.INFO, logger=ACCESS_LOG.name)
    with httpx.Client(base_url=served.http_url) as http:
        resp = http.get("/zarr/nosuch/0/.zarray")
    rid = resp.headers["x-request-id"]
    assert resp.status_code == 404 and resp.text.endswith(f"[request {rid}]")
    client = flight.FlightClient(served.location)
    with pytest.raises(flight.FlightError) as err:
        list(client.do_action(flight.Action("no_such_action", b"")))
    flight_id = re.search(r"\[request ([0-9a-f]+-[0-9a-f]+)\]", str(err.value)).group(1)
    REQUEST_LINES.flush()  # the lines leave the request path on a thread of their own
    lines = [r for r in caplog.records if r.name == ACCESS_LOG.name]
    by_id = {r.request["request_id"]: r.request for r in lines}
    assert by_id[rid]["code"] == "NOT_FOUND" and by_id[rid]["status"] == 404 and by_id[rid]["door"] == "http"
    assert by_id[flight_id]["code"] == "UNIMPLEMENTED" and by_id[flight_id]["call"] == "DoAction"


def test_the_decode_rates_table_is_filled_by_full_resolution_decodes(served):
    client = flight.FlightClient(served.location)
    for t in chunk_tickets(served.runtime):
        client.do_get(t).read_all()
        client.do_get(t).read_all()  # a hit: not a sample
    [scaled] = chunk_tickets(served.runtime, scale=[2, 2], method="area")
    client.do_get(scaled).read_all()  # scaled: not a sample
    sdk = served.client()
    rows = sdk.query(
        "SELECT array_id, mbps, samples, updated_at FROM decode_rates ORDER BY mbps DESC", format="records"
    )
    sdk.close()
    assert [(r["array_id"], r["samples"]) for r in rows] == [("img", 4)]
    assert rows[0]["mbps"] > 0 and rows[0]["updated_at"] is not None


def test_a_stored_levels_decodes_are_its_tensors_rows(tmp_path):
    """A read of a stored pyramid level (an OME-Zarr's ``1``) is sampled under the id the
    client read, never an empty one (a level's own tensor carries no id)."""
    import zarr
    from ome_zarr.format import FormatV04
    from ome_zarr.writer import write_image

    img = np.random.default_rng(5).integers(0, 4000, (128, 96), dtype=np.uint16)
    write_image(
        img,
        zarr.open_group(str(tmp_path / "root" / "pyr.zarr"), mode="w", zarr_format=2),
        scale_factors=[2, 4],
        scaler=None,
        axes="yx",
        fmt=FormatV04(),
        storage_options={"chunks": (32, 32)},
    )
    cat = Catalog([tmp_path / "root"])
    cat.scan()
    cat.decode_rates_refresh = 0.0
    try:
        [rec] = cat.records()
        tensor = rec.source.tensor()
        assert [lv.scale for lv in tensor.native_levels] == [(2, 2), (4, 4)]
        with CacheManager(tmp_path / "cache") as cache, serving(cat, cache=cache, precache_bytes=0) as srv:
            sdk = srv.client()
            got = sdk.get_array(tensor.array_id, scale_hint=[2, 2], reduction_method="precompute")
            np.testing.assert_array_equal(got, tensor.native_levels[0].tensor.get_data())
            rows = sdk.query("SELECT array_id, samples FROM decode_rates", format="records")
            sdk.close()
        assert [r["array_id"] for r in rows] == [tensor.array_id] and rows[0]["samples"] >= 1
    finally:
        cat.close()


def test_the_listener_refuses_off_loopback_without_a_token(catalog):
    runtime = ServingRuntime(catalog, Settings(metrics_port=0, metrics_host="0.0.0.0"))
    try:
        with pytest.raises(InvalidArgument, match="non-loopback address needs --token"):
            MetricsDoor(runtime)
    finally:
        runtime.close()


def test_with_a_token_every_scrape_presents_it(catalog):
    with serving(catalog, token="s3cret", metrics_port=0) as srv:
        with pytest.raises(urllib.error.HTTPError) as err:
            scrape(srv)
        assert err.value.code == 401
        assert ("tensor_server_catalog_sources", frozenset()) in scrape(srv, token="s3cret")


def test_metrics_off_builds_no_instruments_but_still_times(catalog):
    with serving(catalog) as srv:
        assert srv.runtime.metrics.registry is None and srv.metrics is None
        srv.runtime.chunk(
            srv.runtime.describe(IN_PROCESS, "img", fields=["endpoints"]).plan.chunks[0].chunk_id, Caller()
        )
        assert catalog.decode_rates.snapshot()["img"][1] == 1


def _start(cmd, env, until, timeout=90):
    """A server process and its stderr lines up to the one containing ``until``."""
    import subprocess
    import time

    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if until in line:
            break
    return proc, lines


def test_serve_with_metrics_port_and_json_request_log(tmp_path):
    import os
    import subprocess
    import sys

    import httpx

    np.save(tmp_path / "a.npy", np.arange(64 * 64, dtype=np.uint16).reshape(64, 64))
    env = {**os.environ, "TENSOR_SERVER_HOME": str(tmp_path / "home")}
    cmd = [
        sys.executable,
        "-m",
        "tensor_server",
        "serve",
        str(tmp_path / "a.npy"),
        "--port",
        "0",
        "--http-port",
        "0",
        "--metrics-port",
        "0",
        "--log-format",
        "json",
        "--no-http-token",
    ]
    proc, lines = _start(cmd, env, "scan done")
    try:
        text = "".join(lines)
        metrics_url = re.search(r"Prometheus metrics at (\S+)", text).group(1)
        http_url = re.search(r"OME-Zarr over HTTP at (http://[\d.:]+)", text).group(1)
        from tensor_server.core.identity import source_id_for_path

        resp = httpx.get(f"{http_url}/zarr/{source_id_for_path(tmp_path / 'a.npy')}/0/.zarray", timeout=10)
        assert resp.status_code == 200
        rid = resp.headers["x-request-id"]
        while True:  # the request's log line, as JSON, naming the same id
            line = proc.stderr.readline()
            assert line, "the server ended without logging the request"
            if line.startswith("{") and rid in line:
                break
        record = json.loads(line)
        assert record["logger"] == "tensor_server.access" and record["request_id"] == rid
        assert record["door"] == "http" and record["call"] == "zarr_metadata" and record["status"] == 200
        samples = {
            (s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(httpx.get(metrics_url, timeout=10).text)
            for s in f.samples
        }
        key = (
            "tensor_server_requests_total",
            frozenset({"door": "http", "call": "zarr_metadata", "code": "OK"}.items()),
        )
        assert samples[key] == 1
        assert samples[("process_open_fds", frozenset())] > 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stderr.close()
    assert (
        subprocess.run(
            cmd[:-2] + ["--config", str(_public_metrics_config(tmp_path))],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        ).returncode
        == 2
    )


def _public_metrics_config(tmp_path):
    cfg = tmp_path / "public-metrics.toml"
    cfg.write_text('[metrics]\nhost = "0.0.0.0"\n')
    return cfg


def test_every_metric_the_dashboard_queries_is_exposed(catalog, tmp_path):
    from pathlib import Path

    dashboard = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queried = {
        re.sub(r"_(bucket|total)$", "", name)
        for e in exprs
        for name in re.findall(r"\b((?:tensor_server|process)_[a-z_]+)", e)
    }
    with (
        CacheManager(tmp_path / "cache") as cache,
        serving(
            catalog,
            cache=cache,
            metrics_port=0,  # precache on
            write_dir=str(tmp_path / "w"),
            writable=True,
        ) as srv,
    ):
        flight.FlightClient(srv.location).do_get(chunk_tickets(srv.runtime)[0]).read_all()
        with urllib.request.urlopen(srv.metrics_url, timeout=10) as resp:
            exposed = {f.name for f in text_string_to_metric_families(resp.read().decode())}
    assert queried and queried <= exposed, sorted(queried - exposed)


class _Held(ArrayAdapter):
    """Each read waits for ``gate``: computations hold their admission slot until then."""

    def __init__(self, *a, **kw):
        import threading

        super().__init__(*a, **kw)
        self.gate = threading.Event()

    def read_region(self, bounds):
        self.gate.wait(30)
        return super().read_region(bounds)


def test_the_admission_queue_shows_who_waits_and_who_is_refused():
    import concurrent.futures
    import time

    from tensor_server.errors import Overloaded

    cat = Catalog([])
    held = _Held(np.zeros((64, 64), np.uint16), chunk_shape=(16, 64))
    cat.add_source(MemorySource(held, source_id="held"))
    cat.first_scan_done.set()
    try:
        with serving(cat, metrics_port=0, max_computes=1, admission_timeout=30.0, precache_bytes=0) as srv:
            rt = srv.runtime
            cids = [c.chunk_id for c in rt.describe(IN_PROCESS, "held", fields=["endpoints"]).plan.chunks]
            with concurrent.futures.ThreadPoolExecutor(3) as pool:
                futures = [pool.submit(rt.chunk, cid, Caller()) for cid in cids[:3]]
                deadline = time.monotonic() + 30
                while rt.engine.admission["waiting"] < 2 and time.monotonic() < deadline:
                    time.sleep(0.01)  # a wait for a state, not a timing assertion
                waiting = scrape(srv)
                rt.engine.admission_timeout = 0.0  # the next one to find the slot taken is refused
                with pytest.raises(Overloaded):
                    rt.chunk(cids[3], Caller())
                held.gate.set()
                assert all(f.result()[1].shape == (16, 64) for f in futures)
            after = scrape(srv)
    finally:
        cat.close()
    assert waiting[("tensor_server_admission_waiting", frozenset())] == 2
    assert waiting[("tensor_server_admission_slots", frozenset())] == 1
    assert after[("tensor_server_admission_waiting", frozenset())] == 0
    assert after[("tensor_server_admission_waits_total", frozenset())] == 3
    assert after[("tensor_server_admission_refused_total", frozenset())] == 1
    assert after[("tensor_server_verb_calls_total", frozenset({"verb": "chunk", "code": "UNAVAILABLE"}.items()))] == 1


def test_a_query_the_client_left_counts_as_cancelled(served):
    from tensor_server.catalog.sql import CatalogQueryError

    with pytest.raises(CatalogQueryError, match="cancelled"):
        served.runtime.query("SELECT count(*) FROM range(1000000000000000)", Caller(), lambda: True)
    samples = scrape(served)
    assert samples[("tensor_server_verb_calls_total", frozenset({"verb": "query", "code": "CANCELLED"}.items()))] == 1


def test_decode_rates_outlive_the_server_in_the_annotation_file(tmp_path):
    db = str(tmp_path / "annotations.duckdb")
    first = Catalog([], rois_path=db)
    first.decode_rates.record("img", 4 << 20, (4 << 20) / 1e6 / 800.0)  # 800 MB/s
    first.decode_rates.record("img", 4 << 20, (4 << 20) / 1e6 / 800.0)
    assert first.rois.load_decode_rates() == {}  # not written per sample
    measured_at = first.decode_rates.table().column("updated_at")[0].as_py()
    first.close()  # written at close

    second = Catalog([], rois_path=db)
    try:
        second.decode_rates.record("other", 1 << 20, (1 << 20) / 1e6 / 100.0)  # a live sample first
        assert second.decode_rates.rate("img") == pytest.approx(800.0)
        assert second.decode_rates.snapshot() == {"img": (pytest.approx(800.0), 2), "other": (pytest.approx(100.0), 1)}
        second.decode_rates._next_flush = 0.0  # as if FLUSH_SECONDS had passed: the next sample writes through
        second.decode_rates.record("other", 1 << 20, (1 << 20) / 1e6 / 100.0)
        stored = second.rois.load_decode_rates()
        assert {k: v[1] for k, v in stored.items()} == {"img": 2, "other": 2}
        # a row keeps when it was measured across the restart (what the SDK's Updated shows)
        kept = second.decode_rates.table().to_pydict()
        assert abs(kept["updated_at"][kept["array_id"].index("img")] - measured_at).total_seconds() < 1e-3
        assert stored["other"][2] > stored["img"][2]
    finally:
        second.close()


def test_discovery_counts_what_the_scan_walked_opened_and_skipped(tmp_path):
    import os

    import tifffile

    root = tmp_path / "root"
    for sub in ("a", "b/c"):
        (root / sub).mkdir(parents=True)
        tifffile.imwrite(root / sub / "img.tif", np.arange(64, dtype=np.uint8).reshape(8, 8))
        (root / sub / "README.txt").write_text("not a source")
    (root / "a" / "broken.tif").write_bytes(b"II*\x00" + b"\x00" * 12)  # a TIFF header, no IFD
    os.mkfifo(root / "b" / "pipe.tif")  # never opened: skipped
    cat = Catalog([str(root)])
    cat.scan()
    try:
        with serving(cat, metrics_port=0) as srv:
            after = scrape(srv)
        counts = {
            dict(labels)["kind"]: value for (name, labels), value in after.items() if name == "tensor_server_discovery"
        }
        assert counts == {
            "folders_walked": 4,
            "files_seen": 3,
            "files_unchanged": 0,
            "files_opened": 2,
            "files_failed": 1,
            "pending_open": 0,
            "skipped": 1,
        }
        finished = after[("tensor_server_discovery_last_scan_finished_timestamp_seconds", frozenset())]
        assert finished == cat.last_scan_finished_at
    finally:
        cat.close()
