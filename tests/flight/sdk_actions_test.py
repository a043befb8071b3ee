"""The catalog verbs through the real biopb SDK: resolve, add/remove a path,
catalog_children, and the ROI annotations (put/list/delete/prune and the ``rois`` table)."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pyarrow.flight as flight
import pytest

from tensor_server.catalog import Catalog
from tensor_server.testing import serving
from tests.flight.conftest import client_for


def _write_tiff(path, data):
    import tifffile

    path.parent.mkdir(parents=True, exist_ok=True)
    tifffile.imwrite(path, data, photometric="minisblack")


@pytest.fixture
def tree(tmp_path):
    """root/a/b/c/{one,two}.tif, root/a/b/d/three.tif, root/top.tif, root/bad.tif (corrupt)."""
    root = tmp_path / "root"
    rng = np.random.default_rng(7)
    for rel in ("a/b/c/one.tif", "a/b/c/two.tif", "a/b/d/three.tif", "top.tif"):
        _write_tiff(root / rel, rng.integers(0, 255, (20, 30), dtype=np.uint8))
    (root / "bad.tif").write_bytes(b"II*\x00" + b"\xff" * 60)
    return root


@pytest.fixture
def served(tree, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # add_source allows the user's home (and the roots) by default
    cat = Catalog([tree], rois_path=str(tmp_path / "rois.duckdb"))
    cat.scan()
    with serving(cat) as srv:
        yield srv, client_for(srv)
    cat.close()


def _sid(client, name):
    rows = client.query(f"SELECT source_id FROM sources WHERE source_url LIKE '%/{name}'", format="records")
    assert len(rows) == 1, rows
    return rows[0]["source_id"]


def test_resolve_after_the_file_is_repaired(served, tree):
    srv, client = served
    sid = _sid(client, "bad.tif")
    row = client.resolve_source(sid)
    assert row["is_resolved"] is False
    assert row["unresolved_reason"]  # the reason travels with the outcome
    with pytest.raises(ValueError, match="resolve_source"):
        client.get_array(sid)  # the SDK steers an unresolved source to resolve_source
    good = np.arange(600, dtype=np.uint16).reshape(20, 30)
    _write_tiff(tree / "bad.tif", good)
    row = client.resolve_source(sid)
    assert row["is_resolved"] is True and row["unresolved_reason"] is None
    assert row["tensors"][0]["shape"] == [20, 30]
    np.testing.assert_array_equal(np.asarray(client.get_array(sid)), good)
    assert client.query(f"SELECT is_resolved FROM sources WHERE source_id = '{sid}'", format="records")[0][
        "is_resolved"
    ]


def test_resolve_unknown_source_is_refused_by_name(served):
    _, client = served
    with pytest.raises(flight.FlightServerError, match="nope"):
        client.resolve_source("nope")


def test_add_and_remove_a_path_outside_the_roots(served, tmp_path):
    srv, client = served
    drop = tmp_path / "elsewhere" / "exp"
    data = np.arange(12 * 10, dtype=np.uint16).reshape(12, 10)
    _write_tiff(drop / "x.tif", data)
    _write_tiff(drop / "sub" / "y.tif", data + 1)
    (drop / "notes.txt").write_text("not an image")
    before = len(client.query("SELECT source_id FROM sources", format="records"))
    result = client.register_local_path(str(drop))
    assert len(result.added) == 2 and not result.failed
    rows = client.query(
        "SELECT source_id, source_url FROM sources WHERE source_url LIKE 'dnd://%' ORDER BY source_url",
        format="records",
    )
    assert [r["source_url"] for r in rows] == ["dnd://exp/sub/y.tif", "dnd://exp/x.tif"]
    x = [r["source_id"] for r in rows if r["source_url"].endswith("x.tif")][0]
    np.testing.assert_array_equal(np.asarray(client.get_array(x)), data)
    # adding it again refreshes, it does not duplicate
    again = client.register_local_path(str(drop))
    assert sorted(again.already_present) == sorted(result.added) and not again.added
    removed = client.deregister_local_path("dnd://exp")
    assert sorted(removed.removed) == sorted(result.added)
    assert len(client.query("SELECT source_id FROM sources", format="records")) == before


def test_add_source_refuses_what_the_server_cannot_read(served, tmp_path, tree):
    _, client = served
    with pytest.raises(flight.FlightServerError, match="no such file"):
        client.register_local_path(str(tmp_path / "missing"))
    with pytest.raises(flight.FlightServerError, match="absolute"):
        client.register_local_path("relative/path")
    nothing = tmp_path / "empty"
    nothing.mkdir()
    res = client.register_local_path(str(nothing))
    assert not res.added and res.failed[0].path == str(nothing.resolve())
    assert "no supported image format" in res.failed[0].reason
    with pytest.raises(flight.FlightServerError, match="dnd://"):
        client.deregister_local_path(tree.as_uri())  # served roots cannot be removed
    with pytest.raises(flight.FlightServerError, match="unknown source_type 'bogus'"):
        client.register_local_path(str(tree), source_type="bogus")


def test_add_source_with_an_explicit_format(served, tmp_path):
    import tifffile

    _, client = served
    ome = tmp_path / "x.ome.tif"
    tifffile.imwrite(ome, np.arange(6, dtype=np.uint8).reshape(2, 3), metadata={"axes": "YX"})
    auto = client.register_local_path(str(ome))
    row = client.query(f"SELECT source_type FROM sources WHERE source_id = '{auto.added[0]}'", format="records")
    assert row[0]["source_type"] == "ome-tiff"
    forced = client.register_local_path(str(ome), source_type="tiff")  # opened by the TIFF adapter
    assert list(forced.refreshed) == list(auto.added) and not forced.failed
    np.testing.assert_array_equal(np.asarray(client.get_array(auto.added[0])), np.arange(6).reshape(2, 3))
    bad = client.register_local_path(str(ome), source_type="nd2")  # the wrong reader: a failed entry
    assert bad.failed[0].path == str(ome) and "nd2" in bad.failed[0].reason
    again = client.register_local_path(str(ome))  # re-adding rebuilds it against the file
    assert not again.failed and np.asarray(client.get_array(auto.added[0])).sum() == 15


def test_add_source_needs_the_token(tree, tmp_path):
    cat = Catalog([tree])
    cat.scan()
    with serving(cat, token="s3cret") as srv:
        with pytest.raises(flight.FlightUnauthenticatedError):
            client_for(srv, token="wrong").register_local_path(str(tmp_path))
    cat.close()


def test_catalog_children_browses_a_nested_tree(served, tree):
    _, client = served
    top = client.catalog_children()
    assert top["truncated"] is False
    # a single root: its contents at the top, the root's own path as the level's
    assert top["key"] == "" and top["path"] == str(tree)
    assert [f["name"] for f in top["folders"]] == ["a/b"]  # a -> b is one chain
    assert [s["name"] for s in top["sources"]] == ["bad.tif", "top.tif"]
    assert top["folders"][0] == {"name": "a/b", "key": "a/b", "path": str(tree / "a" / "b")}
    ab = client.catalog_children(top["folders"][0]["key"])
    assert [f["name"] for f in ab["folders"]] == ["c", "d"] and ab["sources"] == []
    assert ab["path"] == str(tree / "a" / "b") and ab["folders"][0]["key"] == "a/b/c"
    c = client.catalog_children(ab["folders"][0]["key"])
    assert [s["name"] for s in c["sources"]] == ["one.tif", "two.tif"]
    assert c["sources"][0]["source_id"] == _sid(client, "one.tif")
    cut = client.catalog_children("", limit=2)
    assert cut["truncated"] is True and len(cut["folders"]) + len(cut["sources"]) == 2
    # a key nothing has (a folder emptied since it was read) is an empty level, not an error
    gone = client.catalog_children("no/such/folder")
    assert (gone["folders"], gone["sources"], gone["path"]) == ([], [], None)


def test_catalog_children_names_each_root_by_its_last_component(tmp_path):
    """Two roots ending in ``data``: two top folders ``data`` and ``data (2)`` (in the roots'
    order), their full paths in ``path``; no filesystem parent of a root is a folder."""
    rng = np.random.default_rng(3)
    first, second = tmp_path / "a" / "data", tmp_path / "b" / "data"
    _write_tiff(first / "x.tif", rng.integers(0, 255, (8, 8), dtype=np.uint8))
    _write_tiff(second / "plate" / "y.tif", rng.integers(0, 255, (8, 8), dtype=np.uint8))
    cat = Catalog([first, second])
    cat.scan()
    with serving(cat) as srv:
        client = client_for(srv)
        top = client.catalog_children()
        assert top["folders"] == [
            {"name": "data", "key": "data", "path": str(first)},
            {"name": "data (2)/plate", "key": "data (2)/plate", "path": str(second / "plate")},
        ]
        assert top["sources"] == [] and top["path"] is None
        assert [s["name"] for s in client.catalog_children("data")["sources"]] == ["x.tif"]
        assert [s["name"] for s in client.catalog_children("data (2)/plate")["sources"]] == ["y.tif"]
        assert client.catalog_children("data (2)")["path"] == str(second)
    cat.close()


def test_a_drop_never_shares_a_top_folder_with_the_root(served, tree, tmp_path):
    """An added folder named like a folder at the root's top gets its own label, so its
    ``dnd://<label>`` is its top folder's key and the root's folder keeps its key."""
    _, client = served
    drop = tmp_path / "elsewhere" / "a"
    _write_tiff(drop / "z.tif", np.zeros((8, 8), np.uint8))
    added = client.register_local_path(str(drop))
    assert not added.failed and len(added.added) == 1
    top = client.catalog_children()
    assert [f["key"] for f in top["folders"]] == ["a (2)", "a/b"]
    assert top["folders"][0]["path"] is None  # an added path's label is no place on disk
    assert [s["name"] for s in client.catalog_children("a (2)")["sources"]] == ["z.tif"]
    assert list(client.deregister_local_path("dnd://a (2)").removed) == [added.added[0]]
    assert [f["key"] for f in client.catalog_children()["folders"]] == ["a/b"]


