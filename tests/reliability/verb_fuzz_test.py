"""Hypothesis over the body of every action and every HTTP route (issue 23): whatever a client
sends, the answer is a clean refusal (never INTERNAL / 500), the server stays up, and the next
read is correct. The actions come from the registry, so a new action is fuzzed the day it is
added."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pyarrow.flight as flight
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.service.actions import ACTIONS
from tensor_server.testing import serving

IMAGE = np.arange(48 * 40, dtype=np.uint16).reshape(48, 40)
#: actions that would change what the fixture serves if a fuzzed body happened to be valid
_KEEP_STATE = {"remove_source", "set_upload_status"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(IMAGE, "yx", chunk_shape=(16, 16)), source_id="img"))
    cat.first_scan_done.set()
    with serving(cat, http=True, write_dir=str(tmp_path_factory.mktemp("w")), writable=True) as srv:
        yield srv
    cat.close()


def _code(exc: flight.FlightError) -> str:
    info = json.loads(bytes(exc.extra_info).decode()) if exc.extra_info else {}
    return info.get("code", type(exc).__name__)


def _bodies():
    json_ish = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
        max_leaves=12,
    )
    return st.one_of(
        st.binary(max_size=300),
        json_ish.map(lambda v: json.dumps(v).encode()),
        st.just(b"[" * 5000),
        st.just(b'{"array_id": "img", "slice": {"start": [0], "stop": [1]}}'),
    )


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from([a.name for a in ACTIONS if a.name not in _KEEP_STATE]), body=_bodies())
def test_every_action_refuses_cleanly(served, name, body):
    client = flight.FlightClient(served.location)
    try:
        results = client.do_action(flight.Action(name, body))
        if name == "watch":  # a valid watch streams until its client goes: its first record answers
            next(results, None)
            results.close()
        else:
            list(results)
    except flight.FlightError as exc:
        assert _code(exc) != "INTERNAL", (name, body[:80], str(exc)[:300])
        assert "Traceback" not in str(exc)
    np.testing.assert_array_equal(served.client().get_array("img"), IMAGE)


_SEGMENT = st.one_of(
    st.sampled_from(
        ["img", "0", "1", ".zarray", ".zattrs", "zarr.json", "c", "labels", "0.0", "%C2%B2", "..", "@fields", "\u00b2"]
    ),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    flavour=st.sampled_from(["zarr", "zarr3", "nope"]),
    segments=st.lists(_SEGMENT, max_size=8),
    rng=st.one_of(st.none(), st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=20)),
)
@example(flavour="zarr", segments=["img", "\u00b2"], rng=None)  # "²".isdigit(): a level name, int() refused it (CI)
def test_every_http_route_refuses_cleanly(served, flavour, segments, rng):
    from urllib.parse import quote

    path = "/".join(quote(s, safe="%") for s in segments)
    headers = {} if rng is None or not rng.strip() else {"Range": rng.strip()}  # h11 sends no blank values
    r = httpx.get(f"{served.http_url}/{flavour}/{path}", headers=headers, timeout=30)
    assert r.status_code < 500, (flavour, segments, r.status_code, r.text[:300])
    chunk = httpx.get(f"{served.http_url}/zarr/img/0/0.0", timeout=30)
    assert chunk.status_code == 200
    np.testing.assert_array_equal(np.frombuffer(chunk.content, np.uint16).reshape(16, 16), IMAGE[:16, :16])
