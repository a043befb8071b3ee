"""``export_tensor``: one streamed pass from a tensor to a pyramidal OME-Zarr.

The pass (geometry in export/layout.py, files in export/store.py):

* units are read in row-major order through the read engine, ``read_ahead`` at a time on a
  small pool, each reduced to every level on the thread that read it (NumPy and the kernels
  release the GIL): level k is ``downsample_block(unit, scale_k)``'s bits — the engine's own
  streamed reduction of those pixels, so level k equals ``engine.read(tensor, None,
  scale_k, method)`` bit for bit (export/reduce.py computes them, cascading exact integer
  sums and extremes level to level, without numba where NumPy does as well);
* the image's label images (``labels``) are further parts of the same pass, each on the
  image's levels, written under ``labels/<name>/``;
* a reduced unit is written whole (its shards at every level), each file one job on a pool
  of ``workers`` threads (so one large unit is encoded on every core), ``write_ahead``
  units queued at most, while the next units are read;
* after a unit's files are fsynced its line goes into the progress record.

Memory: at most ``read_ahead + write_ahead + 1`` units are held, each
``Layout.unit_bytes()`` (level 0 plus every level's share), plus the encode buffers (one
shard per writer thread) — independent of the image size (docs/export.md states it). Units
are as large as the reader's block (a TIFF page) at least, so for large units each side's
depth is cut to keep ``INFLIGHT_BYTES`` (never below one unit each).

``progress(record)`` receives JSON-ready dicts (``event``: ``start``, ``unit``, ``done``);
``cancelled()`` is polled before each unit is read and within each unit — before each slab
of its reduction and before each chunk it encodes, on every thread of the pass — so a stop
waits for one chunk's encoding or one unit's read, never for a whole unit's work. True
stops the pass: units whose files are all written are recorded, a unit part way through is
left unrecorded (its files are written again on resume: the record is what is trusted), and
``ReadCancelled`` is raised — a state ``--resume`` continues. ``cancelled`` may be called
from any of the pass's threads.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensor_server.core.adapter_base import TensorAdapter
from tensor_server.core.bounds import Bounds
from tensor_server.core.engine import Cancelled, ReadEngine
from tensor_server.core.ngff import labels_attributes
from tensor_server.core.pyramid import PyramidPolicy
from tensor_server.errors import ReadCancelled
from tensor_server.export.chunk_files import ChunkFiles
from tensor_server.export.layout import Layout, check_file_count, label_scales, label_shape_option, plan_layout
from tensor_server.export.ngff import export_attributes
from tensor_server.export.options import ExportOptions
from tensor_server.export.reduce import unit_levels
from tensor_server.export.store import Staging, block_files, open_levels, out_start, storage_errors

__all__ = ["export_tensor", "Progress", "Cancelled"]

#: what the units queued on each side (read, write) may hold together, once units are large.
#: A 30x4096² zarr export (42 MiB units of 16x1024²) at depth 2/2 took 14.5 s and 343 MB
#: peak, at 1/1 15.9 s and 234 MB (2026-12-03, idle): once a unit's files keep every writer
#: thread busy, a second unit on each side buys little time for its memory. Units of 11 MiB
#: (2048² planes) keep depth 2/2: at 1/1 the read and write sides take turns (22-50 s
#: instead of 14-30 s).
INFLIGHT_BYTES = 64 << 20

Progress = Callable[[dict], None]


class _Stopped(Exception):
    """Raised through a unit's work (a read, a reduction slab, a chunk's encoding) once the
    export is asked to stop; ``_Pass.stream`` turns it into ``ReadCancelled``."""


@dataclass(frozen=True)
class _Part:
    """One image the pass writes: the image itself (``root`` "") or one of its label images
    (``root`` "labels/<name>/"), with its own geometry and its levels' files."""

    root: str
    tensor: TensorAdapter
    layout: Layout
    files: tuple[ChunkFiles, ...] = ()


