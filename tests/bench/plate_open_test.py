"""The plate-open bench runs end to end on a tiny plate: the metadata-only writer writes what
it says (every well's fields, no chunk file), and each measured checkout opens it and its
server lists the plate image (values, not timings)."""

from __future__ import annotations

from pathlib import Path

import pytest

import tensor_server
from tensor_server.bench.plate_open import measure
from tensor_server.bench.writers import write_metadata_plate

pytest.importorskip("ome_zarr")

REPO = Path(__file__).resolve().parents[2]


def test_a_metadata_only_plate_is_every_well_and_no_pixel(tmp_path):
    """2 × 3 wells of 2 fields of 2 × 64² with 2 levels: 12 fields, each a stored level at 2;
    only metadata documents on disk; the plate reads as the fill."""
    plate = write_metadata_plate(tmp_path / "plate.ome.zarr", 2, 3, 2, side=64, levels=2)
    assert {p.name for p in plate.rglob("*") if p.is_file()} == {".zgroup", ".zattrs", ".zarray"}
    with tensor_server.open(plate) as src:
        assert len(src.tensors) == 2 * 3 * 2 + 1
        assert [w["path"] for w in src.tensor("plate").metadata["montage"]["wells"]] == [
            "A/1",
            "A/2",
            "A/3",
            "B/1",
            "B/2",
            "B/3",
        ]
        assert src.tensor("B/3/1").shape == (2, 64, 64) and src.tensor("B/3/1").native_levels[0].scale == (1, 2, 2)
        assert not src.tensor("plate").get_data().any()


def test_the_bench_opens_and_lists_the_plate(tmp_path):
    plate = write_metadata_plate(tmp_path / "plates" / "plate.ome.zarr", 2, 3, 2, side=64, levels=2)
    (row,) = measure(plate, [REPO])
    assert row["checkout"] == str(REPO) and row["tensors"] == 13 and row["unreadable"] == ""
    assert row["wall_s"] > 0 and row["cpu_s"] > 0 and row["rss_mb"] > 0
    assert row["listed_s"] > 0 and row["server_rss_mb"] > row["rss_mb"] / 10
