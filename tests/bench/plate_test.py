"""The plate bench runs end to end on a tiny plate: every contender answers the overview it
stands for (shapes, not timings), and the table has a row per timing with its target."""

from __future__ import annotations

import pytest

from tensor_server.bench import server_process
from tensor_server.bench.plate import measure, rows_of, write_bench_plate

pytest.importorskip("ome_zarr")


def test_a_tiny_plate_is_measured_by_every_contender(tmp_path, monkeypatch):
    """2 × 3 wells of 2 fields of 2 × 96², levels at 2 and 4: the montage is 200 × 592 (cell
    96, gap 8), its stored level at 4 is 50 × 148 (already one tile: the coarsest published
    level), the IIIF overview its own size; the peers lay out field 0 of each well at their
    level 2 (24²): 48 × 72. Before the warm requests the bench waits for 0.5 s of server
    idleness (2.5 of this test's 11 s); shapes need no settled timings, so 50 ms do."""
    settled: list[int] = []
    wait_idle = server_process.wait_idle

    def settle(pid: int) -> None:
        settled.append(pid)
        wait_idle(pid, quiet_s=0.05)

    monkeypatch.setattr(server_process, "wait_idle", settle)
    plate = write_bench_plate(tmp_path / "plates" / "plate.ome.zarr", 2, 3, 2, 96, 3)
    result = measure(plate, runs=1, levels=3)
    assert len(set(settled)) == 3, "a fresh server per request, each settled before its warm requests"
    assert result["array_id"].endswith("/plate")
    assert result["shapes"] == {
        "iiif": [200, 592],
        "sdk stored": [2, 50, 148],
        "sdk coarsest": [2, 50, 148],
        "ome-zarr-py": [2, 48, 72],
        "napari-ome-zarr": [2, 48, 72],
    }
    assert result["notes"] == []
    rows = {r["what"]: r for r in rows_of(result)}
    timed = ["open", *(f"{n} {s}" for n in ("iiif", "sdk stored", "sdk coarsest") for s in ("cold", "warm"))]
    assert list(rows) == [*timed, "ome-zarr-py", "napari-ome-zarr"]
    assert all(r["median_ms"] > 0 for r in rows.values())
    assert rows["open"]["target"] == "<= 2000 ms" and rows["iiif warm"]["target"] == "<= 100 ms"
    assert rows["sdk stored cold"]["target"] == "<= 0.5x peer" and rows["sdk stored cold"]["vs_peer"].endswith("x")
    assert rows["sdk coarsest cold"]["answer"] == "2x50x148" and rows["iiif cold"]["answer"] == "200x592"
    assert rows["iiif warm"]["vs_peer"] == "" and rows["ome-zarr-py"]["target"] == "peer"
