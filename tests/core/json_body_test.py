"""Issue 38: the JSON decoder's nesting measure is linear in the body and reads a body as the
parser does. Before, a regex for string literals backtracked quadratically over a run of
escapes: one 48 KiB body held the GIL (and every door) for 10 s, 1 MiB for over an hour."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensor_server.core.json_body import _depth, decode_json
from tensor_server.errors import InvalidArgument


def reference_depth(body: bytes) -> int:
    """The reading ``_depth`` vectorises, one byte at a time: a backslash escapes the next
    byte, an unescaped quote opens or closes a string, an unescaped bracket outside a string
    counts."""
    depth = best = 0
    in_string = escaped = False
    for byte in body:
        if escaped:
            escaped = False
        elif byte == ord("\\"):
            escaped = True
        elif byte == ord('"'):
            in_string = not in_string
        elif not in_string and byte in b"[{":
            depth += 1
            best = max(best, depth)
        elif not in_string and byte in b"]}":
            depth -= 1
    return best


def nesting(value: object) -> int:
    """The true nesting of a decoded JSON value (what the parser recursed through)."""
    if isinstance(value, dict):
        return 1 + max(map(nesting, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(nesting, value), default=0)
    return 0


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab"\\[]{}\u00e9\n', max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(alphabet='k"\\[{', max_size=4), kids, max_size=3),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(_JSON_VALUES)
def test_the_depth_of_valid_json_is_the_nesting_the_parser_sees(value):
    body = json.dumps(value).encode()
    assert _depth(body) == nesting(json.loads(body)) == reference_depth(body)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(list(b'"\\[]{}a ')), max_size=200).map(bytes) | st.binary(max_size=200))
def test_the_depth_of_any_bytes_is_the_reference_scanners(body):
    assert _depth(body) == reference_depth(body)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list(b'"\\[]{}a ')), max_size=120).map(bytes), st.integers(1, 7))
def test_the_depth_measured_in_blocks_is_the_whole_bodys(body, block):
    """A body is measured in blocks (a 64 MiB GeoJSON import measured whole held ~2 GB): an
    escape, a string or a nesting that straddles a block edge reads as in one piece."""
    from unittest import mock

    with mock.patch("tensor_server.core.json_body._DEPTH_BLOCK", block):
        assert _depth(body) == reference_depth(body)


@pytest.mark.parametrize(
    "body, depth",
    [
        (b"", 0),
        (b'"' + b'\\"' * 1000, 0),  # an escape run, unterminated: all of it is one string
        (b'"' + b'\\"' * 1000 + b"[[", 0),
        (b'["' + b'\\"' * 1000 + b'"]', 1),  # the same run, closed
        (b'["\\\\"[]]', 2),  # an even run: the quote closes the string
        (b'["\\\\\\"[]"]', 1),  # an odd run: the quote is text, the brackets too
        (b'["\\\\\\\\"[]]', 2),
        (b'{"k": "[[[{{{", "v": [1, "]]]"]}', 2),  # brackets inside strings do not count
        (b'"unterminated [[[[', 0),
        (b"[[[" + b"\\" * 7 + b'"]]]', 3),
        (b"\\[[", 1),  # an escaped bracket outside a string (invalid JSON): not counted, as the parser stops there
        (b"[" * 5000, 5000),
    ],
)
def test_hostile_bodies_are_measured_as_the_reference_does(body, depth):
    assert _depth(body) == reference_depth(body) == depth


@pytest.mark.parametrize(
    "body, match",
    [
        (b'"' + b'\\"' * 10_000, "not JSON: Unterminated string"),
        (b'["' + b"\\\\" * 10_000 + b'"' + b"[" * 100 + b"]" * 100 + b"]", "nested 101 deep"),
        (b'["' + b'\\"' * 10_000 + b'"]', None),
        (b'["' + b"\\\\" * 10_000 + b'"]', None),
    ],
)
def test_escape_runs_decode_or_are_refused_by_what_they_are(body, match):
    if match is None:
        assert decode_json(body, "x") == json.loads(body)
    else:
        with pytest.raises(InvalidArgument, match=match):
            decode_json(body, "x")


def test_a_megabyte_of_escapes_is_answered_well_under_a_second():
    """In a child process, so the quadratic measure this replaces fails the test in 20 s
    instead of holding this process's GIL for an hour."""
    child = textwrap.dedent("""
        import time
        from tensor_server.core.json_body import DEFAULT_MAX_JSON_BYTES, decode_json
        from tensor_server.errors import InvalidArgument
        pairs = (DEFAULT_MAX_JSON_BYTES - 4) // 2
        bodies = [b'"' + b'\\\\"' * pairs, b'["' + b'\\\\"' * pairs + b'"]', b'"' + b'\\\\' * pairs]
        worst = 0.0
        for body in bodies:
            assert len(body) <= DEFAULT_MAX_JSON_BYTES
            t0 = time.perf_counter()
            try:
                decode_json(body, "x")
            except InvalidArgument:
                pass
            worst = max(worst, time.perf_counter() - t0)
        print(worst)
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=20, check=True)
    assert float(done.stdout) < 1.0, done.stdout


@pytest.mark.parametrize("body", [b"1e99999", b'{"limit": -1e400}', b"[0.5, 1" + b"0" * 400 + b".0]"])
def test_a_number_past_the_float_range_is_refused_like_infinity(body):
    with pytest.raises(InvalidArgument, match="beyond the range of a JSON number"):
        decode_json(body, "x")
    assert decode_json(b"[1e308, -2.5e-300, 0.1]", "x") == [1e308, -2.5e-300, 0.1]
