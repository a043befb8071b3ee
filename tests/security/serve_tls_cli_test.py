"""``serve --tls --http-port 0`` as a user runs it: the printed fingerprint is the one the SDK
pins and ``health`` reports, the printed HTTPS URL carries the access token and reads with the
certificate, ``url`` prints that URL, and the token file goes when the server stops."""

from __future__ import annotations

import os
import re
import ssl
import subprocess
import sys
import time

import numpy as np


def _start(cmd, env):
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if "OME-Zarr over HTTP at" in line:
            break
    return proc, "".join(lines)


def test_serve_with_tls_prints_what_clients_need(tmp_path):
    import httpx
    from biopb.tensor import TensorFlightClient

    np.save(tmp_path / "a.npy", np.arange(12, dtype=np.int32).reshape(3, 4))
    home = tmp_path / "home"
    env = {**os.environ, "TENSOR_SERVER_HOME": str(home), "BIOPB_STATE_HOME": str(tmp_path / "biopb")}
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
        "--san",
        "viewer.lab",
    ]
    proc, out = _start(cmd, env)
    try:
        fingerprint = re.search(r"tls_fingerprint='([0-9a-f]{64})'", out).group(1)
        location = re.search(r"listening on (grpc\+tls://127\.0\.0\.1:\d+)", out).group(1)
        url = re.search(r"OME-Zarr over HTTP at (https://127\.0\.0\.1:(\d+)/t/[\w-]+/)zarr/<array_id>/", out)
        client = TensorFlightClient(location, tls_fingerprint=fingerprint)
        assert client.health_check()["tls_fingerprint"] == fingerprint
        cert = (home / "tls" / "server-cert.pem").read_bytes()
        ctx = ssl.create_default_context(cadata=cert.decode())
        found = subprocess.run(
            [sys.executable, "-m", "tensor_server", "url", str(tmp_path / "a.npy"), "--http-port", url.group(2)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        printed = found.stdout.strip()
        assert printed.startswith(url.group(1) + "zarr/") and printed.endswith("/")
        deadline = time.monotonic() + 60
        while (r := httpx.get(printed + ".zattrs", verify=ctx)).status_code == 404 and time.monotonic() < deadline:
            time.sleep(0.2)  # the scan is still finding the file
        assert r.status_code == 200 and r.json()["multiscales"][0]["datasets"][0]["path"] == "0"
        assert (
            httpx.get(
                printed.replace(url.group(1), url.group(1).split("/t/")[0] + "/") + ".zattrs", verify=ctx
            ).status_code
            == 401
        )  # the same URL without the token
        assert (home / "http" / f"{url.group(2)}.json").exists()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stderr.close()
    assert not (home / "http" / f"{url.group(2)}.json").exists(), "the token file outlived the server"
