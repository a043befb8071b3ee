"""The upload settings: TOML keys, flags, and the CLI's refusal of --writable without a place
to write."""

from __future__ import annotations

import subprocess
import sys

from tensor_server.cli import _settings
from tensor_server.cli_parser import build_parser
from tensor_server.config import load_settings


def test_toml_keys_and_flags(tmp_path):
    cfg = tmp_path / "server.toml"
    cfg.write_text('write_dir = "/data/results"\n[uploads]\nwritable = true\nupload_ttl = 60\nscratch_ttl = 0\n')
    s = load_settings(cfg)
    assert (s.write_dir, s.writable, s.upload_ttl, s.scratch_ttl) == ("/data/results", True, 60, 0)
    args = build_parser().parse_args(["serve", "/r", "--write-dir", "/w", "--writable"])
    s = _settings(args)
    assert (s.write_dir, s.writable) == ("/w", True)
    s = _settings(build_parser().parse_args(["serve", "/r"]))
    assert (s.write_dir, s.writable) == (None, False)


def test_writable_without_write_dir_is_refused(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "tensor_server", "serve", str(tmp_path), "--port", "0", "--writable"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "--writable needs --write-dir" in out.stderr
