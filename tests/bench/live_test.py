"""The live bench runs end to end on tiny frames: every frame the writer wrote reaches both
clients with its own pixels (the bench refuses a frame served before it was written), every
latency is measured from a write that returned before it, and the table has a row per rate
and client with its target (shapes and counts, not timings)."""

from __future__ import annotations

from tensor_server.bench.live import measure, rows_of


def test_a_tiny_acquisition_reaches_both_clients_frame_by_frame(tmp_path):
    results = measure(tmp_path, rates=[10.0, 100.0], seconds=0.5, side=64, chunk=32)
    assert [(r["rate"], r["frames"]) for r in results] == [(10.0, 5), (100.0, 50)]
    for result in results:
        for who in ("sdk watch", "zarr poll", "noticed"):
            assert len(result[who]) == result["frames"], f"{who} at {result['rate']} fps"
            assert min(result[who]) > 0, f"{who}: a frame had before it was written"
        assert all(n <= r for n, r in zip(result["noticed"], result["sdk watch"])), "read after announced"
    rows = rows_of(results)
    assert [(r["rate"].split(" (")[0], r["client"], r["frames"]) for r in rows] == [
        ("10 fps", "sdk watch", "5/5"),
        ("10 fps", "zarr poll", "5/5"),
        ("100 fps", "sdk watch", "50/50"),
        ("100 fps", "zarr poll", "50/50"),
    ]
    assert rows[0]["target"] == "p50 <= 200, p99 <= 500" and rows[1]["target"] == "peer"
    assert all(r["p99_ms"] >= r["p50_ms"] > 0 for r in rows)
