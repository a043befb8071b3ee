"""The grid-of-TIFF-planes reader shared by the folder formats (TIFF sequences, Micro-Manager,
NDTiff): ``TiffPlaneGridAdapter`` serves an N-D grid of planes (or of mosaic tiles) that live in
TIFF files, reading each plane either raw from a known byte offset or through tifffile, plus
the helpers those formats share (plane headers, axis labels from file-name keywords).

Shared reader machinery, not one format's (it used to live inside tiff_sequence.py).

Read granularity (design §3)
  A plane file is read per request: nothing holds a descriptor between reads, because a
  folder can hold 100k files and the idle reaper would let a full-stack read pin them all.
  Each file's header is parsed once (on first read) to learn whether its planes are stored
  raw (uncompressed, contiguous, no predictor). Raw planes are read with one ``pread`` of the
  rows the window spans (an ``mmap`` with a stride when the skipped rows exceed the kernel
  readahead), so a window costs its own rows: ``read_block_shape`` is None and the tensor
  decimates (the step skips whole planes on the file axes and rows inside a plane).
  Compressed or tiled planes keep their strip/tile offsets from that same header parse, and
  a window reads (one ``pread`` each) and decodes only the striles it touches, in parallel,
  with tifffile's own per-page decoder (``TiffPage.decode``, shared by every file with the
  same page hash; ``_tiff_striles.py``): the block is one strile, declared from the first file. Decoding the whole page for every
  window would make N streaming units cost N page decodes; tifffile's zarr store in strile
  mode reads the same striles but re-parses the file and costs ~5x more per small read.
"""

from __future__ import annotations

import math
import mmap
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
from tensor_server_kernels.reference import output_shape

from tensor_server.adapters._file_stamp import changed_since, file_stamp
from tensor_server.adapters._strided import StridedReads
from tensor_server.adapters._tiff_striles import StrileDecoder, read_strile_window
from tensor_server.core.adapter_base import TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.errors import UnreadableSource

__all__ = [
    "TIFF_SUFFIXES",
    "TIFFFILE_AXES",
    "FileLayout",
    "TiffPlaneGridAdapter",
    "axis_label_for",
    "is_tiff_name",
    "plane_file_header",
    "raw_offset",
    "read_file_header",
    "series_layout",
    "unique_label",
]

TIFF_SUFFIXES = (".tif", ".tiff", ".tf8", ".btf")
#: A strided raw read maps the file when the gap between picked rows exceeds the kernel's
#: default readahead window; below that the kernel faults the skipped rows anyway (design §4).
_READAHEAD_BYTES = 128 << 10
_KEYWORD_LABELS = {
    **dict.fromkeys(("c", "ch", "chan", "channel", "channels", "w", "wl", "wavelength"), "c"),
    **dict.fromkeys(("z", "zs", "slice", "plane", "focus", "section", "depth", "zplane"), "z"),
    **dict.fromkeys(("t", "tp", "time", "timepoint", "frame", "frames"), "t"),
    **dict.fromkeys(("p", "pos", "position", "xy", "s", "site", "fov", "field", "series", "stage"), "p"),
    **dict.fromkeys(("m", "tile", "mosaic"), "m"),
}
#: Letters for axes whose keyword is unknown, in order of use.
_SPARE_LABELS = ("q", "m", "n", "o", "u", "v", "w", "a", "b", "d", "e", "f", "g", "h")
#: Labels a grid axis must not take: the plane's own axes and colour samples.
_RESERVED = frozenset({"y", "x", "s", "rgb", "rgba", "sample", "samples"})
#: tifffile axis codes -> our labels (for leading axes inside a multi-page file).
TIFFFILE_AXES = {"T": "t", "Z": "z", "C": "c", "R": "p", "Y": "y", "X": "x", "S": "s", "M": "m"}


def is_tiff_name(name: str) -> bool:
    low = name.lower()
    return not name.startswith(".") and low.endswith(TIFF_SUFFIXES)


