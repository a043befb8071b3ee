"""Zeiss CZI files through pylibCZIrw (libCZI).

A CZI stores *subblocks*: 2-D tiles placed on a shared pixel grid, each tagged with plane
coordinates (T, C, Z, scene S, mosaic index M, ...). libCZI composes any rectangle of a plane
from the subblocks that touch it (later M over earlier where tiles overlap, background where
none covers), so this adapter never sees tiles: every read is one libCZI ROI read per plane.

Served layout:

* one tensor per scene (fields ``scene_0``, ``scene_1``, ... named by the file's S index),
  whose Y/X extent is that scene's layer-0 bounding box; a file without scenes is one tensor
  (field ``image``). The origin is the bounding box corner, not 0: CZI subblock coordinates
  are stage-like (``s_1_t_1_c_1_z_1.czi`` starts at X 39856, Y 39272), and mosaics may start
  at negative coordinates.
* a file of several scenes also as one image of them all, field ``positions``: the scenes in
  S order on a near-square grid, each in its own cell (``core/positions.py`` says why), named
  from the XML's scene names.
* axes ``t, c, z, y, x`` always, preceded by any other CZI dimension with more than one index
  (R, I, H, V, B, as lower-case labels); RGB pixel types add a trailing ``s`` axis of 3.
* RGB pixels are served in **RGB order**. libCZI returns Bgr24/Bgr48/Bgr96Float in memory
  order B, G, R; viewers read an interleaved ``s`` axis as R, G, B, so the adapter reverses it.
* channels with different pixel types are widened losslessly by libCZI on read (Gray8 with
  Gray16 → Gray16, gray with Gray32Float → Gray32Float, Gray8 with Bgr24 → Bgr24, Gray16 with
  Bgr48 → Bgr48); any other mix is refused rather than served lossy.
* physical scale from the XML ``Scaling/Items/Distance`` (metres) in µm; 0 means unknown.

Read granularity (design scaled-read-path.md §3): ``read_block_shape`` is None. A libCZI ROI
read composes only the subblocks it touches, so a small unit costs the tiles under it, not a
whole plane.

Nearest via libCZI's zoom (§5), declared as ``decimates``: ``get_decimated_data`` serves
nearest with ``read(zoom=1/f)`` where that is exact and declines (None) elsewhere; zoom
which resamples each subblock straight into the reduced bitmap instead of composing the plane
at full resolution. Measured on this libCZI (pylibCZIrw 6.1): inside one subblock, zoom picks
source pixel ``lround(i·f)`` from the ROI origin, exactly the first pixel of each f×f block,
for every factor tried (2-8, 12, 16), so it equals ``data[::f, ::f]``. It is *not* exact
across a subblock edge that lies on the ROI's f-grid: the subblock ending there also paints
the next output pixel with its own last column (libCZI clamps the source index), and that
survives wherever no later-painted subblock starts at the same edge (a gap, the mosaic's
border, an earlier-M neighbour). So the zoomed read cuts the ROI into cells at every on-grid
edge and reads each cell with its own zoomed read; edges off the grid are safe inside a cell
(libCZI paints exactly the pixels whose sample lies in the subblock). See
``CziAdapter._zoom_factor`` for the gate and ``CziAdapter._zoom_cells`` for the rule.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from tensor_server_kernels.reference import output_shape

from tensor_server.adapters.registry import FormatEntry, montage_gap, register_format
from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.core.handles import LazyHandle
from tensor_server.core.identity import file_content_version
from tensor_server.core.positions import POSITIONS_FIELD, positions_montage
from tensor_server.core.units import MICROMETER
from tensor_server.errors import TensorServerError, UnreadableSource

__all__ = ["CziAdapter", "CziSource", "CZI_MAGIC", "sniff_czi"]

log = logging.getLogger(__name__)

#: A CZI file starts with its file-header segment, whose 16-byte id is "ZISRAWFILE" + NULs.
CZI_MAGIC = b"ZISRAWFILE"

# libCZI pixel type name → (numpy dtype, samples per pixel). Only what pylibCZIrw can read.
_PIXEL_FORMATS: dict[str, tuple[np.dtype, int]] = {
    "Gray8": (np.dtype(np.uint8), 1),
    "Gray16": (np.dtype(np.uint16), 1),
    "Gray32Float": (np.dtype(np.float32), 1),
    "Bgr24": (np.dtype(np.uint8), 3),
    "Bgr48": (np.dtype(np.uint16), 3),
    "Bgr96Float": (np.dtype(np.float32), 3),
}

# Mixed per-channel pixel types that libCZI widens without loss (the conversion is a copy,
# a zero-extension or a replication of gray into B, G and R). Anything else is refused.
_LOSSLESS_WIDENING: dict[frozenset[str], str] = {
    frozenset({"Gray8", "Gray16"}): "Gray16",
    frozenset({"Gray8", "Gray32Float"}): "Gray32Float",
    frozenset({"Gray16", "Gray32Float"}): "Gray32Float",
    frozenset({"Gray8", "Gray16", "Gray32Float"}): "Gray32Float",
    frozenset({"Gray8", "Bgr24"}): "Bgr24",
    frozenset({"Gray16", "Bgr48"}): "Bgr48",
}

# Plane dimensions served as axes: T, C, Z always; these only when the file uses more than
# one index (lower-case letter = the dim label). S is the scene (a tensor each), M the mosaic
# tile index (composed by libCZI), neither is an axis.
_EXTRA_DIMS = ("R", "I", "H", "V", "B")
_CORE_DIMS = ("T", "C", "Z")


#: Readers per file: concurrent reads of one file decode in parallel up to this many.
_READER_POOL_SIZE = max(1, min(4, os.cpu_count() or 1))


#: A zoom cell: ((i0, i1), (j0, j1)), half-open output row and column ranges.
_Cell = tuple[tuple[int, int], tuple[int, int]]


class _ZoomShapeMismatch(Exception):
    """libCZI returned a zoomed bitmap whose size is not the contract's (see get_decimated_data)."""


