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

import math
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

from tensor_server.core.identity import ArrayId
from tensor_server.errors import InvalidArgument

__all__ = ["RoiStore", "RoiStoreBusy", "UnseenRois", "RESERVED_SET_PREFIX", "MAX_ROIS_PER_TENSOR"]

RESERVED_SET_PREFIX = "@"
#: An annotation store, not a segmentation store: past this a label tensor is the tool.
MAX_ROIS_PER_TENSOR = 10_000
_MAX_ROI_ID_LEN = 128
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
    PRIMARY KEY (array_id, roi_id)
)
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
_READ_COLUMNS = ("roi_id, array_id, set_name, label, plane, geometry, props_json, "
                 "drawn_against_version, rev, created_at, updated_at")
#: one predicate for the prune report and the prune itself, so what is shown is what goes
_UNSEEN = "COALESCE(last_seen_at, created_at) < ? AND NOT starts_with(set_name, ?)"


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


def _bbox(roi: Any, kind: str) -> list[float]:
    """Axis-aligned [x0, y0, x1, y1] in level-0 pixels: what makes the SQL surface useful."""
    if kind in ("point", "text"):
        p = roi.point if kind == "point" else roi.text.at
        return [p.x, p.y, p.x, p.y]
    if kind == "rectangle":
        a, b = roi.rectangle.top_left, roi.rectangle.bottom_right
        return [min(a.x, b.x), min(a.y, b.y), max(a.x, b.x), max(a.y, b.y)]
    if kind == "ellipse":
        c, r, t = roi.ellipse.center, roi.ellipse.radius, roi.ellipse.rotation
        hx = math.hypot(r.x * math.cos(t), r.y * math.sin(t))
        hy = math.hypot(r.x * math.sin(t), r.y * math.cos(t))
        return [c.x - hx, c.y - hy, c.x + hx, c.y + hy]
    points = roi.polyline.points if kind == "polyline" else roi.polygon.points
    need = 2 if kind == "polyline" else 3
    if len(points) < need:
        raise InvalidArgument(f"a {kind} needs at least {need} points, got {len(points)}")
    pad = abs(roi.polyline.width) / 2.0 if kind == "polyline" else 0.0
    xs, ys = [p.x for p in points], [p.y for p in points]
    return [min(xs) - pad, min(ys) - pad, max(xs) + pad, max(ys) + pad]


def _prepare(array_id: str, roi: Any) -> _Prepared:
    from google.protobuf import json_format

    if roi.array_id and roi.array_id != array_id:
        raise InvalidArgument(f"annotation array_id {roi.array_id!r} does not match the request's {array_id!r}")
    roi_id = roi.roi_id.strip()
    if len(roi_id) > _MAX_ROI_ID_LEN:
        raise InvalidArgument(f"roi_id is longer than {_MAX_ROI_ID_LEN} characters: {roi_id[:32]!r}...")
    if "," in roi_id:
        raise InvalidArgument(f"roi_id may not contain a comma: {roi_id!r}")
    set_name = roi.set_name or "default"
    if is_reserved_set(set_name):
        raise InvalidArgument(f"set_name {set_name!r} is in the server-owned {RESERVED_SET_PREFIX!r} namespace; "
                              "copy the set into one of your own to edit it")
    kind = roi.roi.WhichOneof("shape")
    if kind is None:
        raise InvalidArgument(f"annotation {roi_id or '<new>'} has no geometry")
    if kind not in _ACCEPTED_SHAPES:
        raise InvalidArgument(f"geometry {kind!r} is not stored as an annotation (accepted: "
                              f"{', '.join(sorted(_ACCEPTED_SHAPES))}); a segmentation belongs in a label tensor")
    if kind == "text" and not roi.roi.text.text.strip():
        raise InvalidArgument("caption text is empty")
    return _Prepared(
        roi_id=roi_id or uuid.uuid4().hex, set_name=set_name, label=roi.label, shape_kind=kind,
        plane=dict(roi.plane), bbox=_bbox(roi.roi, kind),
        geometry=json_format.MessageToJson(roi.roi, indent=0).replace("\n", ""),
        props_json=roi.props_json or None,
        drawn_against_version=roi.drawn_against_version.hex() if roi.HasField("drawn_against_version") else None,
        rev=roi.rev, roi=roi.roi,
    )


def _unix_ms(value: datetime | None) -> int:
    return int(value.timestamp() * 1000) if value is not None else 0


