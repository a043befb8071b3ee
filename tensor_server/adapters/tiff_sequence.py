"""TIFF sequences: a folder of plane files whose names carry the indices, one tensor per pattern.

``c0z2t0.tif``, ``Channel_1.tif``, ``img_channel000_position000_time000000000_z000.tif``: the
numbers in a file name are the plane's position on the c/z/t/p/... axes. This module also holds
the machinery the other folder-of-TIFF formats share (Micro-Manager, NDTiff):
``TiffPlaneGridAdapter`` serves an N-D grid of planes (or of mosaic tiles) that live in TIFF
files, reading each plane either raw from a known byte offset or through tifffile.

How a folder becomes tensors
  Every TIFF in the folder (not recursive; hidden files skipped) is split into text and digit
  runs. Files whose text runs are identical share a *pattern* (``c{}z{}t{}``); a number that
  varies inside a pattern is an axis, a number that does not is part of the name. The label is
  read from the word before the number (``c``/``ch``/``channel`` -> c, ``z``/``slice`` -> z,
  ``t``/``time``/``frame`` -> t, ``p``/``pos``/``position``/``s``/``site`` -> p, anything else
  a free letter q, m, n, ...; the word is kept in the metadata). One pattern is one tensor:
  files of different patterns (readlif's 1024^2 ``c0z0t0.tif`` planes next to 128^2
  ``xz_c0_t0.tif`` planes) are different tensors, because a pattern is what a user names a
  series by, and shapes differ between patterns, not inside one. Inside a pattern, every
  file's header is read at open (only the first and last above 256 files; a plane that
  differs is then reported when read) and the pattern is split by (shape, dtype) if they
  differ, the field names gaining a ``_HxW`` suffix.
  Field names are the pattern with the varying numbers dropped (``czt``, ``xz_c_t``,
  ``Channel``); the pattern with most files is the default tensor.

Sparse grids
  An axis runs from the smallest to the largest number seen (``z0`` and ``z2`` make z of 3).
  Planes that are absent from the folder read as zeros, so ``c0z0t0, c0z2t0, c0z2t2, c1z0t0``
  serve as a 2x3x3 grid with 14 zero planes. When numbers are far apart (more than twice the
  count of distinct values plus 16, e.g. timestamps), the axis is ordinal instead (the k-th
  distinct value is index k) and the values are listed in the metadata.

Multi-page files
  A file whose first tifffile series has leading axes (an ImageJ z-stack per time point) adds
  those axes after the file-name axes; its planes are its series' pages.

Read granularity (design §3)
  A plane file is read per request: nothing holds a descriptor between reads, because a
  sequence can hold 100k files and the idle reaper would let a full-stack read pin them all.
  Each file's header is parsed once (on first read) to learn whether its planes are stored
  raw (uncompressed, contiguous, no predictor). Raw planes are read with one ``pread`` of the
  rows the window spans (an ``mmap`` with a stride when the skipped rows exceed the kernel
  readahead), so a window costs its own rows: ``read_block_shape`` is None and the tensor
  decimates (the step skips whole planes on the file axes and rows inside a plane).
  Compressed or tiled planes keep their strip/tile offsets from that same header parse, and
  a window reads (one ``pread`` each) and decodes only the striles it touches, with tifffile's
  own per-page decoder (``TiffPage.decode``, shared by every file with the same page hash):
  the block is one strile, declared from the first file. Decoding the whole page for every
  window would make N streaming units cost N page decodes; tifffile's zarr store in strile
  mode reads the same striles but re-parses the file and costs ~5x more per small read.
  (Design §3's "one strile" for this class is the compressed case; the uncompressed case is
  cheaper than a strile and says so.)
"""
from __future__ import annotations

import math
import mmap
import os
import re
import threading
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from tensor_server.adapters._file_stamp import changed_since, file_stamp
from tensor_server.adapters.registry import FormatEntry, register_format
from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter
from tensor_server.core.identity import file_content_version
from tensor_server.core.bounds import Bounds
from tensor_server.core.normalizing import normalize_axes
from tensor_server.core.units import MICROMETER
from tensor_server.errors import UnreadableSource

__all__ = [
    "TiffPlaneGridAdapter",
    "TiffSequenceAdapter",
    "TiffSequenceSource",
    "FileLayout",
    "PlanePattern",
    "group_plane_names",
    "is_tiff_name",
    "axis_label_for",
    "unique_label",
]

