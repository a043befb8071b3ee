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

__all__ = ["flight_error", "bounded_message"]

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