# ---- the file: a pool of libCZI readers and the subblock geometry ------------------------
class _CziFile:
    """One CZI on disk: a small pool of lazily opened libCZI readers shared by its scenes.

    A pylibCZIrw reader is not safe for concurrent reads, but libCZI releases the GIL while
    it decodes, so concurrent chunk reads of one file are worth running in parallel: each
    read borrows one reader of the pool exclusively (a LIFO pool, so a mostly serial load
    keeps reusing one reader and the idle reaper closes the others). Each reader is a
    LazyHandle: opened on first use, closed by the reaper when idle, never during a read.
    ``rects`` holds the layer-0 subblock rectangles (x0, y0, x1, y1) of the whole file: the
    zoomed read cuts its cells at their edges.
    """

    def __init__(self, path: Path, readers: int | None = None) -> None:
        from pylibCZIrw import czi as pyczi

        self.path = path
        n = readers if readers is not None else _READER_POOL_SIZE
        self.handles: list[LazyHandle[Any]] = [
            LazyHandle(lambda: pyczi.CziReader(str(path)), name=f"{path}#{i}") for i in range(max(1, n))
        ]
        self._free: queue.LifoQueue[int] = queue.LifoQueue()
        for i in reversed(range(len(self.handles))):
            self._free.put(i)
        self.rects = np.zeros((0, 4), dtype=np.int64)
        #: layer-0 subblock rectangles per (scene, plane coordinates in ``plane_dims`` order)
        self.plane_rects: dict[tuple[Any, ...], np.ndarray] = {}
        self.has_pyramid = False

    @contextmanager
    def reader(self) -> Iterator[Any]:
        """Borrow one open reader exclusively for the block."""
        slot = self._free.get()
        try:
            with self.handles[slot].use() as reader:
                yield reader
        finally:
            self._free.put(slot)

    def read(
        self,
        roi: tuple[int, int, int, int],
        plane: dict[str, int],
        scene: int | None,
        pixel_type: str,
        zoom: float | None = None,
    ) -> np.ndarray:
        """libCZI's composed (h, w, samples) bitmap of ``roi`` = (x, y, w, h), as a NumPy view
        onto libCZI's buffer (the caller copies it out). Library failures (a truncated or
        corrupt subblock) become UnreadableSource naming the file."""
        try:
            with self.reader() as reader:
                if zoom is None:
                    arr = reader.read(roi=roi, plane=plane, scene=scene, pixel_type=pixel_type)
                else:
                    arr = reader.read(roi=roi, plane=plane, scene=scene, pixel_type=pixel_type, zoom=zoom)
        except (TensorServerError, MemoryError):
            raise
        except Exception as exc:
            raise UnreadableSource(
                self.path, f"libCZI read of {plane} roi {roi} failed: {type(exc).__name__}: {exc}"
            ) from exc
        return np.asarray(arr)

    def close(self) -> None:
        for handle in self.handles:
            handle.close()


