"""The annotation store on its own: validation, reserved sets, the prune predicate."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from biopb.image.annotation_pb2 import RoiAnnotation
from biopb.image.roi_pb2 import ROI

from tensor_server.catalog.rois import RoiStore
from tensor_server.errors import InvalidArgument


def _polygon(*xy):
    roi = ROI()
    for x, y in xy:
        p = roi.polygon.points.add()
        p.x, p.y = x, y
    return roi


def _ellipse(cx, cy, rx, ry):
    roi = ROI()
    roi.ellipse.center.x, roi.ellipse.center.y = cx, cy
    roi.ellipse.radius.x, roi.ellipse.radius.y = rx, ry
    return roi


@pytest.fixture
def store(tmp_path):
    s = RoiStore(str(tmp_path / "a.duckdb"))
    yield s
    s.close()


def test_geometry_is_validated_and_boxed(store):
    stored, _ = store.put(
        "src/t",
        [
            RoiAnnotation(roi=_polygon((1, 1), (5, 2), (3, 9)), roi_id="tri"),
            RoiAnnotation(roi=_ellipse(10, 10, 4, 2), roi_id="e"),
        ],
        source_url=None,
    )
    assert [r.rev for r in stored] == [1, 1]
    boxes = dict(store._cursor().execute("SELECT roi_id, bbox FROM rois").fetchall())
    assert list(boxes["tri"]) == [1, 1, 5, 9] and list(boxes["e"]) == [6, 8, 14, 12]
    with pytest.raises(InvalidArgument, match="at least 3 points"):
        store.put("src/t", [RoiAnnotation(roi=_polygon((1, 1), (2, 2)))], source_url=None)
    with pytest.raises(InvalidArgument, match="no geometry"):
        store.put("src/t", [RoiAnnotation()], source_url=None)
    with pytest.raises(InvalidArgument, match="duplicate roi_id"):
        store.put("src/t", [RoiAnnotation(roi=_ellipse(1, 1, 1, 1), roi_id="x")] * 2, source_url=None)
    with pytest.raises(InvalidArgument, match="comma"):
        store.put("src/t", [RoiAnnotation(roi=_ellipse(1, 1, 1, 1), roi_id="a,b")], source_url=None)
    # a bad annotation anywhere in a batch writes nothing
    with pytest.raises(InvalidArgument):
        store.put("src/t", [RoiAnnotation(roi=_ellipse(1, 1, 1, 1), roi_id="ok"), RoiAnnotation()], source_url=None)
    assert sorted(r.roi_id for r in store.list("src/t")[0]) == ["e", "tri"]


def test_server_owned_sets_are_read_by_name_and_never_deleted(store):
    store._connection().execute(
        "INSERT INTO rois (roi_id, array_id, source_id, set_name, shape_kind, geometry, rev, created_at) "
        "VALUES ('imp', 'src/t', 'src', '@ome', 'point', '{\"point\": {\"x\": 1, \"y\": 2}}', 1, now())"
    )
    store.put("src/t", [RoiAnnotation(roi=_ellipse(1, 1, 1, 1), roi_id="mine")], source_url=None)
    assert [r.roi_id for r in store.list("src/t")[0]] == ["mine"]  # unqualified: client sets only
    assert [r.roi_id for r in store.list("src/t", "@ome")[0]] == ["imp"]
    assert store.sets("src/t") == [("@ome", 1), ("default", 1)]
    with pytest.raises(InvalidArgument, match="server-owned"):
        store.delete("src/t", ["imp"])
    with pytest.raises(InvalidArgument, match="server-owned"):
        store.put("src/t", [RoiAnnotation(roi=_ellipse(1, 1, 1, 1), roi_id="imp")], source_url=None)
    assert store.delete("src/t") == ["mine"]  # "clear this tensor" leaves the imported set
    assert store.sets("src/t") == [("@ome", 1)]


def test_prune_uses_the_last_sighting(store):
    store.put("seen/t", [RoiAnnotation(roi=_ellipse(1, 1, 1, 1))], source_url="file:///seen.tif")
    store.put("gone/t", [RoiAnnotation(roi=_ellipse(1, 1, 1, 1))], source_url=None)
    old = datetime.now() - timedelta(days=10)
    store._connection().execute(
        "UPDATE rois SET created_at = ?, last_seen_at = CASE WHEN last_seen_at IS NULL THEN NULL ELSE ? END", [old, old]
    )
    store.mark_seen({"seen": "file:///seen.tif"})  # the catalog lists it now
    cut = datetime.now() - timedelta(days=5)
    assert [(u.array_id, u.count, u.source_url) for u in store.unseen(cut)] == [("gone/t", 1, None)]
    assert store.prune(cut) == 1
    assert store.list("gone/t")[0] == [] and len(store.list("seen/t")[0]) == 1


def test_prune_reports_and_deletes_only_what_the_caller_may_read(store):
    """roi_prune is the read rule's too: a granted tensor's annotations are neither reported
    to nor deleted by a caller who may not read it (``hides``, from ``Access.row_view``)."""
    from types import SimpleNamespace

    from tensor_server.catalog.roi_verbs import prune_rois

    for array_id in ("gone/mine", "gone/granted"):
        store.put(array_id, [RoiAnnotation(roi=_ellipse(1, 1, 1, 1))], source_url=None)
    catalog = SimpleNamespace(rois=store, first_scan_done=SimpleNamespace(is_set=lambda: False))
    later = datetime.now() + timedelta(days=10)
    hides = {"gone/granted"}.__contains__
    report = prune_rois(catalog, 5, apply=True, now=later, hides=hides)
    assert [u.array_id for u in report.unseen] == ["gone/mine"] and report.deleted == 1
    assert store.list("gone/mine")[0] == [] and len(store.list("gone/granted")[0]) == 1
    everything = prune_rois(catalog, 5, apply=True, now=later)
    assert [u.array_id for u in everything.unseen] == ["gone/granted"] and everything.deleted == 1