def _roi(**kw):
    from biopb.image.annotation_pb2 import RoiAnnotation
    from biopb.image.roi_pb2 import ROI

    roi = ROI()
    if "rect" in kw:
        (x0, y0, x1, y1) = kw.pop("rect")
        roi.rectangle.top_left.x, roi.rectangle.top_left.y = x0, y0
        roi.rectangle.bottom_right.x, roi.rectangle.bottom_right.y = x1, y1
    else:
        x, y = kw.pop("point")
        roi.point.x, roi.point.y = x, y
    return RoiAnnotation(roi=roi, **kw)


def test_rois_put_list_delete_and_query(served, tmp_path):
    srv, client = served
    sid = _sid(client, "top.tif")
    res = client.put_rois(
        sid, [_roi(rect=(1, 2, 5, 9), label="cell", set_name="nuclei"), _roi(point=(3, 4), roi_id="p1", plane={0: 2})]
    )
    assert len(res.stored) == 2 and not res.conflicts
    minted = [r.roi_id for r in res.stored if r.roi_id != "p1"][0]
    assert all(r.rev == 1 for r in res.stored)
    listed = client.list_rois(sid)
    assert sorted(r.roi_id for r in listed.rois) == sorted([minted, "p1"])
    assert {s.set_name: s.count for s in listed.sets} == {"nuclei": 1, "default": 1}
    p1 = [r for r in listed.rois if r.roi_id == "p1"][0]
    assert (p1.roi.point.x, p1.roi.point.y, dict(p1.plane)) == (3, 4, {0: 2})
    # the bare source id and the tensor id file to the same tensor
    assert listed.rois[0].array_id.startswith(sid)
    assert [r.roi_id for r in client.list_rois(sid, "nuclei").rois] == [minted]
    # check_rev: a stale rev is a conflict, not a write
    stale = client.put_rois(sid, [_roi(point=(9, 9), roi_id="p1", rev=7)], check_rev=True)
    assert not stale.stored and stale.conflicts[0].stored_rev == 1
    upd = client.put_rois(sid, [_roi(point=(9, 9), roi_id="p1", rev=1)], check_rev=True)
    assert upd.stored[0].rev == 2
    # the rois table answers the Tensor Browser's SQL
    rows = client.query(
        "SELECT array_id, set_name, count(*) AS n FROM rois GROUP BY array_id, set_name ORDER BY set_name",
        format="records",
    )
    assert [(r["set_name"], r["n"]) for r in rows] == [("default", 1), ("nuclei", 1)]
    bbox = client.query("SELECT bbox, shape_kind FROM rois WHERE set_name = 'nuclei'", format="records")[0]
    assert bbox["bbox"] == [1, 2, 5, 9] and bbox["shape_kind"] == "rectangle"
    # server-owned sets and bad geometry are refused, naming the reason
    with pytest.raises(flight.FlightServerError, match="server-owned"):
        client.put_rois(sid, [_roi(point=(0, 0), set_name="@ome")])
    with pytest.raises(flight.FlightServerError, match="names no known source"):
        client.put_rois("nope", [_roi(point=(0, 0))])
    deleted = client.delete_rois(sid, ["p1"])
    assert list(deleted.deleted) == ["p1"]
    assert client.delete_rois(sid, set_name="nuclei").deleted == [minted]
    assert client.list_rois(sid).rois == []