def _annotation(row: Sequence[Any]) -> Any:
    from biopb.image.annotation_pb2 import RoiAnnotation
    from google.protobuf import json_format

    roi_id, array_id, set_name, label, plane, geometry, props, drawn, rev, created, updated = row
    out = RoiAnnotation(roi_id=roi_id, array_id=array_id, set_name=set_name, label=label or "",
                        props_json=props or "", rev=rev, created_at_unix_ms=_unix_ms(created),
                        updated_at_unix_ms=_unix_ms(updated))
    json_format.Parse(geometry, out.roi)
    out.plane.update(dict(plane or {}))
    if drawn is not None:
        out.drawn_against_version = bytes.fromhex(drawn)
    return out


class RoiStore:
    """The ``rois`` table in a DuckDB file (or in memory). Thread-safe: writers take one
    lock; every statement runs on its own cursor."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
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
        rows = self._cursor().execute("SELECT array_id, mbps, samples, epoch_us(updated_at) FROM decode_rates").fetchall()
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
                    cur.executemany("INSERT INTO decode_rates VALUES (?, ?, ?, make_timestamp(?::BIGINT))",
                                    [(k, v[0], v[1], round(v[2] * 1e6)) for k, v in rows.items()])
                cur.execute("COMMIT")
            except Exception:
                cur.execute("ROLLBACK")
                raise

    # ---- writes ---------------------------------------------------------------------------
    def put(self, array_id: str, rois: Sequence[Any], *, source_url: str | None, check_rev: bool = False
            ) -> tuple[list[Any], list[Any]]:
        """Create or update ``rois`` on ``array_id`` as one unit: ``(stored, conflicts)``.
        ``source_url`` is the source's catalog url when it is in the catalog now (a
        sighting), else None."""
        from biopb.image.annotation_pb2 import RoiConflict

        prepared = [_prepare(array_id, r) for r in rois]
        ids = [p.roi_id for p in prepared]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise InvalidArgument(f"duplicate roi_id in one batch: {dup}")
        source_id = ArrayId.parse(array_id).source_id
        con = self._connection()
        stored: list[Any] = []
        conflicts: list[Any] = []
        with self._lock:
            now = datetime.now()
            cur = con.cursor()
            cur.execute("BEGIN TRANSACTION")
            try:
                existing = {r[0]: (r[1], r[2], r[3]) for r in cur.execute(
                    "SELECT roi_id, rev, created_at, set_name FROM rois WHERE array_id = ?", [array_id]).fetchall()}
                moved = sorted(p.roi_id for p in prepared if p.roi_id in existing and is_reserved_set(existing[p.roi_id][2]))
                if moved:
                    raise InvalidArgument(f"{', '.join(moved)}: stored in a server-owned set; give the copy a new roi_id")
                authored = sum(1 for v in existing.values() if not is_reserved_set(v[2]))
                new = sum(1 for p in prepared if p.roi_id not in existing)
                if authored + new > MAX_ROIS_PER_TENSOR:
                    raise InvalidArgument(f"annotation limit reached for {array_id}: {authored} stored + {new} new "
                                          f"exceeds {MAX_ROIS_PER_TENSOR}; a segmentation belongs in a label tensor")
                if source_url is not None:
                    cur.execute("UPDATE rois SET source_url = ?, last_seen_at = ? WHERE source_id = ?",
                                [source_url, now, source_id])
                for p in prepared:
                    prior = existing.get(p.roi_id)
                    if prior is not None and check_rev and p.rev != prior[0]:
                        conflicts.append(RoiConflict(roi_id=p.roi_id, stored_rev=prior[0]))
                        continue
                    client_cols = [p.set_name, p.label, p.shape_kind, p.plane, p.bbox, p.geometry, p.props_json,
                                   p.drawn_against_version]
                    if prior is None:
                        rev, created = 1, now
                        cur.execute(
                            "INSERT INTO rois (roi_id, array_id, source_id, set_name, label, shape_kind, plane, bbox, "
                            "geometry, props_json, drawn_against_version, rev, created_at, updated_at, source_url, "
                            "last_seen_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            [p.roi_id, array_id, source_id, *client_cols, rev, now, now, source_url,
                             now if source_url is not None else None])
                    else:
                        rev, created = prior[0] + 1, prior[1]
                        cur.execute(
                            "UPDATE rois SET set_name = ?, label = ?, shape_kind = ?, plane = ?, bbox = ?, geometry = ?, "
                            "props_json = ?, drawn_against_version = ?, rev = ?, updated_at = ? "
                            "WHERE array_id = ? AND roi_id = ?", [*client_cols, rev, now, array_id, p.roi_id])
                    stored.append(_annotation((p.roi_id, array_id, p.set_name, p.label, p.plane, p.geometry,
                                               p.props_json, p.drawn_against_version, rev, created, now)))
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            finally:
                cur.close()
            self.generation += 1
        return stored, conflicts

    def delete(self, array_id: str, roi_ids: Iterable[str] = (), set_name: str = "") -> list[str]:
        """Delete those ids, else the whole set, else every client-owned annotation of the
        tensor; return the ids removed. Server-owned (``@``) sets are refused, never
        silently skipped."""
        if is_reserved_set(set_name):
            raise InvalidArgument(f"set_name {set_name!r} is server-owned; there is nothing to delete there")
        ids = list(roi_ids)
        con = self._connection()
        with self._lock:
            cur = con.cursor()
            try:
                if ids:
                    marks = ", ".join("?" for _ in ids)
                    owned = [r[0] for r in cur.execute(
                        f"SELECT roi_id FROM rois WHERE array_id = ? AND roi_id IN ({marks}) AND starts_with(set_name, ?)",
                        [array_id, *ids, RESERVED_SET_PREFIX]).fetchall()]
                    if owned:
                        raise InvalidArgument(f"{', '.join(sorted(owned))}: in a server-owned set; nothing was deleted")
                    sql, params = f"DELETE FROM rois WHERE array_id = ? AND roi_id IN ({marks}) RETURNING roi_id", [array_id, *ids]
                elif set_name:
                    sql, params = "DELETE FROM rois WHERE array_id = ? AND set_name = ? RETURNING roi_id", [array_id, set_name]
                else:
                    sql = "DELETE FROM rois WHERE array_id = ? AND NOT starts_with(set_name, ?) RETURNING roi_id"
                    params = [array_id, RESERVED_SET_PREFIX]
                deleted = [r[0] for r in cur.execute(sql, params).fetchall()]
            finally:
                cur.close()
            self.generation += bool(deleted)
        return deleted

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
                cur.execute("UPDATE rois SET source_url = s.source_url, last_seen_at = ? FROM _seen s "
                            "WHERE rois.source_id = s.source_id", [datetime.now()])
                cur.unregister("_seen")
            finally:
                cur.close()
            self.generation += 1

    def unseen(self, before: datetime) -> list[UnseenRois]:
        rows = self._cursor().execute(
            "SELECT array_id, any_value(source_url), count(*), max(COALESCE(last_seen_at, created_at)) AS seen "
            f"FROM rois WHERE {_UNSEEN} GROUP BY array_id ORDER BY seen, array_id",
            [before, RESERVED_SET_PREFIX]).fetchall()
        return [UnseenRois(a, url, int(n), seen) for a, url, n, seen in rows]

    def prune(self, before: datetime) -> int:
        con = self._connection()
        with self._lock:
            cur = con.cursor()
            try:
                n = len(cur.execute(f"DELETE FROM rois WHERE {_UNSEEN} RETURNING roi_id",
                                    [before, RESERVED_SET_PREFIX]).fetchall())
            finally:
                cur.close()
            self.generation += bool(n)
        return n

    # ---- reads ----------------------------------------------------------------------------
    def list(self, array_id: str, set_name: str = "") -> tuple[list[Any], bool]:
        """``(annotations, truncated)`` in creation order; without ``set_name``, the
        client-owned sets only (a server-owned set is read by naming it)."""
        sql = f"SELECT {_READ_COLUMNS} FROM rois WHERE array_id = ?"
        params: list[Any] = [array_id]
        if set_name:
            sql += " AND set_name = ?"
            params.append(set_name)
        else:
            sql += " AND NOT starts_with(set_name, ?)"
            params.append(RESERVED_SET_PREFIX)
        rows = self._cursor().execute(sql + " ORDER BY created_at, roi_id LIMIT ?",
                                      params + [MAX_ROIS_PER_TENSOR + 1]).fetchall()
        truncated = len(rows) > MAX_ROIS_PER_TENSOR
        return [_annotation(r) for r in rows[:MAX_ROIS_PER_TENSOR]], truncated

    def sets(self, array_id: str) -> list[tuple[str, int]]:
        rows = self._cursor().execute(
            "SELECT set_name, count(*) FROM rois WHERE array_id = ? GROUP BY set_name ORDER BY set_name",
            [array_id]).fetchall()
        return [(name, int(n)) for name, n in rows]

    def table(self) -> Any:
        """Every row as an Arrow table: the snapshot catalog SQL reads."""
        rel = self._cursor().sql("SELECT * FROM rois")
        fetch = getattr(rel, "to_arrow_table", None) or rel.arrow
        return fetch()
