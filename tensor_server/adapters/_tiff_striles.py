"""Windows of compressed TIFF pages: only the strips/tiles a window touches are read, each
decoded on a shared pool of all cores and strided into the output as soon as it is decoded.

Shared reader machinery of the TIFF readers: single-file TIFF and OME-TIFF series
(``_tiff_series.py``) and the folder formats' plane grids (``_tiff_planes.py``).

Why our own loop over tifffile's per-page decoder (``TiffPage.decode``) rather than
``page.asarray`` or its zarr store: those decode every strile of the page into a full page
buffer on ``TIFF.MAXWORKERS`` threads (half the cores: one thread on a 2-core machine) and the
caller then copies or strides that buffer. Here a strided window (``nearest``) never holds the
page: each decoded strile is picked from straight into the output, so the extra memory is one
strile per worker; a full window (``area``) writes each strile into the output once. Every
strile is read with one ``pread`` on a descriptor of this call (thread-safe, no seek shared
with tifffile's file handle; a TIFF at a URL gives its own ``pread``). The pixels are tifffile's: its own decoder (decompression,
predictor, bit unpacking, JPEG tables), and a strile absent from the file (offset or byte count
0) reads as the page's no-data value, as ``page.asarray`` fills it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np

from tensor_server.core.stream_reduce import run_parallel
from tensor_server.errors import UnreadableSource

__all__ = [
    "PageStriles",
    "Pread",
    "SeriesStriles",
    "StrileDecoder",
    "StrileWindow",
    "decode_windows",
    "read_strile_window",
    "touched_striles",
]


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
    nodata: Any = 0  # what an absent strile reads as (tifffile's page.nodata)

    @classmethod
    def from_page(cls, page: Any) -> StrileDecoder:
        if page.is_tiled:
            rows, cols = int(page.tilelength), int(page.tilewidth)
        else:
            rows, cols = int(min(page.rowsperstrip or page.imagelength, page.imagelength)), int(page.imagewidth)
        jpeg = ()
        if page.compression in (6, 7, 34892, 33007):  # JPEG flavours
            jpeg = (("jpegheader", page.jpegheader),)
        return cls(
            page.decode,
            page.axes,
            np.dtype(page.dtype),
            int(page.imagelength),
            int(page.imagewidth),
            rows,
            cols,
            int(page.samplesperpixel),
            page.planarconfig == 2,
            jpeg,
            getattr(page, "nodata", 0),
        )

    def block(self) -> tuple[int, ...]:
        """One strip or tile in the page's own axes."""
        sizes = {"Y": self.rows, "X": self.cols, "S": 1 if self.planar else self.samples}
        return tuple(sizes[a] for a in self.axes)


@dataclass(frozen=True)
class StrileWindow:
    """One page's part of a read: ``window`` (slices with steps, in the page's axes) of the
    page whose striles are at ``offsets``/``counts`` of ``path``, written into ``out`` (shape:
    the window's strided shape, in the page's axes; typically a view of the caller's output)."""

    path: str
    decoder: StrileDecoder
    offsets: Sequence[int]
    counts: Sequence[int]
    jpegtables: bytes | None
    window: tuple[slice, ...]
    out: np.ndarray


