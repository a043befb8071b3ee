"""The watch rule: a client follows a growing tensor's extent (issue 46), on every door.

``Watches.stream(caller, array_id, since, cancelled)`` yields ``{array_id, shape, sequence}``
records in sequence order as the tensor grows (``core/growth.py``): with ``since``, every
record after it that the tensor's bounded history still holds (resuming after a dropped
connection), else the current extent first. It ends when the client goes (``cancelled``)
or the runtime closes. The Flight action ``watch`` and the HTTP door's Server-Sent Events
(``/watch/<array_id>``) only translate it.

Growth is noticed by a poller: every ``TICK`` seconds, each watched tensor's files are looked
at (``ServingRuntime.refreshed``: one stat of its metadata, growth published in place, a
change that is not growth reopens the source). ``watchfiles`` (inotify) is not installed
here, so polling is the mechanism; it is bounded: only watched tensors are polled, at most
``MAX_POLLED`` a tick. Records are coalesced by the poll: a tensor growing by 10,000 frames a
second makes at most one record a tick. A watcher that never reads holds no queue of its
own: it reads from the tensor's shared history of ``core.growth.KEPT`` records, and the
transport's flow control stops its stream from being produced ahead of it.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from tensor_server.core.json_body import decode_json
from tensor_server.errors import InvalidArgument, TensorServerError

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.service.caller import Caller
    from tensor_server.service.runtime import ServingRuntime

__all__ = ["Watches", "watch_request", "TICK", "MAX_POLLED"]

log = logging.getLogger(__name__)

#: seconds between two looks at a watched tensor (the extent reaches a watcher within it)
TICK = 0.05
#: watched tensors looked at per tick (the rest wait for the next ticks)
MAX_POLLED = 256
#: how long a stream waits for a record before it checks whether its client went
_WAIT = 0.5

_USAGE = 'watch takes {"array_id": "...", "since": <sequence, optional>}'


def watch_request(body: bytes) -> tuple[str, int | None]:
    """(array_id, since) of a watch body (``_USAGE``); refused with the usage otherwise."""
    request = decode_json(body, "watch body") if body else None
    if not isinstance(request, dict) or not isinstance(request.get("array_id"), str):
        raise InvalidArgument(_USAGE)
    since = request.get("since")
    if since is not None and (type(since) is not int or since < 0):
        raise InvalidArgument(f"watch: since must be a non-negative integer sequence; {_USAGE}")
    return request["array_id"], since


class Watches:
    """The watched tensors, their poller, and the streams (module docstring)."""

    def __init__(self, runtime: ServingRuntime) -> None:
        self.runtime = runtime
        self._watched: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._poller: threading.Thread | None = None

    def stream(
        self,
        caller: Caller,
        array_id: str,
        since: int | None,
        cancelled: Callable[[], bool],
        wait: float = _WAIT,
    ) -> Generator[dict[str, Any] | None, None, None]:
        """The records of ``array_id``'s extents after ``since`` (module docstring), and None
        each time ``wait`` seconds passed without one: a door that must not block a thread
        per watcher (the HTTP door's event loop) asks with ``wait=0`` and sleeps between
        asks. The read rule is applied here, before the first record."""
        tensor, echo = self.runtime.tensor(array_id, caller, pixels=False)
        if since is not None and since > tensor.extents.sequence:
            since = None  # numbered by another run of the server: start from the current extent
        return self._records(tensor.array_id, echo, since, cancelled, wait)

    def _records(
        self, array_id: str, echo: str, since: int | None, cancelled: Callable[[], bool], wait: float
    ) -> Generator[dict[str, Any] | None, None, None]:
        self._watch(array_id, +1)
        try:
            while not cancelled() and not self._closed.is_set():
                tensor = self.runtime.catalog.find_tensor(array_id)[0]  # a reopen replaces it
                records = tensor.extents.after(since, wait)
                for sequence, shape in records:
                    yield {"array_id": echo, "shape": list(shape), "sequence": sequence}
                    since = sequence
                if not records:
                    yield None
        finally:
            self._watch(array_id, -1)

    def _watch(self, array_id: str, delta: int) -> None:
        with self._lock:
            self._watched[array_id] += delta
            if self._watched[array_id] <= 0:
                del self._watched[array_id]
            if self._poller is None and self._watched:
                self._poller = threading.Thread(target=self._poll, name="watch-poller", daemon=True)
                self._poller.start()

    def _poll(self) -> None:
        """Look at the watched tensors every ``TICK`` (module docstring)."""
        turn = 0
        while not self._closed.wait(TICK):
            with self._lock:
                watched = sorted(self._watched)
            if not watched:
                continue
            start = turn % len(watched)
            turn += MAX_POLLED
            for array_id in (watched[start:] + watched[:start])[:MAX_POLLED]:
                try:
                    self.runtime.refreshed(self.runtime.catalog.find_tensor(array_id)[0])
                except TensorServerError as exc:  # gone or unreadable: its stream ends or waits
                    log.debug("watch: %s: %s", array_id, exc)
                except Exception:  # the poller's one boundary: one tensor's failure stops no other
                    log.exception("watch: looking at %s failed", array_id)

    def close(self) -> None:
        """End every stream and the poller."""
        self._closed.set()
        if self._poller is not None:
            self._poller.join(timeout=5)