def axis_label_for(keyword: str | None) -> str | None:
    """The axis label a file-name keyword names (``channel`` -> ``c``), or None if unknown."""
    return None if keyword is None else _KEYWORD_LABELS.get(keyword.lower())


def unique_label(wanted: str | None, used: set[str]) -> str:
    """``wanted`` if free (and not a plane/sample label), else the next spare letter."""
    if wanted and wanted not in used and wanted not in _RESERVED:
        used.add(wanted)
        return wanted
    for letter in _SPARE_LABELS:
        if letter not in used:
            used.add(letter)
            return letter
    raise UnreadableSource("<axes>", "too many axes")


# ---- reading planes ---------------------------------------------------------------------------
@dataclass
class FileLayout:
    """Where the planes of one file are, with the stored dtype (byte order included).

    ``offsets[k]``: byte offset of plane ``k`` when stored raw, else -1. ``striles[k]``: for a
    plane that is not raw, ``(decoder, strile offsets, strile byte counts, jpegtables)``, the
    StrileDecoder being shared by every page with the same tifffile page hash (same
    compression, predictor, geometry, dtype); None for raw or absent planes."""

    dtype: np.dtype
    offsets: np.ndarray
    striles: list[tuple[Any, tuple[int, ...], tuple[int, ...], bytes | None] | None] | None = None


def raw_offset(page: Any, keyframe: Any) -> int:
    """Byte offset of ``page``'s pixels when they are stored final (uncompressed, contiguous,
    no predictor, byte-aligned) so they can be read without tifffile, else -1."""
    if page is None or not keyframe.is_final:
        return -1
    offsets, counts = page.dataoffsets, page.databytecounts
    if not offsets:
        return -1
    if len(offsets) > 1:
        if sum(counts) != keyframe.nbytes:
            return -1
        if any(offsets[i] + counts[i] != offsets[i + 1] for i in range(len(offsets) - 1)):
            return -1
    return int(offsets[0])


def _read_exact(fh: Any, nbytes: int, pos: int, path: str, what: str) -> bytearray:
    """``nbytes`` at ``pos`` of an open binary file (this call's own handle, so seek+read is
    thread-safe), or UnreadableSource when the file ends first."""
    buf = bytearray(nbytes)
    view = memoryview(buf)
    fh.seek(pos)
    got = 0
    while got < nbytes:
        n = fh.readinto(view[got:])
        if not n:
            size = os.fstat(fh.fileno()).st_size
            raise UnreadableSource(
                path, f"truncated: {what} needs bytes {pos}..{pos + nbytes}, the file ends at {size}"
            )
        got += n
    return buf


def read_raw_window(
    path: str, offset: int, shape: tuple[int, ...], dtype: np.dtype, window: tuple[slice, ...]
) -> np.ndarray:
    """``window`` (slices with steps) of a raw C-order plane of ``shape`` at ``offset``.

    One read of the outer-axis rows the window spans; when the outer step leaves gaps
    larger than the readahead window, an ``mmap`` read with the stride instead, so the skipped
    rows are never read. The result may be a view of a private buffer (never of a mapping).
    """
    outer = window[0]
    inner_shape = shape[1:]
    inner_items = math.prod(inner_shape)
    stride = inner_items * dtype.itemsize
    span = outer.stop - outer.start
    pos = offset + outer.start * stride
    what = f"plane at byte {offset} ({shape} {dtype})"
    with open(path, "rb", buffering=0) as fh:
        fd = fh.fileno()
        if outer.step > 1 and (outer.step - 1) * stride >= _READAHEAD_BYTES:
            end = pos + span * stride
            size = os.fstat(fd).st_size
            if end > size:
                raise UnreadableSource(path, f"truncated: {what} needs bytes up to {end}, the file ends at {size}")
            base = pos - pos % mmap.ALLOCATIONGRANULARITY
            mm = mmap.mmap(fd, end - base, access=mmap.ACCESS_READ, offset=base)
            try:
                arr = np.frombuffer(mm, dtype, count=span * inner_items, offset=pos - base)
                out = np.array(arr.reshape((span,) + inner_shape)[(slice(None, None, outer.step),) + window[1:]])
                del arr
            finally:
                try:
                    mm.close()
                except BufferError:  # a view survived (it cannot: we copied); GC unmaps it
                    pass
            return out
        buf = _read_exact(fh, span * stride, pos, path, what)
    arr = np.frombuffer(buf, dtype, count=span * inner_items).reshape((span,) + inner_shape)
    return arr[(slice(None, None, outer.step),) + window[1:]]


