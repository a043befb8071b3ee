"""One tifffile page series (or one pyramid level of it) served as a tensor: the lazily opened
file shared by a source's tensors (``TiffHandle``) and the tensor that reads it
(``TiffPageSeriesAdapter``), through a persistent ``series.aszarr(level=..., chunkmode=...)``
store or strile by strile (``_tiff_striles.py``).

Shared reader machinery of the single-file TIFF formats, not one format's: plain TIFF and its
flavours (``tiff.py``) and OME-TIFF (``ome_tiff.py``) each find their series and metadata with
their own opener and build their tensors from these two (it used to live inside tiff.py).
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from tensor_server_kernels.reference import output_shape

from tensor_server.adapters._file_stamp import changed_since, file_stamp
from tensor_server.adapters._strided import strided_slices
from tensor_server.adapters._tiff_striles import SeriesStriles, decode_windows
from tensor_server.core.adapter_base import NativeLevel, TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.core.handles import DEFAULT_IDLE_SECONDS, LazyHandle
from tensor_server.core.identity import file_content_version
from tensor_server.core.uniform import UniformBlock, grid_uniform_blocks
from tensor_server.errors import UnreadableSource

if TYPE_CHECKING:  # pragma: no cover
    import tifffile

__all__ = [
    "TiffHandle",
    "TiffPageSeriesAdapter",
    "level_scale",
    "open_tiff_file",
    "tiff_dim_labels",
]

#: the TIFF adapter's logger: a level not advertised is reported under the format's name
log = logging.getLogger("tensor_server.adapters.tiff")

PAGE_CHUNKMODE = 2  # tifffile CHUNKMODE.PAGE: one zarr chunk = one decoded page
STRILE_CHUNKMODE = 0  # tifffile CHUNKMODE.NONE: one zarr chunk = one strip or tile

# tifffile axis codes -> served labels. Q (other) and I (page sequence) keep their own letters;
# R (OME "tile": region/position) is a stage position, served as p like every other format.
_AXIS_LABELS = {"T": "t", "C": "c", "Z": "z", "Y": "y", "X": "x", "S": "s", "R": "p"}


# ---- small helpers ---------------------------------------------------------------------------
def tiff_dim_labels(axes: str) -> tuple[str, ...]:
    """Lower-case labels for tifffile's axis codes, kept distinct: T C Z Y X S map to t c z y x
    s, R (positions) to p, every other code (Q, I, E, H, ...) to its own lower-case letter. A
    collision (OME's R and P both present) falls back to the code's own letter, then to
    tifffile's dimension name (``phase``), then ``dim_<i>``."""
    out: list[str] = []
    for i, code in enumerate(axes):
        for candidate in (_AXIS_LABELS.get(code, code.lower()), code.lower(), _axis_name(code), f"dim_{i}"):
            if candidate not in out:
                out.append(candidate)
                break
    return tuple(out)


def _axis_name(code: str) -> str:
    try:
        import tifffile

        return str(tifffile.TIFF.AXES_NAMES.get(code, f"axis_{code.lower()}")).lower()
    except Exception:
        return f"axis_{code.lower()}"


def level_scale(shape0: Sequence[int], shape: Sequence[int]) -> tuple[int, ...] | None:
    """Integer per-axis factor from level 0 to a stored level, or None when the level is not
    an integer reduction (each axis: level size is floor or ceil of level-0 size / factor)."""
    if len(shape0) != len(shape):
        return None
    out = []
    for n0, n in zip(shape0, shape):
        if n < 1:
            return None
        f = max(1, int(round(n0 / n)))
        if n not in (n0 // f, -(-n0 // f)):
            return None
        out.append(f)
    return tuple(out)


def open_tiff_file(path: str | os.PathLike[str], **kwargs: Any) -> tifffile.TiffFile:
    """``tifffile.TiffFile(path, **kwargs)`` (imported here, never at module import)."""
    import tifffile

    return tifffile.TiffFile(os.fspath(path), **kwargs)


def decode_threads() -> int:
    """Threads tifffile decodes one page's tiles/strips on: all cores. Its own default is half
    the cores (one thread on a 2-core machine) and, in strile mode, one thread below 3."""
    return os.cpu_count() or 1


# ---- the shared, lazily opened file ----------------------------------------------------------
class _OpenTiff:
    """One open TiffFile and the zarr arrays over its series/levels, created on first use and
    kept until the handle is closed (a store costs a small JSON build; reopening per read would
    re-parse IFDs)."""

    def __init__(self, tf: tifffile.TiffFile, series: Sequence[Any]) -> None:
        self.tf = tf
        self.series = list(series)
        self._arrays: dict[tuple[int, int, int], Any] = {}
        self._stores: list[Any] = []

    def level_series(self, series_index: int, level: int) -> Any:
        return self.series[series_index].levels[level]

    def array(self, series_index: int, level: int, chunkmode: int) -> Any:
        key = (series_index, level, chunkmode)
        arr = self._arrays.get(key)
        if arr is None:
            import zarr

            store = self.series[series_index].aszarr(level=level, chunkmode=chunkmode, maxworkers=decode_threads())
            self._stores.append(store)
            arr = zarr.open_array(store, mode="r", zarr_format=2)
            self._arrays[key] = arr
        return arr

    def close(self) -> None:
        for store in self._stores:
            try:
                store.close()
            except Exception:  # closing must not fail on one bad store
                pass
        self._stores.clear()
        self._arrays.clear()
        self.tf.close()


class TiffHandle:
    """A TIFF file (set) opened lazily, shared by every tensor of a source.

    ``opener`` returns a ``tifffile.TiffFile`` (for a multi-file OME-TIFF, the one that sees
    the whole set); ``series_getter`` picks the series list from it (default ``tf.series``).
    ``files`` are the paths whose stats make the content version.

    Thread safety: a TiffFile's file handle is one seek position, and tifffile loads TiffFrames
    lazily with unlocked seeks, so concurrent reads through one TiffFile can interleave seeks.
    Every read therefore holds ``lock`` (one per handle, i.e. per file set). Correctness first:
    reads of one file are serialized, reads of different files run in parallel, and a
    page-mode read still decodes the tiles of its page on tifffile's own worker threads.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        opener: Callable[[], tifffile.TiffFile] | None = None,
        *,
        series_getter: Callable[[tifffile.TiffFile], Sequence[Any]] | None = None,
        files: Sequence[str | os.PathLike[str]] | None = None,
        idle_seconds: float = DEFAULT_IDLE_SECONDS,
    ) -> None:
        self.path = Path(path)
        self._opener = opener or (lambda: open_tiff_file(self.path))
        self._series_getter = series_getter or (lambda tf: tf.series)
        self.files = [str(f) for f in (files or [self.path])]
        self._stamps = [file_stamp(f) for f in self.files]  # what the parsed structure was read from
        self.lock = threading.RLock()
        self._lazy: LazyHandle[_OpenTiff] = LazyHandle(
            self._open, lambda opened: opened.close(), idle_seconds, name=str(self.path)
        )

    def _open(self) -> _OpenTiff:
        tf = self._opener()
        try:
            return _OpenTiff(tf, self._series_getter(tf))
        except BaseException:
            tf.close()
            raise

    @property
    def opens(self) -> int:
        """How many times the file was (re)opened (tests, stats)."""
        return self._lazy.opens

    @property
    def is_open(self) -> bool:
        return self._lazy.is_open

    @contextmanager
    def use(self) -> Iterator[_OpenTiff]:
        """The open file, pinned (the reaper cannot close it) and locked for the block."""
        with self.lock, self._lazy.use() as opened:
            yield opened

    def content_version(self) -> bytes:
        return file_content_version(*self.files)

    def stale_reason(self) -> str | None:
        """Why the files differ from when this handle was made (one stat each), or None."""
        for path, stamp in zip(self.files, self._stamps):
            why = changed_since(path, stamp)
            if why is not None:
                return why
        return None

    def close(self) -> None:
        self._lazy.close()


# ---- tensors ---------------------------------------------------------------------------------
class TiffPageSeriesAdapter(TensorAdapter):
    """A tensor over one tifffile page series (or one pyramid level of it), read through a
    persistent ``series.aszarr(level=level, chunkmode=...)`` zarr array held by ``handle``.

    Why the read block is the page (for pages read through the store): in page mode (tifffile ``chunkmode="page"``) the store's
    chunk is one page, and a read of any window decodes the whole page and slices it; nothing
    caches the decoded page, so N streaming units inside a page cost N decodes. The per-strile
    mode would read proportionally but loses strip coalescing and threaded tile decode, which
    makes it several times slower for reading a page (design scaled-read-path.md §3). So the
    seed and ``read_block_shape`` are one page: ones on the page-sequence axes, the full page
    on Y/X (and S, and any axis stored inside the page).

    Exception: a page whose decoded size exceeds ``page_mode_max_bytes`` (a whole-slide
    baseline of several GB) is read in strile mode, where the block is one tile or strip;
    decoding gigabytes for one tile would make the file unusable.

    Compressed pages (not stored raw) are read strile by strile on all cores instead of
    through the store (``_strile_read``, ``_tiff_striles.py``): a window decodes only the
    striles it touches, each straight into the output, and ``nearest`` is a decimated read
    that strides each decoded strile into the output without a page buffer. Measured against
    tifffile + NumPy in ``bench peers`` (issue 25).

    Level ``level > 0`` tensors are the stored pyramid levels; level 0 lists them in
    ``native_levels`` (``attach_levels``).
    """

    #: Decoded page size above which the page is read tile by tile (strile mode).
    page_mode_max_bytes: ClassVar[int] = 256 << 20

    @property
    def read_block_shape(self) -> tuple[int, ...] | None:
        """One page (the native chunk), or, where the series is read strile by strile, one page
        along the page-sequence axes and, within the page, the transfer chunk rounded up to
        whole striles: a window then decodes only its striles, so a streaming unit smaller
        than the page (a 2048² transfer chunk of an 8192² page) costs its own striles and the
        page is never held whole; rounded, so that units meet on strile edges and no strile
        is decoded by two units (class docstring)."""
        striles = self._series_striles()
        if striles is None:
            return self.native_chunk_shape
        lead = len(striles.lead_shape)
        page = zip(self.chunk_shape[lead:], striles.decoder.block(), self.shape[lead:])
        return (1,) * lead + tuple(min(-(-max(c, b) // b) * b, n) for c, b, n in page)

    @property
    def decimates(self) -> bool:  # type: ignore[override]
        """nearest from the striles (``get_decimated_data``) where the series is read so."""
        return self._series_striles() is not None

    def __init__(
        self,
        handle: TiffHandle,
        series_index: int = 0,
        level: int = 0,
        *,
        dim_labels: Sequence[str] | None = None,
        physical_scale: Sequence[float | None] | None = None,
        physical_unit: Sequence[str | None] | None = None,
        content_version: bytes | None = None,
        metadata: Mapping[str, Any] | None = None,
        is_labels: bool = False,
    ) -> None:
        self.handle = handle
        self.series_index = int(series_index)
        self.level = int(level)
        with handle.use() as opened:
            series = opened.level_series(self.series_index, self.level)
            keyframe = series.keyframe
            page_bytes = int(np.prod(keyframe.shape, dtype=np.int64)) * np.dtype(series.dtype).itemsize
            striled = keyframe.is_tiled or (0 < keyframe.rowsperstrip < keyframe.imagelength)
            self.chunkmode = STRILE_CHUNKMODE if page_bytes > self.page_mode_max_bytes and striled else PAGE_CHUNKMODE
            arr = opened.array(self.series_index, self.level, self.chunkmode)
            shape, dtype, chunks = tuple(arr.shape), np.dtype(series.dtype), tuple(arr.chunks)
            self.axes: str = series.axes
        if len(self.axes) != len(shape):
            raise UnreadableSource(handle.path, f"series {series_index} axes {self.axes!r} do not fit shape {shape}")
        if not shape or any(n < 1 for n in shape):
            raise UnreadableSource(handle.path, f"series {series_index} holds no image data (shape {shape})")
        super().__init__(
            TensorInfo(
                shape,
                dtype,
                dim_labels=dim_labels or tiff_dim_labels(self.axes),
                native_chunk_shape=tuple(min(c, n) for c, n in zip(chunks, shape)),
                physical_scale=physical_scale,
                physical_unit=physical_unit,
                is_labels=is_labels,
                content_version=content_version or handle.content_version(),
                metadata=metadata,
            )
        )

    def stale_reason(self, bounds: Bounds, exact: bool = False) -> str | None:
        return self.handle.stale_reason()  # any page may sit anywhere in the file(s); always exact

    def read_region(self, bounds: Bounds) -> np.ndarray:
        with self._read_failures(str(bounds)):
            out = self._strile_read(bounds, (1,) * bounds.ndim)
            if out is not None:
                return out
            with self.handle.use() as opened:
                page = self._whole_page(opened, bounds)
                if page is not None:
                    decoded = page.asarray(maxworkers=decode_threads())
                    # a reshape is a view, which get_data copies: only when the shapes differ
                    return decoded if decoded.shape == bounds.shape else decoded.reshape(bounds.shape)
                arr = opened.array(self.series_index, self.level, self.chunkmode)
                return np.asarray(arr[bounds.to_slices()])

    def get_decimated_data(self, bounds: Bounds, step: Sequence[int]) -> np.ndarray | None:
        """``nearest`` as a strided read of the striles (``_strile_read``); None (the engine
        streams) where the series is not read strile by strile."""
        bounds = self.check_bounds(bounds)
        with self._read_failures(f"{bounds} step {tuple(step)}"):
            return self._strile_read(bounds, tuple(int(s) for s in step))

    @contextmanager
    def _read_failures(self, what: str) -> Iterator[None]:
        """A corrupt strip or tile found at read time is the source's error (UnreadableSource,
        naming the series, level and ``what`` was read), never an arbitrary exception."""
        try:
            yield
        except (UnreadableSource, MemoryError):
            raise
        except Exception as exc:
            raise UnreadableSource(
                self.handle.path,
                f"reading series {self.series_index} level {self.level} {what} failed: {type(exc).__name__}: {exc}",
            ) from exc

    def _strile_read(self, bounds: Bounds, step: tuple[int, ...]) -> np.ndarray | None:
        """``bounds`` picked every ``step``, decoded strile by strile on all cores straight
        into the output (``_tiff_striles.py``): the pages under ``bounds``, only the striles
        the window touches, no page buffer. None where the series is not read this way
        (pages stored raw, volumetric tiles, ...) or a page under ``bounds`` is absent."""
        striles = self._series_striles()
        if striles is None:
            return None
        window = strided_slices(bounds, step)
        out = np.empty(output_shape(bounds.shape, step), self.dtype)
        with self.handle.use() as opened:
            jobs = striles.windows(window, out, opened.level_series(self.series_index, self.level))
        if jobs is None:
            return None
        self._decode_windows(jobs)
        return out

    def _decode_windows(self, jobs: list[Any]) -> None:
        decode_windows(jobs)

    def _series_striles(self) -> SeriesStriles | None:
        cached = getattr(self, "_striles", False)
        if cached is False:
            with self.handle.use() as opened:
                cached = SeriesStriles.of(opened.tf, opened.level_series(self.series_index, self.level))
            self._striles = cached
        return cached

    # ---- uniform blocks: sparse pages -----------------------------------------------------------
    @property
    def reports_uniform_blocks(self) -> bool:  # type: ignore[override]
        return self.chunkmode == PAGE_CHUNKMODE

    def uniform_blocks(self, bounds: Bounds) -> list[UniformBlock]:
        """Pages all of whose strips or tiles are absent (offset 0 and byte count 0: a sparse
        file, e.g. GDAL's SPARSE_OK) read as the fill value (0, or the GDAL no-data tag); the
        value is the store's own answer for such a page. Page granularity: the page is the
        read block (class docstring); a page with some sparse tiles is decoded."""
        if not self.reports_uniform_blocks:
            return []
        sparse, fill = self._sparse_pages()
        if not sparse:
            return []
        chunks = self.native_chunk_shape
        grid = [-(-n // c) for n, c in zip(self.shape, chunks)]
        return grid_uniform_blocks(
            bounds,
            chunks,
            self.shape,
            lambda idx: fill if int(np.ravel_multi_index(idx, grid)) in sparse else None,
        )

    def _sparse_pages(self) -> tuple[frozenset[int], np.generic | None]:
        cached = getattr(self, "_sparse", None)
        if cached is not None and cached[0] == self.content_version:
            return cached[1], cached[2]
        sparse: list[int] = []
        fill = None
        with self.handle.use() as opened:
            pages = opened.level_series(self.series_index, self.level).pages
            for i, page in enumerate(pages):
                offsets = getattr(page, "dataoffsets", None)
                counts = getattr(page, "databytecounts", None)
                if offsets and counts and not any(offsets) and not any(counts):
                    sparse.append(i)
            if sparse:
                chunks = self.native_chunk_shape
                grid = [-(-n // c) for n, c in zip(self.shape, chunks)]
                origin = tuple(int(i) * c for i, c in zip(np.unravel_index(sparse[0], grid), chunks))
                arr = opened.array(self.series_index, self.level, self.chunkmode)
                fill = np.asarray(arr[origin]).astype(self.dtype)[()]
        self._sparse = (self.content_version, frozenset(sparse), fill)
        return self._sparse[1], fill

    def _whole_page(self, opened: _OpenTiff, bounds: Bounds) -> Any | None:
        """The page to decode directly when ``bounds`` is the whole tensor and the tensor is
        one page (a 2-D plane, an RGB image, a pyramid level), read in page mode; else None.

        Why: through the zarr store the decoded page is copied once more into zarr's output,
        which cost a third of the decode time in a scaled read of an 8192² tiled plane (py-spy).
        """
        if self.chunkmode != PAGE_CHUNKMODE or bounds.shape != self.shape:
            return None
        series = opened.level_series(self.series_index, self.level)
        if len(series.pages) != 1 or getattr(series, "transform", None) is not None:
            return None
        page = series.pages[0]
        if page is None or np.dtype(page.dtype) != np.dtype(series.dtype) or math.prod(page.shape) != bounds.size:
            return None
        return page

    def attach_levels(self, n_levels: int, make_level: Callable[[int], TensorAdapter]) -> None:
        """Fill ``native_levels`` from stored levels 1..n_levels-1. ``make_level(level)``
        builds the level tensor (same class, same handle); a level that is not an integer
        reduction of this one is skipped with a log line."""
        for level in range(1, n_levels):
            tensor = make_level(level)
            scale = level_scale(self.shape, tensor.shape)
            if scale is None or all(s == 1 for s in scale):
                log.info(
                    "%s: series %d level %d shape %s is not an integer reduction of %s; not advertised",
                    self.handle.path,
                    self.series_index,
                    level,
                    tensor.shape,
                    self.shape,
                )
                continue
            if self.physical_scale is not None:
                tensor.physical_scale = tuple(None if p is None else p * f for p, f in zip(self.physical_scale, scale))
            self.native_levels.append(NativeLevel(scale, tensor))

    def close(self) -> None:
        self.handle.close()