def fingerprint(parts: list[_Part], options: ExportOptions) -> dict[str, Any]:
    """What a resumed export must match: the same source content and the same output."""
    kept = {k: v for k, v in options.as_dict().items() if k not in ("mode", "workers", "read_ahead", "write_ahead")}
    image = parts[0]
    out = {
        "array_id": image.tensor.array_id,
        "content_version": image.tensor.content_version.hex(),
        "shape": list(image.tensor.shape),
        "dtype": image.tensor.dtype.str,
        "options": kept,
        "layout": image.layout.describe(),
    }
    if len(parts) > 1:
        out["labels"] = {
            p.root: {
                "array_id": p.tensor.array_id,
                "content_version": p.tensor.content_version.hex(),
                "dtype": p.tensor.dtype.str,
                "layout": p.layout.describe(),
            }
            for p in parts[1:]
        }
    return out


def _plan(
    tensor: TensorAdapter, labels: Mapping[str, TensorAdapter], options: ExportOptions, policy: PyramidPolicy | None
) -> list[_Part]:
    """The image's geometry, then each label image's on the image's levels, reduced with the
    labels' method (``mode``: ``--method`` is the image's), chunks and shards by axis name."""
    layout = plan_layout(
        tensor,
        levels=options.levels,
        method=options.method,
        chunks=options.chunks,
        shards=options.shards,
        policy=policy,
    )
    parts = [_Part("", tensor, layout)]
    for name in sorted(labels):
        label = labels[name]
        parts.append(
            _Part(
                f"labels/{name}/",
                label,
                plan_layout(
                    label,
                    scales=label_scales(tensor, layout, label),
                    method=None,
                    chunks=label_shape_option(layout.axes, label, options.chunks),
                    shards=label_shape_option(layout.axes, label, options.shards),
                ),
            )
        )
    check_file_count([p.layout for p in parts], sharded=options.zarr_format == 3)
    return parts


def export_tensor(
    tensor: TensorAdapter,
    dest: str | os.PathLike[str],
    options: ExportOptions | None = None,
    *,
    labels: Mapping[str, TensorAdapter] | None = None,
    engine: ReadEngine | None = None,
    progress: Progress | None = None,
    cancelled: Cancelled | None = None,
    name: str | None = None,
    policy: PyramidPolicy | None = None,
) -> dict[str, Any]:
    """Export ``tensor`` (and its ``labels``, name -> label tensor, written under ``labels/``)
    to the OME-Zarr image ``dest``; return the summary (the ``done`` record). See the module
    docstring for the pass, memory, progress and cancellation. ``policy``: the pyramid policy
    ``--levels auto`` follows (a server passes its own, so the export has the levels its
    OME-Zarr view publishes)."""
    options = options or ExportOptions()
    parts = _plan(tensor, labels or {}, options, policy)
    emit = progress or (lambda record: None)
    total = sum(p.layout.unit_count() for p in parts)
    with Staging(dest, fingerprint(parts, options)) as staging, storage_errors(staging.path):
        if not staging.prepare(options.mode):
            summary = {"event": "done", "dest": str(staging.dest), "already_complete": True, "units_total": total}
            emit(summary)
            return summary
        parts = [
            _Part(
                p.root,
                p.tensor,
                p.layout,
                tuple(open_levels(staging, p.layout, p.tensor.dtype, options.codec, options.zarr_format, p.root)),
            )
            for p in parts
        ]
        run = _Pass(parts, staging, engine or ReadEngine(), options, emit, cancelled or (lambda: False))
        run.stream()
        _write_metadata(staging, parts, run, options, name or tensor.array_id)
        staging.publish()
    summary = {"event": "done", "dest": str(staging.dest), "already_complete": False, **run.totals()}
    emit(summary)
    return summary


def _write_metadata(staging: Staging, parts: list[_Part], run: _Pass, options: ExportOptions, name: str) -> None:
    """The image's attributes (with the writer's mark, ``Staging.export_marker``), then
    ``labels/`` and each label image's (``image-label``)."""
    import zarr
    from zarr.storage import LocalStore

    group = zarr.open_group(LocalStore(staging.path), mode="r+", zarr_format=options.zarr_format)
    image = parts[0]
    group.attrs.update(
        {
            **export_attributes(image.tensor, image.layout, name, options.ngff, run.channel_ranges("")),
            **staging.export_marker(),
        }
    )
    if len(parts) == 1:
        return
    names = [p.root.split("/")[1] for p in parts[1:]]
    group["labels"].attrs.update(labels_attributes(names, options.ngff))
    for part, label_name in zip(parts[1:], names):
        group[part.root.rstrip("/")].attrs.update(
            export_attributes(part.tensor, part.layout, label_name, options.ngff, label_of=True)
        )