# ---- the tensor ----------------------------------------------------------------------------
class CziAdapter(TensorAdapter):
    """One scene of a CZI (or the whole file when it has no scenes); see the module docstring.

    ``read_block_shape`` is None: a libCZI ROI read composes only the subblocks it touches.
    ``decimates`` is True: nearest is served by libCZI's zoom where it is exact (the
    engine streams every other request).
    """

    decimates = True
    reports_uniform_blocks = True

    def __init__(
        self,
        file: _CziFile,
        *,
        scene: int | None,
        rect: tuple[int, int, int, int],
        plane_dims: Sequence[tuple[str, int, int]],
        pixel_type: str,
        physical_xyz: tuple[float | None, float | None, float | None],
        metadata: dict[str, Any],
    ) -> None:
        self._file = file
        self.scene = scene
        self.rect = tuple(int(v) for v in rect)  # x, y, w, h in CZI pixel coordinates
        self.plane_dims = tuple((d, int(start), int(size)) for d, start, size in plane_dims)
        self.pixel_type = pixel_type
        dtype, self.samples = _PIXEL_FORMATS[pixel_type]
        x, y, w, h = self.rect
        shape = [size for _, _, size in self.plane_dims] + [h, w]
        labels = [d.lower() for d, _, _ in self.plane_dims] + ["y", "x"]
        sx, sy, sz = physical_xyz
        scales: list[float | None] = [sz if d == "Z" else None for d, _, _ in self.plane_dims] + [sy, sx]
        if self.samples > 1:
            shape.append(self.samples)
            labels.append("s")
            scales.append(None)
        super().__init__(
            TensorInfo(
                shape,
                dtype,
                dim_labels=labels,
                native_chunk_shape=None,
                physical_scale=scales,
                physical_unit=[None if s is None else MICROMETER for s in scales],
                content_version=file_content_version(file.path),
                metadata=metadata,
            )
        )
        self._n_plane = len(self.plane_dims)

    @property
    def read_block_shape(self) -> tuple[int, ...] | None:
        """None: libCZI crops to the subblocks a ROI touches (design §3)."""
        return None

    # ---- level-0 reads ---------------------------------------------------------------------
    def _plane_coords(self, index: Sequence[int]) -> dict[str, int]:
        return {d: start + i for (d, start, _), i in zip(self.plane_dims, index)}

    def _plane_indices(self, bounds: Bounds) -> list[tuple[int, ...]]:
        ranges = [range(bounds.start[a], bounds.stop[a]) for a in range(self._n_plane)]
        return list(itertools.product(*ranges))

    def _samples_rgb(self, bitmap: np.ndarray, bounds: Bounds | None) -> np.ndarray:
        """(h, w, samples) libCZI bitmap → (h, w) gray or (h, w, s) RGB-ordered samples,
        restricted to the bounds' sample range."""
        if self.samples == 1:
            return bitmap[..., 0]
        rgb = bitmap[..., ::-1]
        if bounds is None:
            return rgb
        return rgb[..., bounds.start[-1] : bounds.stop[-1]]

    def _read_plane_roi(self, index: Sequence[int], x: int, y: int, w: int, h: int) -> np.ndarray:
        """Level-0 bitmap (h, w, samples) of one plane, ROI in tensor coordinates."""
        x0, y0 = self.rect[0], self.rect[1]
        return self._file.read((x0 + x, y0 + y, w, h), self._plane_coords(index), self.scene, self.pixel_type)

    def read_region(self, bounds: Bounds) -> np.ndarray:
        ya, xa = self._n_plane, self._n_plane + 1
        y, x = bounds.start[ya], bounds.start[xa]
        h, w = bounds.shape[ya], bounds.shape[xa]
        out = np.empty(bounds.shape, dtype=self.dtype)
        origin = bounds.start[: self._n_plane]
        for index in self._plane_indices(bounds):
            bitmap = self._read_plane_roi(index, x, y, w, h)
            out[tuple(i - o for i, o in zip(index, origin))] = self._samples_rgb(bitmap, bounds)
        return out

    # ---- uniform blocks: regions no subblock covers ------------------------------------------
    def uniform_blocks(self, bounds: Bounds) -> list[tuple[Bounds, np.generic]]:
        """Per plane of ``bounds``, its Y/X box when no layer-0 subblock of that plane (and
        scene) touches it: libCZI composes such a region from the background, zeros. The
        blocks are the asked box per plane (a CZI has no block grid for empty space)."""
        ya = self._n_plane
        x0, y0 = self.rect[0] + bounds.start[ya + 1], self.rect[1] + bounds.start[ya]
        x1, y1 = self.rect[0] + bounds.stop[ya + 1], self.rect[1] + bounds.stop[ya]
        zero = np.zeros((), self.dtype)[()]
        empty = np.zeros((0, 4), dtype=np.int64)
        out: list[tuple[Bounds, np.generic]] = []
        for index in self._plane_indices(bounds):
            coords = self._plane_coords(index)
            rects = self._file.plane_rects.get((self.scene,) + tuple(coords[d] for d, _, _ in self.plane_dims), empty)
            if not _overlapping(rects, x0, y0, x1, y1).any():
                start = tuple(index) + bounds.start[ya:]
                stop = tuple(i + 1 for i in index) + bounds.stop[ya:]
                out.append((Bounds(start, stop), zero))
        return out

    # ---- nearest through libCZI's zoom (design §5) ------------------------------------------
    def _zoom_factor(self, bounds: Bounds, scale: Sequence[int]) -> int | None:
        """The Y/X factor f when zoom=1/f can serve nearest bit-identically, else None.

        The engine asks only for nearest (zoom= differs from area in every pixel). The
        conditions:
        2. Y and X reduce by the same factor f >= 2;
        3. every other axis (planes, samples) has scale 1;
        4. f divides both the Y and the X extent (libCZI sizes the output floor(extent/f),
           the contract ceil(extent/f));
        5. the file has no stored pyramid subblocks: libCZI would paint those for zoom < 1,
           and their reduction is whatever the writer used, not nearest.
        """
        ya, xa = self._n_plane, self._n_plane + 1
        f = scale[ya]
        if f < 2 or scale[xa] != f:
            return None
        if any(s != 1 for a, s in enumerate(scale) if a not in (ya, xa)):
            return None
        if bounds.shape[ya] % f or bounds.shape[xa] % f:
            return None
        if self._file.has_pyramid:
            return None
        return f

    def get_decimated_data(self, bounds: Bounds, step: Sequence[int]) -> np.ndarray | None:
        """Nearest via ``read(zoom=1/f)`` where that is bit-identical (``_zoom_factor``), else
        None (the engine streams).

        A runtime check compares every zoomed bitmap with the shape the contract requires; a
        mismatch (libCZI computes the output size in float32) logs a warning and declines
        instead of failing the read.
        """
        step = tuple(int(s) for s in step)
        f = self._zoom_factor(bounds, step)
        if f is None:
            return None
        try:
            out = self._read_zoomed(bounds, f)
        except _ZoomShapeMismatch as exc:
            log.warning(
                "%s: libCZI zoom returned an unexpected shape (%s); serving %s nearest x%d "
                "through the streamed path instead",
                self._file.path,
                exc,
                bounds,
                f,
            )
            return None
        expected = output_shape(bounds.shape, step)
        if out.shape != expected:  # construction guarantees it; never return a wrong shape
            raise RuntimeError(f"CziAdapter zoom produced {out.shape}, expected {expected}")
        return out

    def _read_zoomed(self, bounds: Bounds, f: int) -> np.ndarray:
        """``get_data(bounds)[..., ::f, ::f]`` assembled from one zoomed read per cell."""
        ya, xa = self._n_plane, self._n_plane + 1
        y, x = bounds.start[ya], bounds.start[xa]
        h, w = bounds.shape[ya], bounds.shape[xa]
        cells = self._zoom_cells(x, y, w, h, f)
        out_shape = output_shape(bounds.shape, [f if a in (ya, xa) else 1 for a in range(self.ndim)])
        out = np.zeros(out_shape, dtype=self.dtype)  # zeros = libCZI's background
        origin = bounds.start[: self._n_plane]
        zoom = 1.0 / f
        for index in self._plane_indices(bounds):
            plane_out = out[tuple(i - o for i, o in zip(index, origin))]
            plane = self._plane_coords(index)
            for (i0, i1), (j0, j1) in cells:
                roi = (self.rect[0] + x + j0 * f, self.rect[1] + y + i0 * f, (j1 - j0) * f, (i1 - i0) * f)
                bitmap = self._file.read(roi, plane, self.scene, self.pixel_type, zoom=zoom)
                if bitmap.shape[:2] != (i1 - i0, j1 - j0):
                    raise _ZoomShapeMismatch(
                        f"roi {roi} zoom 1/{f}: got {bitmap.shape[:2]}, expected {(i1 - i0, j1 - j0)}"
                    )
                plane_out[i0:i1, j0:j1] = self._samples_rgb(bitmap, bounds)
        return out

    def _zoom_cells(self, x: int, y: int, w: int, h: int, f: int) -> list[_Cell]:
        """The ROI (tensor coordinates) cut at every subblock edge that lies on its f-grid,
        as ((i0, i1), (j0, j1)) output-index ranges; cells no subblock touches are left out
        (they are background).

        Why cut exactly there: libCZI maps output pixel i of a subblock to source pixel
        lround(i·f - offset) and paints the output pixels from ceil(start/f) to
        min(ceil((end-1)/f), floor(end/f)). For an edge off the f-grid both bounds select
        exactly the pixels whose sample lies inside the subblock. For an edge on the grid
        (end = k·f) pixel k is painted too, with the subblock's last column clamped in,
        and only a later-painted neighbour starting at k repairs it (not a gap, not an
        earlier-M tile); a start on the grid is also at the mercy of ceil(k ± ε). A cell
        border on that edge takes both out of play: the cell's bitmap ends there.
        Edges of every subblock touching the ROI count, whatever its plane or scene: an
        extra cut never changes values, only the number of reads.
        """
        rx0, ry0 = self.rect[0] + x, self.rect[1] + y
        rects = self._file.rects
        near = rects[_overlapping(rects, rx0, ry0, rx0 + w, ry0 + h)]
        x_runs = _grid_runs(np.concatenate([near[:, 0], near[:, 2]]) - rx0, w, f)
        y_runs = _grid_runs(np.concatenate([near[:, 1], near[:, 3]]) - ry0, h, f)
        cells = []
        for (i0, i1), (j0, j1) in itertools.product(y_runs, x_runs):
            if _overlapping(near, rx0 + j0 * f, ry0 + i0 * f, rx0 + j1 * f, ry0 + i1 * f).any():
                cells.append(((i0, i1), (j0, j1)))
        return cells

    def close(self) -> None:
        self._file.close()


