"""Annotations as GeoJSON (issue 45): every stored ROI kind survives export then import
exactly, a file as QuPath writes it imports with its geometry, and each bad body is refused
whole, naming why, within bounded memory and time."""

from __future__ import annotations

import json
import math
import time
from types import SimpleNamespace

import pytest
from biopb.image.annotation_pb2 import RoiAnnotation
from biopb.image.roi_pb2 import ROI

from tensor_server.catalog.roi_geojson import (
    ELLIPSE_VERTICES,
    MAX_GEOJSON_BYTES,
    ImageFrame,
    feature_collection,
    rois_from_geojson,
)
from tensor_server.catalog.rois import RoiStore
from tensor_server.errors import InvalidArgument, RequestTooLarge

#: a 3-D image, 600 wide and 400 high, with 5 z planes (axes z, y, x)
FRAME = ImageFrame.of(SimpleNamespace(array_id="src/img", shape=(5, 400, 600), dim_labels=("z", "y", "x")))


def _ann(roi_id: str, **kw) -> RoiAnnotation:
    roi = ROI()
    for path, value in kw.pop("geometry").items():
        target = roi
        *parents, leaf = path.split(".")
        for name in parents:
            target = getattr(target, name)
        setattr(target, leaf, value)
    return RoiAnnotation(roi_id=roi_id, roi=roi, **kw)


def _polygonal(roi_id: str, kind: str, xy, **kw) -> RoiAnnotation:
    a = RoiAnnotation(roi_id=roi_id, **kw)
    shape = getattr(a.roi, kind)
    for x, y in xy:
        p = shape.points.add()
        p.x, p.y = x, y
    return a


def _every_kind() -> list[RoiAnnotation]:
    poly = _polygonal("poly", "polygon", [(10.5, 10.25), (50, 12), (30, 40)], label="cell 1", set_name="nuclei")
    poly.props_json = json.dumps({"classification": {"name": "Tumor", "color": [200, 0, 0]}, "color": [255, 0, 0]})
    poly.plane[0] = 3
    poly.drawn_against_version = bytes.fromhex("00ff10")
    line = _polygonal("line", "polyline", [(1, 1), (100, 200), (300, 50)])
    line.roi.polyline.width = 2.5
    line.props_json = '{"kept":"in another spelling"}'  # spread, and kept verbatim too
    verbatim = _ann("pt", geometry={"point.x": 3.0, "point.y": 4.0, "point.z": 2.0}, props_json="not json, kept as is")
    return [
        poly,
        line,
        verbatim,
        _ann("rect", geometry={"rectangle.top_left.x": 90, "rectangle.top_left.y": 80, "rectangle.bottom_right.x": 20,
                               "rectangle.bottom_right.y": 30}),  # corners given swapped: kept swapped
        _ann("ell", geometry={"ellipse.center.x": 200, "ellipse.center.y": 150, "ellipse.radius.x": 40,
                              "ellipse.radius.y": 15, "ellipse.rotation": 0.75}, label="oval"),
        _ann("txt", geometry={"text.at.x": 5, "text.at.y": 6, "text.text": "mitosis here"}),
    ]  # fmt: skip


@pytest.fixture
def store(tmp_path):
    s = RoiStore(str(tmp_path / "a.duckdb"))
    yield s
    s.close()


def _content(a: RoiAnnotation) -> tuple:
    """What an annotation holds, less what the store stamps on every write (rev, times)."""
    return (a.roi_id, a.set_name, a.label, a.roi.SerializeToString(deterministic=True), dict(a.plane),
            a.props_json, a.drawn_against_version)  # fmt: skip


def test_every_roi_kind_round_trips(store):
    store.put("src/img", _every_kind(), source_url=None)
    before, truncated = store.list("src/img")
    body = feature_collection(before, FRAME, truncated=truncated)
    doc = json.loads(body)
    kinds = {f["id"]: f["geometry"]["type"] for f in doc["features"]}
    assert kinds == {"poly": "Polygon", "line": "LineString", "pt": "Point", "rect": "Polygon",
                     "ell": "Polygon", "txt": "Point"}  # fmt: skip
    ell = next(f for f in doc["features"] if f["id"] == "ell")
    assert len(ell["geometry"]["coordinates"][0]) == ELLIPSE_VERTICES + 1
    assert ell["properties"]["ellipse"] == {"center": [200, 150], "radius": [40, 15], "rotation": 0.75}
    poly = next(f for f in doc["features"] if f["id"] == "poly")
    assert poly["properties"]["classification"] == {"name": "Tumor", "color": [200, 0, 0]}
    assert poly["properties"]["name"] == "cell 1" and poly["properties"]["plane"] == {"0": 3}
    assert poly["geometry"]["plane"] == {"c": -1, "z": 3, "t": 0}  # QuPath's own spelling too
    assert poly["geometry"]["coordinates"][0][0] == poly["geometry"]["coordinates"][0][-1] == [10.5, 10.25]

    store.delete("src/img")
    again = rois_from_geojson(body, FRAME)
    store.put("src/img", again, source_url=None)
    after, _ = store.list("src/img")
    assert sorted(map(_content, after)) == sorted(map(_content, before))