class _Pass:
    """One export's streamed pass over its parts (state shared by the read and write sides)."""

    def __init__(
        self,
        parts: list[_Part],
        staging: Staging,
        engine: ReadEngine,
        options: ExportOptions,
        emit: Progress,
        cancelled: Cancelled,
    ) -> None:
        self.parts, self.staging = parts, staging
        self.engine, self.options, self.emit, self.cancelled = engine, options, emit, cancelled
        self.total = sum(p.layout.unit_count() for p in parts)
        self.resumed = len(staging.done)
        self.bytes_read = self.bytes_written = 0
        self.stopped = False
        self.t0 = time.monotonic()
        fit = max(1, INFLIGHT_BYTES // max(1, max(p.layout.unit_bytes() for p in parts)))
        self.read_ahead, self.write_ahead = min(options.read_ahead, fit), min(options.write_ahead, fit)

    # ---- the pass ------------------------------------------------------------------------------
    def stream(self) -> None:
        image = self.parts[0].layout
        self.emit(
            {
                "event": "start",
                "dest": str(self.staging.dest),
                "staging": str(self.staging.path),
                "units_total": self.total,
                "units_resumed": self.resumed,
                "unit_bytes": image.unit_bytes(),
                **image.describe(),
                "labels": [p.root.split("/")[1] for p in self.parts[1:]],
            }
        )
        todo = (
            (part, i, ub)
            for part in self.parts
            for i, ub in enumerate(part.layout.units())
            if (part.root, i) not in self.staging.done
        )
        reads: deque[Future] = deque()
        writes: deque[Callable[[], dict[str, Any]]] = deque()
        with (
            ThreadPoolExecutor(self.read_ahead, thread_name_prefix="export-read") as read_pool,
            ThreadPoolExecutor(self.options.workers, thread_name_prefix="export-write") as write_pool,
        ):
            try:
                self._pump(todo, reads, writes, read_pool, write_pool)
            except _Stopped:
                pass  # raised below as ReadCancelled, once what is finished is recorded
            finally:
                for f in reads:
                    f.cancel()
                for finished in writes:  # what is written whole is recorded; a stopped unit or an error is not
                    try:
                        self._commit(finished())
                    except BaseException:  # the first error is the one raised
                        pass
        if self._asked_to_stop() and len(self.staging.done) < self.total:
            raise ReadCancelled(
                f"export to {self.staging.dest} stopped: {len(self.staging.done)} of {self.total} units written "
                f"to {self.staging.path}; rerun with --resume to continue"
            )

    def _asked_to_stop(self) -> bool:
        """Whether the export is asked to stop (once asked, from then on)."""
        if not self.stopped and self.cancelled():
            self.stopped = True
        return self.stopped

    def _checkpoint(self) -> None:
        """Called between the steps of a unit's work, on any of the pass's threads: raises
        ``_Stopped`` once the export is asked to stop."""
        if self._asked_to_stop():
            raise _Stopped

    def _pump(self, todo, reads, writes, read_pool, write_pool) -> None:
        def top_up() -> None:
            while len(reads) < self.read_ahead:
                if self._asked_to_stop():
                    return
                nxt = next(todo, None)
                if nxt is None:
                    return
                reads.append(read_pool.submit(self._read_unit, *nxt))

        top_up()
        while reads:
            unit = reads.popleft().result()
            while len(writes) >= self.write_ahead:
                self._commit(writes.popleft()())
            writes.append(self._write_unit(write_pool, *unit))
            top_up()
        while writes:
            self._commit(writes.popleft()())

    def _read_unit(self, part: _Part, index: int, ub: Bounds) -> tuple[_Part, int, Bounds, list[np.ndarray]]:
        """A unit's pixels at every level (level 0 first)."""
        self._checkpoint()
        data = self.engine.read(part.tensor, ub, (1,) * part.tensor.ndim)
        blocks = unit_levels(
            data, [lv.scale for lv in part.layout.levels], part.layout.method, checkpoint=self._checkpoint
        )
        return part, index, ub, blocks

    def _write_unit(
        self, pool: ThreadPoolExecutor, part: _Part, index: int, ub: Bounds, blocks: list[np.ndarray]
    ) -> Callable[[], dict[str, Any]]:
        """Queue each file of the unit (every level) on the write pool, one job a file, so a
        large unit is encoded on every writer thread at once; return the call that waits for
        them and makes the unit's record line."""
        jobs = [
            (key, pool.submit(self._write_file, level_files, key, data))
            for lv, level_files, block in zip(part.layout.levels, part.files, blocks)
            for key, data in block_files(
                level_files, part.layout, lv, tuple(a // s for a, s in zip(ub.start, lv.scale)), block, part.root
            )
        ]
        return lambda: self._unit_entry(part, index, ub, blocks, {key: job.result() for key, job in jobs})

    def _write_file(self, level_files: ChunkFiles, key: str, data: np.ndarray) -> list[int] | None:
        return self.staging.write_file(key, level_files.encode(data, self._checkpoint))

    def _unit_entry(
        self, part: _Part, index: int, ub: Bounds, blocks: list[np.ndarray], files: dict[str, list[int] | None]
    ) -> dict[str, Any]:
        entry = {"unit": index, "files": files, "read": int(blocks[0].nbytes)}
        if part.root:
            entry["part"] = part.root
        else:
            entry["range"] = _channel_range(part.layout, ub, blocks[-1])
        return entry

    def _commit(self, entry: dict[str, Any]) -> None:
        self.staging.commit_unit(entry)
        self.bytes_read += entry["read"]
        self.bytes_written += sum(f[0] for f in entry["files"].values() if f)
        record = {
            "event": "unit",
            "unit": entry["unit"],
            "units_done": len(self.staging.done),
            "units_total": self.total,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "elapsed_s": round(time.monotonic() - self.t0, 3),
        }
        if entry.get("part"):
            record["part"] = entry["part"]
        self.emit(record)

    # ---- the summary ---------------------------------------------------------------------------
    def channel_ranges(self, root: str) -> list[list[float]]:
        """Per output channel (min, max) over every unit's coarsest pixels, resumed ones included."""
        found: dict[int, list[float]] = {}
        for (part, _), entry in self.staging.done.items():
            if part != root:
                continue
            for channel, lo, hi in entry.get("range") or []:
                old = found.setdefault(int(channel), [lo, hi])
                found[int(channel)] = [min(old[0], lo), max(old[1], hi)]
        return [found.get(i, [0.0, 0.0]) for i in range(max(found, default=-1) + 1)]

    def totals(self) -> dict[str, Any]:
        return {
            "units_total": self.total,
            "units_resumed": self.resumed,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "elapsed_s": round(time.monotonic() - self.t0, 3),
            "levels": [list(self.parts[0].layout.axes.out_shape(lv.shape)) for lv in self.parts[0].layout.levels],
            "labels": {
                p.root.split("/")[1]: [list(p.layout.axes.out_shape(lv.shape)) for lv in p.layout.levels]
                for p in self.parts[1:]
            },
        }


def _channel_range(layout: Layout, ub: Bounds, block: np.ndarray) -> list[list[float]]:
    """[output channel, min, max] per channel of a unit's (source-ordered) coarsest block
    (NaNs ignored)."""
    out = layout.axes.to_output(block)
    labels = layout.axes.out_labels
    first = 0
    if "c" in labels:
        out = np.moveaxis(out, labels.index("c"), 0)
        first = out_start(layout, ub.start)[labels.index("c")]
    else:
        out = out[np.newaxis]
    ranges = []
    for i, plane in enumerate(out):
        values = plane[~np.isnan(plane)] if plane.dtype.kind == "f" else plane
        if values.size:
            ranges.append([first + i, float(values.min()), float(values.max())])
    return ranges
