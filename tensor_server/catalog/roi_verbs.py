"""The ROI verbs as the serving runtime calls them: one function per verb, every rule here.

A door (Flight DoGet/DoPut, HTTP) translates its request into one of these calls and the
answer back; it never reads a stream whole, checks a target or does date arithmetic itself.
Order matters for a write: the target is checked first (an id must name a tensor the catalog
serves, so the per-tensor cap cannot be dodged with invented ``<source_id>/<anything>`` ids),
then the rows are taken batch by batch within ``RoiLimits.max_request_bytes``, then stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from tensor_server.catalog.rois import is_reserved_set
from tensor_server.core.bounded_stream import take_within
from tensor_server.core.identity import ArrayId
from tensor_server.core.json_body import bounded_int
from tensor_server.errors import InvalidArgument, RequestTooLarge, SourceUnresolved, TensorNotFound

__all__ = ["roi_target", "read_rois", "put_rois", "store_rois", "delete_rois", "prune_rois", "MAX_UNSEEN_DAYS"]

#: a century: a cut-off further back than this is not a retention policy (and past ~2000
#: years the date arithmetic itself overflows)
MAX_UNSEEN_DAYS = 36_500


def roi_target(catalog: Any, array_id: str, *, write: bool) -> str:
    """The tensor id annotations are filed under: a bare source id is its default tensor's
    id, so a read of either finds them. A write must name a tensor the catalog serves now
    (``InvalidArgument`` otherwise); a read or delete of an id whose source is gone passes
    through, so what was written earlier can still be listed and removed."""
    if not array_id:
        raise InvalidArgument("array_id is required")
    source_id, fld = ArrayId.parse(array_id)
    try:
        rec = catalog.get_record(source_id)
    except KeyError:
        if write:
            raise InvalidArgument(f"array_id {array_id!r} names no known source") from None
        return array_id
    if rec.source is None:
        if write and fld:
            raise InvalidArgument(
                f"array_id {array_id!r}: its source is unreadable ({rec.unresolved_reason}), so "
                "the tensor cannot be checked; resolve the source first"
            )
        return array_id
    if write and fld:
        try:
            catalog.find_tensor(array_id)
        except (TensorNotFound, SourceUnresolved):
            raise InvalidArgument(
                f"array_id {array_id!r} names no tensor of source {source_id!r}; "
                f"its tensors: {sorted(rec.source.tensors)[:20]}"
            ) from None
    return array_id if fld else rec.source.tensor().array_id


def _source_url(catalog: Any, array_id: str) -> str | None:
    try:
        return catalog.get_record(ArrayId.parse(array_id).source_id).url
    except KeyError:
        return None


def read_rois(catalog: Any, array_id: str, set_name: str = "") -> Any:
    """One tensor's annotations as ROI rows (a ``pyarrow.Table``); ``truncated`` and the
    tensor's ``sets`` (JSON) ride the schema metadata, as the SDK decodes them."""
    from biopb.tensor._roi_rows import rois_to_table

    target = roi_target(catalog, array_id, write=False)
    rois, truncated = catalog.rois.list(target, set_name)
    sets = [{"set_name": n, "count": c, "reserved": is_reserved_set(n)} for n, c in catalog.rois.sets(target)]
    return rois_to_table(rois, {b"truncated": str(truncated).encode(), b"sets": json.dumps(sets).encode()})


def _table(batches: Iterable[Any], max_bytes: int, what: str, cancelled: Callable[[], bool] | None, schema: Any) -> Any:
    import pyarrow as pa

    taken = take_within(batches, max_bytes, what, cancelled=cancelled)
    if not taken:
        return schema.empty_table()
    try:
        return pa.Table.from_batches(taken)
    except pa.ArrowInvalid as exc:
        raise InvalidArgument(f"{what}: the batches do not share one schema: {str(exc)[:200]}") from None


def put_rois(
    catalog: Any,
    array_id: str,
    batches: Iterable[Any],
    *,
    check_rev: bool = False,
    cancelled: Callable[[], bool] | None = None,
    writer: str | None = None,
) -> Any:
    """A ``roi_put``: ``RoiPutResult``. ``batches`` are the stream's Arrow record batches,
    read only after the target is known and only within the request budget."""
    from biopb.image.annotation_pb2 import RoiPutResult
    from biopb.tensor._roi_rows import ROI_ROW_SCHEMA, table_to_rois

    store = catalog.rois
    target = roi_target(catalog, array_id, write=True)
    what = f"roi_put on {array_id}"
    table = _table(batches, store.limits.max_request_bytes, what, cancelled, ROI_ROW_SCHEMA)
    if table.num_rows > store.limits.max_rows_per_put:
        raise _too_many(what, table.num_rows, store.limits.max_rows_per_put)
    _check_column_sizes(table, store.limits, what)
    try:
        rois = table_to_rois(table)
    except ValueError as exc:
        raise InvalidArgument(f"{what}: {str(exc)[:300]}") from None
    stored, conflicts = store_rois(catalog, array_id, rois, check_rev=check_rev, writer=writer, target=target)
    return RoiPutResult(stored=stored, conflicts=conflicts)