# ---- the plane grid ---------------------------------------------------------------------------
class TiffPlaneGridAdapter(StridedReads, TensorAdapter):
    """An N-D grid of 2-D planes (or mosaic tiles) stored in TIFF files.

    Axes: grid axes (from file names, acquisition metadata or an index) then the plane axes
    (y, x, maybe s). ``file_index[grid..., tile...]`` names the file holding each plane (-1:
    absent, read as zeros) and ``plane_index`` the plane inside that file. Tiles: along each
    plane axis, tile ``k`` covers ``[k*extent, (k+1)*extent)`` of the tensor and takes its
    pixels from ``[crop, crop+extent)`` of the stored plane (Magellan mosaics crop the
    overlap); without tiling there is one tile of the full plane.

    Files are located through ``layouts`` (per-file raw offsets / page indices): given at
    construction by formats that index their planes (NDTiff, MMStack), or resolved from each
    file's header on first read (sequences: ``file_shape`` is then what every file must hold).

    Decimation: the step picks grid indices (skipping whole planes) and strides the rows and
    columns of raw planes; compressed planes decode their window and stride it.
    """

    decimates = True

    def __init__(
        self,
        *,
        files: Sequence[str],
        file_index: np.ndarray,
        plane_index: np.ndarray,
        grid_labels: Sequence[str],
        plane_labels: Sequence[str],
        plane_shape: Sequence[int],
        stored_dtype: Any,
        layouts: Mapping[int, FileLayout] | None = None,
        file_shape: Sequence[int] | None = None,
        tile_extent: Sequence[int] | None = None,
        tile_crop: Sequence[int] | None = None,
        read_block: Sequence[int] | None = None,
        physical_scale: Sequence[float | None] | None = None,
        physical_unit: Sequence[str | None] | None = None,
        content_version: bytes | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self._files = [os.fspath(f) for f in files]
        self._stamps = [file_stamp(f) for f in self._files]  # what the layouts were read from
        self._plane_shape = tuple(int(n) for n in plane_shape)
        nplane = len(self._plane_shape)
        self._ngrid = file_index.ndim - nplane
        if self._ngrid < 0 or len(grid_labels) != self._ngrid or len(plane_labels) != nplane:
            raise ValueError("file_index rank does not match the grid and plane labels")
        self._file_index = np.asarray(file_index, dtype=np.int64)
        self._plane_index = np.asarray(plane_index, dtype=np.int64)
        tile_counts = self._file_index.shape[self._ngrid :]
        self._tile_extent = tuple(int(e) for e in (tile_extent or self._plane_shape))
        self._tile_crop = tuple(int(c) for c in (tile_crop or (0,) * nplane))
        for cnt, ext, crop, n in zip(tile_counts, self._tile_extent, self._tile_crop, self._plane_shape):
            if crop + ext > n or (cnt > 1 and ext < 1):
                raise ValueError("tile extent and crop must lie inside the stored plane")
        self._stored_dtype = np.dtype(stored_dtype)
        self._layouts: dict[int, FileLayout] = dict(layouts or {})
        self._layout_lock = threading.Lock()
        self._decoders: dict[Any, StrileDecoder] = {}  # tifffile page hash -> its decoder
        self._file_shape = None if file_shape is None else tuple(int(n) for n in file_shape)
        self._read_block = None if read_block is None else tuple(int(b) for b in read_block)
        grid_shape = self._file_index.shape[: self._ngrid]
        mosaic = tuple(c * e for c, e in zip(tile_counts, self._tile_extent))
        tiled = any(c > 1 for c in tile_counts)
        super().__init__(
            TensorInfo(
                tuple(grid_shape) + mosaic,
                self._stored_dtype,
                dim_labels=tuple(grid_labels) + tuple(plane_labels),
                native_chunk_shape=((1,) * self._ngrid + self._tile_extent) if tiled else None,
                physical_scale=physical_scale,
                physical_unit=physical_unit,
                content_version=content_version,
                metadata=metadata,
            )
        )

    @property
    def read_block_shape(self) -> tuple[int, ...] | None:
        """None for raw planes (a window costs its own rows); one strile for compressed
        planes (see the module docstring)."""
        return self._read_block

    def stale_reason(self, bounds: Bounds, exact: bool = False) -> str | None:
        """Stats only the files holding planes under ``bounds`` (always all of them: exact)."""
        for i in self._files_under(bounds):
            if (why := changed_since(self._files[i], self._stamps[i])) is not None:
                return why
        return None

    def _files_under(self, bounds: Bounds) -> list[int]:
        """The files holding the planes under ``bounds``."""
        g = self._ngrid
        sel = [slice(a, b) for a, b in zip(bounds.start[:g], bounds.stop[:g])]
        sel += [slice(a // e, -(-b // e)) for a, b, e in zip(bounds.start[g:], bounds.stop[g:], self._tile_extent)]
        return [int(i) for i in np.unique(self._file_index[tuple(sel)]) if i >= 0]

    # ---- reads ------------------------------------------------------------------------------
    def _read_strided(self, bounds: Bounds, step: tuple[int, ...]) -> np.ndarray:
        g = self._ngrid
        start, stop = bounds.start, bounds.stop
        out = np.zeros(output_shape(bounds.shape, step), self.dtype)
        # along each plane axis: the tiles the window touches, as (tile, source, destination)
        plane_parts = []
        for j, (ext, crop) in enumerate(zip(self._tile_extent, self._tile_crop)):
            a, b, s = start[g + j], stop[g + j], step[g + j]
            parts = []
            for t in range(a // ext, (b - 1) // ext + 1):
                lo, hi = max(a, t * ext), min(b, (t + 1) * ext)
                first = a + -(-(lo - a) // s) * s
                if first >= hi:
                    continue
                n = -(-(hi - first) // s)
                src0 = crop + first - t * ext
                dst0 = (first - a) // s
                parts.append((t, slice(src0, src0 + (n - 1) * s + 1, s), slice(dst0, dst0 + n)))
            plane_parts.append(parts)
        grid_ranges = [range(start[i], stop[i], step[i]) for i in range(g)]
        for gidx in product(*grid_ranges):
            oidx = tuple((v - start[i]) // step[i] for i, v in enumerate(gidx))
            for combo in product(*plane_parts):
                key = gidx + tuple(c[0] for c in combo)
                f = int(self._file_index[key])
                if f < 0:
                    continue  # an absent plane (sparse grid / missing tile) reads as zeros
                data = self._read_plane(f, int(self._plane_index[key]), tuple(c[1] for c in combo))
                out[oidx + tuple(c[2] for c in combo)] = data
        return out

    def _read_plane(self, f: int, k: int, window: tuple[slice, ...]) -> np.ndarray:
        path = self._files[f]
        try:
            layout = self._layout(f)
            offset = int(layout.offsets[k])
            if offset >= 0:
                return read_raw_window(path, offset, self._plane_shape, layout.dtype, window)
            strile = layout.striles[k] if layout.striles is not None else None
            if strile is None:
                raise UnreadableSource(path, f"plane {k} cannot be located in the file")
            return read_strile_window(path, *strile, window)
        except (UnreadableSource, MemoryError):
            raise
        except Exception as exc:  # a damaged plane found at read time names its file
            raise UnreadableSource(path, f"cannot read plane {k}: {type(exc).__name__}: {exc}") from exc

    def _layout(self, f: int) -> FileLayout:
        layout = self._layouts.get(f)
        if layout is None:
            layout = self._resolve_layout(f)
            with self._layout_lock:
                self._layouts[f] = layout
        return layout

    def _resolve_layout(self, f: int) -> FileLayout:
        """Parse file ``f``'s header once: where each of its planes is (sequences)."""
        import tifffile

        path = self._files[f]
        if self._file_shape is None:
            raise UnreadableSource(path, "no plane layout for this file")
        with tifffile.TiffFile(path) as tif:
            series = tif.series[0]
            shape, dtype = tuple(series.shape), np.dtype(series.dtype)
            if shape != self._file_shape or dtype != self._stored_dtype.newbyteorder("="):
                raise UnreadableSource(
                    path,
                    f"holds {shape} {dtype}, but the other planes of this sequence are "
                    f"{self._file_shape} {self._stored_dtype.newbyteorder('=')}",
                )
            return series_layout(tif, series, len(self._plane_shape), path, self._decoders)


def series_layout(
    tif: Any, series: Any, plane_ndim: int, path: str, decoders: dict[Any, StrileDecoder] | None = None
) -> FileLayout:
    """The planes of ``series`` (its leading axes flattened): raw offsets where the pixels
    are stored final, strile offsets/counts and a shared decoder elsewhere."""
    keyframe = series.keyframe
    shape = tuple(series.shape)
    n = math.prod(shape[: len(shape) - plane_ndim])
    dtype = np.dtype(series.dtype).newbyteorder(tif.byteorder)
    offsets = np.full(n, -1, dtype=np.int64)
    plane_bytes = math.prod(shape[len(shape) - plane_ndim :]) * dtype.itemsize
    if series.dataoffset is not None and keyframe.is_final:
        offsets[:] = series.dataoffset + np.arange(n, dtype=np.int64) * plane_bytes
        return FileLayout(dtype, offsets)
    series_pages = series.pages
    if len(series_pages) != n:
        raise UnreadableSource(path, f"cannot locate the {n} planes of the file's first series")
    striles: list[Any] = [None] * n
    decoders = {} if decoders is None else decoders
    for k, page in enumerate(series_pages):
        if page is None:
            continue
        offsets[k] = raw_offset(page, keyframe)
        if offsets[k] < 0:
            decoder = decoders.get(keyframe.hash)
            if decoder is None:
                decoder = decoders.setdefault(keyframe.hash, StrileDecoder.from_page(keyframe))
            tables = page.jpegtables if hasattr(page, "tags") else keyframe.jpegtables
            striles[k] = (decoder, tuple(page.dataoffsets), tuple(page.databytecounts), tables)
    return FileLayout(dtype, offsets, striles)


@dataclass
class _FileHeader:
    shape: tuple[int, ...]
    dtype: np.dtype  # with byte order
    axes: str
    page_axes: str
    read_block: tuple[int, ...] | None
    pixel_size: float | None

    @property
    def plane_ndim(self) -> int:
        return len(self.page_axes)


def read_file_header(path: str) -> _FileHeader:
    """Shape, stored dtype, axes and read granularity of a plane file's first series."""
    import tifffile

    with tifffile.TiffFile(path) as tif:
        series = tif.series[0]
        key = series.keyframe
        page_axes = key.axes
        if page_axes not in ("YX", "YXS", "SYX") or not series.axes.endswith(page_axes):
            raise UnreadableSource(path, f"pages with axes {page_axes!r} are not planes")
        dtype = np.dtype(series.dtype).newbyteorder(tif.byteorder)
        block = None if key.is_final else StrileDecoder.from_page(key).block()
        size = None
        ij = tif.imagej_metadata or {}
        unit = str(ij.get("unit", "")).lower()
        res = key.tags.get("XResolution")
        if unit in ("micron", "um", "µm", "\\u00B5m") and res is not None:
            num, den = res.value
            if num:
                size = den / num
        return _FileHeader(tuple(series.shape), dtype, series.axes, page_axes, block, size)


def plane_file_header(path: Path) -> _FileHeader:
    try:
        return read_file_header(str(path))
    except UnreadableSource:
        raise
    except Exception as exc:
        raise UnreadableSource(path, f"cannot read the TIFF header: {type(exc).__name__}: {exc}") from exc
