"""Exception types that cross module boundaries.

One family so the server can map each to a wire error code (NOT_FOUND, INVALID_ARGUMENT, ...)
without string matching, and so callers of ``tensor_server.open`` catch exactly one type for
"this file cannot be served".
"""
from __future__ import annotations

import os

__all__ = [
    "TensorServerError",
    "UnreadableSource",
    "UnknownFormat",
    "InvalidBounds",
    "InvalidArgument",
    "InvalidChunkId",
    "StaleChunkId",
    "TensorNotFound",
]


class TensorServerError(Exception):
    """Base of every error this package raises on purpose.

    ``slug`` is the machine reason a Flight error carries in ``extra_info`` (the biopb
    reference's spelling, e.g. ``slice_rank``), for clients that switch on it; the message
    stays ours. None means the server picks the class's default."""

    slug: str | None = None

    def __init__(self, *args: object, slug: str | None = None) -> None:
        super().__init__(*args)
        if slug is not None:
            self.slug = slug


class UnreadableSource(TensorServerError):
    """A file or folder cannot be opened or read. Always names the path and the cause."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class UnknownFormat(UnreadableSource):
    """No registered adapter recognises the path (by content or by extension)."""


class InvalidArgument(TensorServerError, ValueError):
    """A caller-supplied argument is malformed (scale, method, field name, ...)."""


class InvalidBounds(InvalidArgument):
    """A region does not fit the tensor (wrong rank, negative start, empty, out of range)."""


class InvalidChunkId(InvalidArgument):
    """Bytes that are not a chunk id minted by this server (or by this server's format version)."""


class StaleChunkId(TensorServerError):
    """A chunk id minted for content that has since changed: the client must re-plan."""


class TensorNotFound(TensorServerError, KeyError):
    """No tensor or source with that id."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else "tensor not found"