def _overlapping(rects: np.ndarray, x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
    """Mask of the (x0, y0, x1, y1) ``rects`` that share pixels with the given box."""
    return (rects[:, 0] < x1) & (rects[:, 2] > x0) & (rects[:, 1] < y1) & (rects[:, 3] > y0)


def _grid_runs(edges: np.ndarray, extent: int, f: int) -> list[tuple[int, int]]:
    """Output indices [0, extent // f) split at the ``edges`` (ROI-relative) that lie on the
    f-grid, as half-open (start, stop) runs."""
    n = extent // f
    cuts = sorted({0, n} | {int(e) // f for e in edges if 0 < e < extent and e % f == 0})
    return list(zip(cuts, cuts[1:]))


# ---- the source ----------------------------------------------------------------------------
class CziSource(SourceAdapter):
    """A CZI file: one tensor per scene, and several scenes as one (see the module docstring)."""

    format_name = "czi"

    def __init__(self, path: Path) -> None:
        path = Path(path)
        file = _CziFile(path)
        try:
            with file.reader() as reader:
                tensors, metadata = _describe(path, file, reader)
        except BaseException:
            file.close()
            raise
        super().__init__(path, tensors, metadata=metadata)


def _describe(path: Path, file: _CziFile, reader: Any) -> tuple[dict[str, TensorAdapter], dict[str, Any]]:
    """Scenes, plane dimensions, pixel type, scale and subblock geometry of an open file."""
    blocks: list[tuple[dict[str, int], int, int, int, int, bool, str, int | None]] = []

    def collect(_index: int, info: Any) -> bool:
        r, p = info.logicalRect, info.physicalSize
        layer0 = r.w == p.w and r.h == p.h  # libCZI's own test for a pyramid subblock
        m = info.mIndex if info.is_mindex_valid() else None
        blocks.append((dict(info.coordinate.to_dict()), r.x, r.y, r.w, r.h, layer0, info.pixelType.name, m))
        return True

    reader.enumerate_subblocks(collect)
    layer0 = [b for b in blocks if b[5]]
    if not layer0:
        raise UnreadableSource(path, "the CZI holds no layer-0 subblocks (no pixel data)")
    file.has_pyramid = len(layer0) != len(blocks)
    file.rects = np.array([(b[1], b[2], b[1] + b[3], b[2] + b[4]) for b in layer0], dtype=np.int64)

    # plane dimensions: index range of every dimension the subblocks carry
    ranges: dict[str, list[int]] = {}
    for coord, *_ in layer0:
        for d, v in coord.items():
            lo_hi = ranges.setdefault(d, [v, v])
            lo_hi[0], lo_hi[1] = min(lo_hi[0], v), max(lo_hi[1], v)
    plane_dims: list[tuple[str, int, int]] = []
    for d in _EXTRA_DIMS:
        if d in ranges and ranges[d][1] > ranges[d][0]:
            plane_dims.append((d, ranges[d][0], ranges[d][1] - ranges[d][0] + 1))
    for d in _CORE_DIMS:
        lo, hi = ranges.get(d, (0, 0))
        plane_dims.append((d, lo, hi - lo + 1))

    names = [d for d, _, _ in plane_dims]
    per_plane: dict[tuple[Any, ...], list[tuple[int, int, int, int]]] = {}
    for coord, x, y, w, h, *_ in layer0:
        key = (coord.get("S") if "S" in coord else None,) + tuple(coord.get(d, 0) for d in names)
        per_plane.setdefault(key, []).append((x, y, x + w, y + h))
    file.plane_rects = {k: np.array(v, dtype=np.int64) for k, v in per_plane.items()}

    pixel_type = _common_pixel_type(path, {b[6] for b in layer0})
    physical_xyz, info = _parse_xml(reader.raw_metadata)

    # scenes: layer-0 bounding box of each S index; no S → the whole file is one tensor
    scene_ids = sorted({b[0]["S"] for b in layer0 if "S" in b[0]})
    groups: list[tuple[str, int | None, list[Any]]]
    if scene_ids:
        groups = [(f"scene_{s}", s, [b for b in layer0 if b[0].get("S") == s]) for s in scene_ids]
    else:
        groups = [("image", None, layer0)]
    tensors: dict[str, TensorAdapter] = {}
    scene_rects: dict[str, list[int]] = {}
    for field, scene, members in groups:
        x0 = min(b[1] for b in members)
        y0 = min(b[2] for b in members)
        x1 = max(b[1] + b[3] for b in members)
        y1 = max(b[2] + b[4] for b in members)
        rect = (x0, y0, x1 - x0, y1 - y0)
        scene_rects[field] = list(rect)
        tensors[field] = CziAdapter(
            file,
            scene=scene,
            rect=rect,
            plane_dims=plane_dims,
            pixel_type=pixel_type,
            physical_xyz=physical_xyz,
            metadata={"scene": scene, "czi_rect_xywh": list(rect), "pixel_type": pixel_type},
        )
    metadata = {
        "format": "czi",
        "pixel_type": pixel_type,
        "rgb_order": "RGB (libCZI's BGR reversed)" if _PIXEL_FORMATS[pixel_type][1] > 1 else None,
        "subblocks": len(blocks),
        "pyramid": file.has_pyramid,
        "mosaic": len({b[7] for b in layer0 if b[7] is not None}) > 1,
        "dims": {d: [lo, hi - lo + 1] for d, (lo, hi) in ranges.items()},
        "scenes": scene_rects,
        **info,
    }
    _add_positions(tensors, metadata, scene_ids, info.get("scene_names") or [])
    return tensors, metadata


def _add_positions(
    tensors: dict[str, TensorAdapter],
    metadata: dict[str, Any],
    scene_ids: list[int],
    names: list[str | None],
) -> None:
    """Two scenes or more as one image (``POSITIONS_FIELD``), named by the XML's scene list
    (ZEN lists the scenes in index order) where it names them, else by their field."""
    positions = [
        (s, (names[s] if s < len(names) and names[s] else None) or f"scene_{s}", tensors[f"scene_{s}"])
        for s in scene_ids
    ]
    montage = positions_montage(positions, montage_gap())
    if montage is not None:
        tensors[POSITIONS_FIELD] = montage


def _common_pixel_type(path: Path, types: set[str]) -> str:
    unsupported = sorted(t for t in types if t not in _PIXEL_FORMATS)
    if unsupported:
        raise UnreadableSource(path, f"CZI pixel type(s) {unsupported} are not readable through pylibCZIrw")
    if len(types) == 1:
        return next(iter(types))
    widened = _LOSSLESS_WIDENING.get(frozenset(types))
    if widened is None:
        raise UnreadableSource(
            path, f"channels mix pixel types {sorted(types)}, which cannot be served losslessly as one dtype"
        )
    return widened


def _parse_xml(xml_text: str) -> tuple[tuple[float | None, float | None, float | None], dict[str, Any]]:
    """Physical X/Y/Z pixel size in µm (None when absent or 0) and a few names."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError:
        return (None, None, None), {}
    sizes: dict[str, float | None] = {}
    for dist in root.iterfind(".//Scaling/Items/Distance"):
        value = dist.findtext("Value")
        try:
            metres = float(value) if value is not None else 0.0
        except ValueError:
            metres = 0.0
        sizes[str(dist.get("Id", "")).upper()] = metres * 1e6 if metres > 0 else None
    info: dict[str, Any] = {}
    dims = ".//Information/Image/Dimensions"
    channels = [c.get("Name") or c.get("Id") for c in root.iterfind(f"{dims}/Channels/Channel")]
    if channels:
        info["channel_names"] = channels
    scenes = [s.get("Name") for s in root.iterfind(f"{dims}/S/Scenes/Scene")]
    if any(scenes):
        info["scene_names"] = scenes
    return (sizes.get("X"), sizes.get("Y"), sizes.get("Z")), info


# ---- detection ------------------------------------------------------------------------------
def sniff_czi(path: Path, head: bytes) -> bool:
    """A CZI starts with the file-header segment id ``ZISRAWFILE``."""
    return head.startswith(CZI_MAGIC)


register_format(
    FormatEntry(
        name="czi",
        opener=CziSource,
        sniff=sniff_czi,
        extensions=(".czi",),
        priority=65,
        description="Zeiss CZI (pylibCZIrw / libCZI): scenes as tensors, mosaics composed",
    )
)
