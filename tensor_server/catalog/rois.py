"""ROI annotations: the persistent ``rois`` table the biopb SDK and the Tensor Browser use.

Annotations are user data, not a cache of the files: they live in their own DuckDB file
(``Settings.rois_path``; in memory when none is given) so they survive restarts, a
rescan, and a source going missing for a while. The table has the biopb reference
server's columns, so SQL written against it (``SELECT array_id, set_name, count(*) FROM
rois ...``) works here; the catalog publishes a read-only snapshot of it next to
``sources``.

Rules (the reference's behaviour, so client code written against it works):

- ids are unique per tensor (primary key ``(array_id, roi_id)``); an empty id is minted;
- a batch is all-or-nothing on validity and lands in one transaction;
- only the 2-D vector arms of ``biopb.image.ROI`` are stored (point, rectangle, ellipse,
  polygon, polyline, text); masks and meshes belong in a label tensor;
- set names starting with ``@`` are server-owned and refused to clients;
- ``check_rev`` makes a write conditional on the stored ``rev`` (a conflict, not a write);
- ``last_seen_at`` records when the source was last in the catalog; pruning removes rows
  whose source has been unseen for N days (absence alone is never evidence of deletion).
"""

from __future__ import annotations

import json
import math
import threading
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from tensor_server.core.identity import ArrayId
from tensor_server.errors import InvalidArgument, PermissionDenied, RequestTooLarge

__all__ = ["RoiStore", "RoiStoreBusy", "RoiLimits", "UnseenRois", "RESERVED_SET_PREFIX", "MAX_ROIS_PER_TENSOR"]

RESERVED_SET_PREFIX = "@"
#: An annotation store, not a segmentation store: past this a label tensor is the tool.
MAX_ROIS_PER_TENSOR = 10_000
_MAX_ROI_ID_LEN = 128


@dataclass(frozen=True)
class RoiLimits:
    """What one annotation and one request may hold. An annotation is a hand-drawn shape
    with a caption, not a segmentation (that is a label tensor): past these a request is
    refused (``RequestTooLarge``) before anything is stored, so no client can make the
    store, or every later read of the tensor, slow for everyone."""

    #: vertices of one polygon or polyline (a traced cell outline has hundreds)
    max_points_per_shape: int = 65_536
    #: characters of ``label`` / of a text caption
    max_label_chars: int = 4096
    #: characters of ``props_json``
    max_props_json_chars: int = 65_536
    #: rows of one roi_put (the biopb reference's documented batch maximum)
    max_rows_per_put: int = MAX_ROIS_PER_TENSOR
    #: ids of one roi_delete
    max_ids_per_delete: int = MAX_ROIS_PER_TENSOR
    #: bytes of the Arrow rows of one roi_put / roi_delete request
    max_request_bytes: int = 64 << 20
    #: characters of geometry and props one list_rois answer carries before it is truncated
    max_list_chars: int = 256 << 20


