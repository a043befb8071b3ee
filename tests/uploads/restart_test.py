"""Restart adoption with a real server process killed with SIGKILL mid-upload: READY
tensors come back bit-identical (same content version, so client caches stay valid);
PENDING ones are swept at boot and their names are free again."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from biopb.tensor import TensorFlightClient

_REPO = Path(__file__).resolve().parents[2]


def _start(tmp_path: Path) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(_REPO), str(_REPO / "kernels")]))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensor_server",
            "serve",
            str(tmp_path / "root"),
            "--port",
            "0",
            "--write-dir",
            str(tmp_path / "write"),
            "--writable",
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        m = re.search(r"listening on (grpc://\S+)", line)
        if m:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
            return proc, m.group(1)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError("server did not start")


@pytest.mark.slow
def test_sigkill_mid_upload_then_restart(tmp_path):
    (tmp_path / "root").mkdir()
    rng = np.random.default_rng(3)
    kept = {s: rng.integers(0, 65535, (3, 64, 80), dtype=np.uint16) for s in ("zarr", "cache")}
    big = rng.integers(0, 65535, (128, 256, 256), dtype=np.uint16)
    proc, location = _start(tmp_path)
    try:
        c = TensorFlightClient(location)
        versions = {}
        for scheme, arr in kept.items():
            d = c.setup_array_upload(f"{scheme}://scratch/@fields/kept-{scheme}", arr, chunk_shape=(1, 32, 32))
            assert c.upload_array(d, arr)["state"] == "READY"
            versions[scheme] = d.content_version
        pending = {}
        for scheme in ("zarr", "cache"):  # 512 small cache:// chunks keep the upload in flight
            d = c.setup_array_upload(f"{scheme}://scratch/@fields/inflight-{scheme}", big, chunk_shape=(1, 64, 256))
            pending[scheme] = d
        # zarr: part of the tensor written, the rest never sent; cache: DoPuts still in flight at the kill
        c.upload_array(pending["zarr"], big, slice_hint=(slice(0, 1), slice(None), slice(None)))
        threading.Thread(
            target=lambda: _quietly(TensorFlightClient(location).upload_array, pending["cache"], big), daemon=True
        ).start()
        deadline = time.monotonic() + 60
        while min(c.get_upload_status(d.array_id)["uploaded_chunks"] for d in pending.values()) < 1:
            assert time.monotonic() < deadline, "no chunk landed"
            time.sleep(0.05)
        assert all(c.get_upload_status(d.array_id)["state"] == "PENDING" for d in pending.values())
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    fields = tmp_path / "write" / "fields" / "scratch"
    assert (fields / "inflight-zarr").is_dir() and (fields / "inflight-cache").is_dir()  # the crash left them

    proc, location = _start(tmp_path)
    try:
        c = TensorFlightClient(location)
        for scheme, arr in kept.items():
            got = c.get_array(f"scratch/@fields/kept-{scheme}")
            assert got.dtype == arr.dtype and got.tobytes() == arr.tobytes()
            assert c.get_upload_status(f"scratch/@fields/kept-{scheme}")["state"] == "READY"
            # the same content version: chunk ids, and so every client cache, stay valid
            assert c.get_descriptor(f"scratch/@fields/kept-{scheme}").content_version == versions[scheme]
        for scheme, d in pending.items():
            assert c.get_upload_status(d.array_id)["state"] == "UNKNOWN"
            assert not (fields / f"inflight-{scheme}").exists()
            again = c.setup_array_upload(f"{scheme}://scratch/@fields/inflight-{scheme}", big[:1])  # name is free
            assert again.content_version != d.content_version
        rows = c.query("SELECT tensors FROM sources WHERE source_id = 'scratch'").to_pylist()[0]["tensors"]
        assert sorted(t["array_id"] for t in rows) == ["scratch/@fields/kept-cache", "scratch/@fields/kept-zarr"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _quietly(fn, *args):
    try:
        fn(*args)
    except Exception:
        pass  # the server is killed under it


@pytest.mark.slow
def test_run_prints_an_upload_snippet_that_works(tmp_path):
    """`make run` (python -m tensor_server run): the printed upload snippet, executed as
    printed, uploads, reads back and discards."""
    import numpy as np

    root = tmp_path / "root"
    root.mkdir()
    np.save(root / "a.npy", np.arange(600 * 700, dtype=np.uint16).reshape(600, 700))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(_REPO), str(_REPO / "kernels")]),
        XDG_CACHE_HOME=str(tmp_path / "xdg"),
    )
    env.pop("TENSOR_SERVER_HOME", None)  # the conftest's private home: this test checks the XDG default
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensor_server", "run", str(root), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        lines = []
        deadline = time.monotonic() + 120
        while not any("Ctrl-C stops the server" in ln for ln in lines):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            lines.append(proc.stdout.readline())
        text = "".join(lines)
        snippet = text.split("Upload a result (to the scratch source) and read it back:\n\n", 1)[1]
        snippet = snippet.split("\n\n", 1)[0]
        scope: dict = {}
        exec(compile(snippet, "<printed snippet>", "exec"), scope)
        assert scope["client"].get_upload_status(scope["desc"].array_id)["state"] == "DISCARDED"
        assert (tmp_path / "xdg" / "tensor-server" / "demo-uploads" / "fields").is_dir()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
