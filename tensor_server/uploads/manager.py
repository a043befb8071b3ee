"""UploadManager: add_tensor, chunk writes, the PENDING/READY/DISCARDED ladder and TTL sweeps,
for both store formats, over the records boot adopted (``adoption.py``).

Transport-free (the service floor serves it; each door maps its errors), so an in-process
producer can add and fill tensors while the wire verbs stay refused. Every uploaded tensor
lives in ``<write_dir>/fields/<source_id>/...`` as a *member* directory and is attached to its
source in the catalog, so reads go through the same read path as every other tensor. The
planner is the read planner over the member's reader adapter: one answer to "what is a chunk"
for plans, DoPut and DoGet alike.

Clocks: one injectable wall clock (``clock``) for deadlines (recorded as absolute time in the
marker, so they survive restarts) and idleness, so tests drive sweeps without sleeping.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.core.adapter_base import TensorAdapter
from tensor_server.core.bounded_stream import take_within
from tensor_server.core.chunk_id import UNSCALED, ChunkId
from tensor_server.core.engine import check_chunk_id
from tensor_server.core.folder_lock import FolderHeld, FolderLock
from tensor_server.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    StorageFull,
    TensorNotFound,
    TensorServerError,
)
from tensor_server.uploads.adoption import adopt_write_dir
from tensor_server.uploads.cache_member import CacheMember
from tensor_server.uploads.declared import (
    checked_dim_labels,
    checked_dtype,
    checked_extent,
    checked_metadata,
    checked_ttl,
    chunk_values,
    label_set_dim_labels,
    write_grid,
)
from tensor_server.uploads.layout import member_dir
from tensor_server.uploads.marker import DISCARDED, PENDING, READY, Marker, sync_path
from tensor_server.uploads.names import LABELS, fold_name, parse_upload_id
from tensor_server.uploads.replan import holder_of, replan, same_owner
from tensor_server.uploads.scratch import SCRATCH_SOURCE_ID, ScratchSource
from tensor_server.uploads.upload import (
    SEALING,
    ChunkWrite,
    Upload,
    UploadClosed,
    UploadNotReadable,
    forget_rows,
)
from tensor_server.uploads.zarr_member import ZarrMember

__all__ = [
    "UploadManager",
    "WriteDirHeld",
    "DEFAULT_UPLOAD_TTL",
    "DEFAULT_SCRATCH_TTL",
    "DEFAULT_MAX_PENDING_UPLOADS",
    "DEFAULT_CHUNK_SLACK_BYTES",
]

log = logging.getLogger(__name__)

#: seconds a PENDING upload may go without a write, and a tombstone may stand
DEFAULT_UPLOAD_TTL = 3600.0
#: every lifetime on the scratch source is capped at this (0 = off)
DEFAULT_SCRATCH_TTL = 86400.0
#: PENDING uploads one write dir holds at once
DEFAULT_MAX_PENDING_UPLOADS = 1024
#: bytes a chunk's DoPut stream may carry beyond the chunk's values (Arrow framing, padding)
DEFAULT_CHUNK_SLACK_BYTES = 1 << 20
#: the write dir's lock file (``core/folder_lock.py``): one server per write dir
LOCK_FILE = "tensor-server.lock"


class WriteDirHeld(FolderHeld):
    """Another server holds this write dir (its lock file names the pid)."""


class UploadManager:
    """Every uploaded tensor of one write_dir (see the module docstring). Constructing it
    takes the write dir's lock (``WriteDirHeld`` when another server has it), serves the
    scratch source, keeps the catalog out of write_dir and adopts what a previous life left
    READY."""

    def __init__(
        self,
        catalog: Any,
        write_dir: str | os.PathLike[str],
        *,
        upload_ttl: float = DEFAULT_UPLOAD_TTL,
        scratch_ttl: float = DEFAULT_SCRATCH_TTL,
        clock: Callable[[], float] = time.time,
        max_pending_uploads: int = DEFAULT_MAX_PENDING_UPLOADS,
        max_declared_bytes: int | None = None,
        refuse_unwritten_chunks: bool = False,
        chunk_slack_bytes: int = DEFAULT_CHUNK_SLACK_BYTES,
    ) -> None:
        """Quotas: at most ``max_pending_uploads`` PENDING at once, declaring at most
        ``max_declared_bytes`` together (None: the write dir's free space when each is
        added). ``refuse_unwritten_chunks``: READY is refused while a planned chunk was
        never written, unless that call says holes are fill (the wire protocol reads them
        as zeros, and a label upload skips its all-zero blocks, so the default is off).
        A chunk whose write *failed* always blocks READY until it is written again."""
        self.catalog = catalog
        self.max_pending_uploads = int(max_pending_uploads)
        self.max_declared_bytes = max_declared_bytes
        self.refuse_unwritten_chunks = refuse_unwritten_chunks
        self.chunk_slack_bytes = int(chunk_slack_bytes)
        self.write_dir = Path(write_dir).resolve()
        self.write_dir.mkdir(parents=True, exist_ok=True)
        #: one server per write dir: taken before the boot sweep looks at anything in it
        self._folder_lock = FolderLock(self.write_dir, LOCK_FILE, WriteDirHeld)
        self.upload_ttl = float(upload_ttl)
        self.scratch_ttl = float(scratch_ttl)
        self.clock = clock
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            (self.write_dir / "fields").mkdir(exist_ok=True)
            catalog.excluded.append(self.write_dir)
            catalog.add_source(ScratchSource())
            #: array_id -> Upload, live and tombstones
            self._uploads, self.boot_summary = adopt_write_dir(self.write_dir, catalog, clock())
        except BaseException:
            self._folder_lock.release()
            raise

    # ---- lookup ----------------------------------------------------------------------------
    def get(self, array_id: str) -> Upload | None:
        """The upload (live or tombstone) with this exact id."""
        with self._lock:
            return self._uploads.get(array_id)

    def all_uploads(self) -> list[Upload]:
        """Every upload (live and tombstones), a snapshot."""
        with self._lock:
            return list(self._uploads.values())

    def pending_count(self) -> int:
        """Uploads in flight (PENDING): the metrics' gauge."""
        with self._lock:
            return sum(1 for up in self._uploads.values() if up.state == PENDING)

    def upload_of(self, tensor: TensorAdapter) -> Upload | None:
        up = self.get(tensor.array_id)
        return up if up is not None and up.tensor is tensor else None

    # ---- add_tensor -------------------------------------------------------------------------
    def add_tensor(
        self,
        request_id: str,
        shape: Any,
        dtype: Any,
        *,
        chunk_shape: Any = (),
        dim_labels: Any = (),
        metadata_json: str = "",
        ttl_seconds: int | None = None,
        owner: str = "",
        grant: str = "",
        authorize: Callable[[TensorAdapter], None] | None = None,
        may_write: Callable[[Upload], None] | None = None,
    ) -> Upload:
        """Create a PENDING tensor on an existing source (refused with the reason otherwise).
        ``owner``: the SHA-256 (hex) of its owner's token ("" = the server's); ``grant``: the
        SHA-256 of a read grant it is given on purpose, making it private ("" = none).
        ``authorize(tensor)``: the requester's read check (the service's), applied to every
        tensor a refusal would describe — a label set's image before its shape is compared,
        an upload holding the name before its id and state are named — so a stranger hears
        the read refusal, not a private tensor's shape or state (None: an in-process
        producer, trusted).

        The name of a PENDING upload, declared again the same way, answers that upload as it
        stands (``replan.py``): a crashed uploader re-plans and resumes. A re-plan is a write of
        the upload: ``may_write(upload)`` (the service's write check) decides it, and without
        one the ``owner`` given must be the upload's."""
        may_write = may_write or functools.partial(same_owner, owner, request_id)
        authorize = authorize or (lambda tensor: None)
        target = parse_upload_id(request_id)
        dt = checked_dtype(dtype, request_id)
        shape, chunk_shape, nbytes = checked_extent(
            tuple(shape), tuple(chunk_shape), dt.itemsize, f"add_tensor {request_id!r}"
        )
        dim_labels = asked_labels = checked_dim_labels(dim_labels, len(shape), request_id)
        extra_attrs = checked_metadata(target, metadata_json, request_id)
        checked_ttl(ttl_seconds, request_id)
        rec = self.catalog.get_record(target.source_id)  # TensorNotFound when the source is not served
        if rec.source is None:
            raise TensorNotFound(
                f"add_tensor {request_id!r}: source {target.source_id!r} is unreadable: {rec.unresolved_reason}"
            )
        is_labels = False
        if target.is_label_set:
            image, _ = self.catalog.find_tensor(target.image_id)
            authorize(image)
            if image.array_id != target.image_id:  # e.g. 'src/img' of a single-tensor source 'src'
                target = parse_upload_id(f"zarr://{image.array_id}/{LABELS}/{target.name}")
            image_labels = label_set_dim_labels(image, shape, request_id)
            stored = next((f for f in rec.source.tensors if fold_name(f) == fold_name(target.field)), None)
            if stored is not None:
                raise AlreadyExists(
                    f"add_tensor {request_id!r}: the name is taken: {target.source_id}/{stored} is a "
                    "label image the file stores; add the set under another name"
                )
            is_labels = True
            dim_labels = dim_labels or image_labels
        grid = write_grid(target, shape, chunk_shape, dt, dim_labels, request_id)
        cap = self.scratch_ttl if target.source_id == SCRATCH_SOURCE_ID and self.scratch_ttl > 0 else None
        granted = ttl_seconds if cap is None else min(ttl_seconds or cap, cap)
        now = self.clock()
        with self._lock:
            holder = holder_of(self._uploads.values(), target)
            if holder is not None:
                authorize(holder.tensor)  # before its id, state or declaration is named
                declared = {
                    "store format": target.store_format,
                    "shape": shape,
                    "dtype": dt.str,
                    "chunk_shape": grid,
                    "dim_labels": asked_labels or None,
                }
                return replan(holder, target, request_id, declared, may_write, self.clock)
            self._check_quota(nbytes, request_id)
            path = member_dir(self.write_dir, target.source_id, target.field)
            if path.exists():  # no record holds it (a removal that failed?): never reuse, never delete
                raise InvalidArgument(
                    f"add_tensor {request_id!r}: {path} already exists and no upload holds it; "
                    "remove it or choose another name"
                )
            path.parent.mkdir(parents=True, exist_ok=True)
            marker = Marker(
                target.array_id,
                target.store_format,
                PENDING,
                uuid.uuid4().hex,
                now,
                None if granted is None else now + granted,
                dim_labels,
                is_labels,
                owner,
                grant,
            )
            member: ZarrMember | CacheMember
            with self._disk(f"add_tensor {request_id!r}"):
                if target.store_format == "zarr":
                    member = ZarrMember.create(path, marker, shape, dt, grid, extra_attrs)
                else:
                    member = CacheMember.create(path, marker, shape, dt, grid)
            tensor = member.reader()
            up = Upload(
                target.array_id,
                target.source_id,
                target.field,
                member,
                tensor,
                PENDING,
                marker.expires_at,
                now,
                granted_ttl=granted,
                owner=owner,
                grant=grant,
            )
            self._uploads[target.array_id] = up
            self.catalog.attach(target.source_id, target.field, tensor, listed=False)
        log.info("added %s tensor %s", target.store_format, target.array_id)
        return up

    def _check_quota(self, nbytes: int, request_id: str) -> None:
        """Refuse an upload past the pending count or the declared-bytes quota (caller holds
        ``_lock``)."""
        pending = [u for u in self._uploads.values() if u.state in (PENDING, SEALING)]
        if len(pending) >= self.max_pending_uploads:
            raise ResourceExhausted(
                f"add_tensor {request_id!r}: {len(pending)} uploads are PENDING, the limit of "
                f"this server; finish (READY) or DISCARD some first"
            )
        declared = sum(u.declared_bytes for u in pending)
        quota = self.max_declared_bytes
        where = "max_declared_bytes"
        if quota is None:
            quota, where = shutil.disk_usage(self.write_dir).free, f"the free space of {self.write_dir}"
        if declared + nbytes > quota:
            raise ResourceExhausted(
                f"add_tensor {request_id!r}: {nbytes} bytes declared on top of {declared} by "
                f"PENDING uploads exceeds {quota} ({where}); finish or DISCARD uploads, or "
                "upload a smaller tensor"
            )

    @contextlib.contextmanager
    def _disk(self, what: str) -> Iterator[None]:
        """A full disk under the write dir as ``StorageFull`` naming it (not an OSError)."""
        try:
            yield
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StorageFull(
                    f"{what}: the disk under the write dir {self.write_dir} is full "
                    f"({exc.strerror}); free space there, then retry"
                ) from None
            raise

    # ---- writes ----------------------------------------------------------------------------
    def plan_chunk_write(self, chunk_id: bytes | ChunkId) -> ChunkWrite:
        """Check a DoPut's ticket before its stream is read: the upload exists and is
        PENDING and the ticket names one chunk of its write plan. Returns the chunk and the
        byte budget of its stream (its values plus ``chunk_slack_bytes``)."""
        cid = chunk_id if isinstance(chunk_id, ChunkId) else ChunkId.decode(chunk_id)
        up = self.get(cid.array_id)
        if up is None:
            raise TensorNotFound(f"no upload {cid.array_id!r} (never added, or reclaimed)")
        tensor = up.tensor
        cid = check_chunk_id(tensor, cid)
        b = cid.bounds
        grid = tensor.chunk_shape
        if cid.method != UNSCALED or any(
            a % c or e != min(a + c, n) for a, e, c, n in zip(b.start, b.stop, grid, tensor.shape)
        ):
            raise InvalidArgument(f"{up.array_id}: {b} is not a chunk of its write plan (grid {list(grid)})")
        if up.state != PENDING:
            raise UploadClosed(up.array_id, up.state, up.reason)
        expected = int(np.prod(b.shape, dtype=object)) * tensor.dtype.itemsize
        return ChunkWrite(up, cid, b, expected, expected + self.chunk_slack_bytes)

    def write_chunk_stream(
        self,
        chunk_id: bytes | ChunkId | ChunkWrite,
        pieces: Iterable[Any],
        *,
        cancelled: Callable[[], bool] | None = None,
    ) -> ChunkWrite:
        """A DoPut: check the ticket, then take its pieces (Arrow record batches with one
        ``data`` column, or numpy arrays) one at a time within the chunk's byte budget
        (``RequestTooLarge`` past it, ``ReadCancelled`` when the client goes), then store."""
        plan = chunk_id if isinstance(chunk_id, ChunkWrite) else self.plan_chunk_write(chunk_id)
        taken = take_within(
            pieces, plan.max_stream_bytes, f"DoPut of {plan.upload.array_id} chunk {plan.bounds}", cancelled=cancelled
        )
        self.write_chunk(plan, chunk_values(taken))
        return plan

    def write_chunk(self, chunk_id: bytes | ChunkId | ChunkWrite, data: np.ndarray) -> None:
        """Store one planned chunk of a PENDING tensor (the ticket its write plan minted, or
        the checked ``ChunkWrite``). Only a write that returned is counted; a failed one marks
        the chunk as a hole that blocks READY until it is written again."""
        plan = chunk_id if isinstance(chunk_id, ChunkWrite) else self.plan_chunk_write(chunk_id)
        up, b, tensor = plan.upload, plan.bounds, plan.upload.tensor
        data = np.asarray(data)
        if data.dtype != tensor.dtype:
            raise InvalidArgument(f"{up.array_id}: chunk dtype {data.dtype.str} is not the tensor's {tensor.dtype.str}")
        if data.size != int(np.prod(b.shape)):
            raise InvalidArgument(f"{up.array_id}: chunk {b} needs {int(np.prod(b.shape))} values, got {data.size}")
        with up.cond:
            if up.state != PENDING:
                raise UploadClosed(up.array_id, up.state, up.reason)
            up.inflight += 1
        ok = False
        try:
            with self._disk(f"DoPut of {up.array_id} chunk {b}"):
                up.member.write(b, data.reshape(b.shape))
            ok = True
        finally:
            with up.cond:
                up.inflight -= 1
                if ok:
                    up.received.add(b)
                    up.failed.discard(b)
                else:
                    up.failed.add(b)
                up.last_activity = self.clock()
                up.cond.notify_all()

    # ---- lifecycle -------------------------------------------------------------------------
    def set_ready(self, array_id: str, *, holes_are_fill: bool | None = None) -> Upload:
        """PENDING -> READY: seal writes (wait out those in flight), publish the store, open reads.
        Refused (``FailedPrecondition``) while a chunk's last write failed, and, when
        ``refuse_unwritten_chunks`` (or ``holes_are_fill=False``), while a planned chunk was
        never written; ``holes_are_fill=True`` accepts never-written chunks as zeros."""
        up = self.get(array_id)
        if up is None:
            raise TensorNotFound(f"set_upload_status: {array_id!r} is not an upload")
        with up.cond:
            while up.state == SEALING:  # a concurrent READY: its answer is ours
                up.cond.wait()
            if up.state == DISCARDED:
                raise UploadClosed(up.array_id, DISCARDED, up.reason)
            if up.state == READY:
                return up
            up.state = SEALING  # refuses new writes; discard waits for the outcome
            while up.inflight:
                up.cond.wait()
        try:
            self._check_complete(up, holes_are_fill)
            with self._disk(f"set_upload_status READY of {array_id}"):
                self._sync_parents(up.member.path)
                up.member.publish(up.member.marker.with_state(READY))
        except (OSError, TensorServerError):
            with up.cond:
                up.state = PENDING  # nothing was announced: the caller may retry
                up.cond.notify_all()
            raise
        with up.cond:
            up.state = READY
            up.last_activity = self.clock()
            up.cond.notify_all()
        self.catalog.attach(up.source_id, up.field, up.tensor, listed=True)
        log.info("upload %s READY (%d/%d chunks)", array_id, len(up.received), up.expected_chunks)
        return up

    def _sync_parents(self, path: Path) -> None:
        """fsync the folders from the member's up to the write dir: the member's own entry
        (made at add_tensor) is on the disk before a READY marker inside it is."""
        for folder in path.parents:
            sync_path(folder)
            if folder == self.write_dir:
                return

    def _check_complete(self, up: Upload, holes_are_fill: bool | None) -> None:
        if up.failed:
            first = min(up.failed, key=lambda b: b.start)
            raise FailedPrecondition(
                f"{up.array_id}: {len(up.failed)} chunk(s) failed to write (first {first}) and "
                "were not written again; re-send them, or DISCARD the upload",
                slug="upload_incomplete",
            )
        refuse = self.refuse_unwritten_chunks if holes_are_fill is None else not holes_are_fill
        missing = up.expected_chunks - len(up.received)
        if refuse and missing > 0:
            raise FailedPrecondition(
                f"{up.array_id}: {missing} of {up.expected_chunks} planned chunks were never "
                "written; send them, or say the holes are fill (zeros)",
                slug="upload_incomplete",
            )

    def discard(self, array_id: str, reason: str = "") -> Upload | None:
        """-> DISCARDED from any state: unlist and release the store. None for an id with no
        upload. An adopted tensor leaves no tombstone (its name is free at once)."""
        up = self.get(array_id)
        if up is None:
            return None
        with up.cond:
            while up.state == SEALING:
                up.cond.wait()
            if up.state == DISCARDED:
                return up
            up.state = DISCARDED
            up.reason = reason or "discarded"
            up.discarded_at = self.clock()
            while up.inflight:
                up.cond.wait()
        self.catalog.detach(up.source_id, up.field)
        up.member.remove()
        forget_rows(self.catalog, array_id)
        if up.adopted:
            with self._lock:
                self._uploads.pop(array_id, None)
        log.info("upload %s DISCARDED: %s", array_id, up.reason)
        with self._lock:  # a label set binds to its image: it goes with it
            sets = [
                u.array_id
                for u in self._uploads.values()
                if u.array_id.startswith(f"{array_id}/{LABELS}/") and u.state != DISCARDED
            ]
        for set_id in sets:
            self.discard(set_id, f"its image {array_id} was discarded")
        return up

    def check_readable(self, up: Upload) -> None:
        if up.state == DISCARDED:
            raise UploadNotReadable(f"{up.array_id} was discarded: {up.reason}")
        if up.state != READY:
            raise UploadNotReadable(
                f"{up.array_id} is {up.state}, not readable yet: an uploaded tensor is readable "
                "once it is READY (set_upload_status), not while chunks may still be in flight"
            )

    # ---- sweeps ----------------------------------------------------------------------------
    def sweep(self) -> dict[str, int]:
        """Discard past-deadline tensors (any state) and idle PENDING ones; drop tombstones that
        have stood for upload_ttl (which frees their names)."""
        now = self.clock()
        expired = idle = reclaimed = 0
        with self._lock:
            ups = list(self._uploads.values())
        for up in ups:
            if up.state == DISCARDED:  # upload_ttl 0 turns reclamation off
                if self.upload_ttl > 0 and up.discarded_at is not None and now - up.discarded_at >= self.upload_ttl:
                    with self._lock:
                        self._uploads.pop(up.array_id, None)
                    forget_rows(self.catalog, up.array_id)  # any a write in flight at the discard stored
                    reclaimed += 1
            elif up.expires_at is not None and now >= up.expires_at:
                self.discard(up.array_id, "ttl_seconds deadline passed")
                expired += 1
            elif up.state == PENDING and self.upload_ttl > 0 and now - up.last_activity >= self.upload_ttl:
                self.discard(up.array_id, f"idle for {self.upload_ttl:g} s while PENDING")
                idle += 1
        return {"expired": expired, "idle": idle, "reclaimed": reclaimed}

    def start_sweeps(self, every: float | None = None) -> None:
        every = every or max(1.0, min(60.0, self.upload_ttl / 4 if self.upload_ttl > 0 else 60.0))

        def loop() -> None:
            while not self._stop.wait(every):
                try:
                    self.sweep()
                except Exception:
                    log.exception("upload sweep failed")

        self._thread = threading.Thread(target=loop, name="tensor-server-upload-sweep", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            ups = list(self._uploads.values())
        for up in ups:
            up.member.close()
        self._folder_lock.release()