def test_rois_persist_across_restarts(tree, tmp_path):
    path = str(tmp_path / "keep.duckdb")
    for round_ in range(2):
        cat = Catalog([tree], rois_path=path)
        cat.scan()
        with serving(cat) as srv:
            client = client_for(srv)
            sid = _sid(client, "top.tif")
            if round_ == 0:
                client.put_rois(sid, [_roi(point=(1, 1), roi_id="kept")])
            else:
                assert [r.roi_id for r in client.list_rois(sid).rois] == ["kept"]
        cat.close()


def test_roi_prune_reports_then_deletes_orphans(served, tree, tmp_path):
    srv, client = served
    sid = _sid(client, "top.tif")
    client.put_rois(sid, [_roi(point=(1, 1), roi_id="a"), _roi(point=(2, 2), roi_id="b")])
    gone = _sid(client, "one.tif")
    client.put_rois(gone, [_roi(point=(1, 1), roi_id="c")])
    (tree / "a/b/c/one.tif").unlink()
    srv.runtime.catalog.scan()
    # the orphan's last sighting was a while ago; the live source is stamped by the prune
    store = srv.runtime.catalog.rois
    store._connection().execute(
        "UPDATE rois SET last_seen_at = ?, created_at = ?", [datetime.now() - timedelta(days=40)] * 2
    )
    report = client.prune_rois(30)
    assert [(u.array_id.split("/")[0], u.count) for u in report.unseen] == [(gone, 1)]
    assert report.deleted == 0 and len(client.list_rois(gone).rois) == 1
    applied = client.prune_rois(30, apply=True)
    assert applied.deleted == 1 and client.list_rois(gone).rois == []
    assert len(client.list_rois(sid).rois) == 2
    with pytest.raises(flight.FlightServerError, match="positive"):
        client.prune_rois(0)


