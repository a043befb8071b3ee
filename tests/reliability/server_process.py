"""A real ``python -m tensor_server serve`` child process, for tests that must see the process
itself (its exit status after a signal, that it survives a damaged or full cache disk)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["ServerProcess", "serve_process", "can_mount_tmpfs", "TMPFS_WRAPPER"]

# run the server in a private mount namespace with a small tmpfs over the cache folder: a full
# disk for the server only. "$0" is the cache folder, "$1" its size, then a setup command
# (run before the server, inside the namespace), then the server command.
TMPFS_WRAPPER = [
    "unshare",
    "-m",
    "sh",
    "-c",
    'mount -t tmpfs -o size="$1" tmpfs "$0" && sh -c "$2" && shift 2 && exec "$@"',
]


def can_mount_tmpfs(tmp_path) -> bool:
    """True when this process may make a private mount namespace with a tmpfs (root here)."""
    probe = tmp_path / "mount-probe"
    probe.mkdir(exist_ok=True)
    try:
        return (
            subprocess.run(
                TMPFS_WRAPPER + [str(probe), "64k", "true", "true"], capture_output=True, timeout=30
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    location: str
    stderr_lines: list[str] = field(default_factory=list)

    def action(self, kind: str) -> dict:
        import pyarrow.flight as flight

        client = flight.FlightClient(self.location)
        try:
            results = list(client.do_action(flight.Action(kind, b"")))
        finally:
            client.close()
        return json.loads(results[0].body.to_pybytes()) if results else {}

    def wait_serving(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not self.action("health").get("first_scan_done"):
            assert time.monotonic() < deadline, "server never finished its scan"
            time.sleep(0.1)

    @property
    def stderr(self) -> str:
        return "".join(self.stderr_lines)


@contextmanager
def serve_process(
    roots, cache_dir, *, wrapper: list[str] | None = None, timeout: float = 120, extra_args: list[str] = ()
):
    """Start a server on port 0, yield it once it is SERVING; kill it if the test left it running."""
    cmd = [
        sys.executable,
        "-m",
        "tensor_server",
        "serve",
        *map(str, roots),
        "--cache-dir",
        str(cache_dir),
        "--port",
        "0",
        "--log-level",
        "warning",
        "--rescan-seconds",
        "0",
        *extra_args,
    ]
    proc = subprocess.Popen(
        (wrapper or []) + cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    lines: list[str] = []
    found = threading.Event()

    def pump() -> None:
        for line in proc.stderr:
            lines.append(line)
            if "listening on" in line:
                found.set()
        found.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        found.wait(timeout)
        match = re.search(r"listening on (\S+)", "".join(lines))
        assert match, f"server did not start (rc={proc.poll()}):\n{''.join(lines)[-3000:]}"
        server = ServerProcess(proc, match.group(1), lines)
        server.wait_serving(timeout)
        yield server
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
