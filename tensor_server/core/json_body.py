"""One decoder for every JSON body a client sends (action bodies, metadata_json, HTTP bodies).

``json.loads`` alone turns hostile input into internal errors or worse: deep nesting is a
``RecursionError`` (and a deep C stack), ``"\\ud800"`` decodes to a lone surrogate that
fails later, wherever the text is encoded, ``NaN``/``Infinity`` are accepted as numbers, and
a body of any size is parsed. Here each of those is an ``InvalidArgument`` (or
``RequestTooLarge``) that names what was sent and the limit, before anything uses the value.
The nesting depth is measured on the bytes (brackets inside strings not counted) before
parsing, so a deep body never reaches the parser. That measure is linear in the body's
length, with no regular expression: a string-literal regex backtracks quadratically over a
run of escapes (``"`` + ``\\"`` x 24,576 held the GIL for over 10 s before issue 38).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from tensor_server.errors import InvalidArgument, RequestTooLarge

__all__ = ["decode_json", "bounded_int", "DEFAULT_MAX_JSON_BYTES", "DEFAULT_MAX_JSON_DEPTH"]

#: a control request or a metadata block, never data: 1 MiB is generous
DEFAULT_MAX_JSON_BYTES = 1 << 20
#: OME-Zarr metadata nests about 6 deep; 64 leaves room for any honest document
DEFAULT_MAX_JSON_DEPTH = 64

_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPEN, _CLOSE = np.frombuffer(b"[{", np.uint8), np.frombuffer(b"]}", np.uint8)


#: bytes of a body measured at once: the measure holds a few 8-byte integers per byte, so a
#: 64 MiB body (a GeoJSON import) measured whole would hold ~2 GB; in blocks it holds ~40 MB
_DEPTH_BLOCK = 1 << 20


def _depth(body: bytes) -> int:
    """Greatest bracket nesting of ``body`` outside string literals, in a few vectorised
    passes per block of ``_DEPTH_BLOCK`` bytes (linear in ``len(body)``, whatever the bytes).

    The reading: a backslash escapes the byte after it, a quote that is not escaped opens or
    closes a string, and a bracket counts when it is neither escaped nor in a string. So a
    byte is escaped when the run of backslashes just before it is odd (``\\\\"`` ends a
    string, ``\\"`` does not), and in a string when an odd number of delimiting quotes
    precede it. On valid JSON this is the parser's own reading (outside strings valid JSON
    has no backslash); past the first invalid byte it may differ, but the parser stops
    there, so it never nests deeper than this measure of the prefix it read (an
    unterminated string hides the rest from both). The blocks carry over the string parity,
    the depth and whether the last one ended in an odd run of backslashes."""
    raw = np.frombuffer(body, np.uint8)
    deepest, state = 0, (0, 0, False)
    for start in range(0, raw.size, _DEPTH_BLOCK):
        block_deepest, state = _depth_of_block(raw[start : start + _DEPTH_BLOCK], *state)
        deepest = max(deepest, block_deepest)
    return deepest


def _depth_of_block(raw: np.ndarray, depth: int, quotes: int, escaping: bool) -> tuple[int, tuple[int, int, bool]]:
    """(greatest depth in the block, the state after it) for a block entered at ``depth``,
    after ``quotes`` delimiting quotes, the byte before it an odd run's last backslash when
    ``escaping`` (``_depth``). That backslash is put back in front: it is neither a quote nor
    a bracket, so it counts for nothing but the escape."""
    if escaping:
        raw = np.concatenate((np.array([_BACKSLASH], np.uint8), raw))
    index = np.arange(raw.size, dtype=np.intp)
    # the last byte at or before each position that is not a backslash (-1: none)
    last_plain = np.maximum.accumulate(np.where(raw != _BACKSLASH, index, -1))
    escaped = np.zeros(raw.size, bool)
    escaped[1:] = (index[:-1] - last_plain[:-1]) % 2 == 1  # an odd run of backslashes just before
    delimiter = (raw == _QUOTE) & ~escaped
    seen = np.cumsum(delimiter) + quotes
    in_string = (seen % 2).astype(bool)
    step = np.isin(raw, _OPEN).astype(np.intp) - np.isin(raw, _CLOSE).astype(np.intp)
    step[in_string | escaped] = 0
    levels = np.cumsum(step) + depth
    ends_escaping = bool((raw.size - 1 - last_plain[-1]) % 2 == 1)
    return int(levels.max(initial=depth)), (int(levels[-1]), int(seen[-1]), ends_escaping)


def _refuse_constant(name: str) -> Any:
    raise InvalidArgument(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    """A JSON number past the float range (``1e99999``) would decode as infinity: refused
    like the ``Infinity`` literal, before a handler does arithmetic with it."""
    value = float(text)
    if not math.isfinite(value):
        raise InvalidArgument(f"{text[:40]} is beyond the range of a JSON number here (a 64-bit float)")
    return value


def _check_text(value: Any, what: str) -> None:
    """Every string (keys included) must be valid Unicode: a lone surrogate cannot be stored,
    logged or sent back. Depth is already bounded, so the recursion is too."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(
                f"{what}: the JSON holds a lone surrogate escape (\\ud800-\\udfff); send valid Unicode text"
            ) from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k, what)
            _check_text(v, what)
    elif isinstance(value, list):
        for v in value:
            _check_text(v, what)


def decode_json(
    body: bytes | str, what: str, *, max_bytes: int = DEFAULT_MAX_JSON_BYTES, max_depth: int = DEFAULT_MAX_JSON_DEPTH
) -> object:
    """The value of JSON ``body``, or a refusal naming ``what`` (e.g. ``"tensor_stats body"``)
    and the reason: too many bytes (``RequestTooLarge``), not UTF-8, nested deeper than
    ``max_depth``, not JSON, a NaN/Infinity literal or a number past the float range, a lone
    surrogate, an integer of more digits than Python parses (``InvalidArgument``)."""
    raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else bytes(body)
    if len(raw) > max_bytes:
        raise RequestTooLarge(f"{what}: {len(raw)} bytes of JSON, above the limit of {max_bytes}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"{what}: not UTF-8 text (byte {exc.start})") from None
    depth = _depth(raw)
    if depth > max_depth:
        raise InvalidArgument(f"{what}: JSON nested {depth} deep, above the limit of {max_depth}")
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{what}: {exc}") from None
    except RecursionError:  # the depth pre-check makes this unreachable for max_depth <= ~900
        raise InvalidArgument(f"{what}: JSON nested too deep") from None
    except ValueError as exc:  # JSONDecodeError, and int() past sys.get_int_max_str_digits
        raise InvalidArgument(f"{what}: not JSON: {str(exc)[:200]}") from None
    _check_text(value, what)
    return value


def bounded_int(value: Any, what: str, lo: int, hi: int) -> int:
    """``value`` as an int in ``[lo, hi]``, else ``InvalidArgument`` saying the range (a bool
    is not an int here; a huge int is refused before any arithmetic overflows on it)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgument(f"{what} must be an integer, got {type(value).__name__}")
    if not lo <= int(value) <= hi:
        sign = "a positive integer " if lo == 1 else "an integer "
        raise InvalidArgument(f"{what} must be {sign}in [{lo}, {hi}], got {str(int(value))[:40]}")
    return int(value)