_ACCEPTED_SHAPES = frozenset({"point", "rectangle", "ellipse", "polygon", "polyline", "text"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rois (
    roi_id TEXT NOT NULL,
    array_id TEXT NOT NULL,
    source_id TEXT NOT NULL,
    source_url TEXT,
    set_name TEXT NOT NULL DEFAULT 'default',
    label TEXT,
    shape_kind TEXT NOT NULL,
    plane MAP(UINTEGER, UINTEGER),
    bbox DOUBLE[4],
    geometry TEXT NOT NULL,
    props_json TEXT,
    drawn_against_version TEXT,
    rev BIGINT NOT NULL,
    created_at TIMESTAMP,
    updated_at TIMESTAMP,
    last_seen_at TIMESTAMP,
    writer TEXT,
    PRIMARY KEY (array_id, roi_id)
);
ALTER TABLE rois ADD COLUMN IF NOT EXISTS writer TEXT;
"""
#: the measured decode rates (``catalog/decode_rates.py``) kept in the same file, so a restart
#: does not re-measure every tensor; clearing the chunk cache keeps them too
_DECODE_RATES_SCHEMA = """
CREATE TABLE IF NOT EXISTS decode_rates (
    array_id TEXT PRIMARY KEY,
    mbps DOUBLE NOT NULL,
    samples BIGINT NOT NULL,
    updated_at TIMESTAMP
)
"""
#: who wrote a row: the SHA-256 (hex) of the token its writer presented ("" = none); a writer
#: updates and deletes only its own rows (None = full access: the server token, or in-process)
ANYONE = None
_READ_COLUMNS = (
    "roi_id, array_id, set_name, label, plane, geometry, props_json, drawn_against_version, rev, created_at, updated_at"
)
#: one predicate for the prune report and the prune itself, so what is shown is what goes
_UNSEEN = "COALESCE(last_seen_at, created_at) < ? AND NOT starts_with(set_name, ?)"


def _check_writer(array_id: str, prepared: Sequence[Any], existing: Mapping[str, tuple], writer: str | None) -> None:
    """A writer updates only the rows it stored (``writer`` ``ANYONE``: every row)."""
    if writer is ANYONE:
        return
    theirs = sorted(p.roi_id for p in prepared if p.roi_id in existing and existing[p.roi_id][3] != writer)
    if theirs:
        raise PermissionDenied(
            f"roi_put on {array_id}: {', '.join(theirs[:20])} were stored by another client; "
            "a client updates only its own annotations (give yours new roi_ids)"
        )


def _refuse_others_ids(cur: Any, array_id: str, writer: str) -> None:
    """A delete by id of rows another client stored is refused whole (as ``_check_writer``
    refuses their update), naming them: an id that is not deleted never passes in silence.
    ``cur`` holds the requested ids as ``_ids``."""
    theirs = [
        r[0]
        for r in cur.execute(
            "SELECT roi_id FROM rois WHERE array_id = ? AND roi_id IN (SELECT roi_id FROM _ids) "
            "AND COALESCE(writer, '') <> ? LIMIT 21",
            [array_id, writer],
        ).fetchall()
    ]
    if theirs:
        raise PermissionDenied(
            f"roi_delete on {array_id}: {', '.join(sorted(theirs)[:20])} were stored by another "
            "client; a client deletes only its own annotations (the server token deletes any); "
            "nothing was deleted"
        )


class RoiStoreBusy(InvalidArgument):
    """Another process holds the annotation file (DuckDB allows one writer process)."""


@dataclass(frozen=True)
class UnseenRois:
    """One tensor's annotations whose source has not been seen since the cut-off."""

    array_id: str
    source_url: str | None
    count: int
    last_seen_at: datetime | None


@dataclass(frozen=True)
class _Prepared:
    roi_id: str
    set_name: str
    label: str
    shape_kind: str
    plane: dict[int, int]
    bbox: list[float]
    geometry: str
    props_json: str | None
    drawn_against_version: str | None
    rev: int
    roi: Any  # biopb.image.ROI (the geometry, normalised)


def is_reserved_set(set_name: str) -> bool:
    return set_name.startswith(RESERVED_SET_PREFIX)


def _points(roi: Any, kind: str, limits: RoiLimits) -> np.ndarray:
    """The (n, 2) vertices of a polygon or polyline, within the per-shape cap."""
    points = roi.polyline.points if kind == "polyline" else roi.polygon.points
    need = 2 if kind == "polyline" else 3
    if len(points) < need:
        raise InvalidArgument(f"a {kind} needs at least {need} points, got {len(points)}")
    if len(points) > limits.max_points_per_shape:
        raise RequestTooLarge(
            f"a {kind} of {len(points)} points is above the limit of {limits.max_points_per_shape} "
            "per annotation; simplify the outline, or store a segmentation as a label tensor"
        )
    return np.array([(p.x, p.y) for p in points], np.float64).reshape(-1, 2)


def _finite(kind: str, values: Any) -> None:
    if not np.isfinite(np.asarray(values, np.float64)).all():
        raise InvalidArgument(
            f"a {kind} with a NaN or infinite coordinate cannot be stored; coordinates are "
            "finite level-0 pixel positions"
        )


def _bbox(roi: Any, kind: str, limits: RoiLimits) -> list[float]:
    """Axis-aligned [x0, y0, x1, y1] in level-0 pixels: what makes the SQL surface useful.
    Every coordinate must be finite: a NaN corner would make the bbox (and every spatial
    query over it) meaningless."""
    if kind in ("point", "text"):
        p = roi.point if kind == "point" else roi.text.at
        _finite(kind, [p.x, p.y, p.z])
        return [p.x, p.y, p.x, p.y]
    if kind == "rectangle":
        a, b = roi.rectangle.top_left, roi.rectangle.bottom_right
        _finite(kind, [a.x, a.y, a.z, b.x, b.y, b.z])
        return [min(a.x, b.x), min(a.y, b.y), max(a.x, b.x), max(a.y, b.y)]
    if kind == "ellipse":
        c, r, t = roi.ellipse.center, roi.ellipse.radius, roi.ellipse.rotation
        _finite(kind, [c.x, c.y, c.z, r.x, r.y, r.z, t])
        hx = math.hypot(r.x * math.cos(t), r.y * math.sin(t))
        hy = math.hypot(r.x * math.sin(t), r.y * math.cos(t))
        return [c.x - hx, c.y - hy, c.x + hx, c.y + hy]
    xy = _points(roi, kind, limits)
    pad = abs(roi.polyline.width) / 2.0 if kind == "polyline" else 0.0
    _finite(kind, [pad])
    _finite(kind, xy)
    lo, hi = xy.min(axis=0) - pad, xy.max(axis=0) + pad
    return [float(lo[0]), float(lo[1]), float(hi[0]), float(hi[1])]


def _geometry_json(roi: Any) -> str:
    """The ROI as one line of proto3 JSON: the text ``MessageToJson(indent=0)`` gives without
    its newlines, but through the C JSON encoder (the indenting one is pure Python: 1 ms a
    small polygon, most of a 10,000-row put)."""
    from google.protobuf import json_format

    return json.dumps(json_format.MessageToDict(roi), separators=(",", ": "))


def _check_text_sizes(roi_id: str, roi: Any, limits: RoiLimits) -> None:
    label = roi.label
    caption = roi.roi.text.text if roi.roi.WhichOneof("shape") == "text" else ""
    for what, text, cap in (
        ("label", label, limits.max_label_chars),
        ("caption text", caption, limits.max_label_chars),
        ("props_json", roi.props_json, limits.max_props_json_chars),
    ):
        if len(text) > cap:
            raise RequestTooLarge(
                f"annotation {roi_id or '<new>'}: {what} of {len(text)} characters is above the "
                f"limit of {cap}; keep bulk data in a file or a tensor and refer to it"
            )


def _prepare(array_id: str, roi: Any, limits: RoiLimits = RoiLimits()) -> _Prepared:
    if roi.array_id and roi.array_id != array_id:
        raise InvalidArgument(f"annotation array_id {roi.array_id!r} does not match the request's {array_id!r}")
    roi_id = roi.roi_id.strip()
    if len(roi_id) > _MAX_ROI_ID_LEN:
        raise InvalidArgument(f"roi_id is longer than {_MAX_ROI_ID_LEN} characters: {roi_id[:32]!r}...")
    if "," in roi_id:
        raise InvalidArgument(f"roi_id may not contain a comma: {roi_id!r}")
    _check_text_sizes(roi_id, roi, limits)
    set_name = roi.set_name or "default"
    if is_reserved_set(set_name):
        raise InvalidArgument(
            f"set_name {set_name!r} is in the server-owned {RESERVED_SET_PREFIX!r} namespace; "
            "copy the set into one of your own to edit it"
        )
    kind = roi.roi.WhichOneof("shape")
    if kind is None:
        raise InvalidArgument(f"annotation {roi_id or '<new>'} has no geometry")
    if kind not in _ACCEPTED_SHAPES:
        raise InvalidArgument(
            f"geometry {kind!r} is not stored as an annotation (accepted: "
            f"{', '.join(sorted(_ACCEPTED_SHAPES))}); a segmentation belongs in a label tensor"
        )
    if kind == "text" and not roi.roi.text.text.strip():
        raise InvalidArgument("caption text is empty")
    return _Prepared(
        roi_id=roi_id or uuid.uuid4().hex,
        set_name=set_name,
        label=roi.label,
        shape_kind=kind,
        plane=dict(roi.plane),
        bbox=_bbox(roi.roi, kind, limits),
        geometry=_geometry_json(roi.roi),
        props_json=roi.props_json or None,
        drawn_against_version=roi.drawn_against_version.hex() if roi.HasField("drawn_against_version") else None,
        rev=roi.rev,
        roi=roi.roi,
    )


def _unix_ms(value: datetime | None) -> int:
    return int(value.timestamp() * 1000) if value is not None else 0


def _rows_table(rows: Sequence[tuple[_Prepared, int]]) -> Any:
    """The client-given columns of ``rows`` (with their new rev) as an Arrow table whose
    types DuckDB casts to the ``rois`` columns."""
    import pyarrow as pa

    ps = [p for p, _ in rows]
    return pa.table(
        {
            "roi_id": pa.array([p.roi_id for p in ps], pa.string()),
            "set_name": pa.array([p.set_name for p in ps], pa.string()),
            "label": pa.array([p.label for p in ps], pa.string()),
            "shape_kind": pa.array([p.shape_kind for p in ps], pa.string()),
            "plane": pa.array([list(p.plane.items()) for p in ps], pa.map_(pa.uint32(), pa.uint32())),
            "bbox": pa.array([p.bbox for p in ps], pa.list_(pa.float64(), 4)),
            "geometry": pa.array([p.geometry for p in ps], pa.large_string()),
            "props_json": pa.array([p.props_json for p in ps], pa.large_string()),
            "drawn_against_version": pa.array([p.drawn_against_version for p in ps], pa.string()),
            "rev": pa.array([rev for _, rev in rows], pa.int64()),
        }
    )


def _stored(array_id: str, p: _Prepared, rev: int, created: datetime, now: datetime) -> Any:
    """The annotation as stored, built from the prepared row (no JSON round trip)."""
    from biopb.image.annotation_pb2 import RoiAnnotation

    out = RoiAnnotation(
        roi_id=p.roi_id,
        array_id=array_id,
        set_name=p.set_name,
        label=p.label or "",
        props_json=p.props_json or "",
        rev=rev,
        created_at_unix_ms=_unix_ms(created),
        updated_at_unix_ms=_unix_ms(now),
    )
    out.roi.CopyFrom(p.roi)
    out.plane.update(p.plane)
    if p.drawn_against_version is not None:
        out.drawn_against_version = bytes.fromhex(p.drawn_against_version)
    return out


def _annotation(row: Sequence[Any]) -> Any:
    from biopb.image.annotation_pb2 import RoiAnnotation
    from google.protobuf import json_format

    roi_id, array_id, set_name, label, plane, geometry, props, drawn, rev, created, updated = row
    out = RoiAnnotation(
        roi_id=roi_id,
        array_id=array_id,
        set_name=set_name,
        label=label or "",
        props_json=props or "",
        rev=rev,
        created_at_unix_ms=_unix_ms(created),
        updated_at_unix_ms=_unix_ms(updated),
    )
    json_format.Parse(geometry, out.roi)
    out.plane.update(dict(plane or {}))
    if drawn is not None:
        out.drawn_against_version = bytes.fromhex(drawn)
    return out


class RoiStore:
    """The ``rois`` table in a DuckDB file (or in memory). Thread-safe: writers take one
    lock; every statement runs on its own cursor."""

    def __init__(self, path: str | None = None, *, limits: RoiLimits = RoiLimits()) -> None:
        self.path = path
        self.limits = limits
        self._lock = threading.Lock()
        self._con: Any = None
        #: bumped on every change, so the catalog re-publishes its snapshot only then
        self.generation = 0

    def _connection(self) -> Any:
        if self._con is None:
            import duckdb

            with self._lock:
                if self._con is None:
                    try:
                        con = duckdb.connect(self.path or ":memory:")
                        con.execute(_SCHEMA)
                        con.execute(_DECODE_RATES_SCHEMA)
                    except duckdb.Error as exc:
                        kind = RoiStoreBusy if "lock" in str(exc).lower() else InvalidArgument
                        raise kind(f"annotation store {self.path}: cannot open: {exc}") from None
                    self._con = con
        return self._con

    def open(self) -> None:
        """Open the file now (a server does at start, so a busy or unreadable file is a
        startup error, not a failure of the first annotation call)."""
        self._connection()

    def _cursor(self) -> Any:
        con = self._connection()
        with self._lock:
            return con.cursor()

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None

    # ---- decode rates (the catalog's DecodeRates persists through these) --------------------
    def load_decode_rates(self) -> dict[str, tuple[float, int, float]]:
        """``array_id -> (mbps, samples, updated_at epoch seconds)`` as last saved."""
        rows = (
            self._cursor().execute("SELECT array_id, mbps, samples, epoch_us(updated_at) FROM decode_rates").fetchall()
        )
        return {r[0]: (float(r[1]), int(r[2]), (r[3] or 0) / 1e6) for r in rows}

    def save_decode_rates(self, rows: Mapping[str, tuple[float, int, float]]) -> None:
        """Replace the stored rates by ``rows`` (one transaction)."""
        con = self._connection()
        with self._lock:
            cur = con.cursor()
            cur.execute("BEGIN TRANSACTION")
            try:
                cur.execute("DELETE FROM decode_rates")
                if rows:
                    cur.executemany(
                        "INSERT INTO decode_rates VALUES (?, ?, ?, make_timestamp(?::BIGINT))",
                        [(k, v[0], v[1], round(v[2] * 1e6)) for k, v in rows.items()],
                    )
                cur.execute("COMMIT")
            except Exception:
                cur.execute("ROLLBACK")
                raise

    # ---- writes ---------------------------------------------------------------------------
    def put(
        self,
        array_id: str,
        rois: Sequence[Any],
        *,
        source_url: str | None,
        check_rev: bool = False,
        writer: str | None = ANYONE,
    ) -> tuple[list[Any], list[Any]]:
        """Create or update ``rois`` on ``array_id`` as one unit: ``(stored, conflicts)``.
        ``source_url`` is the source's catalog url when it is in the catalog now (a
        sighting), else None. ``writer`` (see ``ANYONE``) is recorded on new rows; a row
        another writer stored is refused (PERMISSION_DENIED). Rows land in two set statements
        over an Arrow table (not one statement per row), so a full batch costs the store a
        fraction of a second."""
        from biopb.image.annotation_pb2 import RoiConflict

        limits = self.limits
        if len(rois) > limits.max_rows_per_put:
            raise RequestTooLarge(
                f"roi_put on {array_id}: {len(rois)} annotations in one request, above the limit "
                f"of {limits.max_rows_per_put}; send them in several requests"
            )
        prepared = [_prepare(array_id, r, limits) for r in rois]
        dup = sorted(i for i, n in Counter(p.roi_id for p in prepared).items() if n > 1)
        if dup:
            raise InvalidArgument(f"duplicate roi_id in one batch: {dup[:20]}" + (" ..." if len(dup) > 20 else ""))
        con = self._connection()
        with self._lock:
            now = datetime.now()
            cur = con.cursor()
            cur.execute("BEGIN TRANSACTION")
            try:
                existing = {
                    r[0]: (r[1], r[2], r[3], r[4])
                    for r in cur.execute(
                        "SELECT roi_id, rev, created_at, set_name, COALESCE(writer, '') FROM rois WHERE array_id = ?",
                        [array_id],
                    ).fetchall()
                }
                self._check_room(array_id, prepared, existing)
                _check_writer(array_id, prepared, existing, writer)
                if source_url is not None:
                    cur.execute(
                        "UPDATE rois SET source_url = ?, last_seen_at = ? WHERE source_id = ?",
                        [source_url, now, ArrayId.parse(array_id).source_id],
                    )
                stored, conflicts, inserts, updates = [], [], [], []
                for p in prepared:
                    prior = existing.get(p.roi_id)
                    if prior is not None and check_rev and p.rev != prior[0]:
                        conflicts.append(RoiConflict(roi_id=p.roi_id, stored_rev=prior[0]))
                        continue
                    rev, created = (1, now) if prior is None else (prior[0] + 1, prior[1])
                    (inserts if prior is None else updates).append((p, rev))
                    stored.append(_stored(array_id, p, rev, created, now))
                self._write_rows(cur, array_id, inserts, updates, now, source_url, writer or "")
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            finally:
                cur.close()
            self.generation += 1
        return stored, conflicts

    @staticmethod
    def _check_room(array_id: str, prepared: Sequence[_Prepared], existing: Mapping[str, tuple]) -> None:
        moved = sorted(p.roi_id for p in prepared if p.roi_id in existing and is_reserved_set(existing[p.roi_id][2]))
        if moved:
            raise InvalidArgument(f"{', '.join(moved[:20])}: stored in a server-owned set; give the copy a new roi_id")
        authored = sum(1 for v in existing.values() if not is_reserved_set(v[2]))
        new = sum(1 for p in prepared if p.roi_id not in existing)
        if authored + new > MAX_ROIS_PER_TENSOR:
            raise InvalidArgument(
                f"annotation limit reached for {array_id}: {authored} stored + {new} new "
                f"exceeds {MAX_ROIS_PER_TENSOR}; a segmentation belongs in a label tensor"
            )

    @staticmethod
    def _write_rows(
        cur: Any,
        array_id: str,
        inserts: Sequence[tuple[_Prepared, int]],
        updates: Sequence[tuple[_Prepared, int]],
        now: datetime,
        source_url: str | None,
        writer: str,
    ) -> None:
        """One INSERT ... SELECT and one UPDATE ... FROM over Arrow tables of the rows."""
        if inserts:
            rows = _rows_table(inserts)
            cur.register("_new_rois", rows)
            cur.execute(
                "INSERT INTO rois (roi_id, array_id, source_id, set_name, label, shape_kind, plane, bbox, geometry, "
                "props_json, drawn_against_version, rev, created_at, updated_at, source_url, last_seen_at, writer) "
                "SELECT roi_id, ?, ?, set_name, label, shape_kind, plane, bbox, geometry, props_json, "
                "drawn_against_version, rev, ?, ?, ?, ?, ? FROM _new_rois",
                [
                    array_id,
                    ArrayId.parse(array_id).source_id,
                    now,
                    now,
                    source_url,
                    now if source_url is not None else None,
                    writer,
                ],
            )
            cur.unregister("_new_rois")
        if updates:
            cur.register("_upd_rois", _rows_table(updates))
            cur.execute(
                "UPDATE rois SET set_name = u.set_name, label = u.label, shape_kind = u.shape_kind, plane = u.plane, "
                "bbox = u.bbox, geometry = u.geometry, props_json = u.props_json, "
                "drawn_against_version = u.drawn_against_version, rev = u.rev, updated_at = ? "
                "FROM _upd_rois u WHERE rois.array_id = ? AND rois.roi_id = u.roi_id",
                [now, array_id],
            )
            cur.unregister("_upd_rois")

    def delete(
        self, array_id: str, roi_ids: Iterable[str] = (), set_name: str = "", *, writer: str | None = ANYONE
    ) -> list[str]:
        """Delete those ids, else the whole set, else every client-owned annotation of the
        tensor; return the ids removed — only rows ``writer`` wrote, unless it is ``ANYONE``
        (a set or "all" means all of the writer's; an id another wrote is PERMISSION_DENIED).
        Server-owned (``@``) sets are refused, never silently skipped. The ids travel as one
        Arrow column, never as SQL text."""
        import pyarrow as pa

        if is_reserved_set(set_name):
            raise InvalidArgument(f"set_name {set_name!r} is server-owned; there is nothing to delete there")
        ids = list(roi_ids)
        if len(ids) > self.limits.max_ids_per_delete:
            raise RequestTooLarge(
                f"roi_delete on {array_id}: {len(ids)} ids in one request, above the limit of "
                f"{self.limits.max_ids_per_delete} (a tensor holds at most {MAX_ROIS_PER_TENSOR}); "
                "delete the whole set by name, or send several requests"
            )
        con = self._connection()
        with self._lock:
            cur = con.cursor()
            try:
                if ids:
                    cur.register("_ids", pa.table({"roi_id": pa.array(ids, pa.string())}))
                    owned = [
                        r[0]
                        for r in cur.execute(
                            "SELECT roi_id FROM rois WHERE array_id = ? AND roi_id IN (SELECT roi_id FROM _ids) "
                            "AND starts_with(set_name, ?) LIMIT 21",
                            [array_id, RESERVED_SET_PREFIX],
                        ).fetchall()
                    ]
                    if owned:
                        raise InvalidArgument(
                            f"{', '.join(sorted(owned)[:20])}: in a server-owned set; nothing was deleted"
                        )
                    if writer is not ANYONE:
                        _refuse_others_ids(cur, array_id, writer)
                    sql = "DELETE FROM rois WHERE array_id = ? AND roi_id IN (SELECT roi_id FROM _ids) RETURNING roi_id"
                    params: list[Any] = [array_id]
                elif set_name:
                    sql, params = (
                        "DELETE FROM rois WHERE array_id = ? AND set_name = ? RETURNING roi_id",
                        [array_id, set_name],
                    )
                else:
                    sql = "DELETE FROM rois WHERE array_id = ? AND NOT starts_with(set_name, ?) RETURNING roi_id"
                    params = [array_id, RESERVED_SET_PREFIX]
                if writer is not ANYONE:
                    sql = sql.replace(" RETURNING", " AND COALESCE(writer, '') = ? RETURNING")
                    params = [*params, writer]
                deleted = [r[0] for r in cur.execute(sql, params).fetchall()]
            finally:
                cur.close()
            self.generation += bool(deleted)
        return deleted

    def forget(self, array_id: str) -> int:
        """Delete every row of a tensor that is gone for good (a discarded upload: its id may
        later name another's upload), server-owned sets included; the number removed."""
        con = self._connection()
        with self._lock:
            cur = con.cursor()
            try:
                removed = len(
                    cur.execute("DELETE FROM rois WHERE array_id = ? RETURNING roi_id", [array_id]).fetchall()
                )
            finally:
                cur.close()
            self.generation += bool(removed)
        return removed

    def mark_seen(self, source_urls: Mapping[str, str]) -> None:
        """Stamp a sighting on every annotation whose source is in ``source_urls``
        (source_id -> url): the catalog lists it now. Absent sources are left alone."""
        if not source_urls:
            return
        import pyarrow as pa

        con = self._connection()
        seen = pa.table({"source_id": list(source_urls), "source_url": list(source_urls.values())})
        with self._lock:
            cur = con.cursor()
            try:
                cur.register("_seen", seen)
                cur.execute(
                    "UPDATE rois SET source_url = s.source_url, last_seen_at = ? FROM _seen s "
                    "WHERE rois.source_id = s.source_id",
                    [datetime.now()],
                )
                cur.unregister("_seen")
            finally:
                cur.close()
            self.generation += 1

    def unseen(self, before: datetime) -> list[UnseenRois]:
        rows = (
            self._cursor()
            .execute(
                "SELECT array_id, any_value(source_url), count(*), max(COALESCE(last_seen_at, created_at)) AS seen "
                f"FROM rois WHERE {_UNSEEN} GROUP BY array_id ORDER BY seen, array_id",
                [before, RESERVED_SET_PREFIX],
            )
            .fetchall()
        )
        return [UnseenRois(a, url, int(n), seen) for a, url, n, seen in rows]

    def prune(self, before: datetime, array_ids: Sequence[str] | None = None) -> int:
        """Delete the annotations unseen since ``before``; only those of ``array_ids`` when
        given (the ones the caller may read)."""
        if array_ids is not None and not array_ids:
            return 0
        only = "" if array_ids is None else " AND list_contains(?, array_id)"
        params: list[Any] = [before, RESERVED_SET_PREFIX] + ([list(array_ids)] if array_ids is not None else [])
        con = self._connection()
        with self._lock:
            cur = con.cursor()
            try:
                n = len(cur.execute(f"DELETE FROM rois WHERE {_UNSEEN}{only} RETURNING roi_id", params).fetchall())
            finally:
                cur.close()
            self.generation += bool(n)
        return n

    # ---- reads ----------------------------------------------------------------------------
    def list(self, array_id: str, set_name: str = "") -> tuple[list[Any], bool]:
        """``(annotations, truncated)`` in creation order; without ``set_name``, the
        client-owned sets only (a server-owned set is read by naming it). At most
        ``MAX_ROIS_PER_TENSOR`` rows and ``limits.max_list_chars`` of geometry and props
        (always at least one row): ``truncated`` says when more are stored."""
        where = "array_id = ?" + (" AND set_name = ?" if set_name else " AND NOT starts_with(set_name, ?)")
        params: list[Any] = [array_id, set_name or RESERVED_SET_PREFIX]
        size = "length(geometry) + COALESCE(length(props_json), 0) + COALESCE(length(label), 0)"
        rows = (
            self._cursor()
            .execute(
                f"SELECT {_READ_COLUMNS} FROM (SELECT *, sum({size}) OVER w AS upto, row_number() OVER w AS n "
                f"FROM rois WHERE {where} WINDOW w AS (ORDER BY created_at, roi_id)) "
                "WHERE n = 1 OR upto <= ? ORDER BY created_at, roi_id LIMIT ?",
                params + [self.limits.max_list_chars, MAX_ROIS_PER_TENSOR],
            )
            .fetchall()
        )
        total = self._cursor().execute(f"SELECT count(*) FROM rois WHERE {where}", params).fetchone()[0]
        return [_annotation(r) for r in rows], len(rows) < total

    def sets(self, array_id: str) -> list[tuple[str, int]]:
        rows = (
            self._cursor()
            .execute(
                "SELECT set_name, count(*) FROM rois WHERE array_id = ? GROUP BY set_name ORDER BY set_name", [array_id]
            )
            .fetchall()
        )
        return [(name, int(n)) for name, n in rows]

    def table(self) -> Any:
        """Every row as an Arrow table: the snapshot catalog SQL reads."""
        rel = self._cursor().sql("SELECT * EXCLUDE (writer) FROM rois")  # who wrote a row is not published
        fetch = getattr(rel, "to_arrow_table", None) or rel.arrow
        return fetch()