def store_rois(
    catalog: Any,
    array_id: str,
    rois: list[Any],
    *,
    check_rev: bool = False,
    writer: str | None = None,
    target: str | None = None,
) -> tuple[list[Any], list[Any]]:
    """Store annotations (``RoiAnnotation`` messages: a ``roi_put``'s rows, a GeoJSON import)
    on ``array_id`` as one unit: ``(stored, conflicts)``. ``target``: ``roi_target`` of it,
    when the caller found it already."""
    target = target or roi_target(catalog, array_id, write=True)
    for roi in rois:
        if roi.array_id in ("", array_id):
            roi.array_id = target
    return catalog.rois.put(target, rois, source_url=_source_url(catalog, target), check_rev=check_rev, writer=writer)


#: characters of proto3 JSON one vertex takes at most ({"x": -1.2345678901234567e+300, ...})
_JSON_CHARS_PER_POINT = 96


def _check_column_sizes(table: Any, limits: Any, what: str) -> None:
    """Refuse oversized text columns before any row is decoded: parsing a 40 MB geometry
    into a proto is itself the cost to avoid. A column of the wrong type is left to the
    row decoder, which names it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    caps = {
        "label": limits.max_label_chars,
        "props_json": limits.max_props_json_chars,
        "geometry": limits.max_points_per_shape * _JSON_CHARS_PER_POINT + 4096,
    }
    for name, cap in caps.items():
        if name not in table.schema.names or table.num_rows == 0:
            continue
        try:
            longest = pc.max(pc.utf8_length(table.column(name))).as_py()
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            continue
        if longest is not None and longest > cap:
            raise RequestTooLarge(f"{what}: a {name} of {longest} characters is above the limit of {cap}")


def _too_many(what: str, n: int, cap: int) -> RequestTooLarge:
    return RequestTooLarge(f"{what}: {n} rows in one request, above the limit of {cap}; send several requests")


def delete_rois(
    catalog: Any,
    array_id: str,
    batches: Iterable[Any] = (),
    set_name: str = "",
    *,
    cancelled: Callable[[], bool] | None = None,
    writer: str | None = None,
) -> Any:
    """A ``roi_delete``: ``RoiDeleteResult``. ``batches`` carry the ``roi_id`` column (none:
    the named set, else every client-owned annotation of the tensor). ``writer``: only rows it
    wrote are removed, and an id another wrote is refused (None: any row, the server token's right)."""
    from biopb.image.annotation_pb2 import RoiDeleteResult
    from biopb.tensor._roi_rows import ROI_ID_SCHEMA, table_to_roi_ids

    store = catalog.rois
    target = roi_target(catalog, array_id, write=False)
    what = f"roi_delete on {array_id}"
    table = _table(batches, store.limits.max_request_bytes, what, cancelled, ROI_ID_SCHEMA)
    if table.num_rows > store.limits.max_ids_per_delete:
        raise _too_many(what, table.num_rows, store.limits.max_ids_per_delete)
    try:
        ids = table_to_roi_ids(table)
    except ValueError as exc:
        raise InvalidArgument(f"{what}: {exc}") from None
    return RoiDeleteResult(deleted=store.delete(target, ids, set_name, writer=writer))


def prune_rois(
    catalog: Any,
    unseen_days: Any,
    apply: bool = False,
    *,
    now: datetime | None = None,
    hides: Callable[[str], bool] | None = None,
) -> Any:
    """Report, and with ``apply`` delete, annotations whose source has not been in the
    catalog for ``unseen_days`` (1 to ``MAX_UNSEEN_DAYS``): ``RoiPruneResult``. Sightings
    are stamped first, but only from a complete catalog: a source missing from a
    half-finished scan is not evidence of anything. ``hides(array_id)``: the tensors whose
    rows the caller may not read (``Access.row_view``), neither reported nor deleted."""
    from biopb.image.annotation_pb2 import RoiPruneResult, RoiUnseen

    days = bounded_int(unseen_days, "roi_prune: unseen_days", 1, MAX_UNSEEN_DAYS)
    store = catalog.rois
    if catalog.first_scan_done.is_set() and not catalog.scan_in_progress:
        store.mark_seen({r.source_id: r.url for r in catalog.records()})
    before = (now or datetime.now()) - timedelta(days=days)
    unseen = [
        RoiUnseen(
            array_id=u.array_id,
            source_url=u.source_url or "",
            count=u.count,
            last_seen_at_unix_ms=int(u.last_seen_at.timestamp() * 1000) if u.last_seen_at else 0,
        )
        for u in store.unseen(before)
    ]
    shown = [u for u in unseen if hides is None or not hides(u.array_id)]
    only = None if len(shown) == len(unseen) else [u.array_id for u in shown]
    deleted = store.prune(before, only) if apply and shown else 0
    unseen = shown
    return RoiPruneResult(unseen=unseen, deleted=deleted)
