"""Annotations as GeoJSON, in QuPath's convention: the exchange format of pathology tools.

QuPath drags and drops a GeoJSON ``FeatureCollection`` in level-0 pixel coordinates (its
``PathObjectTypeAdapters``: a ``Feature`` with an ``id``, a ``geometry`` with an optional
``plane`` ``{"c", "z", "t"}``, and ``properties`` ``objectType``, ``name``, ``color`` (RGB),
``classification`` ``{"name", "color"}``, ``isLocked``, ``measurements``, ``metadata``).
One feature per annotation, so a file exported here opens in QuPath and one QuPath wrote
imports here. What QuPath has no word for rides in ``properties``, so export then import
gives back every stored annotation exactly (``test_every_roi_kind_round_trips``):

* a point is a ``Point``, a caption a ``Point`` with ``properties.text``;
* a rectangle and an ellipse are ``Polygon``s (an ellipse of ``ELLIPSE_VERTICES`` vertices,
  as QuPath writes its ellipses) with ``properties.rectangle`` / ``properties.ellipse``
  holding the parameters; a polygon whose ring is no longer the one they give (edited
  elsewhere) imports as the polygon it is, the stale parameters kept among its properties;
* a polyline is a ``LineString`` with ``properties.lineWidth``;
* a polygon's holes (QuPath exports tissue with holes) are kept in ``props_json`` as
  ``holes`` and written back into the ``Polygon``; a ``MultiPolygon`` imports as one polygon
  per part and a ``MultiPoint`` (QuPath's points annotation) as one point per point, each
  ``<id>-<k>``;
* the plane pin (wire axis -> index) is ``properties.plane``; it is also written as QuPath's
  ``geometry.plane`` when the tensor's ``c``/``z``/``t`` axes carry it, and read from there
  when ``properties.plane`` is absent;
* ``name`` is the annotation's label, ``set_name`` its set, ``drawnAgainstVersion`` its
  version pin (hex); every other property (``classification``, ``color``, ``measurements``
  ...) is ``props_json`` (``json.dumps`` of them), written back as properties when it is a
  JSON object, and as the ``props_json`` property too when its text is another spelling.

An import is refused whole, naming the feature and the reason, before anything is stored:
a body over ``MAX_GEOJSON_BYTES``, more than ``MAX_GEOJSON_VERTICES`` (counted on the bytes
before parsing, so neither memory nor time grows with a hostile body), a geometry shapely
finds invalid (a self-intersecting ring), a coordinate outside the image, more features than
a tensor holds (``MAX_ROIS_PER_TENSOR``). Cost, one run on the loaded 2-core development VM
(2026-12-05): 10,000 octagons export in 0.31 s (4.6 MB) and import in 0.90 s; 100,000 export
in 7.9 s (45.7 MB).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensor_server.catalog.rois import MAX_ROIS_PER_TENSOR
from tensor_server.core.json_body import decode_json
from tensor_server.core.transfer_grid import spatial_axes
from tensor_server.errors import InvalidArgument, RequestTooLarge

__all__ = [
    "ImageFrame",
    "feature_collection",
    "rois_from_geojson",
    "MAX_GEOJSON_BYTES",
    "MAX_GEOJSON_VERTICES",
    "ELLIPSE_VERTICES",
    "MEDIA_TYPE",
]

MEDIA_TYPE = "application/geo+json"
#: a GeoJSON import: the budget of one ROI write request (``RoiLimits.max_request_bytes``)
MAX_GEOJSON_BYTES = 64 << 20
#: positions of one import, bounded by its ``[`` bytes before parsing: a parsed vertex costs
#: Python ~120 bytes, so 10**6 of them ~120 MB; a tensor holds 10,000 hand-drawn annotations
MAX_GEOJSON_VERTICES = 1_000_000
#: vertices of an exported ellipse (QuPath writes its ellipses as polygons too)
ELLIPSE_VERTICES = 72
_KINDS = ("Point", "MultiPoint", "Polygon", "LineString", "MultiPolygon")
#: the properties this module reads or writes; every other one is the annotation's props_json
_OWN = frozenset(
    {"objectType", "name", "set_name", "plane", "rectangle", "ellipse", "text", "lineWidth", "drawnAgainstVersion"}
)


@dataclass(frozen=True)
class ImageFrame:
    """What an import is checked against: the level-0 extent (x, y) and the axes."""

    width: float
    height: float
    shape: tuple[int, ...]
    dim_labels: tuple[str, ...]

    @classmethod
    def of(cls, tensor: Any) -> ImageFrame:
        labels = tuple(str(d).lower() for d in (tensor.dim_labels or ()))
        axes = spatial_axes(len(tensor.shape), labels or None)
        if len(axes) < 2:
            raise InvalidArgument(f"{tensor.array_id} has no y and x axes to draw annotations on")
        y, x = axes[-2:]
        return cls(float(tensor.shape[x]), float(tensor.shape[y]), tuple(tensor.shape), labels)

    def qupath_axes(self) -> dict[str, int]:
        """QuPath's plane keys -> this tensor's axes (the ones it has)."""
        return {k: self.dim_labels.index(k) for k in ("c", "z", "t") if k in self.dim_labels}


# ---- export ---------------------------------------------------------------------------------
def _position(p: Any) -> list[float]:
    return [p.x, p.y] if p.z == 0 else [p.x, p.y, p.z]


def _ellipse_ring(center: Sequence[float], radius: Sequence[float], rotation: float) -> np.ndarray:
    """The closed ring of ``ELLIPSE_VERTICES`` vertices an ellipse is exported as."""
    t = np.linspace(0.0, 2.0 * math.pi, ELLIPSE_VERTICES, endpoint=False)
    ex, ey = radius[0] * np.cos(t), radius[1] * np.sin(t)
    c, s = math.cos(rotation), math.sin(rotation)
    ring = np.stack([center[0] + ex * c - ey * s, center[1] + ex * s + ey * c], axis=1)
    return np.vstack([ring, ring[:1]])


def _rectangle_ring(a: Sequence[float], b: Sequence[float]) -> list[list[float]]:
    return [[a[0], a[1]], [b[0], a[1]], [b[0], b[1]], [a[0], b[1]], [a[0], a[1]]]


def _geometry(roi: Any, props: dict[str, Any], extras: dict[str, Any]) -> dict[str, Any]:
    kind = roi.WhichOneof("shape")
    if kind in ("point", "text"):
        if kind == "text":
            props["text"] = roi.text.text
        return {"type": "Point", "coordinates": _position(roi.point if kind == "point" else roi.text.at)}
    if kind == "rectangle":
        a, b = _position(roi.rectangle.top_left), _position(roi.rectangle.bottom_right)
        props["rectangle"] = {"topLeft": a, "bottomRight": b}
        return {"type": "Polygon", "coordinates": [_rectangle_ring(a, b)]}
    if kind == "ellipse":
        e = roi.ellipse
        props["ellipse"] = {"center": _position(e.center), "radius": _position(e.radius), "rotation": e.rotation}
        ring = _ellipse_ring((e.center.x, e.center.y), (e.radius.x, e.radius.y), e.rotation)
        return {"type": "Polygon", "coordinates": [ring.tolist()]}
    if kind == "polyline":
        if roi.polyline.width:
            props["lineWidth"] = roi.polyline.width
        return {"type": "LineString", "coordinates": [_position(p) for p in roi.polyline.points]}
    shell = [_position(p) for p in roi.polygon.points]
    holes = extras.pop("holes") if isinstance(extras.get("holes"), list) else []
    return {"type": "Polygon", "coordinates": [shell + shell[:1], *holes]}


def _extras(props_json: str) -> tuple[dict[str, Any], str | None]:
    """(the properties ``props_json`` spreads into, the text to keep verbatim as the
    ``props_json`` property or None): a JSON object spreads (so QuPath sees a classification),
    and its text rides along too unless an import would write it back byte for byte
    (``json.dumps``'s form, holes last), so export then import stores ``props_json`` exactly."""
    if not props_json:
        return {}, None
    try:
        value = json.loads(props_json)
    except ValueError:
        return {}, props_json
    if not isinstance(value, dict) or not value or _OWN & value.keys() or "props_json" in value:
        return {}, props_json
    exact = json.dumps(value) == props_json and ("holes" not in value or list(value)[-1] == "holes")
    return value, None if exact else props_json


def _qupath_plane(plane: Mapping[int, int], frame: ImageFrame | None) -> dict[str, int] | None:
    """QuPath's ``geometry.plane`` for a pin every axis of which is its c, z or t; None when
    the pin is QuPath's default plane or has an axis QuPath cannot name."""
    if frame is None or not plane:
        return None
    names = {axis: key for key, axis in frame.qupath_axes().items()}
    if any(axis not in names for axis in plane):
        return None
    out = {"c": -1, "z": 0, "t": 0}
    out.update({names[axis]: int(index) for axis, index in plane.items()})
    return None if out == {"c": -1, "z": 0, "t": 0} else out


def _feature(a: Any, frame: ImageFrame | None) -> dict[str, Any]:
    extras, verbatim = _extras(a.props_json)
    props: dict[str, Any] = {"objectType": "annotation", "set_name": a.set_name}
    if a.label:
        props["name"] = a.label
    geometry = _geometry(a.roi, props, extras)
    if a.plane:
        props["plane"] = {str(axis): int(index) for axis, index in sorted(a.plane.items())}
        qupath = _qupath_plane(a.plane, frame)
        if qupath is not None:
            geometry["plane"] = qupath
    if a.HasField("drawn_against_version"):
        props["drawnAgainstVersion"] = a.drawn_against_version.hex()
    props.update(extras)
    if verbatim is not None:
        props["props_json"] = verbatim
    return {"type": "Feature", "id": a.roi_id, "geometry": geometry, "properties": props}


def feature_collection(annotations: Iterable[Any], frame: ImageFrame | None, *, truncated: bool = False) -> bytes:
    """The annotations (``RoiAnnotation``) as one GeoJSON FeatureCollection, UTF-8 bytes;
    ``truncated`` (a foreign member) says the store held more than one answer carries."""
    doc: dict[str, Any] = {"type": "FeatureCollection", "features": [_feature(a, frame) for a in annotations]}
    if truncated:
        doc["truncated"] = True
    return json.dumps(doc, ensure_ascii=False).encode()


# ---- import ---------------------------------------------------------------------------------
class _Refused(InvalidArgument):
    """A feature that cannot be imported (the message names it)."""


def _decode(body: bytes, what: str) -> dict[str, Any]:
    if len(body) > MAX_GEOJSON_BYTES:
        raise RequestTooLarge(f"{what}: {len(body)} bytes, above the limit of {MAX_GEOJSON_BYTES} for one import")
    brackets = bytes(body).count(b"[")  # every position opens one: a bound counted before parsing
    if brackets > MAX_GEOJSON_VERTICES:
        raise RequestTooLarge(
            f"{what}: {brackets} JSON arrays (a vertex is one), above the limit of {MAX_GEOJSON_VERTICES} "
            "vertices for one import; split the file, or store a segmentation as a label tensor"
        )
    doc = decode_json(body, what, max_bytes=MAX_GEOJSON_BYTES)
    if isinstance(doc, dict) and doc.get("type") == "Feature":
        doc = {"type": "FeatureCollection", "features": [doc]}
    if isinstance(doc, list):  # QuPath's export without FEATURE_COLLECTION: a bare array of features
        doc = {"type": "FeatureCollection", "features": doc}
    if not isinstance(doc, dict) or doc.get("type") != "FeatureCollection" or not isinstance(doc.get("features"), list):
        raise InvalidArgument(f"{what}: not a GeoJSON FeatureCollection (nor a Feature, nor a list of features)")
    return doc


def _positions(coords: Any, where: str, least: int) -> np.ndarray:
    """(n, 2 or 3) float positions, each finite (the decoder refused NaN and infinities)."""
    try:
        xy = np.array(coords)
    except ValueError:
        xy = np.empty(0)
    if xy.ndim != 2 or xy.shape[1] not in (2, 3) or xy.dtype.kind not in "iuf" or len(xy) < least:
        raise _Refused(f"{where}: coordinates must be a list of at least {least} [x, y] positions")
    return xy.astype(np.float64)


def _point(p: Any, xyz: Sequence[float]) -> None:
    p.x, p.y = float(xyz[0]), float(xyz[1])
    if len(xyz) > 2:
        p.z = float(xyz[2])


def _params(props: Mapping[str, Any], key: str, fields: Sequence[str], where: str) -> dict[str, Any] | None:
    value = props.get(key)
    if value is None:
        return None
    if not isinstance(value, dict) or any(f not in value for f in fields):
        raise _Refused(f"{where}: properties.{key} must hold {', '.join(fields)}")
    return value


def _ring_is(ring: np.ndarray, expected: Any) -> bool:
    expected = np.asarray(expected, np.float64)
    return ring.shape[0] == expected.shape[0] and bool(np.allclose(ring[:, :2], expected[:, :2], rtol=1e-12, atol=1e-9))


def _polygon_roi(rings: list[np.ndarray], props: Mapping[str, Any], extras: dict[str, Any], where: str) -> Any:
    """A Polygon feature: the rectangle or ellipse its parameters name when its ring is still
    theirs, else a polygon (holes kept in ``extras``)."""
    from biopb.image.roi_pb2 import ROI

    roi, shell = ROI(), rings[0]
    rect = _params(props, "rectangle", ("topLeft", "bottomRight"), where)
    ell = _params(props, "ellipse", ("center", "radius", "rotation"), where)
    if len(rings) == 1 and rect is not None and _ring_is(shell, _rectangle_ring(rect["topLeft"], rect["bottomRight"])):
        _point(roi.rectangle.top_left, _positions([rect["topLeft"]], where, 1)[0])
        _point(roi.rectangle.bottom_right, _positions([rect["bottomRight"]], where, 1)[0])
        return roi
    if len(rings) == 1 and ell is not None:
        c, r = _positions([ell["center"]], where, 1)[0], _positions([ell["radius"]], where, 1)[0]
        if isinstance(ell["rotation"], (int, float)) and _ring_is(shell, _ellipse_ring(c, r, float(ell["rotation"]))):
            _point(roi.ellipse.center, c)
            _point(roi.ellipse.radius, r)
            roi.ellipse.rotation = float(ell["rotation"])
            return roi
    for key, value in (("rectangle", rect), ("ellipse", ell)):
        if value is not None:  # the parameters of a shape the ring no longer is: kept, not obeyed
            extras[key] = value
    points = shell[:-1] if len(shell) > 1 and np.array_equal(shell[0], shell[-1]) else shell
    for xyz in points:
        _point(roi.polygon.points.add(), xyz)
    if len(rings) > 1:
        extras["holes"] = [ring.tolist() for ring in rings[1:]]
    return roi


def _rings(coords: Any, where: str) -> list[np.ndarray]:
    if not isinstance(coords, list) or not coords:
        raise _Refused(f"{where}: a Polygon's coordinates are a list of rings")
    return [_positions(ring, where, 3) for ring in coords]


def _checked(shape: Any, where: str, frame: ImageFrame) -> None:
    """shapely's validity (a self-intersecting ring, a hole outside its shell) and the image's
    extent: every vertex within [0, width] x [0, height]."""
    import shapely

    if not shape.is_valid:
        raise _Refused(f"{where}: invalid geometry: {shapely.is_valid_reason(shape)}")
    x0, y0, x1, y1 = shape.bounds
    if x0 < 0 or y0 < 0 or x1 > frame.width or y1 > frame.height:
        raise _Refused(
            f"{where}: coordinates outside the image (bounds [{x0:g}, {y0:g}, {x1:g}, {y1:g}]; the image is "
            f"{frame.width:g} x {frame.height:g} level-0 pixels, origin at its top-left corner)"
        )


def _shapes(
    geometry: Any, props: Mapping[str, Any], extras: dict[str, Any], where: str, frame: ImageFrame
) -> list[tuple[Any, dict[str, Any]]]:
    """(ROI, its props) of one feature's geometry (a MultiPolygon gives one per part, each
    with its own copy of the props), each checked."""
    import shapely
    from biopb.image.roi_pb2 import ROI

    if not isinstance(geometry, dict) or geometry.get("type") not in _KINDS:
        kind = geometry.get("type") if isinstance(geometry, dict) else type(geometry).__name__
        raise _Refused(f"{where}: geometry {str(kind)[:40]!r} is not one of {', '.join(_KINDS)}")
    kind, coords = geometry["type"], geometry.get("coordinates")
    if kind in ("Point", "MultiPoint"):  # QuPath's points annotations are MultiPoints
        xy = _positions([coords] if kind == "Point" else coords, where, 1)
        _checked(shapely.multipoints(xy[:, :2]), where, frame)
        text = props.get("text")
        if text is not None and not isinstance(text, str):
            raise _Refused(f"{where}: properties.text must be a string")
        points = []
        for xyz in xy:
            roi = ROI()
            _point(roi.text.at if text is not None else roi.point, xyz)
            if text is not None:
                roi.text.text = text
            points.append((roi, dict(extras) if kind == "MultiPoint" else extras))
        return points
    if kind == "LineString":
        xy = _positions(coords, where, 2)
        _checked(shapely.linestrings(xy[:, :2]), where, frame)
        roi = ROI()
        for xyz in xy:
            _point(roi.polyline.points.add(), xyz)
        width = props.get("lineWidth", 0)
        if not isinstance(width, (int, float)) or isinstance(width, bool) or width < 0:
            raise _Refused(f"{where}: properties.lineWidth must be a non-negative number")
        roi.polyline.width = float(width)
        return [(roi, extras)]
    parts = [coords] if kind == "Polygon" else coords
    if not isinstance(parts, list) or not parts:
        raise _Refused(f"{where}: a MultiPolygon's coordinates are a list of polygons")
    rois = []
    for k, part in enumerate(parts):
        at = where if kind == "Polygon" else f"{where} part {k}"
        rings = _rings(part, at)
        _checked(shapely.Polygon(rings[0][:, :2], [r[:, :2] for r in rings[1:]]), at, frame)
        own = dict(extras) if kind == "MultiPolygon" else extras
        rois.append((_polygon_roi(rings, props, own, at), own))
    return rois


def _plane(props: Mapping[str, Any], geometry: Any, where: str, frame: ImageFrame) -> dict[int, int]:
    """``properties.plane`` (axis -> index), else QuPath's ``geometry.plane`` on the tensor's
    c/z/t axes; every index within the tensor's shape."""
    pin = props.get("plane")
    if pin is None and isinstance(geometry, dict) and isinstance(geometry.get("plane"), dict):
        pin = _from_qupath_plane(geometry["plane"], where, frame)
    if pin is None:
        return {}
    if not isinstance(pin, dict):
        raise _Refused(f"{where}: properties.plane must map axis indices to indices")
    plane = {}
    for axis, index in pin.items():
        if not str(axis).isdigit() or type(index) is not int or not 0 <= int(axis) < len(frame.shape):
            raise _Refused(f"{where}: plane {{{str(axis)[:20]!r}: {str(index)[:20]}}} is not an axis of the tensor")
        if not 0 <= index < frame.shape[int(axis)]:
            raise _Refused(
                f"{where}: plane index {index} on axis {axis} is outside the image "
                f"(that axis has {frame.shape[int(axis)]} planes)"
            )
        plane[int(axis)] = index
    return plane


def _from_qupath_plane(qupath: Mapping[str, Any], where: str, frame: ImageFrame) -> dict[str, Any]:
    """QuPath's ``{"c", "z", "t"}`` as a pin on the tensor's axes of those names: a value at
    QuPath's default (c -1: every channel, z 0, t 0) pins nothing; another on an axis the
    tensor lacks is refused (the annotation would land on a plane that is not there)."""
    axes, pin = frame.qupath_axes(), {}
    for key, default in (("c", -1), ("z", 0), ("t", 0)):
        value = qupath.get(key, default)
        if value == default:
            continue
        if key not in axes:
            raise _Refused(f"{where}: geometry.plane {key}={str(value)[:20]}, and the tensor has no {key} axis")
        pin[str(axes[key])] = value
    return pin


def _annotations(feature: Any, index: int, frame: ImageFrame, set_name: str) -> list[Any]:
    from biopb.image.annotation_pb2 import RoiAnnotation

    if not isinstance(feature, dict) or feature.get("type") != "Feature":
        raise _Refused(f"feature {index}: not a GeoJSON Feature")
    fid = feature.get("id")
    if fid is not None and not isinstance(fid, (str, int)):
        raise _Refused(f"feature {index}: its id must be a string or a number")
    where = f"feature {index}" + (f" ({str(fid)[:64]})" if fid is not None else "")
    props = feature.get("properties") or {}
    if not isinstance(props, dict):
        raise _Refused(f"{where}: properties must be an object")
    extras = {k: v for k, v in props.items() if k not in _OWN and k != "props_json"}
    geometry = feature.get("geometry")
    shapes = _shapes(geometry, props, extras, where, frame)
    plane = _plane(props, geometry, where, frame)
    out = []
    for k, (roi, own) in enumerate(shapes):
        roi_id = "" if fid is None else str(fid) if len(shapes) == 1 else f"{fid}-{k}"
        a = RoiAnnotation(roi_id=roi_id, set_name=_text(props, "set_name", where) or set_name, roi=roi)
        a.label = _text(props, "name", where)
        a.plane.update(plane)
        verbatim = props.get("props_json")
        if verbatim is not None and not isinstance(verbatim, str):
            raise _Refused(f"{where}: properties.props_json must be a string")
        a.props_json = verbatim if verbatim is not None else json.dumps(own) if own else ""
        version = _text(props, "drawnAgainstVersion", where)
        if version:
            try:
                a.drawn_against_version = bytes.fromhex(version)
            except ValueError:
                raise _Refused(f"{where}: drawnAgainstVersion is not hex") from None
        out.append(a)
    return out


def _text(props: Mapping[str, Any], key: str, where: str) -> str:
    value = props.get(key, "")
    if not isinstance(value, str):
        raise _Refused(f"{where}: properties.{key} must be a string")
    return value


def rois_from_geojson(body: bytes, frame: ImageFrame, *, set_name: str = "", what: str = "GeoJSON import") -> list:
    """The annotations (``RoiAnnotation``, array_id unset) a GeoJSON body describes, every
    feature checked (module docstring), or the refusal of the whole body naming the first
    feature at fault. ``set_name``: the set of features that name none ("default" when empty)."""
    doc = _decode(body, what)
    if len(doc["features"]) > MAX_ROIS_PER_TENSOR:  # before any geometry is built (80,000 take ~12 s)
        raise RequestTooLarge(
            f"{what}: {len(doc['features'])} features, above the {MAX_ROIS_PER_TENSOR} annotations a tensor "
            "holds; a segmentation belongs in a label tensor"
        )
    out: list[Any] = []
    for index, feature in enumerate(doc["features"]):
        try:
            out.extend(_annotations(feature, index, frame, set_name))
        except _Refused as exc:
            raise InvalidArgument(f"{what}: {exc}; nothing was imported") from None
    return out
