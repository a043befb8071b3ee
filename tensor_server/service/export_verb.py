"""The ``export`` action: a served tensor to an OME-Zarr image under the write dir, streamed.

Body (JSON): ``{"array_id": "...", "dest": "<name>", "options": {...}}`` — ``options`` are
``ExportOptions`` fields (``export/options.py``: levels, method, chunks, shards, codec, ngff,
overwrite, resume). The image is written to ``<write_dir>/exports/<name>`` (a name, never a
path: nothing outside the write dir is written). Each progress record of the export
(``start``, one ``unit`` per unit, ``done``) is one result, sent as it is made; the export
stops, resumably, when the client goes (``--resume`` semantics: ``"resume": true``).
"""
from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from tensor_server.core.json_body import decode_json
from tensor_server.errors import InvalidArgument, ReadOnly
from tensor_server.uploads.names import name_problem

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.service.caller import Caller
    from tensor_server.service.runtime import ServingRuntime

__all__ = ["export_action"]

_USAGE = 'export takes {"array_id": "...", "dest": "<name under the write dir>", "options": {...}}'
_DONE = object()


def _destination(runtime: ServingRuntime, dest: Any) -> Path:
    if runtime.uploads is None:
        raise ReadOnly("export: this server has no write dir to export into: start it with --write-dir DIR")
    if not isinstance(dest, str) or not dest or dest.strip(".") == "" or "/" in dest or "\\" in dest:
        raise InvalidArgument(f"export: dest must be a plain name (no '/'), got {str(dest)[:100]!r}")
    problem = name_problem(dest)
    if problem:
        raise InvalidArgument(f"export: dest {dest[:100]!r}: {problem}")
    return runtime.uploads.write_dir / "exports" / dest


def _readable_labels(runtime: ServingRuntime, caller: Caller, tensor: Any) -> dict[str, Any]:
    """The image's label images (export/sources.py's rule, uploaded label sets included)
    that the caller may read too; the others are left out, as a read of them would be refused."""
    from tensor_server.core.identity import ArrayId
    from tensor_server.errors import TensorServerError
    from tensor_server.export.sources import label_images

    aid = ArrayId.parse(tensor.array_id)
    fields = runtime.catalog.fields(aid.source_id)
    field = next((f for f, t in fields.items() if t is tensor), aid.field)
    found = label_images(fields, field, tensor, next(iter(fields), field))
    readable = {}
    for name, label in found.labels.items():
        try:
            runtime.authorize(caller, label)
        except TensorServerError:
            continue
        readable[name] = label
    return readable


def export_action(runtime: ServingRuntime, caller: Caller, body: bytes, cancelled: Callable[[], bool]
                  ) -> Iterator[bytes]:
    from tensor_server.export import ExportOptions, export_tensor

    request = decode_json(body, "export body") if body else None
    if not isinstance(request, dict) or not isinstance(request.get("array_id"), str):
        raise InvalidArgument(_USAGE)
    unknown = sorted(set(request) - {"array_id", "dest", "options"})
    if unknown:
        raise InvalidArgument(f"export: unknown key(s) {unknown[:8]}; {_USAGE}")
    options = ExportOptions.from_mapping(request.get("options") or {})
    dest = _destination(runtime, request.get("dest"))
    tensor, _ = runtime.tensor(request["array_id"], caller)  # the read rules: token or grant, the gate
    labels = _readable_labels(runtime, caller, tensor)
    dest.parent.mkdir(parents=True, exist_ok=True)
    records: queue.Queue = queue.Queue(maxsize=64)
    failure: list[BaseException] = []

    written = [0]  # the records' bytes_written is a running total: the metric counts its growth

    def noted(record: dict) -> None:
        if record.get("event") == "unit":
            total = int(record.get("bytes_written") or 0)
            runtime.metrics.exported(total - written[0])
            written[0] = total
        records.put(record)

    def run() -> None:
        runtime.metrics.export_started(+1)
        try:
            export_tensor(tensor, dest, options, labels=labels, engine=runtime.engine, cancelled=cancelled,
                          progress=noted, name=request["array_id"])
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
            failure.append(exc)
        finally:
            runtime.metrics.export_started(-1)
            records.put(_DONE)

    worker = threading.Thread(target=run, name="export", daemon=True)
    worker.start()
    while True:
        record = records.get()
        if record is _DONE:
            break
        yield json.dumps(record, default=str).encode()
    worker.join()
    if failure:
        raise failure[0]
