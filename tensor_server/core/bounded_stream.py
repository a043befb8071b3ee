"""Take a client's stream piece by piece within a byte budget, refusing the first piece past it.

A door that reads a whole upload stream before looking at it (``reader.read_all()``) holds
whatever a client sends: a junk ticket followed by gigabytes took the server's memory with it.
The rule below the door is: check the target first (the caller does, before it calls this),
then take pieces one at a time, counting bytes, and stop with ``RequestTooLarge`` as soon as
the count passes what the target can hold, and with ``ReadCancelled`` as soon as the client
has gone. Pieces are anything with ``nbytes`` (Arrow record batches, numpy arrays).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tensor_server.errors import ReadCancelled, RequestTooLarge

__all__ = ["take_within"]


def take_within(
    pieces: Iterable[Any], max_bytes: int, what: str, *, cancelled: Callable[[], bool] | None = None
) -> list[Any]:
    """Every piece of ``pieces``, in order, as long as their total ``nbytes`` stays within
    ``max_bytes``; ``what`` names the request in the refusal. The iterator is not read past
    the piece that breaks the budget."""
    taken: list[Any] = []
    total = 0
    for piece in pieces:
        if cancelled is not None and cancelled():
            raise ReadCancelled(f"{what}: the client went away; nothing was stored")
        total += int(piece.nbytes)
        if total > max_bytes:
            raise RequestTooLarge(
                f"{what}: the stream carries more than {max_bytes} bytes, which is all "
                f"this request may hold; nothing was stored"
            )
        taken.append(piece)
    return taken
