"""The command line's terminal output besides the start-up block (``tensor_server/cli_logging.py``):
a warning during the scan is a line of its own, never glued to the progress line (issue 40),
and the request log goes where ``--request-log`` says: a file in the home under ``run``, so
the terminal keeps its links."""

from __future__ import annotations

import io
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tensor_server.cli_banner import BLOCK_END
from tensor_server.cli_logging import ScanProgress, _LineHandler, setup_logging


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def logging_restored():
    """setup_logging changes the process's logging: put it back for the other tests."""
    root, access = logging.getLogger(), logging.getLogger("tensor_server.access")
    saved = (root.handlers[:], root.level, access.handlers[:], access.level, access.propagate)
    yield
    for h in access.handlers:
        if h not in saved[2]:
            h.close()
    root.handlers[:], root.level = saved[0], saved[1]
    access.handlers[:], access.level, access.propagate = saved[2], saved[3], saved[4]


def test_a_warning_clears_the_progress_line_and_takes_a_line_of_its_own():
    term = _Terminal()
    handler = _LineHandler(term)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("tensor_server.tests.progress")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        progress = ScanProgress(term)
        progress("/data/a", 3)
        logger.warning("unreadable source /data/a/bad.tif: no image series in the file")
        progress.last = 0.0  # the next update is due
        progress("/data/b", 4)
        progress.done({"total": 4, "unresolved": 1})
        logger.warning("after the scan")
    finally:
        logger.removeHandler(handler)
    assert term.getvalue() == (
        "\r\x1b[Kscanning: 1 folders, 3 sources  /data/a"
        "\r\x1b[K"  # erased before the warning...
        "unreadable source /data/a/bad.tif: no image series in the file\n"  # ...which is a line of its own
        "\r\x1b[Kscanning: 2 folders, 4 sources  /data/b"
        "\r\x1b[Kscan done: 4 sources (1 unreadable), 2 folders\n"
        "after the scan\n"
    )  # no progress line open: nothing erased


def _request(line: str) -> logging.LogRecord:
    return logging.LogRecord("tensor_server.access", logging.INFO, __file__, 1, line, None, None)


def test_the_request_log_goes_to_a_file_to_stderr_or_nowhere(tmp_path, capsys, logging_restored):
    access = logging.getLogger("tensor_server.access")
    path = tmp_path / "logs" / "requests.log"
    setup_logging("warning", requests=str(path))
    access.handle(_request("request door=http call=catalog_page"))
    logging.getLogger("tensor_server.catalog").warning("a warning")
    assert "call=catalog_page" in path.read_text() and "a warning" not in path.read_text()
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    assert "catalog_page" not in capsys.readouterr().err

    setup_logging("warning", requests="-")
    access.info("request door=http call=zarr_chunk")
    assert "call=zarr_chunk" in capsys.readouterr().err

    setup_logging("info", requests="off")
    access.info("request door=http call=dzi")
    assert "dzi" not in capsys.readouterr().err and "dzi" not in path.read_text()


class _CountedWrites(io.StringIO):
    writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def test_the_request_lines_of_a_batch_are_written_at_once(tmp_path, monkeypatch, logging_restored):
    """``RequestLines`` hands its waiting lines over and flushes: one write for all of them,
    on stderr and in the file (a write per line let go of the interpreter lock per line); a
    record logged on its own is written at once."""
    from tensor_server.service.request_log import RequestLines

    stream = _CountedWrites()
    monkeypatch.setattr(sys, "stderr", stream)
    for where in ("-", str(tmp_path / "requests.log")):
        setup_logging("warning", requests=where)
        handler = logging.getLogger("tensor_server.access").handlers[0]
        if where != "-":
            handler.stream = stream
        stream.writes, lines = 0, RequestLines()
        for i in range(50):
            lines.add({"door": "flight", "call": f"call{i}"})
        lines.flush()
        written = stream.getvalue().splitlines()[-50:]
        assert stream.writes == 1 and [line.rsplit("call=", 1)[1].rstrip('"') for line in written] == [
            f"call{i}" for i in range(50)
        ]
        logging.getLogger("tensor_server.access").info("request door=http call=alone")
        assert stream.writes == 2 and stream.getvalue().rstrip().endswith('call=alone"')


def test_run_logs_requests_to_its_home_and_the_terminal_keeps_the_block(tmp_path):
    import httpx

    root, home = tmp_path / "root", tmp_path / "home"
    root.mkdir()
    np.save(root / "a.npy", np.arange(12, dtype=np.uint16).reshape(3, 4))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensor_server",
            "run",
            str(root),
            "--port",
            "0",
            "--http-port",
            "0",
            "--metrics-port",
            "0",
            "--log-level",
            "info",
        ],
        env={**os.environ, "TENSOR_SERVER_HOME": str(home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True).start()
    log_file = home / "logs" / "requests.log"
    try:
        out = []
        while not out or out[-1].rstrip("\n") != BLOCK_END:
            out.append(proc.stdout.readline())
            assert out[-1], "".join(out)
        assert f"request log   {log_file}\n" in out
        url = re.search(r"^catalog page +(\S+)", "".join(out), re.M).group(1)
        assert httpx.get(url).status_code == 200
        deadline = time.monotonic() + 120
        while "call=catalog_page" not in log_file.read_text():
            assert time.monotonic() < deadline, log_file.read_text()
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
    assert proc.returncode == 0
    assert "tensor_server.access" not in "".join(stderr) and "listening on" in "".join(stderr)