def test_upload_puts_on_a_read_only_server_are_refused_clearly(served):
    import pyarrow as pa
    from biopb.tensor.ticket_pb2 import PutCommand

    srv, _ = served
    fc = flight.FlightClient(srv.location)
    desc = flight.FlightDescriptor.for_command(PutCommand(chunk_ticket=b"x").SerializeToString())
    writer, _ = fc.do_put(desc, pa.schema([("a", pa.int8())]))
    with pytest.raises(flight.FlightError, match="read-only: start it with --write-dir"):
        writer.close()
    desc = flight.FlightDescriptor.for_command(b"\xff not a command")
    writer, _ = fc.do_put(desc, pa.schema([("a", pa.int8())]))
    with pytest.raises(flight.FlightError, match="not a PutCommand"):
        writer.close()


def test_health_reports_catalog_generation_and_annotation_persistence(served, tree):
    srv, client = served
    h0 = client.health_check()
    assert h0["annotations_persisted"] is True and h0["registration_pending"] == 0
    sid = _sid(client, "bad.tif")
    client.resolve_source(sid)  # still unreadable: the row is rewritten all the same
    h1 = client.health_check()
    assert h1["catalog_generation"] > h0["catalog_generation"]
    assert client.health_check()["catalog_generation"] == h1["catalog_generation"]  # stable when idle
    srv.runtime.catalog.scan()  # nothing changed on disk
    assert client.health_check()["catalog_generation"] == h1["catalog_generation"]


@pytest.mark.parametrize(
    "kind, body, match",
    [
        ("add_source", b"\xff\xff\xff", "not the SDK's request message"),
        ("roi_prune", b"\x08", "not the SDK's request message"),
        ("catalog_children", b"[1, 2]", "JSON object"),
        ("catalog_children", b'{"key": "", "limit": 0}', "positive integer limit"),
    ],
)
def test_malformed_action_bodies_are_refused_by_name(served, kind, body, match):
    srv, client = served
    fc = flight.FlightClient(srv.location)
    with pytest.raises(flight.FlightServerError, match=match):
        list(fc.do_action(flight.Action(kind, body)))
    assert client.health_check()["status"] == "SERVING"
