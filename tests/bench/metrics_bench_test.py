"""The metrics bench runs its two servers and times every request it says it does (no
timing is asserted: that is the bench's report)."""

from __future__ import annotations

import tempfile

from tensor_server.bench.metrics import run_metrics


def test_the_bench_times_both_doors_on_both_servers(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    rows = run_metrics(requests=6, rounds=2)
    assert not list(tmp_path.iterdir()), "the bench left its cache folders behind"
    assert [r["door"] for r in rows] == ["flight", "http"]
    for r in rows:
        assert r["requests"] == 12
        assert r["p50_on_ms"] > 0 and r["p50_off_ms"] > 0
        assert r["ratio_p50"] == r["p50_on_ms"] / r["p50_off_ms"]
