"""The catalog and annotation verbs the biopb SDK and the Tensor Browser call.

Actions (``do_action``): ``resolve``, ``add_source``, ``remove_source``,
``catalog_children``, ``roi_prune``. ROI annotations also ride the data verbs:
``roi_read`` is a DoGet ticket, ``roi_put`` / ``roi_delete`` are DoPut commands
(``PutCommand`` in the descriptor, rows in the stream, the result in the put's metadata).
Message shapes are the SDK's own generated classes; the behaviour follows the biopb
reference server so client code written against it works here.

The server keeps the dispatch (and the auth check, which these verbs share with every
other call but ``health``); this module keeps what each verb does.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from tensor_server.catalog.catalog import Catalog, SourceRecord
from tensor_server.catalog.dropped import DroppedPaths
from tensor_server.catalog.rois import is_reserved_set
from tensor_server.catalog.tree import DEFAULT_LIMIT, CatalogTree
from tensor_server.errors import InvalidArgument, TensorServerError
from tensor_server.flight.wire import flight_error

__all__ = ["CatalogActions", "ACTION_DESCRIPTIONS"]

ACTION_DESCRIPTIONS = [
    ("resolve", "open an unreadable source again now; streams its catalog row"),
    ("add_source", "register a path on the server's disk for this server's lifetime (streams progress)"),
    ("remove_source", "deregister a path added with add_source (its dnd:// branch)"),
    ("catalog_children", "one level of the catalog tree: the folders and sources under a folder (JSON)"),
    ("roi_prune", "report (or with apply, delete) annotations whose source has been unseen for N days"),
]


def _one(body: bytes) -> Iterator[flight.Result]:
    return iter([flight.Result(body)])


class CatalogActions:
    """The verbs above, over one catalog (its ``rois`` store included)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.dropped = DroppedPaths(catalog)
        self._tree: tuple[int, CatalogTree] | None = None  # (catalog generation, its index)

    def handles(self, kind: str) -> bool:
        return any(kind == name for name, _ in ACTION_DESCRIPTIONS)

    def do_action(self, kind: str, body: bytes) -> Iterator[flight.Result]:
        """Run action ``kind``; package errors leave as the Flight errors the SDK reads."""
        from google.protobuf.message import DecodeError

        try:
            if kind == "resolve":
                return _one(self._resolve(body.decode("utf-8", "replace")))
            if kind == "add_source":
                return iter([flight.Result(m) for m in self._add_source(body)])
            if kind == "remove_source":
                return _one(self._remove_source(body))
            if kind == "catalog_children":
                return _one(self._catalog_children(body))
            if kind == "roi_prune":
                return _one(self._roi_prune(body))
        except flight.FlightError:
            raise
        except DecodeError:
            raise flight_error(InvalidArgument(f"{kind}: the request body is not the SDK's request message")) from None
        except Exception as exc:
            raise flight_error(exc) from None
        raise flight.FlightServerError(f"Unknown action: {kind}")

    # ---- sources ---------------------------------------------------------------------------
    def _row_ipc(self, rec: SourceRecord) -> bytes:
        table = self.catalog.sources_table([rec])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes()

    def _resolve(self, source_id: str) -> bytes:
        from biopb.tensor.descriptor_pb2 import ResolveStreamMessage

        rec = self.catalog.resolve(source_id.strip())
        return ResolveStreamMessage(source_row=self._row_ipc(rec)).SerializeToString()

    def _add_source(self, body: bytes) -> Iterator[bytes]:
        from biopb.tensor.descriptor_pb2 import AddSourceProgress, AddSourceRequest, AddSourceResult, AddSourceStreamMessage

        req = AddSourceRequest.FromString(body)
        progress: list[bytes] = []

        def on_source(count: int, path: str) -> None:
            msg = AddSourceStreamMessage(progress=AddSourceProgress(added_count=count, current_path=path))
            progress.append(msg.SerializeToString())

        tally = self.dropped.add(req.url, req.source_type, on_source)
        result = AddSourceResult(added=tally.added, already_present=tally.already_present,
                                 refreshed=tally.refreshed, removed=tally.removed)
        for path, reason in tally.failed:
            result.failed.add(path=path, reason=reason)
        for msg in progress:
            yield msg
        yield AddSourceStreamMessage(result=result).SerializeToString()

    def _remove_source(self, body: bytes) -> bytes:
        from biopb.tensor.descriptor_pb2 import RemoveSourceRequest, RemoveSourceResult

        req = RemoveSourceRequest.FromString(body)
        return RemoveSourceResult(removed=self.dropped.remove(req.root_url)).SerializeToString()

    def _catalog_children(self, body: bytes) -> bytes:
        try:
            req = json.loads(body) if body else {}
        except ValueError:
            req = None
        if not isinstance(req, dict):
            raise InvalidArgument("catalog_children takes a JSON object {\"key\": ..., \"limit\": ...}")
        key, limit = req.get("key", ""), req.get("limit", DEFAULT_LIMIT)
        if not isinstance(key, str) or isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidArgument("catalog_children takes a string key and a positive integer limit")
        return json.dumps(self._catalog_tree().children(key, limit), ensure_ascii=False,
                          separators=(",", ":")).encode()

    def _catalog_tree(self) -> CatalogTree:
        """The folder index, rebuilt only when the catalog's rows changed."""
        cached = self._tree
        generation = self.catalog.generation
        if cached is None or cached[0] != generation:
            rows = [(r.source_id, r.url, r.lists_tensors()) for r in self.catalog.records()]
            cached = self._tree = (generation, CatalogTree(rows))
        return cached[1]

    # ---- ROI annotations -------------------------------------------------------------------
    def _roi_array_id(self, array_id: str, *, strict: bool) -> str:
        """The tensor id annotations are filed under: a bare source id is its default
        tensor's id, so a read of either finds them. A write (``strict``) must name a
        source the catalog has; a read or delete of an id whose source is gone passes
        through, so what was written earlier can still be listed and removed."""
        if not array_id:
            raise InvalidArgument("array_id is required")
        source_id, _, fld = array_id.partition("/")
        try:
            rec = self.catalog.get_record(source_id)
        except KeyError:
            if strict:
                raise InvalidArgument(f"array_id {array_id!r} names no known source") from None
            return array_id
        if fld or rec.source is None:
            return array_id
        return rec.source.tensor().array_id

    def _source_url(self, array_id: str) -> str | None:
        try:
            return self.catalog.get_record(array_id.split("/", 1)[0]).url
        except KeyError:
            return None

    def roi_read(self, req: Any) -> flight.RecordBatchStream:
        """One tensor's annotations as ROI rows; ``truncated`` and the tensor's ``sets``
        (JSON) ride the stream's schema metadata, as the SDK decodes them."""
        from biopb.tensor._roi_rows import rois_to_table

        array_id = self._roi_array_id(req.array_id, strict=False)
        rois, truncated = self.catalog.rois.list(array_id, req.set_name)
        sets = [{"set_name": n, "count": c, "reserved": is_reserved_set(n)} for n, c in self.catalog.rois.sets(array_id)]
        table = rois_to_table(rois, {b"truncated": str(truncated).encode(), b"sets": json.dumps(sets).encode()})
        return flight.RecordBatchStream(table)

    def roi_put(self, cmd: Any, reader: Any, writer: Any) -> None:
        """A ``roi_put`` or ``roi_delete`` DoPut: apply it, answer in the put's metadata."""
        from biopb.image.annotation_pb2 import RoiDeleteResult, RoiPutResult
        from biopb.tensor._roi_rows import table_to_roi_ids, table_to_rois

        try:
            table = reader.read_all()
            if cmd.WhichOneof("command") == "roi_put":
                asked = cmd.roi_put.array_id
                array_id = self._roi_array_id(asked, strict=True)
                try:
                    rois = table_to_rois(table)
                except ValueError as exc:
                    raise InvalidArgument(f"roi_put on {asked}: {exc}") from None
                for roi in rois:
                    if roi.array_id == asked:
                        roi.array_id = array_id
                stored, conflicts = self.catalog.rois.put(array_id, rois, source_url=self._source_url(array_id),
                                                          check_rev=cmd.roi_put.check_rev)
                reply = RoiPutResult(stored=stored, conflicts=conflicts)
            else:
                try:
                    ids = table_to_roi_ids(table)
                except ValueError as exc:
                    raise InvalidArgument(f"roi_delete: {exc}") from None
                array_id = self._roi_array_id(cmd.roi_delete.array_id, strict=False)
                reply = RoiDeleteResult(deleted=self.catalog.rois.delete(array_id, ids, cmd.roi_delete.set_name))
        except (TensorServerError, flight.FlightError) as exc:
            raise flight_error(exc) from None
        writer.write(pa.py_buffer(reply.SerializeToString()))

    def _roi_prune(self, body: bytes) -> bytes:
        """Report, and with ``apply`` delete, annotations whose source has not been in the
        catalog for ``unseen_days``. Sightings are stamped first, but only from a complete
        catalog: a source missing from a half-finished scan is not evidence of anything."""
        from biopb.image.annotation_pb2 import RoiPruneRequest, RoiPruneResult, RoiUnseen

        req = RoiPruneRequest.FromString(body)
        if req.unseen_days <= 0:
            raise InvalidArgument("roi_prune: unseen_days must be positive")
        store = self.catalog.rois
        if self.catalog.first_scan_done.is_set() and not self.catalog.scan_in_progress:
            store.mark_seen({r.source_id: r.url for r in self.catalog.records()})
        before = datetime.now() - timedelta(days=req.unseen_days)
        unseen = [RoiUnseen(array_id=u.array_id, source_url=u.source_url or "", count=u.count,
                            last_seen_at_unix_ms=int(u.last_seen_at.timestamp() * 1000) if u.last_seen_at else 0)
                  for u in store.unseen(before)]
        deleted = store.prune(before) if req.apply and unseen else 0
        return RoiPruneResult(unseen=unseen, deleted=deleted).SerializeToString()
