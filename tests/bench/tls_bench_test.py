"""``python -m tensor_server.bench tls`` (which docs/security.md tells readers to run) imports,
answers ``--help`` and runs its two servers, plaintext and TLS (no timing is asserted: that is
the bench's report)."""

from __future__ import annotations

import tempfile

import pytest

from tensor_server.bench.__main__ import main
from tensor_server.bench.tls import run_tls

_TINY = {"big": ((64, 32), (32, 32)), "small": ((32, 32), (16, 16)), "http": ((64, 64), (32, 32))}


def test_the_command_answers_help(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["tls", "--help"])
    assert exited.value.code == 0
    assert "--rounds" in capsys.readouterr().out


def test_the_bench_reads_every_chunk_over_both_transports(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    rows = run_tls(rounds=2, sets=_TINY)
    assert not list(tmp_path.iterdir()), "the bench left its cache or certificate folders behind"
    assert [(r["case"], r["transport"]) for r in rows] == [
        ("8 MiB DoGet", "plaintext"),
        ("8 MiB DoGet", "TLS"),
        ("64 KiB DoGet", "plaintext"),
        ("64 KiB DoGet", "TLS"),
        ("1 MiB HTTP chunk", "plaintext"),
        ("1 MiB HTTP chunk", "TLS"),
    ]
    chunks = {"8 MiB DoGet": 2, "64 KiB DoGet": 4, "1 MiB HTTP chunk": 4}  # per round, from _TINY
    for r in rows:
        assert r["chunks"] == 2 * chunks[r["case"]]
        assert r["MB_per_s"] > 0
    assert [r["x_plaintext"] for r in rows if r["transport"] == "plaintext"] == [1.0, 1.0, 1.0]
