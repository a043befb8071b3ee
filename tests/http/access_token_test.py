"""The HTTP door's access token is kept in ``<home>/http/token`` (0600) across restarts, so a
URL a viewer, a bookmark or a script holds keeps reading (issue 40: a per-run token broke
them at every restart); ``--rotate-http-token`` or deleting the file makes a new one."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time

import numpy as np

from tensor_server.http.access_url import stored_access_token, token_file


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_token_is_kept_private_and_read_again(tmp_path):
    token, why = stored_access_token(tmp_path)
    path = token_file(tmp_path)
    assert why == "none was kept" and path == tmp_path / "http" / "token"
    assert path.read_text() == token + "\n" and len(token) == 32
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    assert stored_access_token(tmp_path) == (token, None)
    assert sorted(p.name for p in path.parent.iterdir()) == ["token"]  # no temporary file left


def test_rotating_or_deleting_makes_a_new_token(tmp_path):
    first, _ = stored_access_token(tmp_path)
    rotated, why = stored_access_token(tmp_path, rotate=True)
    assert rotated != first and why == "asked by --rotate-http-token"
    assert token_file(tmp_path).read_text() == rotated + "\n" and _mode(token_file(tmp_path)) == 0o600
    token_file(tmp_path).unlink()
    fresh, why = stored_access_token(tmp_path)
    assert fresh not in (first, rotated) and why == "none was kept"


def test_a_token_others_could_read_or_a_file_without_one_is_replaced(tmp_path):
    leaked, _ = stored_access_token(tmp_path)
    token_file(tmp_path).chmod(0o644)
    replaced, why = stored_access_token(tmp_path)
    assert replaced != leaked and why == "the kept one was readable by other users (mode 0644)"
    assert _mode(token_file(tmp_path)) == 0o600
    token_file(tmp_path).write_text("not a token!\n")
    again, why = stored_access_token(tmp_path)
    assert again != replaced and why == "the file did not hold one"


def _start(home, root, *extra: str) -> tuple[subprocess.Popen, str, int, str]:
    """A real server on free ports: (its process, its stderr up to the HTTP line, its HTTP
    port, the token in its URLs)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensor_server", "serve", str(root), "--port", "0", "--http-port", "0", *extra],
        env={**os.environ, "TENSOR_SERVER_HOME": str(home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines, deadline = [], time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        if not line or "OME-Zarr over HTTP at" in line:
            break
    found = re.search(r"OME-Zarr over HTTP at http://127\.0\.0\.1:(\d+)/t/([\w-]+)/zarr/", "".join(lines))
    assert found, "".join(lines)
    return proc, "".join(lines), int(found.group(1)), found.group(2)


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=300)
    proc.stderr.close()


def test_a_url_from_before_a_restart_still_reads_and_rotation_retires_it(tmp_path):
    import httpx

    from tensor_server.core.identity import source_id_for_path

    np.save(tmp_path / "a.npy", np.arange(12, dtype=np.uint16).reshape(3, 4))
    home = tmp_path / "home"
    array = source_id_for_path(tmp_path / "a.npy")
    proc, said, port, token = _start(home, tmp_path / "a.npy")
    try:
        assert f"a new HTTP access token (none was kept), kept in {home / 'http' / 'token'}" in said, said
        assert httpx.get(f"http://127.0.0.1:{port}/t/{token}/zarr/{array}/.zattrs").status_code == 200
    finally:
        _stop(proc)
    assert token_file(home).read_text() == token + "\n" and _mode(token_file(home)) == 0o600

    proc, said, port, kept = _start(home, tmp_path / "a.npy")  # a restart (on another free port)
    try:
        assert "a new HTTP access token" not in said and kept == token, said
        reply = httpx.get(f"http://127.0.0.1:{port}/t/{token}/zarr/{array}/.zattrs")  # the URL held before
        assert reply.status_code == 200 and "multiscales" in reply.json()
    finally:
        _stop(proc)

    proc, said, port, rotated = _start(home, tmp_path / "a.npy", "--rotate-http-token")
    try:
        assert "a new HTTP access token (asked by --rotate-http-token)" in said, said
        assert rotated != token and token_file(home).read_text() == rotated + "\n"
        assert httpx.get(f"http://127.0.0.1:{port}/t/{token}/zarr/{array}/.zattrs").status_code == 401
        assert httpx.get(f"http://127.0.0.1:{port}/t/{rotated}/zarr/{array}/.zattrs").status_code == 200
    finally:
        _stop(proc)
