"""The ``warm`` action through Flight: a region's plan (or a plan's chunk ids) lands in the chunk
cache with no pixels sent, so the SDK's read of it that follows computes nothing; each bad
body and each caller without the tensor's read is refused by name."""

from __future__ import annotations

import base64
import json

import numpy as np
import pyarrow.flight as flight
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.cache import CacheManager
from tensor_server.catalog import Catalog
from tensor_server.core import plan_read
from tensor_server.core.bounds import Bounds
from tensor_server.service import warm_verb
from tensor_server.testing import serving

IMAGE = np.random.default_rng(3).integers(0, 60000, (256, 192), dtype=np.uint16)
TOKEN = "warm-token-0123456789"


@pytest.fixture
def served(tmp_path):
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(IMAGE, "yx", chunk_shape=(64, 64)), source_id="img"))
    cat.first_scan_done.set()
    cache = CacheManager(tmp_path / "cache")
    with serving(cat, cache=cache, token=TOKEN, precache_bytes=0) as srv:  # misses are the reads' alone
        yield srv
    cache.close()
    cat.close()


def _options(token: str | None = TOKEN) -> flight.FlightCallOptions:
    return flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())] if token else [])


def _warm(srv, body, token: str | None = TOKEN) -> list[dict]:
    client = flight.FlightClient(srv.location)
    action = flight.Action("warm", json.dumps(body).encode())
    return [json.loads(r.body.to_pybytes()) for r in client.do_action(action, options=_options(token))]


def _computed(srv) -> int:
    return srv.runtime.cache.stats["misses"]


def test_a_region_is_warmed_and_the_read_that_follows_computes_nothing(served):
    from biopb.tensor import TensorFlightClient

    records = _warm(served, {"array_id": "img", "region": [[0, 128], [0, 192]], "scale": [2, 2], "method": "mean"})
    assert records[-1] == {"done": 2, "total": 2, "cached": 0, "computed": 2}  # 128 x 192 at 2: two 64² chunks
    assert len(served.runtime.cache) == 2
    misses = _computed(served)
    client = TensorFlightClient(served.location, token=TOKEN, cache_bytes=0)
    got = client.get_array("img", slice_hint=(slice(0, 128), slice(0, 192)), scale_hint=[2, 2], reduction_method="mean")
    want = served.runtime.engine.read(
        served.runtime.catalog.find_tensor("img")[0], Bounds((0, 0), (128, 192)), (2, 2), "mean"
    )
    np.testing.assert_array_equal(np.asarray(got), want)
    assert _computed(served) == misses, "the read found every chunk the warm computed"
    again = _warm(served, {"array_id": "img", "region": [[0, 128], [0, 192]], "scale": [2, 2], "method": "mean"})
    assert again[-1] == {"done": 2, "total": 2, "cached": 2, "computed": 0}


def test_chunk_ids_of_a_plan_are_warmed_with_progress_on_the_way(served, monkeypatch):
    monkeypatch.setattr(warm_verb, "_PROGRESS_EVERY", 4)
    tensor = served.runtime.catalog.find_tensor("img")[0]
    ids = [base64.b64encode(c.chunk_id.encode()).decode() for c in plan_read(tensor).chunks]
    records = _warm(served, {"chunk_ids": ids})
    assert [r["done"] for r in records] == [4, 8, 12] and records[-1]["computed"] == 12 == len(ids)
    for c in plan_read(tensor).chunks:
        assert c.chunk_id.encode() in served.runtime.cache


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "warm takes"),
        ({"chunk_ids": "x"}, "warm takes"),
        ({"chunk_ids": [7]}, r"chunk_ids\[0\] is not a base64 string"),
        ({"chunk_ids": ["%%%"]}, r"chunk_ids\[0\] is not base64"),
        ({"chunk_ids": [base64.b64encode(b"tsc\x01garbage").decode()]}, "chunk id is corrupt"),
        ({"array_id": "img", "region": [[0, 10]]}, "1 axes but the tensor has 2"),
        ({"array_id": "img", "region": [[0, "a"], [0, 1]]}, "region must be"),
        ({"array_id": "img", "scale": "2"}, "scale must be"),
        ({"array_id": "img", "colour": 1}, "unknown keys"),
        ({"array_id": "nope"}, "nope"),
    ],
)
def test_a_bad_body_is_refused_naming_what_is_wrong(served, body, message):
    with pytest.raises(flight.FlightError, match=message):
        _warm(served, body)


def test_more_chunks_than_a_request_may_warm_is_refused_before_any_is_read(served, monkeypatch):
    monkeypatch.setattr(warm_verb, "MAX_CHUNKS", 3)
    with pytest.raises(flight.FlightError, match="12 chunks asked, at most 3"):
        _warm(served, {"array_id": "img"})
    assert len(served.runtime.cache) == 0


def test_more_bytes_than_the_cache_holds_is_refused(served, monkeypatch):
    monkeypatch.setattr(served.runtime.cache, "max_total_bytes", 1000)
    with pytest.raises(flight.FlightError, match="more than the chunk cache's budget of 1000"):
        _warm(served, {"array_id": "img"})


def test_a_caller_without_the_token_learns_nothing(served):
    with pytest.raises(flight.FlightUnauthenticatedError):
        _warm(served, {"array_id": "img"}, token="wrong-token-0123456789")
    with pytest.raises(flight.FlightUnauthenticatedError):
        _warm(served, {"array_id": "img"}, token=None)
    assert len(served.runtime.cache) == 0


def test_it_stops_before_the_next_chunk_once_the_client_went(served):
    from tensor_server.service.caller import Caller

    asked: list[int] = []

    def went() -> bool:  # the client goes while the fourth chunk is due
        asked.append(1)
        return len(asked) > 3

    records = warm_verb.warm_action(served.runtime, Caller(token=TOKEN), json.dumps({"array_id": "img"}).encode(), went)
    assert list(records) == []  # no last record: it stopped
    assert len(served.runtime.cache) == 3


def test_grid_tiles_warms_what_a_viewers_tiles_read(tmp_path):
    """A region read at once is planned on the transfer grid (1024² here), a viewer's 512² tile
    on the tile grid: ``grid: tiles`` warms the chunks the tiles then find."""
    from biopb.tensor import TensorFlightClient

    image = np.random.default_rng(5).integers(0, 60000, (2048, 2048), dtype=np.uint16)
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(image, "yx", chunk_shape=(1024, 1024)), source_id="big"))
    cat.first_scan_done.set()
    cache = CacheManager(tmp_path / "cache")
    try:
        with serving(cat, cache=cache, token=TOKEN, precache_bytes=0) as srv:
            region = {"array_id": "big", "region": [[0, 1024], [0, 2048]]}
            assert _warm(srv, region)[-1]["total"] == 2, "one read of the region: two 1024² transfer chunks"
            assert _warm(srv, {**region, "grid": "tiles"})[-1] == {"done": 8, "total": 8, "cached": 0, "computed": 8}
            misses = _computed(srv)
            client = TensorFlightClient(srv.location, token=TOKEN, cache_bytes=0)
            for y in (0, 512):
                for x in range(0, 2048, 512):
                    tile = client.get_array("big", slice_hint=(slice(y, y + 512), slice(x, x + 512)))
                    np.testing.assert_array_equal(np.asarray(tile), image[y : y + 512, x : x + 512])
            assert _computed(srv) == misses, "every tile found its chunk warmed"
            with pytest.raises(flight.FlightError, match="grid must be one of"):
                _warm(srv, {**region, "grid": "fine"})
    finally:
        cache.close()
        cat.close()
