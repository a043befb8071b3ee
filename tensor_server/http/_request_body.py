"""A request body read within a bound: the one way the HTTP door takes a body (a render spec,
a GeoJSON import, the catalog page's share request), so no route holds a body it then refuses."""

from __future__ import annotations

from typing import Any

from tensor_server.errors import RequestTooLarge

__all__ = ["body_within"]


async def body_within(request: Any, limit: int) -> bytes:
    """The request body, refused (``RequestTooLarge``) once it runs past ``limit`` bytes: a
    declared length over it before a byte is read, a streamed one as soon as it passes it."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(f"request body: {declared} bytes, above the limit of {limit} for this verb")
    pieces, size = [], 0
    async for piece in request.stream():
        size += len(piece)
        if size > limit:
            raise RequestTooLarge(f"request body: more than {limit} bytes, the limit for this verb")
        pieces.append(piece)
    return b"".join(pieces)
