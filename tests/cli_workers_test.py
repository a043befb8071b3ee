"""``serve --workers N`` as a user runs it (cli_workers.py): the processes answer on one HTTP
port, share one chunk cache, a killed worker is restarted while clients retry, SIGTERM stops
every process, and a port in use or a missing --http-port is said before anything starts.
Which process answered a connection is read from the kernel's socket table (psutil), never
from timing."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import psutil
import pytest

from tensor_server.core.identity import source_id_for_path

pytestmark = pytest.mark.slow


class Served:
    """A ``serve --workers 2`` process: its HTTP port, Flight location and stderr lines."""

    def __init__(self, tmp_path, workers: int = 2, extra: tuple[str, ...] = (), root: str | None = None) -> None:
        if root is None:
            data = (np.arange(1024 * 1024, dtype=np.uint32).reshape(1024, 1024) % 65521).astype(np.uint16)
            np.save(tmp_path / "a.npy", data)
            root = str(tmp_path / "a.npy")
        self.array_id = source_id_for_path(root)
        # HOME: add_source allows the user's home (and the roots) by default
        env = {**os.environ, "TENSOR_SERVER_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)}
        cmd = [sys.executable, "-m", "tensor_server", "serve", root, "--port", "0"]
        cmd += ["--http-port", "0", "--no-http-token", "--request-log", "off", "--workers", str(workers), *extra]
        self.proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.lines: list[str] = []
        self.http_port = self.location = self.metrics_url = None
        deadline = time.monotonic() + 120
        while self.http_port is None and time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise AssertionError("the server exited:\n" + "".join(self.lines))
            self.lines.append(line)
            if (m := re.search(r"Prometheus metrics at (\S+)", line)) and self.metrics_url is None:
                self.metrics_url = m.group(1)  # the primary's (a worker does not say its own)
            if m := re.search(r"listening on (grpc://\S+)", line):
                self.location = m.group(1)
            if m := re.search(r"OME-Zarr over HTTP at http://127.0.0.1:(\d+)/", line):
                self.http_port = int(m.group(1))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    def workers(self) -> list[int]:
        pids = []
        for child in psutil.Process(self.proc.pid).children():
            try:
                if "tensor_server" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                    pids.append(child.pid)
            except psutil.NoSuchProcess:
                pass  # exited between the listing and the look
        return pids

    def connection(self) -> tuple[http.client.HTTPConnection, int]:
        """A kept-alive connection and the pid of the process that accepted it."""
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=60)
        conn.connect()
        mine = conn.sock.getsockname()[1]
        deadline = time.monotonic() + 30  # accepted by the process's event loop after the handshake:
        while time.monotonic() < deadline:  # soon, or later on a loaded machine (a fresh worker)
            for pid in [self.proc.pid, *self.workers()]:
                try:
                    held = psutil.Process(pid).net_connections(kind="tcp")
                except psutil.NoSuchProcess:  # a worker that exited after the listing
                    continue
                if any(c.laddr.port == self.http_port and c.raddr and c.raddr.port == mine for c in held):
                    return conn, pid
            time.sleep(0.05)
        raise AssertionError("no server process holds the connection")

    def get(self, path: str, conn: http.client.HTTPConnection | None = None) -> bytes:
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=60)
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read()
        assert response.status == 200, body
        return body

    def cache_stats(self) -> dict:
        import pyarrow.flight as flight

        client = flight.FlightClient(self.location)
        try:
            return json.loads(next(iter(client.do_action(flight.Action("cache_stats", b"")))).body.to_pybytes())
        finally:
            client.close()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


@pytest.fixture
def served(tmp_path):
    server = Served(tmp_path)
    yield server
    server.stop()


def _by_process(served: Served, want: int = 2) -> dict[int, http.client.HTTPConnection]:
    """One kept-alive connection per serving process (the kernel spreads new connections)."""
    held: dict[int, http.client.HTTPConnection] = {}
    for _ in range(64):
        conn, pid = served.connection()
        held.setdefault(pid, conn)
        if len(held) == want:
            return held
    raise AssertionError(f"64 connections reached only {sorted(held)}")


def test_two_processes_answer_on_one_port_and_share_one_cache(served):
    workers = served.workers()
    assert len(workers) == 1
    held = _by_process(served)
    assert sorted(held) == sorted([served.proc.pid, *workers])
    chunk = f"/zarr/{served.array_id}/1/0.0"  # a computed level: cached once made
    through_worker = served.get(chunk, held[workers[0]])
    before = served.cache_stats()
    through_primary = served.get(chunk, held[served.proc.pid])
    after = served.cache_stats()
    assert through_primary == through_worker and len(through_primary) == 512 * 512 * 2
    assert after["pool_stats"]["file"]["peer_hits"] == before["pool_stats"]["file"]["peer_hits"] + 1
    assert after["misses"] == before["misses"] == 0  # the primary computed nothing
    assert after["processes"] == 2 and after["total_entries"] >= 1
    conn = held[workers[0]]
    conn.request("GET", "/zarr/uploaded-elsewhere/.zattrs")
    response = conn.getresponse()
    body = response.read().decode()
    assert response.status == 404 and "this is worker 1 of a `serve --workers 2` server" in body
    assert served.location in body


def test_a_killed_worker_is_restarted_and_retried_requests_succeed(served):
    chunk = f"/zarr/{served.array_id}/0/0.0"
    expected = served.get(chunk)
    (victim,) = served.workers()
    os.kill(victim, signal.SIGKILL)
    bodies = []
    for _ in range(20):  # fresh connections, each retried as a client does on a reset
        for attempt in range(5):
            try:
                bodies.append(served.get(chunk))
                break
            except (ConnectionError, http.client.HTTPException):
                assert attempt < 4
    assert bodies == [expected] * 20
    deadline = time.monotonic() + 60
    while not (served.workers() and served.workers() != [victim]) and time.monotonic() < deadline:
        time.sleep(0.2)
    (replacement,) = served.workers()
    assert replacement != victim
    while not any(f"(pid {replacement}) serving HTTP" in line for line in served.lines):
        assert time.monotonic() < deadline, "".join(served.lines)
        time.sleep(0.2)
    assert any(f"(pid {victim}) exited with -9; restarting it" in line for line in served.lines)
    _by_process(served)  # the replacement takes connections again
    assert served.stop() == 0
    assert not psutil.pid_exists(replacement) or psutil.Process(replacement).status() == psutil.STATUS_ZOMBIE


def test_a_port_in_use_is_said_at_once_and_nothing_is_left_running(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((4, 4)))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "tensor_server", "serve", str(tmp_path / "a.npy"), "--port", "0"]
            + ["--http-port", str(port), "--workers", "2"],
            env={**os.environ, "TENSOR_SERVER_HOME": str(tmp_path / "home")},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}: port in use" in out.stderr.splitlines()[0]
    assert "worker" not in out.stderr  # refused before any worker was started


def test_workers_need_an_http_port_and_more_than_the_cores_is_said(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((4, 4)))
    cmd = [sys.executable, "-m", "tensor_server", "serve", str(tmp_path / "a.npy"), "--port", "0"]
    env = {**os.environ, "TENSOR_SERVER_HOME": str(tmp_path / "home")}
    out = subprocess.run(cmd + ["--workers", "2"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--workers serves HTTP from several processes: it needs --http-port" in out.stderr
    bad = subprocess.run(cmd + ["--workers", "0"], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "expected an integer >= 1 or 'auto', got '0'" in bad.stderr
    with socket.socket() as taken:  # many workers on a taken port: the first line, then the refusal
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        many = subprocess.run(
            cmd + ["--workers", "64", "--http-port", str(port)], env=env, capture_output=True, text=True, timeout=120
        )
    assert many.returncode == 2
    assert f"--workers 64 is more than the {os.cpu_count()} cores" in many.stderr.splitlines()[0]
    assert f"cannot listen on 127.0.0.1:{port}: port in use" in many.stderr


def test_the_primarys_metrics_answer_for_every_process(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    served = Served(tmp_path, extra=("--metrics-port", "0"))
    try:
        held = _by_process(served)
        for conn in held.values():
            served.get(f"/zarr/{served.array_id}/0/0.0", conn)
        with urllib.request.urlopen(served.metrics_url, timeout=30) as response:
            text = response.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}  # one family per name
        counted = {
            s.labels["process"]: s.value
            for s in families["tensor_server_requests"].samples
            if s.labels.get("call") == "zarr_chunk" and s.name.endswith("_total")
        }
        assert counted == {"primary": 1.0, "worker-1": 1.0}
        rss = {s.labels["process"] for s in families["process_resident_memory_bytes"].samples}
        assert rss == {"primary", "worker-1"}
    finally:
        assert served.stop() == 0


def test_workers_stop_when_their_primary_is_killed(tmp_path):
    served = Served(tmp_path)
    (worker,) = served.workers()
    served.proc.kill()  # no drain: the worker sees its stdin close
    served.proc.wait(timeout=30)
    deadline = time.monotonic() + 60
    while psutil.pid_exists(worker) and psutil.Process(worker).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the worker outlived its primary"
        time.sleep(0.2)


def test_a_worker_that_cannot_start_fails_the_start_and_leaves_nothing_running(tmp_path):
    from tensor_server.cache import CacheManager

    np.save(tmp_path / "a.npy", np.zeros((4, 4)))
    held = CacheManager(tmp_path / "home" / "chunks" / "worker-1")  # worker 1's cache folder, taken
    try:
        out = subprocess.run(
            [sys.executable, "-m", "tensor_server", "serve", str(tmp_path / "a.npy"), "--port", "0"]
            + ["--http-port", "0", "--workers", "2"],
            env={**os.environ, "TENSOR_SERVER_HOME": str(tmp_path / "home")},
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        held.close()
    assert out.returncode == 2
    assert "worker-1 is held by another tensor-server" in out.stderr
    assert "serve: worker 1 of 2 did not start (exit code 2; its lines above say why)" in out.stderr
    assert "listening on" not in out.stderr


def _on(served: Served, pid: int) -> http.client.HTTPConnection:
    """A fresh connection the process ``pid`` accepted (a kept-alive one may idle out while
    the other process compiles its first composite)."""
    for _ in range(64):
        conn, holder = served.connection()
        if holder == pid:
            return conn
        conn.close()
    raise AssertionError(f"64 connections never reached process {pid}")


def test_a_render_spec_posted_to_one_process_is_served_by_the_other(served):
    primary, worker = served.proc.pid, served.workers()[0]

    def on(pid: int) -> http.client.HTTPConnection:
        return _on(served, pid)

    ids = []
    for pid, colour in ((primary, "red"), (worker, "green")):  # each process stores one
        conn = on(pid)
        conn.request("POST", "/render", body=json.dumps({"channels": [{"index": 0, "color": colour}]}))
        response = conn.getresponse()
        doc = json.loads(response.read())
        assert response.status == 200, doc
        ids.append(doc["id"])
    for spec_id, other in ((ids[0], worker), (ids[1], primary)):
        assert json.loads(served.get(f"/render/{spec_id}", on(other)))["id"] == spec_id
        tile = served.get(f"/iiif/3/{served.array_id};r={spec_id}/0,0,1024,1024/32,32/0/default.png", on(other))
        assert _channels_lit(tile) == ([True, False, False] if spec_id == ids[0] else [False, True, False])


def _status(conn: http.client.HTTPConnection, path: str) -> tuple[int, bytes]:
    conn.request("GET", path)
    response = conn.getresponse()
    return response.status, response.read()


def _chunk_bytes(data: np.ndarray, zarray: dict) -> bytes:
    """Chunk 0.0 of ``data`` as the OME-Zarr view's ``.zarray`` says it is stored (uncompressed,
    an edge chunk padded with the fill value)."""
    assert zarray["compressor"] is None and zarray["fill_value"] == 0 and len(zarray["chunks"]) == data.ndim
    chunk = np.zeros(zarray["chunks"], np.dtype(zarray["dtype"]))
    region = tuple(slice(0, min(c, n)) for c, n in zip(zarray["chunks"], data.shape))
    chunk[region] = data[region]
    return chunk.tobytes()


def test_uploads_and_added_paths_are_served_by_every_process(tmp_path):
    """A READY upload and an added zarr (both only on the primary's catalog) answer the same
    bytes on every process's HTTP door; discarded and removed, they are a 404 on every one."""
    import zarr
    from biopb.tensor import TensorFlightClient

    served = Served(tmp_path, extra=("--write-dir", str(tmp_path / "write"), "--writable"))
    try:
        client = TensorFlightClient(served.location)
        rng = np.random.default_rng(41)
        uploaded = rng.integers(0, 65535, (96, 160), dtype=np.uint16)
        desc = client.setup_array_upload("zarr://scratch/@fields/shared", uploaded, chunk_shape=(64, 64))
        assert client.upload_array(desc, uploaded)["state"] == "READY"
        added = rng.integers(0, 255, (100, 120), dtype=np.uint8)
        store = zarr.open_array(
            str(tmp_path / "elsewhere" / "dropped.zarr"),
            mode="w",
            shape=added.shape,
            chunks=(64, 64),
            dtype="u1",
            zarr_format=2,
        )
        store[:] = added
        (sid,) = client.register_local_path(str(tmp_path / "elsewhere" / "dropped.zarr")).added
        direct = {"scratch/@fields/shared": uploaded, sid: added}
        for array_id, data in direct.items():  # the primary's own read, over Flight
            np.testing.assert_array_equal(np.asarray(client.get_array(array_id)), data)
        pids = [served.proc.pid, *served.workers()]
        assert len(pids) == 2
        for array_id, data in direct.items():
            for pid in pids:
                conn = _on(served, pid)
                status, body = _status(conn, f"/zarr/{array_id}/0/.zarray")
                assert status == 200, (pid, body)
                zarray = json.loads(body)
                assert zarray["shape"] == list(data.shape)
                status, body = _status(conn, f"/zarr/{array_id}/0/0.0")
                assert status == 200 and body == _chunk_bytes(data, zarray), (pid, status)
        client.set_upload_status("scratch/@fields/shared", "DISCARDED")
        assert list(client.deregister_local_path("dnd://dropped.zarr").removed) == [sid]
        gone = {pid: False for pid in pids}
        deadline = time.monotonic() + 30  # a worker looks at the manifest every second
        while not all(gone.values()) and time.monotonic() < deadline:
            for pid in pids:
                conn = _on(served, pid)
                gone[pid] = all(_status(conn, f"/zarr/{a}/0/.zarray")[0] == 404 for a in direct)
        assert all(gone.values()), gone
    finally:
        served.stop()


def _channels_lit(png: bytes) -> list[bool]:
    import io

    from PIL import Image

    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    return [bool(rgb[..., k].any()) for k in range(3)]
