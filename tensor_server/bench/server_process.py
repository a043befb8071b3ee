"""A real server process for the benchmarks whose clients must not share its interpreter.

A client in the server's own process competes with it for the GIL (the biopb SDK's Python,
an HTTP client's parsing), which is not what a browser or a notebook costs the server, so the
load and viewport benchmarks run ``python -m tensor_server serve`` as its own process and
talk to it over loopback, as every real client does (the localhost mmap fast path included).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ServerProcess", "cpu_seconds", "server_process", "wait_idle"]


@dataclass(frozen=True)
class ServerProcess:
    pid: int
    location: str  # grpc://127.0.0.1:PORT
    http_url: str  # http://127.0.0.1:PORT (no token)


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (seconds)."""
    import os

    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_idle(pid: int, quiet_s: float = 0.5, limit_s: float = 60.0) -> None:
    """Return once ``pid`` used under 2 % of a core for ``quiet_s`` (its background work,
    such as precaching after a warm-up read, is done), or after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = cpu_seconds(pid)
        time.sleep(quiet_s)
        if cpu_seconds(pid) - before < 0.02 * quiet_s:
            return


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server_process(
    roots: Sequence[Path],
    cache_dir: Path,
    *extra: str,
    ready_seconds: float = 120.0,
    env: dict[str, str] | None = None,
) -> Iterator[ServerProcess]:
    """``serve ROOTS`` with its chunk cache in ``cache_dir`` and an HTTP door without the
    token, yielded once the first scan is done; terminated (killed after 60 s) on exit.
    ``env``: the server's environment (default this one's; an A/B run points ``PYTHONPATH``
    at another checkout)."""
    from biopb.tensor import TensorFlightClient

    port, http_port = _free_port(), _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensor_server",
            "serve",
            *map(str, roots),
            "--port",
            str(port),
            "--cache-dir",
            str(cache_dir),
            "--http-port",
            str(http_port),
            "--no-http-token",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    served = ServerProcess(proc.pid, f"grpc://127.0.0.1:{port}", f"http://127.0.0.1:{http_port}")
    try:
        deadline = time.monotonic() + ready_seconds
        while True:
            try:
                if TensorFlightClient(served.location).health_check().get("first_scan_done"):
                    break
            except Exception:  # not listening yet
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode} before serving")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not finish its first scan within {ready_seconds:.0f} s")
            time.sleep(0.1)
        yield served
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