def _picks(lo: int, hi: int, win: slice) -> tuple[slice, slice] | None:
    """For a strile spanning [lo, hi) along one axis: (source slice in the strile, destination
    slice in the strided output) of the window's picked positions in it, or None."""
    a, b, s = win.start, win.stop, win.step
    first = a + -(-(max(a, lo) - a) // s) * s
    end = min(b, hi)
    if first >= end:
        return None
    n = -(-(end - first) // s)
    dst0 = (first - a) // s
    return slice(first - lo, first - lo + (n - 1) * s + 1, s), slice(dst0, dst0 + n)


def _tasks(job: StrileWindow) -> list[tuple[int, int, tuple[slice, slice], tuple[slice, slice], slice, np.ndarray]]:
    """(strile index, output sample plane, (rows src, dst), (cols src, dst), contiguous-sample
    slice, 4-D output view) for every strile holding a picked pixel of ``job``'s window."""
    d = job.decoder
    win = dict(zip(d.axes, job.window))
    ys, xs = win["Y"], win["X"]
    ss = win.get("S", slice(0, 1, 1))
    if d.axes == "YX":
        out4 = job.out[None, :, :, None]
    elif d.axes == "YXS":
        out4 = job.out[None]
    else:  # SYX
        out4 = job.out[:, :, :, None]
    across = -(-d.width // d.cols)
    per_sample = -(-d.length // d.rows) * across
    separate = [(s, (s - ss.start) // ss.step) for s in range(ss.start, ss.stop, ss.step)] if d.planar else [(0, 0)]
    contiguous = slice(None) if d.planar or d.samples == 1 else slice(ss.start, ss.stop, ss.step)
    tasks = []
    for r in range(ys.start // d.rows, (ys.stop - 1) // d.rows + 1):
        rows = _picks(r * d.rows, min((r + 1) * d.rows, d.length), ys)
        if rows is None:
            continue
        for c in range(xs.start // d.cols, (xs.stop - 1) // d.cols + 1):
            cols = _picks(c * d.cols, min((c + 1) * d.cols, d.width), xs)
            if cols is None:
                continue
            for s, si in separate:
                tasks.append((s * per_sample + r * across + c, si, rows, cols, contiguous, out4))
    return tasks


def touched_striles(job: StrileWindow) -> list[int]:
    """The indices of the striles holding a picked pixel of ``job``'s window (its ``out`` is
    only looked at for its shape): what a remote read fetches ahead (``_url_tiff.py``)."""
    return [task[0] for task in _tasks(job)]


def _pread(fd: int, path: str, nbytes: int, pos: int, what: str) -> bytes:
    data = os.pread(fd, nbytes, pos)
    while len(data) < nbytes:  # a short read: the file ended, or the kernel split it
        more = os.pread(fd, nbytes - len(data), pos + len(data))
        if not more:
            size = os.fstat(fd).st_size
            raise UnreadableSource(
                path, f"truncated: {what} needs bytes {pos}..{pos + nbytes}, the file ends at {size}"
            )
        data += more
    return data


#: reads ``nbytes`` at ``pos`` of a job's file (``what``: the strile, for the error message)
Pread = Callable[[int, int, str], bytes]


def _decode_one(read: Pread, job: StrileWindow, task: tuple) -> None:
    index, si, (ysrc, ydst), (xsrc, xdst), con, out4 = task
    d = job.decoder
    dst = out4[si, ydst, xdst]
    if index >= len(job.offsets) or job.counts[index] <= 0 or job.offsets[index] <= 0:
        dst[...] = d.nodata  # an absent strile, as page.asarray fills it
        return
    data = read(int(job.counts[index]), int(job.offsets[index]), f"strile {index}")
    kwargs: dict[str, Any] = dict(d.jpeg_kwargs)
    if kwargs:
        kwargs["jpegtables"] = job.jpegtables
    seg = d.decode(data, index, **kwargs)[0]
    if seg is None:
        dst[...] = d.nodata
        return
    seg = seg.reshape(seg.shape[-3:])  # (rows, cols, contiguous samples)
    dst[...] = seg[ysrc, xsrc, con]


def decode_windows(jobs: Sequence[StrileWindow], pread_of: Callable[[str], Pread] | None = None) -> None:
    """Fill every job's ``out`` from the striles its window touches, all of them decoded in
    parallel (in file order, so a cold read walks the file forwards). Raises the first error
    (UnreadableSource for a truncated file; tifffile's own for a damaged strile). ``pread_of``:
    a job's path -> the bytes of that file, when it is no local path (a TIFF at a URL,
    ``_url_tiff.py``), else ``pread`` on the jobs' paths."""
    work = []
    fds: dict[str, int] = {}
    try:
        for job in jobs:
            read = None if pread_of is None else pread_of(job.path)
            if read is None:
                if job.path not in fds:
                    fds[job.path] = os.open(job.path, os.O_RDONLY)
                read = functools.partial(_pread, fds[job.path], job.path)
            tasks = _tasks(job)
            tasks.sort(key=lambda t: job.offsets[t[0]] if t[0] < len(job.offsets) else 0)
            work += [(read, job, t) for t in tasks]
        # this thread and the shared read pool each take the next strile (run_parallel: it
        # returns once none is being decoded, so nothing writes into ``out`` after)
        run_parallel(work, lambda item: _decode_one(*item))
    finally:
        for fd in fds.values():
            os.close(fd)


def read_strile_window(
    path: str,
    decoder: StrileDecoder,
    offsets: Sequence[int],
    counts: Sequence[int],
    jpegtables: bytes | None,
    window: tuple[slice, ...],
) -> np.ndarray:
    """``window`` (slices with steps, in the page's axes) of one compressed (or otherwise not
    raw) page, as a new array of the window's strided shape."""
    shape = tuple(-(-(w.stop - w.start) // w.step) for w in window)
    out = np.empty(shape, decoder.dtype)
    decode_windows([StrileWindow(path, decoder, offsets, counts, jpegtables, window, out)])
    return out


@dataclass(frozen=True)
class PageStriles:
    """Where one page's striles are: its file, strile offsets and byte counts, JPEG tables."""

    path: str
    offsets: tuple[int, ...]
    counts: tuple[int, ...]
    jpegtables: bytes | None


class SeriesStriles:
    """The pages of one tifffile series (or pyramid level) as strile grids, for windowed
    reads through ``decode_windows``: the series' leading axes index its pages (C order),
    its trailing axes are one page's (YX, YXS or SYX), every page decodes with the keyframe's
    decoder (as tifffile's own series reads do).

    ``of`` says None for what tifffile reads otherwise than strile by strile (pages stored
    final, i.e. raw, which the caller reads its own way; volumetric tiles; NDPI's whole-strip
    JPEGs; series with an axis transform) so those keep their reader."""

    def __init__(self, lead_shape: tuple[int, ...], decoder: StrileDecoder) -> None:
        self.lead_shape = lead_shape
        self.decoder = decoder
        self._pages: dict[int, PageStriles] = {}

    @classmethod
    def of(cls, tf: Any, series: Any) -> SeriesStriles | None:
        """For an open ``tf``'s ``series`` (call it under the file's lock)."""
        key = series.keyframe
        shape = tuple(series.shape)
        page_shape = tuple(key.shape)
        lead = shape[: len(shape) - len(page_shape)]
        if (
            key.is_final
            or getattr(series, "transform", None) is not None
            or getattr(tf, "is_ndpi", False)
            or key.axes not in ("YX", "YXS", "SYX")
            or int(getattr(key, "imagedepth", 1)) != 1
            or shape[len(lead) :] != page_shape
            or not series.axes.endswith(key.axes)
            or int(np.prod(lead, dtype=np.int64)) != len(series.pages)
            or key.dtype is None
            or np.dtype(key.dtype) != np.dtype(series.dtype)
        ):
            return None
        return cls(lead, StrileDecoder.from_page(key))

    def windows(self, window: tuple[slice, ...], out: np.ndarray, series: Any) -> list[StrileWindow] | None:
        """The jobs reading ``window`` (slices with steps over the series' axes) into ``out``
        (its strided shape): one per page the step picks. None when one of those pages is
        absent from the file. Call it under the file's lock (``page``)."""
        lead = len(self.lead_shape)
        jobs = []
        for index in product(*(range(w.start, w.stop, w.step) for w in window[:lead])):
            page = self.page(int(np.ravel_multi_index(index, self.lead_shape)) if lead else 0, series)
            if page is None:
                return None
            at = tuple((i - w.start) // w.step for i, w in zip(index, window))
            jobs.append(
                StrileWindow(
                    page.path, self.decoder, page.offsets, page.counts, page.jpegtables, window[lead:], out[at]
                )
            )
        return jobs

    def page(self, k: int, series: Any) -> PageStriles | None:
        """Page ``k``'s striles (``series`` is only touched on the first call for ``k``: call
        it under the file's lock); None for a page the file does not hold."""
        hit = self._pages.get(k)
        if hit is None and k not in self._pages:
            page = series.pages[k]
            if page is not None:
                tables = page.jpegtables if hasattr(page, "tags") else series.keyframe.jpegtables
                hit = PageStriles(
                    os.path.realpath(page.parent.filehandle.path),
                    tuple(page.dataoffsets),
                    tuple(page.databytecounts),
                    tables,
                )
            self._pages[k] = hit
        return hit
