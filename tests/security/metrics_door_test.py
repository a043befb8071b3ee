"""The metrics door with TLS under idle and half-open connections (issue 38): a connection
that never starts its TLS handshake, and hundreds that stop half-way, neither freeze the
scrape nor the stop, and the half-sent ones are closed by the header deadline; a served
``serve --tls`` exits on SIGTERM while an idle connection holds its metrics port."""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.config import Settings
from tensor_server.errors import FailedPrecondition
from tensor_server.http.metrics_door import MetricsDoor
from tensor_server.service import ServingRuntime

#: the header deadline the door runs with here (the default is 10 s)
HEADER_SECONDS = 1.0
#: connections that never send a byte (no TLS handshake), and ones that stop mid-header
SILENT, HALF_SENT = 151, 150


@pytest.fixture
def runtime(server_cert):
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(np.zeros((8, 8), np.uint8), "yx"), source_id="img"))
    cat.first_scan_done.set()
    rt = ServingRuntime(cat, Settings(metrics_port=0), tls=server_cert)
    yield rt
    rt.close()
    cat.close()


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (it sends nothing else)."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError):
        return True


def test_silent_and_half_sent_connections_hold_neither_the_scrape_nor_the_stop(runtime, server_cert):
    import httpx

    trusting = ssl.create_default_context(cadata=server_cert.cert_pem.decode())
    door = MetricsDoor(runtime, "127.0.0.1", 0, header_seconds=HEADER_SECONDS)
    opened: list[socket.socket] = []
    try:
        assert door.url.startswith("https://127.0.0.1:") and door.url.endswith("/metrics")
        address = ("127.0.0.1", door.port)
        silent = [socket.create_connection(address, timeout=5) for _ in range(SILENT)]
        opened += silent
        half_sent = []
        for _ in range(HALF_SENT):
            sock = trusting.wrap_socket(socket.create_connection(address, timeout=5), server_hostname="127.0.0.1")
            opened.append(sock)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the headers never end
            half_sent.append(sock)

        t0 = time.monotonic()
        resp = httpx.get(door.url, verify=trusting, timeout=10)
        assert resp.status_code == 200 and time.monotonic() - t0 < 5
        assert re.search(r"^tensor_server_catalog_sources 1\.0$", resp.text, re.MULTILINE)
        assert httpx.get(door.url.replace("/metrics", "/other"), verify=trusting, timeout=10).status_code == 404

        deadline = time.monotonic() + HEADER_SECONDS + 10
        closed = sum(_closed_by_server(s, max(0.05, deadline - time.monotonic())) for s in half_sent)
        assert closed == HALF_SENT  # by the header deadline: the door is still serving

        t0 = time.monotonic()
        door.stop()  # the silent connections are still open, mid-handshake
        assert time.monotonic() - t0 < 5
        assert not door._front._thread.is_alive()
    finally:
        door.stop()
        for sock in opened:
            sock.close()


def test_off_loopback_the_door_needs_tls_as_every_door_does(server_cert):
    cat = Catalog([])
    rt = ServingRuntime(cat, Settings(metrics_port=0, metrics_host="0.0.0.0", token="s3cret"))
    try:
        with pytest.raises(FailedPrecondition, match="without TLS"):
            MetricsDoor(rt)
    finally:
        rt.close()
        cat.close()


def _stderr_until(proc: subprocess.Popen, marker: str, timeout: float = 90) -> str:
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if marker in line:
            break
    return "".join(lines)


def test_sigterm_stops_a_tls_server_while_an_idle_connection_holds_its_metrics_port(tmp_path):
    import httpx

    np.save(tmp_path / "a.npy", np.arange(12, dtype=np.int32).reshape(3, 4))
    home = tmp_path / "home"
    env = {**os.environ, "TENSOR_SERVER_HOME": str(home)}
    cmd = [
        sys.executable,
        "-m",
        "tensor_server",
        "serve",
        str(tmp_path / "a.npy"),
        "--port",
        "0",
        "--tls",
        "--metrics-port",
        "0",
    ]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    idle = None
    try:
        out = _stderr_until(proc, "listening on")
        url = re.search(r"Prometheus metrics at (https://127\.0\.0\.1:(\d+)/metrics)", out)
        assert url is not None, out
        trusting = ssl.create_default_context(cadata=(home / "tls" / "server-cert.pem").read_text())
        assert httpx.get(url.group(1), verify=trusting, timeout=10).status_code == 200
        idle = socket.create_connection(("127.0.0.1", int(url.group(2))), timeout=5)  # sends nothing
        time.sleep(0.5)  # accepted by now
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        assert time.monotonic() - t0 < 10
        assert code == 0  # the Ctrl-C path: doors stopped, the cache sealed
    finally:
        if idle is not None:
            idle.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stderr.close()
