"""The share bench answers every chunk with each credential (a refused one stops it) and
prints a row for each, then the GeoJSON timings."""

from __future__ import annotations

import argparse

from tensor_server.bench import share


def test_the_bench_reads_with_every_credential(capsys):
    assert share.main(argparse.Namespace(rounds=1, rois=20)) == 0
    out = capsys.readouterr().out
    rows = [line.split()[0:2] for line in out.splitlines() if line.startswith("  ")]
    assert rows == [["server", "token"], ["share", "link"], ["OIDC", "JWT"]]
    assert "GeoJSON export of 20 octagons" in out and "GeoJSON import of 20 " in out
