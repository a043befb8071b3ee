"""The request log: one line per request, written off the request path.

``service/metrics.py`` ends each request by handing its fields here (``REQUEST_LINES.add``);
the records reach ``ACCESS_LOG``'s handlers, which the command line chooses
(``cli_logging.py``: stderr, a file, or none), from a thread of this module's own.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import deque
from typing import Any

__all__ = ["ACCESS_LOG", "REQUEST_LINES", "RequestLines"]

#: the request log's logger: one INFO line per request (the command line turns it on)
ACCESS_LOG = logging.getLogger("tensor_server.access")


class _RequestLine:
    """A request's ``key=value`` text, made when the line is written, not by the request."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.fields.items() if v not in (None, ""))


class RequestLines:
    """The request log's lines on their way to ``ACCESS_LOG``'s handlers (the command line
    chooses them), off the request path: a request appends its fields to a bounded deque (no
    lock, no wake-up); a thread of its own makes the log records and hands them over every
    ``PERIOD_S``. Logged by each request itself, a line cost it 108 µs of CPU under the GIL
    (record, caller lookup, queue, formatting), 5 to 15 % of a warm tile. A log that cannot keep
    up (a stalled terminal or disk) loses lines, counted and said once a minute, rather than
    grow the server or hold a request."""

    #: lines waiting at most; then a request's line is dropped and counted
    LIMIT = 10_000
    PERIOD_S = 0.05

    def __init__(self) -> None:
        self._lines: deque[tuple[float, dict[str, Any]]] = deque()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self.dropped = 0
        self._said = 0.0

    def add(self, fields: dict[str, Any]) -> None:
        if len(self._lines) >= self.LIMIT:
            self.dropped += 1
            return
        self._lines.append((time.time(), fields))
        if self._thread is None:
            self._start()

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tensor-server-request-log", daemon=True)
                self._thread.start()
                atexit.register(self.flush)

    def _run(self) -> None:
        while True:
            time.sleep(self.PERIOD_S)
            self.flush()

    def flush(self) -> None:
        """Hand every waiting line to the log's handlers now (the thread does it every
        ``PERIOD_S``; tests and a stopping server call it)."""
        with self._write_lock:
            while self._lines:
                created, fields = self._lines.popleft()
                record = ACCESS_LOG.makeRecord(
                    ACCESS_LOG.name,
                    logging.INFO,
                    __file__,
                    0,
                    "request %s",
                    (_RequestLine(fields),),
                    None,
                    extra={"request": fields, "flush_follows": True},  # cli_logging writes the batch at once
                )
                record.created, record.msecs = created, (created % 1) * 1000
                ACCESS_LOG.handle(record)
            for handler in ACCESS_LOG.handlers:  # the batch written at once (cli_logging)
                handler.flush()
            if self.dropped and time.monotonic() - self._said > 60:
                self._said = time.monotonic()
                logging.getLogger(__name__).warning(
                    "the request log cannot keep up: %d lines dropped so far", self.dropped
                )


#: the process's request lines (``ACCESS_LOG`` is the process's too)
REQUEST_LINES = RequestLines()
