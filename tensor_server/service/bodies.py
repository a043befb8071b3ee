"""Protobuf request bodies: the one place a verb's bytes become a message, with one refusal
wording. The messages are the biopb SDK's generated classes. JSON bodies have their own one
decoder, ``core/json_body.py`` (bounded in size and nesting before they are parsed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from tensor_server.errors import InvalidArgument

if TYPE_CHECKING:
    from google.protobuf.message import Message

__all__ = ["decode_message"]

M = TypeVar("M", bound="Message")


def decode_message(cls: type[M], body: bytes, verb: str) -> M:
    """``body`` parsed as protobuf message ``cls``, or InvalidArgument naming the verb and
    the message the SDK sends."""
    from google.protobuf.message import DecodeError

    msg = cls()
    try:
        msg.ParseFromString(bytes(body or b""))
    except (DecodeError, ValueError, TypeError):
        raise InvalidArgument(
            f"{verb}: the request body is not the SDK's request message (not a {cls.__name__})"
        ) from None
    return msg
