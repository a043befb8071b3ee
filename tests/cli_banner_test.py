"""What ``run`` and ``serve`` print once they serve (``tensor_server/cli_banner.py``): the
snippets, then the block of links that stays on screen, ending the output (issue 40: the
catalog page was never printed). The wording without a server, then the real command."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tensor_server.cli_banner import BLOCK_END, BLOCK_TITLE, Example, ServingFacts, startup_text

RUN_FACTS = ServingFacts(
    location="grpc://127.0.0.1:8815",
    catalog_url="http://127.0.0.1:8816/t/TOK/",
    metrics_url="http://127.0.0.1:8817/metrics",
    request_log="/home/u/.tensor-server/logs/requests.log",
    list_command="python -m tensor_server list /data",
    example=Example("a-1234", (1, 4, 4), "area", "http://127.0.0.1:8816/t/TOK/zarr/a-1234/"),
    upload=True,
)


def test_the_links_close_the_output_in_a_block():
    lines = startup_text(RUN_FACTS).splitlines()
    block = lines[lines.index(BLOCK_TITLE) :]
    assert block == [
        BLOCK_TITLE,
        "catalog page  http://127.0.0.1:8816/t/TOK/   (open it in a browser)",
        "OME-Zarr      http://127.0.0.1:8816/t/TOK/zarr/a-1234/   (napari-ome-zarr, neuroglancer 'zarr://...', vizarr)",
        "Flight        grpc://127.0.0.1:8815   (the SDK snippet above)",
        "metrics       http://127.0.0.1:8817/metrics   (Prometheus)",
        "request log   /home/u/.tensor-server/logs/requests.log",
        "list          python -m tensor_server list /data",
        BLOCK_END,
    ]
    assert lines[0] == "Read a scaled level with the biopb SDK (pip install 'biopb[tensor]'):"
    assert "level = client.get_array('a-1234', scale_hint=[1, 4, 4], reduction_method='area')" in lines
    assert "Upload a result (to the scratch source) and read it back:" in lines


def test_a_server_without_an_http_door_or_an_example_names_what_it_has():
    facts = ServingFacts(
        location="grpc+tls://10.0.0.5:8815", catalog_url=None, token="s3cret", tls_fingerprint="sha256:ab"
    )
    text = startup_text(facts)
    assert text.splitlines()[0] == "List and read the tensors with the biopb SDK (pip install 'biopb[tensor]'):"
    assert (
        "client = TensorFlightClient('grpc+tls://10.0.0.5:8815', token='s3cret', tls_fingerprint='sha256:ab')" in text
    )
    assert text.splitlines()[-3:] == [
        BLOCK_TITLE,
        "Flight        grpc+tls://10.0.0.5:8815   (the SDK snippet above)",
        BLOCK_END,
    ]
    assert "Upload" not in text and "catalog page" not in text


def _until_block(stream, timeout: float = 180) -> str:
    """What ``stream`` (a child's stdout) says up to the block's last line."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        lines.append(line)
        if line.rstrip("\n") == BLOCK_END:
            break
    return "".join(lines)


@pytest.mark.parametrize("command", ["run", "serve"])
def test_start_up_prints_the_catalog_url_and_it_opens(tmp_path, command):
    import httpx

    root = tmp_path / "root"
    root.mkdir()
    np.save(root / "a.npy", np.arange(64 * 64, dtype=np.uint16).reshape(64, 64))
    env = {**os.environ, "TENSOR_SERVER_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensor_server",
            command,
            str(root),
            "--port",
            "0",
            "--http-port",
            "0",
            "--metrics-port",
            "0",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
    try:
        out = _until_block(proc.stdout)
        assert out.rstrip("\n").endswith(BLOCK_END), out
        url = re.search(r"^catalog page +(http://127\.0\.0\.1:\d+/t/[\w-]+/) ", out, re.M)
        assert url, out
        page = httpx.get(url.group(1))
        assert page.status_code == 200 and "<title>tensor-server</title>" in page.text  # the catalog page
        flight = re.search(r"^Flight +(grpc://127\.0\.0\.1:\d+) ", out, re.M).group(1)
        assert f"TensorFlightClient({flight!r})" in out
        if command == "serve":  # its snippet names no tensor: it runs as printed
            snippet = out.split("(pip install 'biopb[tensor]'):\n\n", 1)[1].split("\n\n", 1)[0]
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(snippet, "<printed snippet>", "exec"), {})
            assert printed.getvalue().splitlines()[-1] == "(64, 64)"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
        proc.stdout.close()
