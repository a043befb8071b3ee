"""The HTTP translation of the error taxonomy (``tensor_server/errors.py``): one function, for
every HTTP route (the OME-Zarr view, IIIF, DeepZoom, the catalog page)."""

from __future__ import annotations

import logging
from typing import Any

from tensor_server.errors import TensorServerError, bounded_message, internal_message

__all__ = ["error_response"]

log = logging.getLogger(__name__)


def error_response(exc: BaseException, request_id: str | None = None) -> Any:
    """The HTTP answer for an error: the class's status and slug, the message, and
    ``Retry-After`` for what may be retried; an error that is not ours is a 500 naming its
    type only (logged with its traceback). ``request_id`` ends the message (the request
    log's id, also in the ``X-Request-Id`` header), so a client's error can be found."""
    from starlette.responses import PlainTextResponse

    tail = f" [request {request_id}]" if request_id else ""
    if not isinstance(exc, TensorServerError):
        log.error("internal error answering HTTP request %s", request_id, exc_info=exc)
        return PlainTextResponse(internal_message(exc) + tail, status_code=500)
    headers = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, int(exc.retry_after)))
    if exc.http_status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return PlainTextResponse(
        f"{exc.slug}: {bounded_message(str(exc))}{tail}", status_code=exc.http_status, headers=headers
    )
