"""The ``export`` action: a served tensor to an OME-Zarr image under the write dir, streamed.

Body (JSON): ``{"array_id": "...", "dest": "<name>", "options": {...}}`` — ``options`` are
``ExportOptions`` fields (``export/options.py``: levels, method, chunks, shards, codec, ngff,
workers, and ``mode``: "create" (the default: refused if the image exists), "overwrite" or
"resume", the command's ``--overwrite`` / ``--resume``). The image is written to
``<write_dir>/exports/<name>`` (a name, never a path: nothing outside the write dir is
written). Each progress record of the export (``start``, one ``unit`` per unit, ``done``) is
one result, sent as it is made.

The rules every door gets here, at the service floor:

* at most ``MAX_RUNNING`` exports run on a server at once; the next is ``Overloaded``
  (UNAVAILABLE, retryable) naming the limit. A slot is held until the export's thread has
  stopped, not merely until its client went.
* ``workers`` is at most ``MAX_SERVICE_WORKERS`` (the server's cores serve reads too).
* a client that goes stops the export within one chunk's encoding or one unit's read
  (export/run.py): the handler's thread watches for it while it waits for records, and
  closing the result stream stops it too. What was written is kept, resumably: the same
  body with ``"mode": "resume"`` continues it (``"mode": "overwrite"`` starts over).
"""

from __future__ import annotations

import json
import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensor_server.core.json_body import decode_json
from tensor_server.errors import InvalidArgument, Overloaded, ReadOnly
from tensor_server.uploads.names import name_problem

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.service.caller import Caller
    from tensor_server.service.runtime import ServingRuntime

__all__ = ["export_action", "MAX_RUNNING", "MAX_SERVICE_WORKERS"]

#: exports one server runs at once: each holds up to three units (64 MiB each at most,
#: export/options.py) and keeps its writer threads busy; six at once grew a server by 620 MB
MAX_RUNNING = 2
#: writer threads one export of a server may ask for
MAX_SERVICE_WORKERS = 4
#: how often the handler's thread asks whether its client went, while no record comes
_POLL_S = 0.1
_USAGE = 'export takes {"array_id": "...", "dest": "<name under the write dir>", "options": {...}}'
_DONE = object()
#: the staging folder's suffix (export/store.py) must fit in a file name too
_MAX_DEST_BYTES = 255 - len(".partial")


class _Slots:
    """The exports running on one server (``MAX_RUNNING`` at most)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0

    def take(self) -> None:
        with self._lock:
            if self._running >= MAX_RUNNING:
                raise Overloaded(
                    f"export: {self._running} exports are running on this server, the most it runs at "
                    f"once ({MAX_RUNNING}); retry when one has finished"
                )
            self._running += 1

    def give_back(self) -> None:
        with self._lock:
            self._running -= 1


_SLOTS: weakref.WeakKeyDictionary[ServingRuntime, _Slots] = weakref.WeakKeyDictionary()
_SLOTS_LOCK = threading.Lock()


def _slots(runtime: ServingRuntime) -> _Slots:
    with _SLOTS_LOCK:
        return _SLOTS.setdefault(runtime, _Slots())


def _destination(runtime: ServingRuntime, dest: Any) -> Path:
    if runtime.uploads is None:
        raise ReadOnly("export: this server has no write dir to export into: start it with --write-dir DIR")
    if not isinstance(dest, str) or not dest or dest.strip(".") == "" or "/" in dest or "\\" in dest:
        raise InvalidArgument(f"export: dest must be a plain name (no '/'), got {str(dest)[:100]!r}")
    problem = name_problem(dest)
    if problem:
        raise InvalidArgument(f"export: dest {dest[:100]!r}: {problem}")
    if len(dest.encode("utf-8")) > _MAX_DEST_BYTES:
        raise InvalidArgument(
            f"export: dest {dest[:100]!r} is longer than {_MAX_DEST_BYTES} UTF-8 bytes "
            "(its staging folder adds '.partial')"
        )
    return runtime.uploads.write_dir / "exports" / dest


def _offer(records: queue.Queue, item: object, stop: threading.Event) -> None:
    """Queue ``item`` for the handler's thread, waiting while the queue is full, unless the
    export is stopping (then nobody may be reading: the item is dropped, never waited on)."""
    while not stop.is_set():
        try:
            records.put(item, timeout=_POLL_S)
            return
        except queue.Full:
            continue


def export_action(
    runtime: ServingRuntime, caller: Caller, body: bytes, cancelled: Callable[[], bool]
) -> Iterator[bytes]:
    from tensor_server.export import ExportOptions, export_tensor

    request = decode_json(body, "export body") if body else None
    if not isinstance(request, dict) or not isinstance(request.get("array_id"), str):
        raise InvalidArgument(_USAGE)
    unknown = sorted(set(request) - {"array_id", "dest", "options"})
    if unknown:
        raise InvalidArgument(f"export: unknown key(s) {unknown[:8]}; {_USAGE}")
    options = ExportOptions.from_mapping(request.get("options") or {})
    if options.workers > MAX_SERVICE_WORKERS:
        raise InvalidArgument(
            f"export: workers {options.workers} is more than a server's export may use ({MAX_SERVICE_WORKERS})"
        )
    dest = _destination(runtime, request.get("dest"))
    tensor, _ = runtime.tensor(request["array_id"], caller)  # the read rules: token or grant, the gate
    runtime.access.folder_write(caller, tensor.array_id)  # a file on the server: a sign-in's write folders only
    labels = runtime.image_labels(caller, tensor)
    dest.parent.mkdir(parents=True, exist_ok=True)
    slots = _slots(runtime)
    slots.take()
    records: queue.Queue = queue.Queue(maxsize=64)
    stop = threading.Event()  # the client went: the export's only "cancelled" (never the call's context)
    failure: list[BaseException] = []
    written = [0]  # the records' bytes_written is a running total: the metric counts its growth

    def noted(record: dict) -> None:
        if record.get("event") == "unit":
            total = int(record.get("bytes_written") or 0)
            runtime.metrics.exported(total - written[0])
            written[0] = total
        _offer(records, record, stop)

    def run() -> None:
        runtime.metrics.export_started(+1)
        try:
            export_tensor(
                tensor,
                dest,
                options,
                labels=labels,
                engine=runtime.engine,
                cancelled=stop.is_set,
                progress=noted,
                name=request["array_id"],
                policy=runtime.policy,
            )
        except BaseException as exc:
            failure.append(exc)
        finally:
            runtime.metrics.export_started(-1)
            slots.give_back()
            _offer(records, _DONE, stop)

    worker = threading.Thread(target=run, name="export", daemon=True)
    try:
        worker.start()
    except BaseException:
        slots.give_back()
        raise
    try:
        yield from _relayed(records, worker, stop, cancelled)
    finally:
        stop.set()  # the stream closed early (the client went) or ended: nothing more is wanted
    worker.join()
    if failure:
        raise failure[0]


def _relayed(
    records: queue.Queue, worker: threading.Thread, stop: threading.Event, cancelled: Callable[[], bool]
) -> Iterator[bytes]:
    """The export's records as results until it ends. ``cancelled`` (the call's own "has the
    client gone?") is asked here, on the handler's thread, while the call is alive; once it
    says so the export is stopped and its remaining records are dropped."""
    while True:
        if not stop.is_set() and cancelled():
            stop.set()
        try:
            record = records.get(timeout=_POLL_S)
        except queue.Empty:
            if not worker.is_alive() and records.empty():
                return  # ended while stopping: its _DONE was dropped
            continue
        if record is _DONE:
            return
        if not stop.is_set():
            yield json.dumps(record, default=str).encode()
