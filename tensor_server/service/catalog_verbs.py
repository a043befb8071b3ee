"""The catalog and annotation verbs the biopb SDK and the Tensor Browser call.

Actions: ``resolve``, ``add_source``, ``remove_source``, ``catalog_children``, ``roi_prune``;
ROI annotations also ride the data verbs (``roi_read`` a read ticket, ``roi_put`` /
``roi_delete`` writes whose rows arrive as Arrow batches) and travel as GeoJSON
(``rois_geojson``, ``geojson_import``: the ``rois_geojson`` / ``put_rois_geojson`` actions
and ``/rois/<id>.geojson`` on HTTP; ``catalog/roi_geojson.py`` holds the format). Message shapes are the SDK's own
generated classes; the behaviour follows the biopb reference server so client code written
against it works here. Transport-free: bodies in, bytes (or an Arrow table) out.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tensor_server.catalog import roi_geojson, roi_verbs
from tensor_server.catalog.catalog import SourceRecord
from tensor_server.catalog.dropped import AddTally, DroppedPaths
from tensor_server.catalog.sql import MAX_VIEWS
from tensor_server.catalog.tree import DEFAULT_LIMIT, CatalogTree
from tensor_server.core.identity import ArrayId
from tensor_server.core.json_body import decode_json
from tensor_server.errors import InvalidArgument, PermissionDenied, TensorNotFound
from tensor_server.service.bodies import decode_message
from tensor_server.service.plates import WellsPage, split_plates, wells_page

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.service.caller import Caller
    from tensor_server.service.runtime import ServingRuntime

__all__ = ["CatalogVerbs", "GeojsonImport"]


@dataclass(frozen=True)
class GeojsonImport:
    """A GeoJSON import the caller may make, checked before its body is read
    (``CatalogVerbs.geojson_import``): the tensor, its frame, and who writes."""

    catalog: Any
    array_id: str
    frame: roi_geojson.ImageFrame
    writer: str | None
    set_name: str = ""

    def store(self, body: bytes) -> dict[str, Any]:
        """Parse and check ``body`` whole (``roi_geojson.rois_from_geojson``), then store every
        annotation in one transaction, or none: ``{"array_id", "stored", "roi_ids"}``."""
        what = f"GeoJSON import onto {self.array_id}"
        rois = roi_geojson.rois_from_geojson(body, self.frame, set_name=self.set_name, what=what)
        stored, _ = roi_verbs.store_rois(self.catalog, self.array_id, rois, writer=self.writer)
        return {"array_id": self.array_id, "stored": len(stored), "roi_ids": [r.roi_id for r in stored]}


class CatalogVerbs:
    """The verbs above over one runtime's catalog (its ``rois`` store included)."""

    def __init__(self, runtime: ServingRuntime) -> None:
        self.runtime = runtime
        self.catalog = runtime.catalog
        refused = [runtime.cache.dir] if runtime.cache is not None else []
        self.dropped = DroppedPaths(
            runtime.catalog, allowed_paths=runtime.settings.allowed_paths, refused_paths=refused
        )
        #: the folder index of the catalog generation ``_trees_generation``, by row view key
        self._trees: OrderedDict[Hashable, CatalogTree] = OrderedDict()
        self._trees_generation = -1
        self._trees_lock = threading.Lock()

    # ---- sources ---------------------------------------------------------------------------
    def _row_ipc(self, rec: SourceRecord, caller: Caller) -> bytes:
        """The source's ``sources`` row as one Arrow IPC stream, listing only the tensors the
        caller may read (the rows SQL shows it: ``Access.row_view``)."""
        table = self.catalog.sources_table([rec], view=self.runtime.access.row_view(caller))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes()

    def resolve(self, body: bytes, caller: Caller) -> Iterator[bytes]:
        from biopb.tensor.descriptor_pb2 import ResolveStreamMessage

        source_id = bytes(body).decode("utf-8", "replace").strip()
        self.runtime.access.folder_read(caller, source_id)  # before it is opened or said unknown
        rec = self.catalog.resolve(source_id)
        yield ResolveStreamMessage(source_row=self._row_ipc(rec, caller)).SerializeToString()

    def add_source(self, body: bytes, cancelled: Callable[[], bool]) -> Iterator[bytes]:
        """Streams one progress message per source as the walk finds it, then the result;
        the walk stops when the client goes (``catalog/dropped.py`` bounds the rest)."""
        from biopb.tensor.descriptor_pb2 import (
            AddSourceProgress,
            AddSourceRequest,
            AddSourceResult,
            AddSourceStreamMessage,
        )

        req = decode_message(AddSourceRequest, body, "add_source")
        if not self.runtime.settings.add_source:
            raise PermissionDenied("add_source: this server was started with --no-add-source; it serves its roots only")
        for event in self.dropped.add_events(req.url, req.source_type, cancelled=cancelled):
            if isinstance(event, AddTally):
                result = AddSourceResult(
                    added=event.added,
                    already_present=event.already_present,
                    refreshed=event.refreshed,
                    removed=event.removed,
                )
                for path, reason in event.failed:
                    result.failed.add(path=path, reason=reason)
                yield AddSourceStreamMessage(result=result).SerializeToString()
            else:
                progress = AddSourceProgress(added_count=event.added_count, current_path=event.current_path)
                yield AddSourceStreamMessage(progress=progress).SerializeToString()

    def remove_source(self, body: bytes) -> Iterator[bytes]:
        from biopb.tensor.descriptor_pb2 import RemoveSourceRequest, RemoveSourceResult

        req = decode_message(RemoveSourceRequest, body, "remove_source")
        yield RemoveSourceResult(removed=self.dropped.remove(req.root_url)).SerializeToString()

    def catalog_children(self, body: bytes, caller: Caller) -> Iterator[bytes]:
        req = decode_json(body, "catalog_children body") if body else {}
        usage = 'catalog_children takes a JSON object with a string key and a positive integer limit: {"key": "", "limit": 100}'
        if not isinstance(req, dict):
            raise InvalidArgument(usage)
        key, limit = req.get("key", ""), req.get("limit", DEFAULT_LIMIT)
        if not isinstance(key, str) or isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidArgument(usage)
        yield json.dumps(
            self.catalog_tree(caller).children(key, limit), ensure_ascii=False, separators=(",", ":")
        ).encode()

    def catalog_tree(self, caller: Caller) -> CatalogTree:
        """The folder index ``caller`` sees: a source is in it when its SQL row lists a tensor
        the caller may read (``Catalog.lists_tensors`` under ``Access.row_view``: the scratch
        source, which holds only uploads, shows once one of them is READY and readable to
        it). Built once per catalog generation and class of caller (callers of one row view
        see the same tree); the last few classes are kept."""
        view = self.runtime.access.row_view(caller)
        generation = self.catalog.generation
        with self._trees_lock:
            if self._trees_generation != generation:
                self._trees.clear()
                self._trees_generation = generation
            tree = self._trees.get(view.key)
            if tree is not None:
                self._trees.move_to_end(view.key)
                return tree
        rows = [(r.source_id, r.url, self.catalog.lists_tensors(r, view)) for r in self.catalog.records()]
        tree = CatalogTree(rows, self.catalog.roots)
        with self._trees_lock:
            if self._trees_generation == generation:
                self._trees[view.key] = tree
                while len(self._trees) > MAX_VIEWS:
                    self._trees.popitem(last=False)
        return tree

    def catalog_level(self, key: str, caller: Caller, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
        """One level of the catalog as the HTTP door shows it (the page, ``/api/catalog``):
        ``catalog_children``'s folders and sources, each source with the tensors it serves to
        ``caller`` (``ServingRuntime.fields``: ``ServedTensor``s) or the reason it cannot be
        read. A key that names no folder but a source (``scratch``, a source with no path,
        sits at the top under its id) lists that source alone. ``trail``: the folders from the
        top down to ``key`` (``CatalogTree.trail``), the page's breadcrumb. The control
        surface's view."""
        self.runtime.authenticate(caller)
        tree = self.catalog_tree(caller)
        level = tree.children(key, limit)
        if not level["folders"] and not level["sources"] and key and "/" not in key:
            level["sources"] = [{"name": key, "source_id": key}]  # dropped below unless it is a source
        sources = []
        for entry in level["sources"]:
            try:
                rec = self.catalog.get_record(entry["source_id"])
                tensors = list(self.runtime.fields(rec.source_id, caller).values())
            except (TensorNotFound, PermissionDenied):  # removed since the tree was built, or not the caller's
                continue
            sources.append({**entry, "tensors": tensors, "unresolved_reason": rec.unresolved_reason})
        return {**level, "sources": sources, "trail": tree.trail(key)}

    def plate_wells(self, identifier: str, caller: Caller, start: int) -> tuple[Any, WellsPage]:
        """A plate image's wells from well ``start``, one page (``service/plates.py``: the
        listings' rule), with the fields ``caller`` is served; the plate's ``ServedTensor``.
        The wells list of the page and of ``/api/wells``."""
        tensor, _echo = self.runtime.tensor(identifier, caller, pixels=False)
        if "montage" not in tensor.metadata:
            raise InvalidArgument(f"{identifier!r} is not a plate image: it has no wells to list")
        served = self.runtime.fields(ArrayId.parse(tensor.array_id).source_id, caller).values()
        plate, fields = next(
            (t, f) for t, f in split_plates(list(served)) if t.tensor.array_id == tensor.array_id and f is not None
        )
        return plate, wells_page(plate, fields, start)

    # ---- ROI annotations (catalog/roi_verbs.py holds their rules) ----------------------------
    def _may_read(self, array_id: str, caller: Caller) -> None:
        """A tensor's annotations fall under its read rule (its grant covers them, a stranger
        hears the read refusal); those of an id nothing serves are the control surface's."""
        try:
            self.runtime.tensor(array_id, caller, pixels=False)
        except TensorNotFound:
            self.runtime.authenticate(caller)

    def roi_read(self, req: Any, caller: Caller) -> pa.Table:
        """One tensor's annotations as ROI rows: a read of that tensor."""
        self._may_read(req.array_id, caller)
        return roi_verbs.read_rois(self.catalog, req.array_id, req.set_name)

    def roi_write(
        self, cmd: Any, batches: Iterable[pa.RecordBatch], caller: Caller, cancelled: Callable[[], bool]
    ) -> bytes:
        """A ``roi_put`` or ``roi_delete``: the control surface (or a read+annotate share link
        of the target), and the target's read rule
        (a stranger's write onto a granted tensor is refused as its read is), both before
        the rows are read; the rows are read within the request budget; a client changes
        only the rows it wrote (the server token, any row). The reply message's bytes."""
        self.runtime.access.annotate(caller)
        self.runtime.refuse_if_read_only(cmd.WhichOneof("command"))
        writer = self.runtime.access.roi_writer(caller)
        if cmd.WhichOneof("command") == "roi_put":
            self._may_read(cmd.roi_put.array_id, caller)
            self.runtime.access.folder_write(caller, cmd.roi_put.array_id)
            reply = roi_verbs.put_rois(
                self.catalog,
                cmd.roi_put.array_id,
                batches,
                check_rev=cmd.roi_put.check_rev,
                cancelled=cancelled,
                writer=writer,
            )
        else:
            self._may_read(cmd.roi_delete.array_id, caller)
            self.runtime.access.folder_write(caller, cmd.roi_delete.array_id)
            reply = roi_verbs.delete_rois(
                self.catalog,
                cmd.roi_delete.array_id,
                batches,
                cmd.roi_delete.set_name,
                cancelled=cancelled,
                writer=writer,
            )
        return reply.SerializeToString()

    def rois_geojson(self, array_id: str, set_name: str, caller: Caller) -> bytes:
        """One tensor's annotations as a GeoJSON FeatureCollection: a read of that tensor."""
        self._may_read(array_id, caller)
        try:
            frame: roi_geojson.ImageFrame | None = roi_geojson.ImageFrame.of(
                self.runtime.tensor(array_id, caller, pixels=False)[0]
            )
        except (TensorNotFound, InvalidArgument):  # its source is gone: no axes to name planes by
            frame = None
        target = roi_verbs.roi_target(self.catalog, array_id, write=False)
        rois, truncated = self.catalog.rois.list(target, set_name)
        return roi_geojson.feature_collection(rois, frame, truncated=truncated)

    def geojson_import(self, array_id: str, caller: Caller, set_name: str = "") -> GeojsonImport:
        """Check a GeoJSON import before its body is read: the control surface (or a
        read+annotate share link of the tensor), a writable
        server, the tensor's read rule (the tensor must be served: its extent bounds the
        coordinates). ``GeojsonImport.store`` then takes the body; the writer rule of
        ``roi_put`` applies (a client updates only the annotations it wrote)."""
        self.runtime.access.annotate(caller)
        self.runtime.refuse_if_read_only("put_rois_geojson")
        if not isinstance(array_id, str) or not array_id:
            raise InvalidArgument("put_rois_geojson: array_id is required")
        if not isinstance(set_name, str):
            raise InvalidArgument("put_rois_geojson: set_name must be a string")
        tensor, _ = self.runtime.tensor(array_id, caller, pixels=False)
        self.runtime.access.folder_write(caller, tensor.array_id)
        return GeojsonImport(
            self.catalog,
            array_id,
            roi_geojson.ImageFrame.of(tensor),
            self.runtime.access.roi_writer(caller),
            set_name,
        )

    def roi_prune(self, body: bytes, caller: Caller) -> Iterator[bytes]:
        """The report and the deletion cover only the annotations the caller may read: a
        granted tensor's rows are its holder's (the read rule)."""
        from biopb.image.annotation_pb2 import RoiPruneRequest

        req = decode_message(RoiPruneRequest, body, "roi_prune")
        if req.apply:
            self.runtime.refuse_if_read_only("roi_prune with apply")
        hides = self.runtime.access.row_view(caller).hides
        yield roi_verbs.prune_rois(self.catalog, req.unseen_days, req.apply, hides=hides).SerializeToString()
