"""What a server writes under its home is its user's only (issue 38): the catalog, the
annotations, cached pixels, the TLS pair, the HTTP access-token file, the write dir, all
0600 files in 0700 folders, while it serves and after it stops; a home an older server left
open to other users is named at start with the fix."""

from __future__ import annotations

import os
import re
import signal
import ssl
import stat
import subprocess
import sys
import time

import numpy as np

from tensor_server import config


def _open_to_others(home) -> list[str]:
    """Every entry under ``home`` (itself included) with a group or other permission bit."""
    found = []
    for entry in [home, *home.rglob("*")]:
        mode = stat.S_IMODE(entry.lstat().st_mode)
        if mode & 0o077 and not entry.is_symlink():
            found.append(f"{entry.relative_to(home.parent)} {mode:04o}")
    return found


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


def test_a_served_home_holds_nothing_other_users_can_read(tmp_path):
    import httpx

    from tensor_server.core.identity import source_id_for_path

    np.save(tmp_path / "a.npy", np.arange(64 * 64, dtype=np.uint16).reshape(64, 64))
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
        "--http-port",
        "0",
        "--tls",
        "--writable",
        "--write-dir",
        str(home / "results"),
    ]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        out = _stderr_until(proc, "OME-Zarr over HTTP at")
        assert "WARNING" not in out, out
        base = re.search(r"OME-Zarr over HTTP at (https://127\.0\.0\.1:(\d+)/t/[\w-]+/)zarr/", out)
        assert base is not None, out
        trusting = ssl.create_default_context(cadata=(home / "tls" / "server-cert.pem").read_text())
        chunk = f"{base.group(1)}zarr/{source_id_for_path(tmp_path / 'a.npy')}/0/0.0"
        deadline = time.monotonic() + 60
        while (r := httpx.get(chunk, verify=trusting, timeout=10)).status_code == 404 and time.monotonic() < deadline:
            time.sleep(0.2)  # the scan is still finding the file
        assert r.status_code == 200 and len(r.content) == 64 * 64 * 2
        written = {p.relative_to(home).as_posix() for p in home.rglob("*")}
        assert {
            "catalog.duckdb",
            "annotations.duckdb",
            "tls/server-key.pem",
            "tls/server-cert.pem",
            f"http/{base.group(2)}.json",
            "chunks",
            "results",
        } <= written, written
        assert _open_to_others(home) == []
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        proc.stderr.close()
    sealed = {p.name for p in (home / "chunks").iterdir()}
    assert {"seg_0000.arrow", "seg_0000.idx"} <= sealed, sealed  # the chunk read, cached; its index at the stop
    assert _open_to_others(home) == []  # what the stop wrote too


def test_a_home_open_to_other_users_is_named_with_the_fix(tmp_path, monkeypatch):
    umasks: list[int] = []
    monkeypatch.setattr(os, "umask", lambda mask: umasks.append(mask) or 0o022)  # not this test process's
    fresh = tmp_path / "fresh"
    monkeypatch.setenv("TENSOR_SERVER_HOME", str(fresh))
    assert config.keep_home_files_private() == []
    assert umasks == [config.PRIVATE_UMASK] and stat.S_IMODE(fresh.stat().st_mode) == 0o700
    older = tmp_path / "older"
    older.mkdir()
    older.chmod(0o755)
    monkeypatch.setenv("TENSOR_SERVER_HOME", str(older))
    [warning] = config.keep_home_files_private()
    assert f"server home {older} is open to other users (mode 0755)" in warning
    assert warning.endswith(f"Fix: chmod -R go-rwx {older}")
    assert stat.S_IMODE(older.stat().st_mode) == 0o755  # named, not changed: it may be shared on purpose
