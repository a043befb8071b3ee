"""What a server started from the command line writes to its terminal besides the start-up
block (``cli_banner``): log records, the request log, and the scan's progress line.

They share stderr, so they are owned together here. The progress line is redrawn in place
(``\\r``) on a terminal; a log record written while it is open would be glued to its end
(issue 40: a bad file's warning was), so the stderr handler clears the line first and the
next progress update draws it again below the record. The request log (one line per
request, logger ``tensor_server.access``) goes where ``--request-log`` says: stderr for
``serve``, a file in the server home for ``run``, so a terminal keeps its links.

Request lines reach these handlers from the service's own thread (``service.request_log.
RequestLines``), never from a request, and a batch of them is written at once: that thread
hands over every line waiting (some 60 at 600 tiles/s) and then calls ``flush``, and the
request-log handlers keep the lines until then. Written one by one, each line was a ``write``
(and for the file an ``lseek``) that let go of the interpreter lock and took it back behind the
requests: 6 SDK clients' warm tiles cost the server 0.14-0.4 ms more CPU each with the request
log on than off (2026-12-05), for lines that cost 12 µs each to make.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

__all__ = ["setup_logging", "ScanProgress", "REQUEST_LOG_OFF", "REQUEST_LOG_STDERR"]

#: ``--request-log`` values that name no file
REQUEST_LOG_OFF = "off"
REQUEST_LOG_STDERR = "-"
#: a request log file is rotated at this size, keeping this many old ones (bounded on disk)
REQUEST_LOG_BYTES = 64 << 20
REQUEST_LOG_BACKUPS = 2

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


class _Batched(logging.Handler):
    """A request-log handler: ``emit`` formats the line and keeps it, ``flush`` writes every
    kept line in one call (``write_batch``). A record that says a flush follows it
    (``flush_follows``: ``RequestLines`` hands over a batch, then flushes) waits for it; any
    other is written at once."""

    pending: list[str]

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.pending.append(self.format(record) + "\n")
        except Exception:  # logging's rule: a record that cannot be formatted never raises
            self.handleError(record)
        if not getattr(record, "flush_follows", False):
            self.flush()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            text, self.pending[:] = "".join(self.pending), []
            if text:
                self.write_batch(text)

    def write_batch(self, text: str) -> None:
        raise NotImplementedError


class _AccessLines(_Batched, _LineHandler):
    """The request log on stderr, a batch of lines at a time."""

    def __init__(self, stream: TextIO) -> None:
        _LineHandler.__init__(self, stream)
        self.pending = []

    def write_batch(self, text: str) -> None:
        with _OpenLine.lock:
            _OpenLine.clear()
            self.stream.write(text)
            self.stream.flush()


class _AccessFile(_Batched, logging.handlers.RotatingFileHandler):
    """The request log file, a batch of lines at a time, rotated once it reaches its size."""

    def __init__(self, path: Path) -> None:
        logging.handlers.RotatingFileHandler.__init__(
            self, path, maxBytes=REQUEST_LOG_BYTES, backupCount=REQUEST_LOG_BACKUPS, encoding="utf-8"
        )
        self.pending = []

    def write_batch(self, text: str) -> None:
        if self.stream is None:  # closed by a rollover's failure or at shutdown: opened again
            self.stream = self._open()
        self.stream.write(text)
        self.stream.flush()
        if self.stream.tell() >= self.maxBytes:
            self.doRollover()


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
        to_stderr = _AccessLines(sys.stderr)
        to_stderr.setFormatter(formatter)
        access.handlers[:] = [to_stderr]
        return
    path = Path(requests)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))  # peers and paths: the user's only
    to_file = _AccessFile(path)
    to_file.setFormatter(formatter)
    access.handlers[:] = [to_file]  # the file only: the terminal keeps the start-up block


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
