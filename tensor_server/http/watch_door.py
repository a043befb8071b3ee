"""Server-Sent Events door of the watch rule: ``GET /watch/<array_id>`` streams a growing
tensor's extents (``service/watch.py``) as ``event: extent`` messages whose ``id`` is the
record's sequence and whose ``data`` is the record's JSON, ``{array_id, shape, sequence}``.
A client resumes with ``?since=<sequence>`` or the standard ``Last-Event-ID`` header (an
``EventSource`` sends it on reconnecting by itself).

A translation only: the runtime applies the read rule and numbers the records. The stream is
asked without blocking (``wait=0``) from the event loop, which sleeps a poll tick between
asks, so a thousand watchers hold no worker thread each; a comment line every
``_KEEPALIVE`` seconds keeps proxies from closing an idle stream.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from tensor_server.errors import InvalidArgument
from tensor_server.http.viewer_door import guarded
from tensor_server.service.watch import TICK

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.service import Caller, ServingRuntime

__all__ = ["routes", "PREFIX"]

PREFIX = "/watch/"
_KEEPALIVE = 15.0


def _since(request: Any) -> int | None:
    raw = request.query_params.get("since") or request.headers.get("last-event-id")
    if raw is None:
        return None
    if not raw.isdigit():
        raise InvalidArgument(f"watch: since (or Last-Event-ID) must be a sequence number, not {raw[:40]!r}")
    return int(raw)


def routes(runtime: ServingRuntime, caller_of: Callable[[Any], Caller]) -> list[Any]:
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def serve(request: Any, caller: Caller) -> Any:
        raw = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
        array_id = unquote(raw[raw.find(PREFIX) + len(PREFIX) :])
        gone = threading.Event()
        records = await run_in_threadpool(runtime.watches.stream, caller, array_id, _since(request), gone.is_set, 0.0)

        async def events() -> AsyncIterator[str]:
            quiet = 0.0
            try:
                for record in records:
                    if record is None:
                        quiet += TICK
                        if quiet >= _KEEPALIVE:
                            quiet = 0.0
                            yield ": keep-alive\n\n"
                        await asyncio.sleep(TICK)
                        continue
                    quiet = 0.0
                    yield f"id: {record['sequence']}\nevent: extent\ndata: {json.dumps(record)}\n\n"
            finally:
                gone.set()
                records.close()

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    return [Route(PREFIX + "{rest:path}", guarded(serve, caller_of), methods=["GET"])]
