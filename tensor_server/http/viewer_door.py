"""What the viewer routes (IIIF, DeepZoom, the catalog page) share: the caller of a request
and the token it presented, the translation of ``tensor_server.errors`` into plain-text
responses, and work that stops when the client goes."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from tensor_server.http.credentials import TOKEN_PATH_PREFIX
from tensor_server.http.errors import error_response
from tensor_server.http.security import CREDENTIAL_KEY, EXPLICIT_CREDENTIAL_KEY
from tensor_server.service import Caller
from tensor_server.service.metrics import current as current_request

__all__ = ["presented_token", "token_path", "guarded", "while_connected"]

log = logging.getLogger(__name__)


def presented_token(request: Any) -> str | None:
    """The credential the request presented, exactly as the security middleware checked it
    (``http/security.py``: a ``/t/<token>/`` path, ``?token=``, ``Authorization``, the cookie);
    nothing else of the request is read as one."""
    return request.scope.get(CREDENTIAL_KEY)


def token_path(request: Any) -> str:
    """The path form (``/t/<token>``) of the credential the request presented itself (its URL
    or an ``Authorization`` header; "" for none, or the cookie's), put before the links a door
    answers with so they work where they are pasted: zarr clients keep a path prefix on every
    key they fetch (a ``?token=`` query becomes ``…/?token=T/zarr.json``), and an IIIF viewer
    on another origin fetches every tile from the ``id`` of ``info.json``, with no cookie."""
    token = request.scope.get(CREDENTIAL_KEY)
    if not token or not request.scope.get(EXPLICIT_CREDENTIAL_KEY):
        return ""
    return f"{TOKEN_PATH_PREFIX}{quote(token, safe='')}"


def guarded(
    handler: Callable[[Any, Caller], Awaitable[Any]], caller_of: Callable[[Any], Caller]
) -> Callable[[Any], Awaitable[Any]]:
    """``handler(request, caller)`` for the caller ``caller_of`` makes of the request (the
    runtime's verbs judge it), with every error answered by its class's HTTP status
    (``http/errors.py``)."""

    async def endpoint(request: Any) -> Any:
        try:
            return await handler(request, caller_of(request))
        except Exception as exc:  # the one boundary: every error is an answer
            rq = current_request()
            return error_response(exc, rq.id if rq is not None else None)

    return endpoint


async def while_connected(request: Any, work: Callable[[Callable[[], bool]], Any]) -> Any:
    """``work(cancelled)`` in a worker thread; ``cancelled()`` turns True once the client has
    gone, so a region read stops between chunks instead of finishing for nobody."""
    import asyncio
    import threading

    from starlette.concurrency import run_in_threadpool

    gone = threading.Event()

    async def watch() -> None:  # first look after 0.1 s: most tiles are done by then
        while not gone.is_set():
            await asyncio.sleep(0.1)
            if await request.is_disconnected():
                gone.set()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        return await run_in_threadpool(work, gone.is_set)
    finally:
        watcher.cancel()
