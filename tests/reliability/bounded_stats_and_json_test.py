"""Issue 23 findings 2 and 8: tensor_stats is bounded, shares the engine's admission and stops
when its client goes; every JSON body decodes to a value or to INVALID_ARGUMENT."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensor_server.adapters.memory import ArrayAdapter
from tensor_server.core.bounds import Bounds
from tensor_server.core.engine import ReadEngine
from tensor_server.core.json_body import decode_json
from tensor_server.core.stats import StatsLimits, tensor_stats
from tensor_server.errors import InvalidArgument, Overloaded, ReadCancelled, RequestTooLarge


class _Counting(ArrayAdapter):
    """A tensor whose read block is small, so a stats call spans many units."""

    @property
    def read_block_shape(self):
        return (4, 4)


@pytest.fixture
def tensor():
    t = _Counting(np.arange(64 * 64, dtype=np.uint16).reshape(64, 64), "yx")
    t.array_id = "t"
    return t


def test_stats_are_exact_within_the_limits(tensor):
    out = tensor_stats(tensor, engine=ReadEngine(special_chunks=False))
    assert (out["min"], out["max"], out["sum"], out["count"]) == (0, 4095, 4095 * 4096 // 2, 4096)


def test_a_region_of_too_many_units_is_refused_before_any_read(tensor):
    with pytest.raises(RequestTooLarge, match="spans 256 blocks .* above the limit of 100 per call; ask for a slice"):
        tensor_stats(tensor, engine=ReadEngine(special_chunks=False), limits=StatsLimits(max_units=100))
    assert tensor.reads == 0
    part = tensor_stats(
        tensor, Bounds((0, 0), (8, 64)), engine=ReadEngine(special_chunks=False), limits=StatsLimits(max_units=100)
    )
    assert part["count"] == 512 and part["max"] == 7 * 64 + 63


def test_decoded_bytes_per_call_are_capped(tensor):
    with pytest.raises(RequestTooLarge, match="bytes of pixels decoded"):
        tensor_stats(tensor, engine=ReadEngine(special_chunks=False), limits=StatsLimits(max_decoded_bytes=1000))
    assert tensor.reads * 4 * 4 * 2 <= 1000


def test_a_cancelled_call_stops_at_the_next_unit(tensor):
    polls = {"n": 0}

    def cancelled():
        polls["n"] += 1
        return polls["n"] > 3

    with pytest.raises(ReadCancelled, match="client went away"):
        tensor_stats(tensor, engine=ReadEngine(special_chunks=False), cancelled=cancelled)
    assert tensor.reads <= 3


def test_stats_share_the_engines_admission_bound(tensor):
    engine = ReadEngine(special_chunks=False, max_computes=1, admission_timeout=0.05)
    held, release = threading.Event(), threading.Event()

    def occupy():
        with engine.admitted():
            held.set()
            release.wait(10)

    t = threading.Thread(target=occupy)
    t.start()
    held.wait(10)
    try:
        with pytest.raises(Overloaded, match="1 chunk computations are running"):
            tensor_stats(tensor, engine=engine)
    finally:
        release.set()
        t.join()
    assert tensor.reads == 0
    assert tensor_stats(tensor, engine=engine)["count"] == 4096  # the slot is free again


@pytest.mark.parametrize(
    "body, match",
    [
        (b"[" * 50_000 + b"]" * 50_000, "nested 50000 deep"),
        (b'{"array_id": "\\ud800"}', "lone surrogate"),
        (b'{"\\udfff": 1}', "lone surrogate"),
        (b'{"limit": NaN}', "NaN is not a JSON number"),
        (b'{"n": ' + b"9" * 5000 + b"}", "not JSON"),
        (b"\xff\xfe", "not UTF-8"),
        (b'{"a": ', "not JSON"),
    ],
)
def test_hostile_json_bodies_are_invalid_argument(body, match):
    with pytest.raises(InvalidArgument, match=match):
        decode_json(body, "tensor_stats body")


def test_json_bodies_are_bounded_in_bytes_and_decode_honest_ones():
    with pytest.raises(RequestTooLarge, match="above the limit of 1024"):
        decode_json(b'"' + b"x" * 2000 + b'"', "catalog_children body", max_bytes=1024)
    doc = b'{"key": "a/[b]{c}", "slice": {"start": [0, 1], "stop": [2, 3]}, "s": "\\u00e9\\ud83d\\ude00"}'
    assert decode_json(doc, "x", max_depth=3) == {
        "key": "a/[b]{c}",
        "slice": {"start": [0, 1], "stop": [2, 3]},
        "s": "\u00e9\U0001f600",
    }
    with pytest.raises(InvalidArgument, match="nested 3 deep"):
        decode_json(doc, "x", max_depth=2)


_JSON_ALPHABET = list(b'[]{}",:\\0123456789eE+-.truefalsn \t\nNaIiy') + [0xED, 0xA0, 0x80, 0xFF]


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=200),
        st.lists(st.sampled_from(_JSON_ALPHABET), max_size=300).map(bytes),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=8),
            lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
            max_leaves=20,
        ).map(lambda v: json.dumps(v).encode()),
    )
)
def test_any_body_decodes_or_is_refused_cleanly(body):
    try:
        value = decode_json(body, "fuzz", max_bytes=1 << 10, max_depth=8)
    except (InvalidArgument, RequestTooLarge) as exc:
        assert str(exc).startswith("fuzz: ")
        return
    assert json.loads(json.dumps(value, allow_nan=False)) == value  # a clean, re-encodable value
