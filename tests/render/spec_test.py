"""Render specs as pure functions: the canonical id, each refusal naming its field, the bounded
store (evicted: 404 saying to post again; never stored: 400), resolution against a tensor's
channels; histograms, percentile windows and channel lists; the named LUTs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tensor_server.errors import InvalidArgument, RenderSpecEvicted
from tensor_server.render.histogram import BINS, channel_list, histogram_of, percentile_window
from tensor_server.render.luts import colour_value
from tensor_server.render.spec import MAX_SPEC_CHANNELS, SpecStore, parse_spec, resolve, split_spec_id

SPEC = {
    "channels": [
        {"index": 3, "color": "#ff0000", "window": {"start": 100, "end": 4000}},
        {"index": 17, "color": "green", "window": {"percentiles": [1, 99]}, "gamma": 0.8},
        {"index": 5, "visible": False},
    ],
    "plane": {"z": 2},
}


def _body(doc) -> bytes:
    return json.dumps(doc).encode()


def test_the_id_is_the_content_hash_whatever_the_spelling():
    spec = parse_spec(_body(SPEC))
    assert spec.id == "99a9dcbcf0c16514"  # pinned: an id in a shared URL must not change
    respelled = json.dumps(SPEC, indent=3, sort_keys=True).replace("#ff0000", "#FF0000").encode()
    assert parse_spec(respelled).id == spec.id
    other = {**SPEC, "plane": {"z": 3}}
    assert parse_spec(_body(other)).id != spec.id


@pytest.mark.parametrize(
    "doc,field",
    [
        ({"channels": [{"index": 0, "color": "#12345"}]}, "channels[0].color"),
        ({"channels": [{"index": 0, "color": "chartreuse"}]}, "channels[0].color"),
        (
            {"channels": [{"index": 0, "window": {"start": 10, "end": 5}}]},
            "channels[0].window: start 10.0 must be below",
        ),
        ({"channels": [{"index": 0, "window": {"start": 10}}]}, "channels[0].window"),
        ({"channels": [{"index": 0, "window": {"percentiles": [50, 20]}}]}, "channels[0].window.percentiles"),
        ({"channels": [{"index": 0, "gamma": 0}]}, "channels[0].gamma"),
        ({"channels": [{"index": 0, "gamma": True}]}, "channels[0].gamma"),
        ({"channels": [{"index": -1}]}, "channels[0].index"),
        ({"channels": [{"color": "red"}]}, "channels[0].index"),
        ({"channels": [{"index": 0, "colour": "red"}]}, "channels[0].colour: not a channel setting"),
        ({"channels": [{"index": 0}, {"index": 0}]}, "channels[1].index: channel 0 is named again"),
        ({"channels": [{"index": i} for i in range(10_000)]}, f"channels: 10000 entries, at most {MAX_SPEC_CHANNELS}"),
        ({"channels": [{"index": i} for i in range(65)]}, "channels: 65 visible; a composite shows 1 to 64"),
        ({"channels": [{"index": 0, "visible": False}]}, "channels: 0 visible"),
        ({"channels": []}, "channels: give a list"),
        ({"channels": [{"index": 0}], "plane": {"c": 1}}, "plane.c"),
        ({"channels": [{"index": 0}], "plane": {"z": "3"}}, "plane.z"),
        ({"channels": [{"index": 0}], "lut": "x"}, "lut: not a spec field"),
        ([1, 2], "the spec is a JSON object"),
    ],
)
def test_each_bad_spec_is_a_400_naming_its_field(doc, field):
    with pytest.raises(InvalidArgument) as err:
        parse_spec(_body(doc))
    assert field in str(err.value) and err.value.http_status == 400


def test_not_json_and_non_numbers_are_refused():
    with pytest.raises(InvalidArgument, match="not JSON"):
        parse_spec(b"{channels: [")
    with pytest.raises(InvalidArgument, match="NaN, which is not a JSON number"):
        parse_spec(b'{"channels": [{"index": 0, "gamma": NaN}]}')
    with pytest.raises(InvalidArgument, match="bytes"):
        parse_spec(b" " * (300 * 1024))


def test_the_identifier_suffix():
    assert split_spec_id("a/b;z=3;r=99a9dcbcf0c16514") == ("a/b;z=3", "99a9dcbcf0c16514")
    assert split_spec_id("a/b;z=3") == ("a/b;z=3", None)
    with pytest.raises(InvalidArgument, match="^c: "):
        split_spec_id("a;c=1;r=99a9dcbcf0c16514")
    with pytest.raises(InvalidArgument, match="^r: "):
        split_spec_id("a;r=1;r=2")
    with pytest.raises(InvalidArgument, match="characters"):  # bounded before it is split
        split_spec_id("a;" * 5000)


def test_the_store_is_bounded_and_says_what_an_unknown_id_is():
    store = SpecStore(max_specs=2)
    ids = [store.put(parse_spec(_body({"channels": [{"index": i}]}))) for i in range(3)]
    assert len(set(ids)) == 3 and store.get(ids[2]).channels[0].index == 2
    with pytest.raises(RenderSpecEvicted, match="POST the spec to /render again") as evicted:
        store.get(ids[0])
    assert evicted.value.http_status == 404
    with pytest.raises(InvalidArgument, match="r: render spec 0123456789abcdef is not stored"):
        store.get("0123456789abcdef")
    with pytest.raises(InvalidArgument, match="is not a render spec id"):
        store.get("xyz")
    assert store.put(parse_spec(_body({"channels": [{"index": 0}]}))) == ids[0]  # re-posted: the same id
    assert store.get(ids[0]).channels[0].index == 0


def test_resolve_names_a_channel_the_tensor_lacks_and_fills_defaults():
    spec = parse_spec(_body(SPEC))
    asked = []

    def percentiles(i, low, high):
        asked.append(i)
        return percentile_window(np.arange(1000, dtype=np.uint16), low, high)

    defaults = {i: ((0, 255, 0), 0.0, 10.0) for i in range(20)}
    indices, channels = resolve(spec, 20, defaults.__getitem__, percentiles, "img")
    assert indices == (3, 17) and asked == [17]  # measured only where a spec asks for percentiles
    assert (channels[0].start, channels[0].end, channels[0].colour) == (100.0, 4000.0, (1.0, 0.0, 0.0))
    assert (channels[1].start, channels[1].gamma) == (pytest.approx(9.99), 0.8)  # 1st percentile of 0..999
    assert channels[1].colour == (0.0, 1.0, 0.0) and channels[1].end == pytest.approx(989.01)
    with pytest.raises(InvalidArgument, match=r"channels\[1\].index: img has no channel 17 \(10 channels, 0 to 9\)"):
        resolve(spec, 10, defaults.__getitem__, percentiles, "img")


def test_histograms_exact_for_narrow_integers_binned_otherwise():
    h = histogram_of(np.array([[5, 5, 6, 9]], np.int16))
    assert (h.lo, h.width, h.exact, h.counts.tolist()) == (5.0, 1.0, True, [2, 1, 0, 0, 1])
    wide = histogram_of(np.array([0, 65535, 65535, 1, np.nan], np.float32))
    assert not wide.exact and wide.counts.size == BINS and wide.total == 4
    assert (wide.counts[0], wide.counts[-1], wide.width) == (2, 2, 65535 / BINS)


def test_percentile_windows_and_channel_lists():
    assert percentile_window(np.full(10, 7, np.uint16), 0.1, 99.9) == (7.0, 8.0)  # start < end always
    assert percentile_window(np.array([np.nan, np.inf]), 0.1, 99.9) == (0.0, 1.0)
    assert percentile_window(np.array([0.0, 10.0, np.nan]), 0, 100) == (0.0, 10.0)
    assert channel_list("0,3,17", 20) == [0, 3, 17] and channel_list(None, 3) == [0, 1, 2]
    with pytest.raises(InvalidArgument, match=r"^c: there is no channel 20 \(20 channels"):
        channel_list("1,20", 20)
    with pytest.raises(InvalidArgument, match="^c: a channel index"):
        channel_list("1,x", 20)
    with pytest.raises(InvalidArgument, match="^c: name at most 1024"):
        channel_list(",".join(["0"] * 2000), 20)


def test_named_luts_are_matplotlibs():
    viridis, magma = colour_value("viridis"), colour_value("magma")
    assert viridis[0].tolist() == [68, 1, 84] and viridis[255].tolist() == [253, 231, 37]
    assert magma[0].tolist() == [0, 0, 4] and magma[255].tolist() == [252, 253, 191]
    assert colour_value("magenta") == (1.0, 0.0, 1.0) and colour_value("#0080FF") == (0.0, 128 / 255, 1.0)