#: a FeatureCollection with the exact structure QuPath's GeoJSON export writes
#: (``PathObjectTypeAdapters``/``ROITypeAdapters``: ``id`` a UUID, ``geometry`` with ``plane``
#: off the default plane, ``properties`` objectType, name, color [r, g, b], classification
#: {name, color}, isLocked only when locked, measurements as an object)
QUPATH_EXPORT = {
    "type": "FeatureCollection",
    "features": [
        {
            "type": "Feature",
            "id": "0f3d2a64-7d1b-4c52-9a0e-3b6b0f2f9e11",
            "geometry": {
                "type": "Polygon",
                "coordinates": [
                    [[100, 100], [300, 100], [300, 300], [100, 300], [100, 100]],
                    [[150, 150], [150, 200], [200, 200], [200, 150], [150, 150]],
                ],
            },
            "properties": {
                "objectType": "annotation",
                "name": "Tissue",
                "color": [255, 0, 0],
                "classification": {"name": "Tumor", "color": [200, 0, 0]},
                "isLocked": True,
                "measurements": {"Area px^2": 37500.0},
            },
        },
        {
            "type": "Feature",
            "id": "8e1f5b0c-2f44-4b39-8d9a-6c2a1e7f3d20",
            "geometry": {
                "type": "LineString",
                "coordinates": [[10.5, 20.25], [40, 60]],
                "plane": {"c": -1, "z": 2, "t": 0},
            },
            "properties": {"objectType": "annotation"},
        },
        {
            "type": "Feature",
            "id": "a4c7d9e2-1b3f-4e6a-9c8d-0f2e4b6a8c1d",
            "geometry": {"type": "MultiPoint", "coordinates": [[5, 6], [7, 8]]},
            "properties": {
                "objectType": "annotation",
                "classification": {"name": "Immune cells", "color": [160, 90, 160]},
            },
        },
        {
            "type": "Feature",
            "id": "c2b8e4f6-3a5d-4c7e-8f9a-1b2c3d4e5f60",
            "geometry": {
                "type": "MultiPolygon",
                "coordinates": [
                    [[[400, 10], [420, 10], [420, 30], [400, 10]]],
                    [[[500, 50], [520, 50], [520, 70], [500, 50]]],
                ],
            },
            "properties": {"objectType": "detection"},
        },
    ],
}


def test_a_qupath_export_imports_with_its_geometry():
    got = {a.roi_id: a for a in rois_from_geojson(json.dumps(QUPATH_EXPORT).encode(), FRAME, set_name="qupath")}
    tissue = got["0f3d2a64-7d1b-4c52-9a0e-3b6b0f2f9e11"]
    assert [(p.x, p.y) for p in tissue.roi.polygon.points] == [(100, 100), (300, 100), (300, 300), (100, 300)]
    assert tissue.label == "Tissue" and tissue.set_name == "qupath"
    props = json.loads(tissue.props_json)
    assert props["classification"] == {"name": "Tumor", "color": [200, 0, 0]} and props["color"] == [255, 0, 0]
    assert props["holes"] == [[[150, 150], [150, 200], [200, 200], [200, 150], [150, 150]]]
    assert props["measurements"] == {"Area px^2": 37500.0} and props["isLocked"] is True
    line = got["8e1f5b0c-2f44-4b39-8d9a-6c2a1e7f3d20"]
    assert [(p.x, p.y) for p in line.roi.polyline.points] == [(10.5, 20.25), (40, 60)]
    assert dict(line.plane) == {0: 2}  # QuPath's z on the tensor's z axis
    points = [got[f"a4c7d9e2-1b3f-4e6a-9c8d-0f2e4b6a8c1d-{k}"] for k in (0, 1)]
    assert [(a.roi.point.x, a.roi.point.y) for a in points] == [(5, 6), (7, 8)]
    parts = [got[f"c2b8e4f6-3a5d-4c7e-8f9a-1b2c3d4e5f60-{k}"].roi.polygon.points for k in (0, 1)]
    assert [(p.x, p.y) for p in parts[1]] == [(500, 50), (520, 50), (520, 70)]
    # and back out: the hole is in the Polygon again
    out = json.loads(feature_collection([tissue], FRAME))["features"][0]
    assert out["geometry"]["coordinates"] == QUPATH_EXPORT["features"][0]["geometry"]["coordinates"]
    assert out["properties"]["classification"] == {"name": "Tumor", "color": [200, 0, 0]}