TIFF_SUFFIXES = (".tif", ".tiff", ".tf8", ".btf")
#: A strided raw read maps the file when the gap between picked rows exceeds the kernel's
#: default readahead window; below that the kernel faults the skipped rows anyway (design §4).
_READAHEAD_BYTES = 128 << 10
#: Folders larger than this are not fully listed by ``sniff`` (it must stay cheap).
_SNIFF_LIST_LIMIT = 4096

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
_DIGITS = re.compile(r"(\d+)")
_TRAILING_WORD = re.compile(r"([A-Za-z]+)[^A-Za-z0-9]*$")


def is_tiff_name(name: str) -> bool:
    low = name.lower()
    return not name.startswith(".") and low.endswith(TIFF_SUFFIXES)


def _tiff_stem(name: str) -> str:
    low = name.lower()
    for suffix in (".ome.tiff", ".ome.tif") + TIFF_SUFFIXES:
        if low.endswith(suffix):
            return name[: -len(suffix)]
    return name


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


@dataclass(frozen=True)
class StrileDecoder:
    """What decoding a strip/tile of a page needs, captured while its file is open (some of
    tifffile's lazily computed page properties read the file, e.g. JPEG's ``is_jfif``)."""

    decode: Any  # tifffile's TiffPage.decode closure
    axes: str  # the page's axes: YX, YXS or SYX
    dtype: np.dtype
    length: int
    width: int
    rows: int  # strile height
    cols: int  # strile width
    samples: int
    planar: bool
    jpeg_kwargs: tuple[tuple[str, Any], ...]

    @classmethod
    def from_page(cls, page: Any) -> "StrileDecoder":
        if page.is_tiled:
            rows, cols = int(page.tilelength), int(page.tilewidth)
        else:
            rows, cols = int(min(page.rowsperstrip or page.imagelength, page.imagelength)), int(page.imagewidth)
        jpeg = ()
        if page.compression in (6, 7, 34892, 33007):  # JPEG flavours
            jpeg = (("jpegheader", page.jpegheader),)
        return cls(page.decode, page.axes, np.dtype(page.dtype), int(page.imagelength), int(page.imagewidth),
                   rows, cols, int(page.samplesperpixel), page.planarconfig == 2, jpeg)

    def block(self) -> tuple[int, ...]:
        """One strip or tile in the page's own axes."""
        sizes = {"Y": self.rows, "X": self.cols, "S": 1 if self.planar else self.samples}
        return tuple(sizes[a] for a in self.axes)


