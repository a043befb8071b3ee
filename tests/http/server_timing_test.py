"""Server-Timing on every HTTP response: it parses, names every part, and its parts add up
to no more than the request took (values, not speed); the route class a path is counted
under is bounded and follows the path's shape alone."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.cache import CacheManager
from tensor_server.catalog import Catalog
from tensor_server.http.app import route_class
from tensor_server.service.metrics import CALLS
from tensor_server.testing import serving


@pytest.fixture
def served(tmp_path):
    cat = Catalog([])
    data = np.random.default_rng(3).integers(0, 60000, (128, 128), dtype=np.uint16)
    cat.add_source(MemorySource(ArrayAdapter(data, "yx", chunk_shape=(64, 64)), source_id="img"))
    cat.first_scan_done.set()
    from tensor_server.http.security import HttpSecurity

    viewer = HttpSecurity.build(cors_origins=["http://viewer"])  # the page whose fetches read the timing
    with (
        CacheManager(tmp_path / "cache") as cache,
        serving(cat, cache=cache, http=True, http_security=viewer, precache_bytes=0, plane_budget_px=64 * 64) as srv,
    ):
        yield srv
    cat.close()


def parse_server_timing(header: str) -> dict[str, float]:
    parts = {}
    for item in header.split(","):
        name, _, dur = item.strip().partition(";dur=")
        parts[name] = float(dur)
    return parts


def test_server_timing_parses_and_its_parts_fit_in_the_request(served):
    with httpx.Client(base_url=served.http_url) as http:
        for key in ("0/.zarray", "0/0.0", "0/0.0", "1/0.0", "nope/0.0"):
            t0 = time.perf_counter()
            resp = http.get(f"/zarr/img/{key}")
            elapsed_ms = (time.perf_counter() - t0) * 1e3
            parts = parse_server_timing(resp.headers["server-timing"])
            assert set(parts) == {"lookup", "cache", "decode", "reduce", "encode", "total"}
            assert all(v >= 0 for v in parts.values())
            assert sum(v for k, v in parts.items() if k != "total") <= parts["total"] + 0.01
            assert parts["total"] <= elapsed_ms
            assert parts["lookup"] > 0
            if key == "0/0.0":
                assert resp.status_code == 200 and parts["encode"] > 0
            assert resp.headers["x-request-id"]
    stats = served.runtime.server_stats()["server_timing"]["http"]
    assert stats["requests"] == 5 and stats["lookup"] > 0 and stats["decode"] > 0
    assert sum(stats[p] for p in ("lookup", "cache", "decode", "reduce", "encode")) <= stats["seconds"]


def test_every_response_carries_it_errors_and_cors_preflights_too(served):
    with httpx.Client(base_url=served.http_url) as http:
        for resp in (
            http.get("/healthz"),
            http.get("/nowhere"),
            http.get("/zarr/nosuch/0/0.0"),
            http.options(
                "/zarr/img/0/0.0", headers={"Origin": "http://viewer", "Access-Control-Request-Method": "GET"}
            ),
        ):
            parts = parse_server_timing(resp.headers["server-timing"])
            assert parts["total"] >= sum(v for k, v in parts.items() if k != "total") - 0.01
            assert resp.headers["timing-allow-origin"] == "*"
        cors = http.get("/zarr/img/0/.zarray", headers={"Origin": "http://viewer"})
        exposed = {h.strip().lower() for h in cors.headers["access-control-expose-headers"].split(",")}
        assert {"server-timing", "x-request-id"} <= exposed


def test_a_clients_request_id_is_kept_when_valid(served):
    with httpx.Client(base_url=served.http_url) as http:
        assert http.get("/healthz", headers={"X-Request-Id": "trace-42.a"}).headers["x-request-id"] == "trace-42.a"
        made = http.get("/healthz", headers={"X-Request-Id": "no spaces or ../ please"}).headers["x-request-id"]
        assert made != "no spaces or ../ please" and " " not in made


@pytest.mark.parametrize(
    "path, cls",
    [
        ("/zarr/img/", "zarr_index"),
        ("/zarr/img/.zattrs", "zarr_metadata"),
        ("/zarr/img/0/.zarray", "zarr_metadata"),
        ("/zarr3/a/b/zarr.json", "zarr_metadata"),
        ("/zarr/img/0/3.4", "zarr_chunk"),
        ("/zarr3/img/0/c/3/4", "zarr_chunk"),
        ("/zarr/img/labels/cells/0/1.2", "zarr_chunk"),
        ("/zarr/img/0/x.y", "zarr_other"),
        ("/healthz", "healthz"),
        ("/iiif/3/img/info.json", "iiif_info"),
        ("/iiif/3/img/full/max/0/default.jpg", "iiif_image"),
        ("/iiif/../../etc/passwd", "iiif_image"),
        ("/deepzoom/img.dzi", "dzi"),
        ("/deepzoom/img_files/9/0_1.jpg", "dzi_tile"),
        ("/", "catalog_page"),
        ("/view/img", "viewer_page"),
        ("/assets/openseadragon/openseadragon.min.js", "viewer_assets"),
        ("/" + "z" * 5000, "other"),
        ("/t", "other"),
    ],
)
def test_route_classes_follow_the_path_shape(path, cls):
    assert route_class(path) == cls and cls in CALLS["http"]


def test_the_token_in_a_path_reaches_neither_the_label_nor_the_log(tmp_path, caplog):
    """``/t/<token>/...``: the route class is the path's without the prefix, and the request
    log's target never holds the token."""
    import logging

    from prometheus_client.parser import text_string_to_metric_families

    from tensor_server.http.security import HttpSecurity
    from tensor_server.service.request_log import ACCESS_LOG, REQUEST_LINES

    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(np.zeros((64, 64), np.uint8), "yx"), source_id="img"))
    cat.first_scan_done.set()
    token = "s3cret-token-xyz"
    with (
        serving(cat, http=True, http_security=HttpSecurity.build(tokens=[token]), metrics_port=0) as srv,
        caplog.at_level(logging.INFO, logger=ACCESS_LOG.name),
    ):
        assert httpx.get(f"{srv.http_url}/zarr/img/0/.zarray").status_code == 401
        assert httpx.get(f"{srv.http_url}/t/{token}/zarr/img/0/.zarray").status_code == 200
        samples = {
            (s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(httpx.get(srv.metrics_url).text)
            for s in f.samples
        }
    cat.close()
    ok = ("tensor_server_requests_total", frozenset({"door": "http", "call": "zarr_metadata", "code": "OK"}.items()))
    assert samples[ok] == 1
    REQUEST_LINES.flush()  # the lines leave the request path on a thread of their own
    lines = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOG.name]
    assert sum("/zarr/img/0/.zarray" in line for line in lines) == 2, lines
    assert not any(token in line for line in lines), lines
