"""What a server started from the command line writes to its terminal besides the start-up
block (``cli_banner``): log records, the request log, and the scan's progress line.

They share stderr, so they are owned together here. The progress line is redrawn in place
(``\\r``) on a terminal; a log record written while it is open would be glued to its end
(issue 40: a bad file's warning was), so the stderr handler clears the line first and the
next progress update draws it again below the record. The request log (one line per
request, logger ``tensor_server.access``) goes where ``--request-log`` says: stderr for
``serve``, a file in the server home for ``run``, so a terminal keeps its links.

Request lines are handed to a thread of their own (``_Queued``): a request only makes its
record and queues it; formatting and the write happen on that thread. Written by each request
itself, under the handler's lock, they were a third of a Flight server's busy time with six
concurrent clients (the lock was contended, and the write blocks). The queue is bounded: a
log that cannot keep up (a stalled terminal or disk) loses lines, counted and said once a
minute, instead of growing the server or holding a request.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

__all__ = ["setup_logging", "flush_request_log", "ScanProgress", "REQUEST_LOG_OFF", "REQUEST_LOG_STDERR"]

#: ``--request-log`` values that name no file
REQUEST_LOG_OFF = "off"
REQUEST_LOG_STDERR = "-"
#: a request log file is rotated at this size, keeping this many old ones (bounded on disk)
REQUEST_LOG_BYTES = 64 << 20
REQUEST_LOG_BACKUPS = 2
#: request lines waiting for the log's thread at most (then lines are dropped and counted)
REQUEST_LOG_QUEUE = 10_000

_ACCESS = "tensor_server.access"


class _KeyValueFormatter(logging.Formatter):
    """One line per record, ``key=value`` pairs: greppable, parseable, quiet."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage().replace('"', "'")
        out = f'ts={self.formatTime(record, "%Y-%m-%dT%H:%M:%S")} level={record.levelname.lower()} logger={record.name} msg="{msg}"'
        if record.exc_info:
            out += " exc=" + repr(self.formatException(record.exc_info))
        return out


class _JsonFormatter(logging.Formatter):
    """One JSON object per line (``--log-format json``); a request line carries its fields."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(getattr(record, "request", None) or {})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class _OpenLine:
    """The progress line a terminal shows unfinished, if any: a record clears it first."""

    lock = threading.Lock()
    stream: TextIO | None = None

    @classmethod
    def clear(cls) -> None:
        """Erase the open line (the caller holds ``lock``); the next progress update redraws it."""
        if cls.stream is not None:
            cls.stream.write("\r\x1b[K")
            cls.stream.flush()
            cls.stream = None


class _LineHandler(logging.StreamHandler):
    """The stderr handler: each record on a line of its own, never after an open progress line."""

    def emit(self, record: logging.LogRecord) -> None:
        with _OpenLine.lock:
            _OpenLine.clear()
            super().emit(record)


class _Queued(logging.handlers.QueueHandler):
    """``target`` on a thread of its own, through a bounded queue (module docstring). The
    record is queued as made: its message is formatted on that thread, not by the request."""

    def __init__(self, target: logging.Handler) -> None:
        super().__init__(queue.Queue(REQUEST_LOG_QUEUE))
        self.listener = logging.handlers.QueueListener(self.queue, target)
        self.listener.start()
        self.dropped = 0
        self._said = 0.0

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1
            if time.monotonic() - self._said > 60:
                self._said = time.monotonic()
                logging.getLogger(__name__).warning(
                    "the request log cannot keep up: %d lines dropped so far", self.dropped
                )

    def flush(self) -> None:
        """Wait until every queued line is written."""
        self.queue.join()  # type: ignore[attr-defined]
        for target in self.listener.handlers:
            target.flush()

    def close(self) -> None:
        self.listener.stop()  # writes what is queued, then ends the thread
        for target in self.listener.handlers:
            target.close()
        super().close()


def flush_request_log() -> None:
    """Wait until the request lines logged so far are written (tests, and a server stopping)."""
    for handler in logging.getLogger(_ACCESS).handlers:
        handler.flush()


def setup_logging(level: str, fmt: str = "text", *, requests: str | None = None) -> None:
    """Log records to stderr at ``level``. ``requests``: where the request log goes (one line
    per request, ``tensor_server.access`` at INFO whatever ``level`` is): a file path,
    ``REQUEST_LOG_STDERR``, or None / ``REQUEST_LOG_OFF`` for nowhere. A file is appended to
    and rotated at ``REQUEST_LOG_BYTES``; an OSError says it cannot be written."""
    formatter = _JsonFormatter() if fmt == "json" else _KeyValueFormatter()
    handler = _LineHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.WARNING))
    access = logging.getLogger(_ACCESS)
    for old in access.handlers:
        old.close()
    access.handlers[:] = []
    access.propagate = True
    if requests in (None, REQUEST_LOG_OFF):
        access.setLevel(logging.WARNING)  # request lines are INFO: none, even at --log-level info
        return
    access.setLevel(logging.INFO)
    access.propagate = False
    if requests == REQUEST_LOG_STDERR:
        to_stderr = _LineHandler(sys.stderr)
        to_stderr.setFormatter(formatter)
        access.handlers[:] = [_Queued(to_stderr)]
        return
    path = Path(requests)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))  # peers and paths: the user's only
    to_file = logging.handlers.RotatingFileHandler(
        path, maxBytes=REQUEST_LOG_BYTES, backupCount=REQUEST_LOG_BACKUPS, encoding="utf-8"
    )
    to_file.setFormatter(formatter)
    access.handlers[:] = [_Queued(to_file)]  # the file only: the terminal keeps the start-up block


class ScanProgress:
    """A one-line progress display in a terminal; periodic plain lines otherwise."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last = 0.0
        self.folders = 0

    def __call__(self, folder: str, sources: int) -> None:
        self.folders += 1
        now = time.monotonic()
        if now - self.last < (0.1 if self.tty else 5.0):
            return
        self.last = now
        with _OpenLine.lock:
            if self.tty:
                short = folder if len(folder) < 60 else "…" + folder[-59:]
                self.stream.write(f"\r\x1b[Kscanning: {self.folders} folders, {sources} sources  {short}")
                _OpenLine.stream = self.stream
            else:  # plain lines, not log records: progress is not a warning, yet must show
                self.stream.write(f"scanning: {self.folders} folders, {sources} sources, at {folder}\n")
            self.stream.flush()

    def done(self, summary: dict) -> None:
        line = f"scan done: {summary['total']} sources ({summary['unresolved']} unreadable), {self.folders} folders"
        with _OpenLine.lock:
            _OpenLine.clear()
            self.stream.write(line + "\n")
            self.stream.flush()