def read_strile_window(
    path: str,
    decoder: StrileDecoder,
    offsets: Sequence[int],
    counts: Sequence[int],
    jpegtables: bytes | None,
    window: tuple[slice, ...],
) -> np.ndarray:
    """``window`` of a compressed (or otherwise not raw) plane: only the strips/tiles the
    window touches are read (one ``pread`` each) and decoded with tifffile's decoder."""
    axes = decoder.axes
    win = dict(zip(axes, window))
    ys, xs = win["Y"], win["X"]
    ss = win.get("S", slice(0, 1, 1))
    rows, cols, planar = decoder.rows, decoder.cols, decoder.planar
    # working buffer: (separate sample, y, x, contiguous sample) over the unstrided window
    y0, y1, x0, x1, s0, s1 = ys.start, ys.stop, xs.start, xs.stop, ss.start, ss.stop
    sep = range(s0, s1) if planar else range(1)
    con = (0, 1) if planar or decoder.samples == 1 else (s0, s1)
    work = np.zeros((len(sep), y1 - y0, x1 - x0, con[1] - con[0]), decoder.dtype)
    across = -(-decoder.width // cols)
    per_sample = -(-decoder.length // rows) * across
    wanted = []
    for si, s in enumerate(sep):
        for r in range(y0 // rows, (y1 - 1) // rows + 1):
            for c in range(x0 // cols, (x1 - 1) // cols + 1):
                wanted.append((s * per_sample + r * across + c, si))
    kwargs: dict[str, Any] = dict(decoder.jpeg_kwargs)
    if kwargs:
        kwargs["jpegtables"] = jpegtables
    with open(path, "rb", buffering=0) as fh:
        for index, si in sorted(wanted, key=lambda w: offsets[w[0]] if w[0] < len(offsets) else 0):
            if index >= len(offsets) or counts[index] <= 0 or offsets[index] <= 0:
                continue  # an empty strile reads as zeros, as in tifffile
            data = bytes(_read_exact(fh, counts[index], offsets[index], path, f"strile {index}"))
            seg, (_, _, sy, sx, _), _shape = decoder.decode(data, index, **kwargs)
            if seg is None:
                continue
            seg = seg.reshape(seg.shape[-3:])  # (rows, cols, contiguous samples)
            ly0, ly1 = max(y0, sy), min(y1, sy + seg.shape[0])
            lx0, lx1 = max(x0, sx), min(x1, sx + seg.shape[1])
            if ly0 >= ly1 or lx0 >= lx1:
                continue
            work[si, ly0 - y0 : ly1 - y0, lx0 - x0 : lx1 - x0] = seg[
                ly0 - sy : ly1 - sy, lx0 - sx : lx1 - sx, con[0] : con[1]
            ]
    if axes == "YX":
        out = work[0, :, :, 0]
    elif axes == "YXS":
        out = work[0]
    else:  # SYX
        out = work[:, :, :, 0]
    steps = tuple(slice(None, None, s.step) for s in window)
    return out[steps]


# ---- the plane grid ---------------------------------------------------------------------------
class TiffPlaneGridAdapter(TensorAdapter):
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
            tuple(grid_shape) + mosaic,
            self._stored_dtype,
            dim_labels=tuple(grid_labels) + tuple(plane_labels),
            native_chunk_shape=((1,) * self._ngrid + self._tile_extent) if tiled else None,
            physical_scale=physical_scale,
            physical_unit=physical_unit,
            content_version=content_version,
            metadata=metadata,
        )

    @property
    def read_block_shape(self) -> tuple[int, ...] | None:
        """None for raw planes (a window costs its own rows); one strile for compressed
        planes (see the module docstring)."""
        return self._read_block

    def stale_reason(self, bounds: Bounds) -> str | None:
        """Stats only the files holding planes under ``bounds``."""
        g = self._ngrid
        sel = [slice(a, b) for a, b in zip(bounds.start[:g], bounds.stop[:g])]
        sel += [slice(a // e, -(-b // e)) for a, b, e in zip(bounds.start[g:], bounds.stop[g:], self._tile_extent)]
        for i in np.unique(self._file_index[tuple(sel)]):
            if i >= 0 and (why := changed_since(self._files[i], self._stamps[i])) is not None:
                return why
        return None

    # ---- reads ------------------------------------------------------------------------------
    def read_region(self, bounds: Bounds) -> np.ndarray:
        return self._read(bounds, (1,) * self.ndim)

    def get_decimated_data(self, bounds: Bounds, step: Sequence[int]) -> np.ndarray | None:
        bounds = self.check_bounds(bounds)
        return self._read(bounds, tuple(int(s) for s in step))

    def _read(self, bounds: Bounds, step: Sequence[int]) -> np.ndarray:
        g = self._ngrid
        start, stop = bounds.start, bounds.stop
        out = np.zeros(tuple(-(-(b - a) // s) for a, b, s in zip(start, stop, step)), self.dtype)
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


def series_layout(tif: Any, series: Any, plane_ndim: int, path: str, decoders: dict[Any, StrileDecoder] | None = None) -> FileLayout:
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


class TiffSequenceAdapter(TiffPlaneGridAdapter):
    """One pattern of a TIFF sequence folder (module docstring: axes, sparse grids, blocks)."""


# ---- file-name patterns -----------------------------------------------------------------------
@dataclass
class PlanePattern:
    """Files of a folder that share their text runs; numbers in ``values`` per file."""

    texts: tuple[str, ...]
    names: list[str] = field(default_factory=list)
    values: list[tuple[int, ...]] = field(default_factory=list)

    def varying(self) -> list[int]:
        """Positions of the numbers that differ between files (the axes)."""
        if not self.values:
            return []
        first = self.values[0]
        return [j for j in range(len(first)) if any(v[j] != first[j] for v in self.values)]

    def keyword(self, j: int) -> str | None:
        """The word before number ``j`` (``img_channel`` -> ``channel``)."""
        m = _TRAILING_WORD.search(self.texts[j])
        return m.group(1).lower() if m else None

    def field_name(self) -> str:
        """The pattern with its varying numbers dropped: ``c{}z{}t{}`` -> ``czt``."""
        vary = set(self.varying())
        first = self.values[0] if self.values else ()
        parts = []
        for j, text in enumerate(self.texts):
            parts.append(text)
            if j < len(first) and j not in vary:
                parts.append(str(first[j]))
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", "".join(parts))
        name = re.sub(r"([_.-])[_.-]+", r"\1", name).strip("_.- ")
        return name or "image"

    def display(self, labels: Mapping[int, str]) -> str:
        vary = set(self.varying())
        first = self.values[0] if self.values else ()
        out = []
        for j, text in enumerate(self.texts):
            out.append(text)
            if j < len(first):
                out.append("{" + labels.get(j, "?") + "}" if j in vary else str(first[j]))
        return "".join(out)


def group_plane_names(names: Iterable[str]) -> list[PlanePattern]:
    """TIFF names grouped by pattern (text runs), names in natural order inside a group."""
    groups: dict[tuple[str, ...], PlanePattern] = {}
    for name in names:
        parts = _DIGITS.split(_tiff_stem(name))
        texts = tuple(parts[0::2])
        values = tuple(int(v) for v in parts[1::2])
        g = groups.setdefault(texts, PlanePattern(texts))
        g.names.append(name)
        g.values.append(values)
    for g in groups.values():
        order = sorted(range(len(g.names)), key=lambda i: (g.values[i], g.names[i]))
        g.names = [g.names[i] for i in order]
        g.values = [g.values[i] for i in order]
    return list(groups.values())


def _list_tiff_names(folder: Path, limit: int | None = None) -> list[str]:
    names = []
    with os.scandir(folder) as it:
        for i, entry in enumerate(it):
            if limit is not None and i >= limit:
                break
            if is_tiff_name(entry.name) and entry.is_file():
                names.append(entry.name)
    return names


def _looks_like_sequence(patterns: Sequence[PlanePattern]) -> bool:
    """At least two TIFF files that differ only in their numbers. A folder holding a lone
    ``scan_001.tif`` (or a few unrelated TIFFs, like ../testdata/ome-tiff) is not claimed:
    opening it as a sequence would surprise a user who meant the files; such files still
    open on their own, and the folder opens with ``format="tiff-sequence"``."""
    return any(len(g.names) >= 2 for g in patterns)


def sniff_tiff_sequence(path: Path, head: bytes) -> bool:
    if not path.is_dir():
        return False
    return _looks_like_sequence(group_plane_names(_list_tiff_names(path, _SNIFF_LIST_LIMIT)))


# ---- building tensors ---------------------------------------------------------------------------
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
        plane_ndim = len(page_axes)
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


def build_sequence_tensor(folder: Path, pattern: PlanePattern, header: _FileHeader) -> TiffSequenceAdapter:
    """A tensor over one pattern: file-name axes, then the file's own leading axes, then the plane."""
    vary = pattern.varying()
    used: set[str] = set()
    labels: dict[int, str] = {}
    axes_meta: dict[str, Any] = {}
    index_of: list[dict[int, int]] = []
    shape: list[int] = []
    for j in vary:
        kw = pattern.keyword(j)
        label = unique_label(axis_label_for(kw), used)
        labels[j] = label
        vals = sorted({v[j] for v in pattern.values})
        lo, hi = vals[0], vals[-1]
        meta: dict[str, Any] = {"keyword": kw}
        if hi - lo + 1 > 2 * len(vals) + 16:  # far apart: ordinal axis
            index_of.append({v: i for i, v in enumerate(vals)})
            shape.append(len(vals))
            meta["values"] = vals
        else:
            index_of.append({v: v - lo for v in vals})
            shape.append(hi - lo + 1)
            meta["first"] = lo
        axes_meta[label] = meta
    lead_shape = header.shape[: len(header.shape) - header.plane_ndim]
    lead_labels = [unique_label(TIFFFILE_AXES.get(a), used) for a in header.axes[: len(lead_shape)]]
    plane_shape = header.shape[len(lead_shape) :]
    plane_labels = [TIFFFILE_AXES[a] for a in header.page_axes]
    grid_shape = tuple(shape) + tuple(lead_shape)
    file_index = np.full(grid_shape, -1, dtype=np.int64)
    plane_index = np.zeros(grid_shape, dtype=np.int64)
    lead_planes = np.arange(math.prod(lead_shape), dtype=np.int64).reshape(lead_shape)
    files = [str(folder / n) for n in pattern.names]
    duplicates = []
    for f, values in enumerate(pattern.values):
        key = tuple(index_of[i][values[j]] for i, j in enumerate(vary))
        if file_index[key].size and (file_index[key] >= 0).any():
            duplicates.append(pattern.names[f])
            continue
        file_index[key] = f
        plane_index[key] = lead_planes
    # one tile per plane: the plane axes have a tile count of 1
    file_index = file_index.reshape(grid_shape + (1,) * header.plane_ndim)
    plane_index = plane_index.reshape(grid_shape + (1,) * header.plane_ndim)
    nplanes = len(pattern.names) - len(duplicates)
    present = int((file_index >= 0).sum())
    metadata = {
        "pattern": pattern.display(labels),
        "files": nplanes,
        "missing_planes": int(file_index.size - present),
        "axes": axes_meta,
        **({"duplicate_files_ignored": duplicates} if duplicates else {}),
    }
    ndim = len(grid_shape) + header.plane_ndim
    scale: list[float | None] = [None] * ndim
    unit: list[str | None] = [None] * ndim
    if header.pixel_size:
        for i, label in enumerate(plane_labels, start=len(grid_shape)):
            if label in ("y", "x"):
                scale[i], unit[i] = header.pixel_size, MICROMETER
    read_block = None if header.read_block is None else (1,) * len(grid_shape) + header.read_block
    return TiffSequenceAdapter(
        files=files,
        file_index=file_index,
        plane_index=plane_index,
        grid_labels=[labels[j] for j in vary] + lead_labels,
        plane_labels=plane_labels,
        plane_shape=plane_shape,
        stored_dtype=header.dtype,
        file_shape=header.shape,
        read_block=read_block,
        physical_scale=scale if header.pixel_size else None,
        physical_unit=unit if header.pixel_size else None,
        content_version=file_content_version(*files),
        metadata=metadata,
    )


#: Patterns with at most this many files have every header read at open; larger ones only
#: the first and last (a plane that differs is then reported when read).
_CHECK_ALL_HEADERS = 256


def _split_by_shape(folder: Path, pattern: PlanePattern) -> list[tuple[PlanePattern, _FileHeader]]:
    """One (pattern, header) per (shape, dtype) found in the pattern (see _CHECK_ALL_HEADERS)."""
    first = plane_file_header(folder / pattern.names[0])
    last = first if len(pattern.names) == 1 else plane_file_header(folder / pattern.names[-1])
    same = (first.shape, first.dtype) == (last.shape, last.dtype)
    if same and len(pattern.names) > _CHECK_ALL_HEADERS:
        return [(pattern, first)]
    headers = [first] + [plane_file_header(folder / n) for n in pattern.names[1:-1]] + ([last] if len(pattern.names) > 1 else [])
    if all((h.shape, h.dtype) == (first.shape, first.dtype) for h in headers):
        return [(pattern, first)]
    parts: dict[tuple, tuple[PlanePattern, _FileHeader]] = {}
    for name, values, h in zip(pattern.names, pattern.values, headers):
        sub, _ = parts.setdefault((h.shape, h.dtype.str), (PlanePattern(pattern.texts), h))
        sub.names.append(name)
        sub.values.append(values)
    return list(parts.values())


def plane_file_header(path: Path) -> _FileHeader:
    try:
        return read_file_header(str(path))
    except UnreadableSource:
        raise
    except Exception as exc:
        raise UnreadableSource(path, f"cannot read the TIFF header: {type(exc).__name__}: {exc}") from exc


class TiffSequenceSource(SourceAdapter):
    """A folder of TIFF planes: one tensor per file-name pattern (module docstring)."""

    format_name = "tiff-sequence"

    def __init__(self, path: Path) -> None:
        path = Path(path)
        if not path.is_dir():
            raise UnreadableSource(path, "a TIFF sequence is a folder of TIFF files")
        patterns = group_plane_names(_list_tiff_names(path))
        if not patterns:
            raise UnreadableSource(path, "the folder holds no TIFF files")
        built: list[tuple[str, int, int, TensorAdapter]] = []
        for pattern in patterns:
            parts = _split_by_shape(path, pattern)
            for sub, header in parts:
                name = sub.field_name()
                if len(parts) > 1:  # same pattern, different plane shapes: name the shape
                    plane = dict(zip(header.page_axes, header.shape[-header.plane_ndim :]))
                    name += f"_{plane['Y']}x{plane['X']}"
                tensor = build_sequence_tensor(path, sub, header)
                built.append((name, len(sub.names), math.prod(header.shape), tensor))
        built.sort(key=lambda b: (-b[1], -b[2], b[0]))
        tensors: dict[str, TensorAdapter] = {}
        for name, _, _, tensor in built:
            unique, i = name, 2
            while unique in tensors:
                unique, i = f"{name}_{i}", i + 1
            tensors[unique] = normalize_axes(tensor)
        super().__init__(
            path,
            tensors,
            metadata={"patterns": {n: t.metadata.get("pattern") for n, t in tensors.items()}},
        )


register_format(
    FormatEntry(
        name="tiff-sequence",
        opener=TiffSequenceSource,
        sniff=sniff_tiff_sequence,
        priority=50,
        folders=True,
        files=False,
        claims=TIFF_SUFFIXES,  # a .czi or .map beside the planes is a source of its own
        description="folder of TIFF planes named by index (c0z2t0.tif, Channel_1.tif, ...)",
    )
)
