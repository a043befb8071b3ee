"""What the viewer routes (IIIF, DeepZoom, the catalog page) share: the token a request
presents, and the translation of ``tensor_server.errors`` into plain-text responses."""
from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

from tensor_server.errors import TensorServerError

__all__ = ["presented_token", "guarded", "while_connected"]

log = logging.getLogger(__name__)


def presented_token(request: Any) -> str | None:
    """``Authorization: Bearer <token>`` or ``?token=`` (viewers that cannot set headers)."""
    header = request.headers.get("authorization", "")
    if header.startswith("Bearer "):
        return header[len("Bearer "):]
    return request.query_params.get("token")


def guarded(provider: Any, handler: Callable[[Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
    """``handler`` behind the token check, with errors answered by their HTTP status."""
    from starlette.responses import PlainTextResponse

    async def endpoint(request: Any) -> Any:
        try:
            provider.authenticate(presented_token(request))
            return await handler(request)
        except TensorServerError as exc:
            headers = {"WWW-Authenticate": "Bearer"} if exc.http_status == 401 else None
            return PlainTextResponse(f"{type(exc).__name__}: {str(exc)[:500]}", status_code=exc.http_status,
                                     headers=headers)
    return endpoint


async def while_connected(request: Any, work: Callable[[Callable[[], bool]], Any]) -> Any:
    """``work(cancelled)`` in a worker thread; ``cancelled()`` turns True once the client has
    gone, so a region read stops between chunks instead of finishing for nobody."""
    import asyncio
    import threading

    from starlette.concurrency import run_in_threadpool

    gone = threading.Event()

    async def watch() -> None:
        while not gone.is_set():
            if await request.is_disconnected():
                gone.set()
                return
            await asyncio.sleep(0.1)

    watcher = asyncio.ensure_future(watch())
    try:
        return await run_in_threadpool(work, gone.is_set)
    finally:
        watcher.cancel()
