"""Issue 23 finding 5 (and 8's roi_prune overflow): ROI requests are bounded below the door.

Driven through ``catalog/roi_verbs.py``, the functions every door calls: the target is checked
before the stream is read, sizes are refused before rows are decoded, coordinates are finite,
a batch of the documented maximum lands in one bulk write."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from biopb.image.annotation_pb2 import RoiAnnotation
from biopb.image.roi_pb2 import ROI
from biopb.tensor._roi_rows import roi_ids_to_table, rois_to_table

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.catalog.roi_verbs import delete_rois, prune_rois, put_rois, read_rois
from tensor_server.catalog.rois import MAX_ROIS_PER_TENSOR, RoiLimits
from tensor_server.errors import InvalidArgument, RequestTooLarge


def _polygon(n: int, off: float = 0.0) -> ROI:
    roi = ROI()
    t = np.linspace(0, 2 * math.pi, n, endpoint=False)
    for x, y in zip(50 + 20 * np.cos(t) + off, 50 + 20 * np.sin(t)):
        p = roi.polygon.points.add()
        p.x, p.y = x, y
    return roi


class _Pulls:
    """An iterator of record batches that counts how many were taken."""

    def __init__(self, batches):
        self.batches, self.pulled = list(batches), 0

    def __iter__(self):
        for b in self.batches:
            self.pulled += 1
            yield b


def _batches(rois):
    return rois_to_table(rois).to_batches()


@pytest.fixture
def catalog(tmp_path):
    cat = Catalog([], rois_path=str(tmp_path / "rois.duckdb"))
    cat.add_source(MemorySource({"img": ArrayAdapter(np.zeros((100, 100), np.uint8), "yx")}, source_id="src"))
    cat.first_scan_done.set()
    yield cat
    cat.close()


def test_a_write_to_an_invented_tensor_id_is_refused_before_the_stream_is_read(catalog):
    stream = _Pulls(_batches([RoiAnnotation(roi=_polygon(4))]))
    with pytest.raises(InvalidArgument, match="names no tensor"):
        put_rois(catalog, "src/anything-at-all", stream)
    with pytest.raises(InvalidArgument, match="no known source"):
        put_rois(catalog, "nosuch/img", stream)
    assert stream.pulled == 0
    assert catalog.rois.table().num_rows == 0


def test_the_request_stream_is_taken_within_its_byte_budget(catalog):
    catalog.rois.limits = RoiLimits(max_request_bytes=64 << 10)
    many = [RoiAnnotation(roi=_polygon(200, i)) for i in range(200)]
    batches = [b for r in many for b in _batches([r])]  # one row per batch, ~5 KB each
    stream = _Pulls(batches)
    with pytest.raises(RequestTooLarge, match="more than 65536 bytes"):
        put_rois(catalog, "src/img", stream)
    assert stream.pulled < len(batches) // 4  # stopped at the budget, not at the end
    assert catalog.rois.table().num_rows == 0


def test_a_million_point_polygon_is_refused_before_it_is_decoded(catalog):
    xy = ",".join('{"x":1.5,"y":2.5}' for _ in range(1_000_000))
    row = rois_to_table([RoiAnnotation(roi=_polygon(3))]).to_pylist()[0]
    row["geometry"] = '{"polygon":{"points":[' + xy + "]}}"
    table = pa.Table.from_pylist([row], schema=rois_to_table([]).schema)
    with pytest.raises(RequestTooLarge, match="geometry of .* characters is above the limit"):
        put_rois(catalog, "src/img", table.to_batches())
    # and one just past the per-shape cap that does get decoded is refused by its count
    catalog.rois.limits = RoiLimits(max_points_per_shape=100)
    with pytest.raises(RequestTooLarge, match="polygon of 101 points is above the limit of 100"):
        put_rois(catalog, "src/img", _batches([RoiAnnotation(roi=_polygon(101))]))
    assert catalog.rois.table().num_rows == 0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_coordinates_are_refused(catalog, bad):
    roi = _polygon(5)
    roi.polygon.points[2].y = bad
    point = ROI()
    point.point.x, point.point.y = 1.0, bad
    for shape in (roi, point):
        with pytest.raises(InvalidArgument, match="NaN or infinite coordinate"):
            put_rois(catalog, "src/img", _batches([RoiAnnotation(roi=shape)]))
    assert catalog.rois.table().num_rows == 0


@pytest.mark.parametrize("field", ["label", "props_json"])
def test_text_fields_are_capped(catalog, field):
    big = "x" * (RoiLimits().max_props_json_chars + 1)
    with pytest.raises(RequestTooLarge, match=f"{field} of {len(big)} characters"):
        put_rois(catalog, "src/img", _batches([RoiAnnotation(roi=_polygon(3), **{field: big})]))


def test_a_delete_of_a_million_ids_is_refused(catalog):
    ids = roi_ids_to_table([f"r{i}" for i in range(1_000_000)])
    with pytest.raises(RequestTooLarge, match=f"1000000 rows in one request, above the limit of {MAX_ROIS_PER_TENSOR}"):
        delete_rois(catalog, "src/img", ids.to_batches(max_chunksize=100_000))


def test_a_full_batch_lands_in_one_bulk_write_and_reads_back(catalog):
    rois = [RoiAnnotation(roi_id=f"r{i}", roi=_polygon(6, i), label="cell") for i in range(MAX_ROIS_PER_TENSOR)]
    reply = put_rois(catalog, "src/img", _batches(rois))
    assert len(reply.stored) == MAX_ROIS_PER_TENSOR and {r.rev for r in reply.stored} == {1}
    again = put_rois(catalog, "src/img", _batches(rois[:3]))
    assert [r.rev for r in again.stored] == [2, 2, 2]
    table = read_rois(catalog, "src/img")
    assert table.num_rows == MAX_ROIS_PER_TENSOR and table.schema.metadata[b"truncated"] == b"False"
    assert sorted(table.column("roi_id").to_pylist()[:2]) == ["r0", "r1"]
    deleted = delete_rois(catalog, "src/img", roi_ids_to_table(["r0", "r5"]).to_batches())
    assert sorted(deleted.deleted) == ["r0", "r5"]


def test_a_listing_is_bounded_in_size_and_says_it_was_truncated(catalog):
    catalog.rois.limits = RoiLimits(max_list_chars=20_000)
    put_rois(catalog, "src/img", _batches([RoiAnnotation(roi_id=f"r{i}", roi=_polygon(100, i)) for i in range(20)]))
    table = read_rois(catalog, "src/img")
    assert 1 <= table.num_rows < 20
    assert table.schema.metadata[b"truncated"] == b"True"


@pytest.mark.parametrize("days", [2**31 - 1, 2**63 - 1, 0, -1, True])
def test_roi_prune_refuses_days_out_of_range(catalog, days):
    with pytest.raises(InvalidArgument, match="unseen_days"):
        prune_rois(catalog, days)


def test_roi_prune_in_range_reports_nothing_unseen(catalog):
    put_rois(catalog, "src/img", _batches([RoiAnnotation(roi=_polygon(3))]))
    assert list(prune_rois(catalog, 36_500, apply=True).unseen) == []
