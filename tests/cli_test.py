from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tensor_server.cli import main
from tensor_server.config import load_settings
from tensor_server.errors import InvalidArgument


def test_version(capsys):
    assert main(["version"]) == 0
    import tensor_server

    assert capsys.readouterr().out.strip() == tensor_server.__version__


def test_list_prints_sources_and_tensors(tmp_path, capsys):
    np.save(tmp_path / "stack.npy", np.zeros((4, 5, 6), np.uint16))
    (tmp_path / "broken.npy").write_bytes(b"\x93NUMPY")
    assert main(["list", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[npy]" in out and "4x5x6 zyx <u2" in out and "UNREADABLE" in out


def test_config_file_then_flags(tmp_path):
    cfg = tmp_path / "server.toml"
    cfg.write_text('roots = ["/data"]\nport = 9000\n[cache]\nmax_bytes = 1024\n[pyramid]\nplane_budget_px = 65536\n')
    s = load_settings(cfg, port=9100, roots=[])
    assert s.roots == ["/data"] and s.port == 9100 and s.cache_max_bytes == 1024 and s.plane_budget_px == 65536
    cfg.write_text('[annotations]\npath = "/data/rois.duckdb"\n')
    assert load_settings(cfg).rois_path == "/data/rois.duckdb"
    assert load_settings(cfg, rois_path="/elsewhere.duckdb").rois_path == "/elsewhere.duckdb"  # the flag wins
    cfg.write_text("[cache]\nsize = 3\n")
    with pytest.raises(InvalidArgument, match="unknown config keys"):
        load_settings(cfg)
    cfg.write_text("port = = 3")
    with pytest.raises(InvalidArgument, match="cannot read config"):
        load_settings(cfg)


def test_serve_refuses_public_bind_without_token(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tensor_server",
            "serve",
            str(tmp_path),
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--insecure",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TENSOR_SERVER_HOME": str(tmp_path / "home")},
    )
    assert out.returncode == 2 and "needs --token" in out.stderr


def test_serve_without_roots_is_an_error():
    out = subprocess.run([sys.executable, "-m", "tensor_server", "serve"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "ROOT" in out.stderr


def test_serve_reports_a_busy_port(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "tensor_server",
                "serve",
                str(tmp_path),
                "--port",
                str(port),
                "--cache-dir",
                str(tmp_path / "cache"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2 and "port in use" in out.stderr


def test_a_second_server_gets_its_own_cache_and_annotation_files(tmp_path):
    """Two servers with default folders: the second takes ``chunks-<n>``,
    ``annotations-<n>.duckdb`` and ``catalog-<n>.duckdb`` instead of failing on the first one's locks; a folder given
    with a flag that is taken is a clear error naming the flag."""
    import os
    import time

    np.save(tmp_path / "a.npy", np.arange(12).reshape(3, 4))
    home = tmp_path / "home"
    env = {**os.environ, "TENSOR_SERVER_HOME": str(home)}
    cmd = [sys.executable, "-m", "tensor_server", "serve", str(tmp_path / "a.npy"), "--port", "0"]
    procs = []

    def start(extra=()):
        p = subprocess.Popen(cmd + list(extra), env=env, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = p.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "listening on" in line:
                return "".join(lines)
        p.wait(timeout=10)
        return "".join(lines) + p.stderr.read()

    try:
        first = start()
        assert "listening on" in first and "held by another" not in first
        second = start()
        assert "listening on" in second
        assert f"{home / 'chunks'} is held by another tensor-server; using {home}/chunks-" in second
        assert f"{home / 'annotations.duckdb'} is held by another tensor-server; using {home}/annotations-" in second
        assert f"{home / 'catalog.duckdb'} is held by another tensor-server; using {home}/catalog-" in second
        assert "kept in memory only" not in first + second  # each keeps its catalog across restarts
        assert len(list(home.glob("catalog-*.duckdb"))) == 1
        third = start(["--cache-dir", str(home / "chunks")])
        assert procs[-1].returncode == 2 and "pass another --cache-dir" in third
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=20)
            p.stderr.close()


def test_read_workers_from_config_and_flag(tmp_path, capsys):
    from tensor_server.cli import _settings
    from tensor_server.cli_parser import build_parser

    cfg = tmp_path / "server.toml"
    cfg.write_text("[read]\nworkers = 3\n")
    assert load_settings(cfg).read_workers == 3
    assert load_settings().read_workers == 0  # absent: 0 = the machine's cores
    args = build_parser().parse_args(["serve", "/data", "--config", str(cfg), "--read-workers", "5"])
    assert _settings(args).read_workers == 5  # the flag overrides the file
    cfg.write_text("[read]\nworkers = -2\n")
    with pytest.raises(InvalidArgument, match="read workers"):
        load_settings(cfg)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "/data", "--read-workers", "-1"])
    assert "expected an integer >= 0" in capsys.readouterr().err


def test_serve_refuses_public_plaintext_and_says_why(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tensor_server",
            "serve",
            str(tmp_path),
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--token",
            "t",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TENSOR_SERVER_HOME": str(tmp_path / "home")},
    )
    assert out.returncode == 2
    assert "without TLS" in out.stderr and "cleartext" in out.stderr and "--insecure" in out.stderr


def test_list_prints_skipped_files_with_reasons_and_totals(tmp_path, capsys):
    np.save(tmp_path / "stack.npy", np.zeros((4, 5), np.uint16))
    (tmp_path / "broken.npy").write_bytes(b"\x93NUMPY")
    (tmp_path / "a.zip").write_bytes(b"PK\x03\x04")
    (tmp_path / "b.zip").write_bytes(b"PK\x03\x04")
    os.mkfifo(tmp_path / "pipe.npy")
    assert main(["list", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"SKIPPED  {tmp_path / 'a.zip'}: no format recognises this file" in out
    assert f"SKIPPED  {tmp_path / 'b.zip'}: no format recognises" in out
    assert f"SKIPPED  {tmp_path / 'pipe.npy'}: not a regular file" in out
    assert out.rstrip().endswith(
        "2 sources (1 readable, 1 unreadable), 1 tensors; 3 files skipped (2 not a known format, 1 refused)"
    )


def test_a_missing_root_is_an_error_or_a_warning(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.zeros(3))
    assert main(["list", str(tmp_path / "nope")]) == 2
    assert f"list: no such folder or file: {tmp_path / 'nope'}" in capsys.readouterr().err
    assert main(["list", str(tmp_path), str(tmp_path / "nope")]) == 0
    captured = capsys.readouterr()
    assert f"list: WARNING: root {tmp_path / 'nope'} does not exist" in captured.err
    assert f"SKIPPED  {tmp_path / 'nope'}: the root does not exist" in captured.out
    out = subprocess.run(
        [sys.executable, "-m", "tensor_server", "serve", str(tmp_path / "nope"), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and f"serve: no such folder or file: {tmp_path / 'nope'}" in out.stderr


def test_url_of_a_missing_path_exits_non_zero(tmp_path, capsys):
    assert main(["url", str(tmp_path / "missing.nd2")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert main(["url", "image.nd2"]) == 2  # a file name, not an id
    capsys.readouterr()
    assert main(["url", "cells-1a2b3c4d/image"]) == 0  # an array id passes through
    assert capsys.readouterr().out == "http://127.0.0.1:8816/zarr/cells-1a2b3c4d/image/\n"


def test_log_level_is_validated():
    assert load_settings(log_level="INFO").log_level == "info"
    with pytest.raises(
        InvalidArgument, match="log level must be one of debug, info, warning, error, critical; got 'bogus'"
    ):
        load_settings(log_level="bogus")
    out = subprocess.run(
        [sys.executable, "-m", "tensor_server", "serve", "/tmp", "--log-level", "bogus", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and out.stderr.startswith("serve: log level must be one of")


@pytest.mark.parametrize(
    "flag, make_var", [("--port", "PORT"), ("--http-port", "HTTP_PORT"), ("--metrics-port", "METRICS_PORT")]
)
def test_a_busy_port_is_said_first_and_plainly(tmp_path, flag, make_var):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        ports = {"--port": "0", "--http-port": "0", "--metrics-port": "0", flag: str(port)}
        out = subprocess.run(
            [sys.executable, "-m", "tensor_server", "serve", str(tmp_path), *[a for kv in ports.items() for a in kv]],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"serve: cannot listen on 127.0.0.1:{port}: port in use (another tensor-server, "
        f"or another program). Pass {flag} N (0 picks a free one), or with make: "
        f"make run {make_var}=N"
    ]


@pytest.mark.parametrize("command", ["list", "serve", "url"])
def test_usage_names_the_installed_command(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`tensor-server list` once printed its usage as `python -m tensor_server list` (issue 40)."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert capsys.readouterr().out.startswith(f"usage: tensor-server {command}")