def _fc(*features) -> bytes:
    return json.dumps({"type": "FeatureCollection", "features": list(features)}).encode()


def _polygon_feature(ring, **props):
    return {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [ring]}, "properties": props}


@pytest.mark.parametrize(
    "body, error, match",
    [
        (_fc(_polygon_feature([[0, 0], [10, 10], [10, 0], [0, 10], [0, 0]])), InvalidArgument, "Self-intersection"),
        (_fc(_polygon_feature([[0, 0], [700, 0], [700, 10], [0, 0]])), InvalidArgument, "outside the image"),
        (_fc({"type": "Feature", "geometry": {"type": "Point", "coordinates": [-1, 5]}}), InvalidArgument,
         "outside the image"),
        (_fc(_polygon_feature([[0, 0], [10, 0], [10, 10], [0, 0]], plane={"0": 9})), InvalidArgument,
         "outside the image"),
        (_fc({"type": "Feature", "geometry": {"type": "GeometryCollection", "geometries": []}}), InvalidArgument,
         "not one of"),
        (_fc({"type": "Feature", "geometry": {"type": "Point", "coordinates": ["1", "2"]}}), InvalidArgument,
         "coordinates"),
        (b'{"type": "Topology"}', InvalidArgument, "not a GeoJSON FeatureCollection"),
    ],
)  # fmt: skip
def test_bad_features_are_refused_whole_naming_why(body, error, match):
    good = _polygon_feature([[0, 0], [10, 0], [10, 10], [0, 0]])
    doc = json.loads(body)
    if isinstance(doc.get("features"), list):  # a good feature first: nothing of it may be kept
        doc["features"].insert(0, good)
        body = json.dumps(doc).encode()
    with pytest.raises(error, match=match) as refused:
        rois_from_geojson(body, FRAME)
    assert "nothing was imported" in str(refused.value) or "FeatureCollection" in match


def test_ten_million_vertices_are_refused_before_parsing():
    ring = b"[1,1]," * 10_000_000
    body = b'{"type":"FeatureCollection","features":[{"type":"Feature","geometry":{"type":"LineString",' \
           b'"coordinates":[' + ring + b'[2,2]]}}]}'  # fmt: skip
    assert len(body) < MAX_GEOJSON_BYTES  # the byte bound alone would let it through
    started = time.monotonic()
    with pytest.raises(RequestTooLarge, match="10000003 JSON arrays"):
        rois_from_geojson(body, FRAME)
    assert time.monotonic() - started < 5  # counted on the bytes, never parsed (parsing takes ~10 s)


def test_more_features_than_a_tensor_holds_are_refused_before_any_geometry():
    point = {"type": "Feature", "geometry": {"type": "Point", "coordinates": [1, 1]}}
    with pytest.raises(RequestTooLarge, match="10001 features, above the 10000"):
        rois_from_geojson(json.dumps({"type": "FeatureCollection", "features": [point] * 10_001}).encode(), FRAME)


def test_a_body_over_the_byte_bound_is_refused_by_its_length():
    with pytest.raises(RequestTooLarge, match=f"above the limit of {MAX_GEOJSON_BYTES}"):
        rois_from_geojson(b" " * (MAX_GEOJSON_BYTES + 1), FRAME)


def test_an_ellipse_edited_elsewhere_imports_as_the_polygon_it_is():
    a = _ann("e", geometry={"ellipse.center.x": 100, "ellipse.center.y": 100, "ellipse.radius.x": 20,
                            "ellipse.radius.y": 10})  # fmt: skip
    feature = json.loads(feature_collection([a], FRAME))["features"][0]
    feature["geometry"]["coordinates"][0][1] = [125.0, 100.0]  # one vertex dragged outward
    (got,) = rois_from_geojson(_fc(feature), FRAME)
    assert got.roi.WhichOneof("shape") == "polygon" and len(got.roi.polygon.points) == ELLIPSE_VERTICES
    assert json.loads(got.props_json)["ellipse"]["radius"] == [20, 10]  # kept, not obeyed
    assert math.isclose(got.roi.polygon.points[1].x, 125.0)
