"""The catalog and annotation verbs the biopb SDK and the Tensor Browser call.

Actions: ``resolve``, ``add_source``, ``remove_source``, ``catalog_children``, ``roi_prune``;
ROI annotations also ride the data verbs (``roi_read`` a read ticket, ``roi_put`` /
``roi_delete`` writes whose rows arrive as Arrow batches). Message shapes are the SDK's own
generated classes; the behaviour follows the biopb reference server so client code written
against it works here. Transport-free: bodies in, bytes (or an Arrow table) out.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import pyarrow as pa

from tensor_server.catalog.catalog import SourceRecord
from tensor_server.catalog.dropped import DroppedPaths
from tensor_server.catalog.rois import is_reserved_set
from tensor_server.catalog.tree import DEFAULT_LIMIT, CatalogTree
from tensor_server.core.identity import ArrayId
from tensor_server.errors import InvalidArgument, PermissionDenied, RequestTooLarge, TensorNotFound
from tensor_server.service.bodies import decode_json, decode_message

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.service.caller import Caller
    from tensor_server.service.runtime import ServingRuntime

__all__ = ["CatalogVerbs"]

#: bytes of ROI rows one roi_put / roi_delete may carry (the stream is read batch by batch
#: and refused past this, before it is all in memory)
MAX_ROI_REQUEST_BYTES = 64 << 20


class CatalogVerbs:
    """The verbs above over one runtime's catalog (its ``rois`` store included)."""

    def __init__(self, runtime: ServingRuntime) -> None:
        self.runtime = runtime
        self.catalog = runtime.catalog
        self.dropped = DroppedPaths(runtime.catalog)
        self._tree: tuple[int, CatalogTree] | None = None  # (catalog generation, its index)

    # ---- sources ---------------------------------------------------------------------------
    def _row_ipc(self, rec: SourceRecord) -> bytes:
        table = self.catalog.sources_table([rec])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes()

    def resolve(self, body: bytes) -> Iterator[bytes]:
        from biopb.tensor.descriptor_pb2 import ResolveStreamMessage

        rec = self.catalog.resolve(bytes(body).decode("utf-8", "replace").strip())
        yield ResolveStreamMessage(source_row=self._row_ipc(rec)).SerializeToString()

    def add_source(self, body: bytes) -> Iterator[bytes]:
        from biopb.tensor.descriptor_pb2 import (
            AddSourceProgress,
            AddSourceRequest,
            AddSourceResult,
            AddSourceStreamMessage,
        )

        req = decode_message(AddSourceRequest, body, "add_source")
        if not self.runtime.settings.add_source:
            raise PermissionDenied("add_source: this server was started with --no-add-source; it serves its roots only")
        self._refuse_write_dir(req.url)
        progress: list[bytes] = []

        def on_source(count: int, path: str) -> None:
            msg = AddSourceStreamMessage(progress=AddSourceProgress(added_count=count, current_path=path))
            progress.append(msg.SerializeToString())

        tally = self.dropped.add(req.url, req.source_type, on_source)
        result = AddSourceResult(added=tally.added, already_present=tally.already_present,
                                 refreshed=tally.refreshed, removed=tally.removed)
        for path, reason in tally.failed:
            result.failed.add(path=path, reason=reason)
        yield from progress
        yield AddSourceStreamMessage(result=result).SerializeToString()

    def _refuse_write_dir(self, raw_path: str) -> None:
        """The write dir holds uploads, served through the upload gate: added as a source it
        would serve PENDING pixels around that gate."""
        uploads = self.runtime.uploads
        if uploads is None or not raw_path:
            return
        try:
            path = Path(raw_path.removeprefix("file://")).expanduser().resolve()
        except (OSError, RuntimeError, ValueError):
            return  # the add itself reports the path
        wd = uploads.write_dir
        if path == wd or wd in path.parents or path in wd.parents:
            raise PermissionDenied(f"add_source: {raw_path!r} is (or holds) this server's write dir, whose "
                                   "uploads are served only through their upload's state; add another path")

    def remove_source(self, body: bytes) -> Iterator[bytes]:
        from biopb.tensor.descriptor_pb2 import RemoveSourceRequest, RemoveSourceResult

        req = decode_message(RemoveSourceRequest, body, "remove_source")
        yield RemoveSourceResult(removed=self.dropped.remove(req.root_url)).SerializeToString()

    def catalog_children(self, body: bytes) -> Iterator[bytes]:
        req = decode_json(body, "catalog_children", empty={})
        usage = 'catalog_children takes a JSON object with a string key and a positive integer limit: {"key": "", "limit": 100}'
        if not isinstance(req, dict):
            raise InvalidArgument(usage)
        key, limit = req.get("key", ""), req.get("limit", DEFAULT_LIMIT)
        if not isinstance(key, str) or isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidArgument(usage)
        yield json.dumps(self._catalog_tree().children(key, limit), ensure_ascii=False,
                         separators=(",", ":")).encode()

    def _catalog_tree(self) -> CatalogTree:
        """The folder index, rebuilt only when the catalog's rows changed."""
        cached = self._tree
        generation = self.catalog.generation
        if cached is None or cached[0] != generation:
            rows = [(r.source_id, r.url, r.source is None or bool(r.source.tensors)) for r in self.catalog.records()]
            cached = self._tree = (generation, CatalogTree(rows))
        return cached[1]

    # ---- ROI annotations -------------------------------------------------------------------
    def _roi_array_id(self, array_id: str, *, strict: bool) -> str:
        """The tensor id annotations are filed under: a bare source id is its default
        tensor's id, so a read of either finds them. A write (``strict``) must name a tensor
        the catalog has; a read or delete of an id whose source is gone passes through, so
        what was written earlier can still be listed and removed."""
        if not array_id:
            raise InvalidArgument("array_id is required")
        try:
            tensor, _ = self.catalog.find_tensor(array_id)
        except TensorNotFound:
            if strict:
                raise InvalidArgument(f"array_id {array_id!r} names no tensor this server serves") from None
            return array_id
        return tensor.array_id

    def _source_url(self, array_id: str) -> str | None:
        try:
            return self.catalog.get_record(ArrayId.parse(array_id).source_id).url
        except TensorNotFound:
            return None

    def roi_read(self, req: Any, caller: Caller) -> pa.Table:
        """One tensor's annotations as ROI rows; ``truncated`` and the tensor's ``sets``
        (JSON) ride the table's schema metadata, as the SDK decodes them. A read of that
        tensor (its grant covers it); annotations of an id nothing serves any more are the
        control surface's."""
        from biopb.tensor._roi_rows import rois_to_table

        try:
            self.runtime.tensor(req.array_id, caller, pixels=False)
        except TensorNotFound:
            self.runtime.authenticate(caller)

        array_id = self._roi_array_id(req.array_id, strict=False)
        rois, truncated = self.catalog.rois.list(array_id, req.set_name)
        sets = [{"set_name": n, "count": c, "reserved": is_reserved_set(n)} for n, c in self.catalog.rois.sets(array_id)]
        return rois_to_table(rois, {b"truncated": str(truncated).encode(), b"sets": json.dumps(sets).encode()})

    def roi_write(self, cmd: Any, batches: Iterable[pa.RecordBatch]) -> bytes:
        """A ``roi_put`` or ``roi_delete``: the target is checked before the rows are read,
        the rows are read within ``MAX_ROI_REQUEST_BYTES``; the reply message's bytes."""
        from biopb.image.annotation_pb2 import RoiDeleteResult, RoiPutResult
        from biopb.tensor._roi_rows import table_to_roi_ids, table_to_rois

        self.runtime.refuse_if_read_only(cmd.WhichOneof("command"))
        if cmd.WhichOneof("command") == "roi_put":
            asked = cmd.roi_put.array_id
            array_id = self._roi_array_id(asked, strict=True)
            try:
                rois = table_to_rois(_bounded_table(batches, f"roi_put on {asked}"))
            except ValueError as exc:
                raise InvalidArgument(f"roi_put on {asked}: {exc}") from None
            for roi in rois:
                if roi.array_id == asked:
                    roi.array_id = array_id
            stored, conflicts = self.catalog.rois.put(array_id, rois, source_url=self._source_url(array_id),
                                                      check_rev=cmd.roi_put.check_rev)
            return RoiPutResult(stored=stored, conflicts=conflicts).SerializeToString()
        array_id = self._roi_array_id(cmd.roi_delete.array_id, strict=False)
        try:
            ids = table_to_roi_ids(_bounded_table(batches, "roi_delete"))
        except ValueError as exc:
            raise InvalidArgument(f"roi_delete: {exc}") from None
        return RoiDeleteResult(deleted=self.catalog.rois.delete(array_id, ids, cmd.roi_delete.set_name)
                               ).SerializeToString()

    def roi_prune(self, body: bytes) -> Iterator[bytes]:
        """Report, and with ``apply`` delete, annotations whose source has not been in the
        catalog for ``unseen_days``. Sightings are stamped first, but only from a complete
        catalog: a source missing from a half-finished scan is not evidence of anything."""
        from biopb.image.annotation_pb2 import RoiPruneRequest, RoiPruneResult, RoiUnseen

        req = decode_message(RoiPruneRequest, body, "roi_prune")
        if req.apply:
            self.runtime.refuse_if_read_only("roi_prune with apply")
        if not 0 < req.unseen_days <= 36500:
            raise InvalidArgument(f"roi_prune: unseen_days must be a positive number of days, at most 36500 "
                                  f"(100 years), got {req.unseen_days}")
        store = self.catalog.rois
        if self.catalog.first_scan_done.is_set() and not self.catalog.scan_in_progress:
            store.mark_seen({r.source_id: r.url for r in self.catalog.records()})
        before = datetime.now() - timedelta(days=req.unseen_days)
        unseen = [RoiUnseen(array_id=u.array_id, source_url=u.source_url or "", count=u.count,
                            last_seen_at_unix_ms=int(u.last_seen_at.timestamp() * 1000) if u.last_seen_at else 0)
                  for u in store.unseen(before)]
        deleted = store.prune(before) if req.apply and unseen else 0
        yield RoiPruneResult(unseen=unseen, deleted=deleted).SerializeToString()


def _bounded_table(batches: Iterable[pa.RecordBatch], verb: str) -> pa.Table:
    """The rows of a write stream, read batch by batch and refused past the byte budget."""
    taken, size = [], 0
    for batch in batches:
        size += batch.nbytes
        if size > MAX_ROI_REQUEST_BYTES:
            raise RequestTooLarge(f"{verb}: the rows exceed {MAX_ROI_REQUEST_BYTES >> 20} MiB in one request; "
                                  "send them in several")
        taken.append(batch)
    if not taken:
        return pa.table({})
    return pa.Table.from_batches(taken)
