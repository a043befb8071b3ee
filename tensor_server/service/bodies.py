"""Request bodies: the one place a verb's bytes become a message, with one refusal wording.

Protobuf bodies are the biopb SDK's generated classes; JSON bodies are bounded in size and
nesting before they are parsed (a 100,000-deep ``[[[...]]]`` would otherwise surface as a
RecursionError, an internal error, instead of the client's mistake it is).
"""
from __future__ import annotations

import json
from typing import Any, TypeVar

from tensor_server.errors import InvalidArgument, RequestTooLarge

__all__ = ["decode_message", "decode_json", "MAX_JSON_BYTES", "MAX_JSON_DEPTH"]

M = TypeVar("M")

#: a JSON action body larger than this is refused unparsed (ids, slices and keys are small)
MAX_JSON_BYTES = 1 << 20
#: nesting deeper than this is refused before ``json.loads`` recurses into it
MAX_JSON_DEPTH = 64


def decode_message(cls: type[M], body: bytes, verb: str) -> M:
    """``body`` parsed as protobuf message ``cls``, or InvalidArgument naming the verb and
    the message the SDK sends."""
    from google.protobuf.message import DecodeError

    msg = cls()
    try:
        msg.ParseFromString(bytes(body or b""))
    except (DecodeError, ValueError, TypeError):
        raise InvalidArgument(f"{verb}: the request body is not the SDK's request message "
                              f"(not a {cls.__name__})") from None
    return msg


def decode_json(body: bytes, verb: str, *, empty: Any = None) -> Any:
    """``body`` parsed as JSON (``empty`` when there is none), or InvalidArgument /
    RequestTooLarge naming the verb. Lone surrogates and over-deep nesting are refused."""
    if not body:
        return empty
    if len(body) > MAX_JSON_BYTES:
        raise RequestTooLarge(f"{verb}: a {len(body)}-byte body is larger than {MAX_JSON_BYTES} bytes")
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"{verb}: the body is not JSON (it is not UTF-8 text)") from None
    if _depth(text) > MAX_JSON_DEPTH:
        raise InvalidArgument(f"{verb}: the JSON body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(text)
        json.dumps(value).encode("utf-8")  # a lone surrogate (\ud800) parses but cannot be used as text
    except (ValueError, UnicodeEncodeError):
        raise InvalidArgument(f"{verb}: the body is not JSON text") from None
    return value


def _depth(text: str) -> int:
    """The deepest bracket nesting of ``text`` (brackets inside strings counted too: an
    over-estimate only refuses a body that is absurd anyway)."""
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest
