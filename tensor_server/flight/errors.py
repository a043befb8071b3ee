"""The Flight translation of the error taxonomy (``tensor_server/errors.py``): one function.

pyarrow's Flight exposes a handful of exception classes, not gRPC's codes; the class carries
retryability and the biopb SDK switches on it (``FlightUnavailableError`` is retried and, with
"unresolved" in the message, steers the user to ``resolve_source``; ``FlightCancelledError``
with an ``upload_*`` reason is the SDK's ``UploadRefused``). The precise code and reason
travel in ``extra_info`` as JSON (wire-protocol §12).
"""

from __future__ import annotations

import json
import logging

import pyarrow.flight as flight

from tensor_server.errors import TensorServerError, bounded_message, internal_message

__all__ = ["flight_error", "schema_error", "bounded_message"]

log = logging.getLogger(__name__)

_CLASS_BY_CODE = {
    "UNAVAILABLE": flight.FlightUnavailableError,
    "CANCELLED": flight.FlightCancelledError,
    "ABORTED": flight.FlightCancelledError,
    "UNAUTHENTICATED": flight.FlightUnauthenticatedError,
    "PERMISSION_DENIED": flight.FlightUnauthorizedError,
    "INTERNAL": flight.FlightInternalError,
}


def flight_error(exc: BaseException, request_id: str | None = None) -> flight.FlightError:
    """The Flight error a client receives for ``exc``. A Flight error passes as it is; an
    error that is not ours is INTERNAL, named by type only, and logged with its traceback.
    ``request_id`` (the request log's) ends the message, so a client's error can be found
    in the server log (``extra_info`` stays the wire contract's ``{code, reason, ...}``)."""
    if isinstance(exc, flight.FlightError):
        return exc
    tail = f" [request {request_id}]" if request_id else ""
    if not isinstance(exc, TensorServerError):
        log.error("internal error answering request %s", request_id, exc_info=exc)
        info = {"code": "INTERNAL", "reason": "internal"}
        return flight.FlightInternalError(internal_message(exc) + tail, extra_info=json.dumps(info).encode())
    info = {"code": exc.code, "reason": exc.slug, **exc.details}
    cls = _CLASS_BY_CODE.get(exc.code, flight.FlightServerError)
    return cls(bounded_message(str(exc)) + tail, extra_info=json.dumps(info, default=str).encode())


class _SchemaRefusal(Exception):
    """A GetSchema refusal: its message as it is (KeyError would quote it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class _SchemaNotFound(_SchemaRefusal, KeyError):
    pass


class _SchemaInvalid(_SchemaRefusal, ValueError):
    pass


class _SchemaUnimplemented(_SchemaRefusal, NotImplementedError):
    pass


#: the Python classes pyarrow turns into these codes when a GetSchema handler raises them
_SCHEMA_CLASS_BY_CODE: dict[str, type[_SchemaRefusal]] = {
    "NOT_FOUND": _SchemaNotFound,
    "INVALID_ARGUMENT": _SchemaInvalid,
    "UNIMPLEMENTED": _SchemaUnimplemented,
}


def schema_error(exc: BaseException, request_id: str | None = None) -> Exception:
    """What a GetSchema handler raises for ``exc``: ``flight_error``'s message, as a class
    pyarrow maps to the taxonomy's gRPC code. pyarrow 26 does not catch a FlightError raised
    in GetSchema (``_flight.pyx`` ``_get_schema`` lacks the ``except FlightError`` of every
    other handler), so its Flight class would reach the client as UNKNOWN; a KeyError,
    ValueError or NotImplementedError becomes NOT_FOUND, INVALID_ARGUMENT or UNIMPLEMENTED
    (other codes stay UNKNOWN: Arrow has no status for them). pyarrow still appends the
    formatted Python traceback to any error a GetSchema handler raises."""
    err = flight_error(exc, request_id)
    code = json.loads(err.extra_info or b"{}").get("code", "")
    return _SCHEMA_CLASS_BY_CODE.get(code, _SchemaRefusal)(str(err))
