"""nginx run in the foreground with a configuration ``nginx-config`` printed, its pid, logs and
temporary files under one prefix: how the replicas test and the crowd benchmark put Debian's
nginx in front of replicas on loopback, as docs/deploying.md tells a user to run it."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

__all__ = ["nginx_binary", "running_nginx"]


def nginx_binary() -> str | None:
    """Debian's nginx (``make test`` installs it as it does Chromium); /usr/sbin is not on
    every user's PATH."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")


@contextmanager
def running_nginx(config: str, prefix: Path, ports: Sequence[int], ready_seconds: float = 30.0) -> Iterator[None]:
    """nginx serving ``config`` (written to ``prefix``/nginx.conf), yielded once every port
    in ``ports`` accepts a connection; terminated on exit. Raises ``RuntimeError`` when nginx
    is not installed, exits, or does not listen within ``ready_seconds``."""
    nginx = nginx_binary()
    if nginx is None:
        raise RuntimeError("nginx is not installed (make test installs Debian's nginx with apt; see the Makefile)")
    prefix.mkdir(parents=True, exist_ok=True)
    (prefix / "nginx.conf").write_text(config)
    proc = subprocess.Popen(
        [nginx, "-c", str(prefix / "nginx.conf"), "-p", f"{prefix}/", "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + ready_seconds
        for port in ports:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"nginx exited: {proc.stderr.read() if proc.stderr else ''}")
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"nginx did not listen on {port} within {ready_seconds:.0f} s") from None
                    time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=30)
