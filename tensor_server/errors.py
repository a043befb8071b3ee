"""The error taxonomy: every refusal this package makes on purpose, and what each door says.

One family, and one owner of each class's wire meaning: its canonical gRPC code name
(``code``), its machine reason (``slug``, the biopb reference's spelling where it has one,
e.g. ``slice_rank``), its HTTP status and whether a client may retry it as is. A door
translates only: Flight picks its exception class from ``code`` and puts ``{"code",
"reason", **details}`` in ``extra_info`` (``flight/errors.py``); HTTP answers ``http_status``
with the message (``http/app.py``). So one error reads the same on every door, and a new
error is one class here.

Messages say what happened and how to proceed. They never carry a traceback; an error
that is not one of these is an internal error whose message only names its type (the
server log has the rest, under the request's id).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "TensorServerError",
    "InvalidArgument",
    "InvalidBounds",
    "InvalidChunkId",
    "TensorNotFound",
    "Unimplemented",
    "SourceUnresolved",
    "StaleChunkId",
    "RenderSpecEvicted",
    "UnreadableSource",
    "RemoteUnavailable",
    "UnknownFormat",
    "Unauthenticated",
    "PermissionDenied",
    "FailedPrecondition",
    "AlreadyExists",
    "ReadOnly",
    "ResourceExhausted",
    "RequestTooLarge",
    "StorageFull",
    "Overloaded",
    "PrimaryUnavailable",
    "ReadCancelled",
    "Unimplemented",
    "MAX_ERROR_CHARS",
    "bounded_message",
    "internal_message",
    "code_of_http_status",
]

#: gRPC carries error text in metadata (8 KiB by default for all of it), and an HTTP client
#: shows it: a message that echoes a client's megabyte id back would itself fail. Keep the
#: start, say how much was cut.
MAX_ERROR_CHARS = 1024


def bounded_message(msg: str) -> str:
    if len(msg) <= MAX_ERROR_CHARS:
        return msg
    return f"{msg[:MAX_ERROR_CHARS]}... ({len(msg) - MAX_ERROR_CHARS} more characters)"


def internal_message(exc: BaseException) -> str:
    """What a client hears of an error that is not ours: its type, never its text (which
    may hold paths, reprs or a traceback)."""
    return f"internal error ({type(exc).__name__}); the server log has the details"


class TensorServerError(Exception):
    """Base of every error this package raises on purpose.

    Class attributes are the wire meaning (see the module docstring); ``slug`` may be
    given per instance (``InvalidBounds(..., slug="slice_rank")``). ``details`` are extra
    JSON fields a client may switch on (Flight ``extra_info``)."""

    code: str = "INTERNAL"
    slug: str = "internal"
    http_status: int = 500
    retryable: bool = False
    #: seconds a client should wait before retrying (HTTP ``Retry-After``); None = not said
    retry_after: float | None = None

    def __init__(self, *args: object, slug: str | None = None, **details: Any) -> None:
        super().__init__(*args)
        if slug is not None:
            self.slug = slug
        self.details: dict[str, Any] = details

    def __str__(self) -> str:
        return bounded_message(super().__str__())


class InvalidArgument(TensorServerError, ValueError):
    """A caller-supplied argument is malformed (scale, method, field name, body, ...)."""

    code, slug, http_status = "INVALID_ARGUMENT", "invalid_argument", 400


class InvalidBounds(InvalidArgument):
    """A region does not fit the tensor (wrong rank, negative start, empty, out of range)."""


class InvalidChunkId(InvalidArgument):
    """Bytes that are not a chunk id minted by this server (or by this server's format version)."""

    slug = "malformed_chunk_id"


class TensorNotFound(TensorServerError, KeyError):
    """No tensor or source with that id."""

    code, slug, http_status = "NOT_FOUND", "unknown_source", 404

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return bounded_message(str(self.args[0])) if self.args else "tensor not found"


class SourceUnresolved(TensorNotFound):
    """The source is known but could not be opened (its row says why). UNAVAILABLE with
    "unresolved" in the message is what makes the biopb SDK point its user at
    ``resolve_source``."""

    code, slug, http_status, retryable = "UNAVAILABLE", "unreadable_source", 503, True

    def __str__(self) -> str:
        return bounded_message(f"source unresolved (resolve it once the file is fixed): {super().__str__()}")


class RenderSpecEvicted(TensorServerError):
    """A render spec id this server stored and has since evicted (its store is bounded): post
    the spec again (the same spec gets the same id)."""

    code, slug, http_status = "NOT_FOUND", "evicted_render_spec", 404


class StaleChunkId(TensorServerError):
    """A chunk id minted for content that has since changed: the client must re-plan."""

    code, slug, http_status = "NOT_FOUND", "stale_content_version", 404

    def __str__(self) -> str:
        return bounded_message(f"stale chunk id, re-plan: {super().__str__()}")


class UnreadableSource(TensorServerError):
    """A file or folder cannot be opened or read. Always names the path and the cause."""

    code, slug, http_status = "INTERNAL", "io_error", 500

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class RemoteUnavailable(UnreadableSource):
    """A remote URL did not answer in time (a timeout, a stalled host, a refused connection, a
    5xx): the read gave up after its deadline and names the URL; retry later."""

    code, slug, http_status, retryable, retry_after = "UNAVAILABLE", "remote_unavailable", 503, True, 1.0


class UnknownFormat(UnreadableSource):
    """No registered adapter recognises the path (by content or by extension)."""


class Unauthenticated(TensorServerError):
    """No credential, or a wrong one, for a call that needs one."""

    code, slug, http_status = "UNAUTHENTICATED", "unauthenticated", 401


class PermissionDenied(TensorServerError):
    """The caller is known but this is not theirs to do (a rule names why)."""

    code, slug, http_status = "PERMISSION_DENIED", "permission_denied", 403


class FailedPrecondition(TensorServerError):
    """The request is well formed but the server's state does not allow it now (an upload
    not READY, a verb this server was started without)."""

    code, slug, http_status = "FAILED_PRECONDITION", "failed_precondition", 409


class AlreadyExists(TensorServerError):
    """A name is taken (an upload's field on its source): the message names what holds it."""

    code, slug, http_status = "ALREADY_EXISTS", "already_exists", 409


class ReadOnly(FailedPrecondition):
    """A write verb on a server that takes no writes (the message says which flag)."""

    slug = "read_only"


class ResourceExhausted(TensorServerError):
    """A limit was reached (a quota, a budget of a request)."""

    code, slug, http_status = "RESOURCE_EXHAUSTED", "resource_exhausted", 429


class RequestTooLarge(ResourceExhausted):
    """One request asks for more than a request may (bytes, rows, points, elements)."""

    slug, http_status = "request_too_large", 413


class StorageFull(ResourceExhausted):
    """The disk under the write dir (or the cache) is full."""

    slug, http_status = "storage_full", 507


class Overloaded(TensorServerError):
    """More work was waiting than the server admits in time: retry later."""

    code, slug, http_status, retryable, retry_after = "UNAVAILABLE", "overloaded", 503, True, 1.0


class PrimaryUnavailable(TensorServerError):
    """A worker of ``serve --workers`` hands a request only the first process answers (the
    annotations) to it, and it did not answer in time: retry later (``http/forward.py``)."""

    code, slug, http_status, retryable, retry_after = "UNAVAILABLE", "primary_unavailable", 503, True, 1.0


class Unimplemented(TensorServerError):
    """A well-formed request for a verb, action, option or feature this server does not offer
    (e.g. an IIIF rotation that is not a multiple of 90): the request is valid, so retrying it
    will not help. An unknown action's message starts "Unknown action": the biopb SDK
    recognises an older server by it."""

    code, slug, http_status = "UNIMPLEMENTED", "unimplemented", 501


class ReadCancelled(TensorServerError):
    """The client that asked for this work has gone; it was stopped."""

    code, slug, http_status = "CANCELLED", "cancelled", 499


def code_of_http_status(status: int) -> str:
    """The taxonomy's code for an HTTP status a door answered without raising one of these
    (the security middleware's 401/403, a framework's 405, a viewer door's 400): the code of
    the class with that status nearest the base (breadth first, in definition order); else INVALID_ARGUMENT for 4xx
    and INTERNAL for 5xx. So the metrics count every refusal under a code, whoever made it."""
    if status < 400:
        return "OK"
    pending, seen = [TensorServerError], []
    while pending:
        cls = pending.pop(0)
        seen.append(cls)
        pending.extend(cls.__subclasses__())
    for cls in seen:
        if cls.http_status == status:
            return cls.code
    return "INVALID_ARGUMENT" if status < 500 else "INTERNAL"
