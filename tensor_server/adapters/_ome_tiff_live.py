"""An OME-TIFF that ome-writers is still writing, served while it grows (issue 46).

ome-writers' tifffile backend writes one OME image per file, and its OME-XML says one time
point (for an unbounded T) until the file is closed, so tifffile alone reads an acquisition
in progress as one time point (the planes past it ignored, or read as zeros). It writes the
planes in one of two ways, and this module follows both, planes read where they are, T the
complete time points on disk, grown in place by ``LiveOmeTiffAdapter.refresh_extent``:

* **contiguous** (uncompressed, the default): the first page's IFD (with the OME-XML), then
  every frame's pixels appended back to back; the other pages' IFDs are written only at the
  close (``TiffWriter._write_remaining_pages``). Planes are at ``data offset + k × plane
  bytes`` and a look counts them from the file's size (one ``stat``: there are no new IFDs to
  read while acquiring). The close writes the IFD chain after the pixels, then links the
  first IFD to it: a look between the two would take the chain for frames, so each new
  frame's first bytes are checked not to be an IFD of the image. The linked chain ends
  growth: its IFDs are counted, the shape and the content version stay (the close rewrites
  IFDs and the OME-XML, never the pixels).
* **paged** (compressed: an IFD per frame, linked as it is written): a look reads only the
  IFDs after the last one it took (``_tiff_ifds``), each believed once its strips are on
  disk (tifffile links an IFD before it writes it), and the planes are decoded strip by strip.

Recognised (``live_layout``): one OME image in one file, T the slowest axis of the
DimensionOrder with more than one plane (ome-writers grows its first storage axis, T in an
acquisition), at least one complete time point on disk, and either one IFD whose next-IFD
pointer is 0 with a plane stored raw and more planes declared or on disk (contiguous), or
another count of IFDs than of planes declared (paged). A finished file has as many as it
declares and is read as tifffile reads it.
"""

from __future__ import annotations

import math
import os
import threading
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.adapters._tiff_ifds import IfdFormat, IfdReader, Strips
from tensor_server.adapters._tiff_planes import FileLayout, TiffPlaneGridAdapter, raw_offset
from tensor_server.adapters._tiff_striles import StrileDecoder
from tensor_server.core.bounds import Bounds
from tensor_server.core.identity import file_stat_stamp

__all__ = ["LiveLayout", "LiveOmeTiffAdapter", "live_layout"]


@dataclass(frozen=True)
class LiveLayout:
    """Where an acquisition's planes are (module docstring). ``labels``/``sizes``: the grid
    axes slowest first, T first with its extent at open; ``next_at``: the byte offset of the
    first IFD's next-IFD pointer; ``data_offset``: the first plane's pixels when contiguous,
    -1 when paged; ``pages``: the strips of the IFDs found so far (paged)."""

    path: Path
    plane_shape: tuple[int, ...]
    dtype: np.dtype
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    fmt: IfdFormat
    next_at: int
    data_offset: int = -1
    decoder: StrileDecoder | None = None
    pages: tuple[Strips, ...] = ()

    @property
    def plane_bytes(self) -> int:
        return math.prod(self.plane_shape) * self.dtype.itemsize

    @property
    def inner(self) -> int:
        """Planes per time point."""
        return math.prod(self.sizes[1:])

    def planes(self, size: int, known: int) -> tuple[int, bool]:
        """Contiguous: (complete planes on disk, whether the writer closed the file) for a
        file of ``size`` bytes of which ``known`` planes were counted before."""
        with open(self.path, "rb") as fh:
            ifds = IfdReader(fh, self.fmt)
            chain = ifds.uint(self.next_at, self.fmt.offset_size)
            if chain:
                return 1 + ifds.count(chain), True
            n = max(0, (size - self.data_offset) // self.plane_bytes)
            for k in range(known, n):
                at = self.data_offset + k * self.plane_bytes
                if any(ifds.strips(at + pad, self.plane_shape, size) for pad in (0, 1)):
                    return k, False  # the close's chain, not linked yet (module docstring)
            return n, False

    def more_pages(self, size: int) -> LiveLayout:
        """Paged: this layout with the IFDs written since its last one."""
        pages = list(self.pages)
        with open(self.path, "rb") as fh:
            ifds = IfdReader(fh, self.fmt)
            at = ifds.uint(pages[-1].next_at if pages else self.next_at, self.fmt.offset_size)
            while at:
                found = ifds.strips(at, self.plane_shape, size)
                if found is None:
                    break
                pages.append(found)
                at = ifds.uint(found.next_at, self.fmt.offset_size)
        return replace(self, pages=tuple(pages))

    def file_layout(self, planes: int) -> FileLayout:
        """Where the first ``planes`` planes are, for the reader."""
        if self.decoder is None:
            return FileLayout(self.dtype, self.data_offset + np.arange(planes, dtype=np.int64) * self.plane_bytes)
        striles = [(self.decoder, p.offsets, p.counts, None) for p in self.pages[:planes]]
        return FileLayout(self.dtype, np.full(planes, -1, np.int64), list(striles))


def live_layout(path: Path, tf: Any, omexml: str | None) -> LiveLayout | None:
    """The layout of an acquisition ome-writers is still writing to ``path`` (opened as
    ``tf``), or None when the file is not one (module docstring). The IFDs are looked at
    first: a finished file is told apart by its page count, before its OME-XML is read."""
    if not tf.is_ome or len(tf.series) != 1 or tf.series[0].is_multifile or len(tf.series[0].levels) != 1:
        return None
    page = tf.pages.first
    if page.samplesperpixel != 1:
        return None
    fmt = IfdFormat(tf.byteorder, tf.is_bigtiff)
    size = os.stat(path).st_size
    with open(path, "rb") as fh:
        next_at = IfdReader(fh, fmt).next_at(page.offset)
        chained = IfdReader(fh, fmt).uint(next_at, fmt.offset_size) != 0
    if chained and len(tf.pages) * math.prod(page.shape) == math.prod(tf.series[0].shape):
        return None  # as many pages as the image's planes: a finished file
    axes = _growing_axes(_only_pixels(omexml), tuple(page.shape))
    if axes is None:
        return None
    labels, inner, declared = axes
    layout = LiveLayout(
        path, tuple(page.shape), np.dtype(page.dtype).newbyteorder(fmt.byteorder), labels, (0, *inner), fmt, next_at
    )
    if chained or raw_offset(page, page) < 0:
        first = Strips(tuple(page.dataoffsets), tuple(page.databytecounts), next_at)
        layout = replace(layout, decoder=StrileDecoder.from_page(page), pages=(first,)).more_pages(size)
        planes = len(layout.pages)
        if planes == declared:
            return None
    else:
        offset = raw_offset(page, page)
        if page.offset > offset or any(tag.valueoffset >= offset for tag in page.tags.values()):
            return None  # something of the IFD after the pixels: the bytes past them are not frames
        layout = replace(layout, data_offset=offset)
        planes, closed = layout.planes(size, 1)
        if closed or (declared <= 1 and planes < 2):
            return None
    if planes < layout.inner:
        return None
    return replace(layout, sizes=(planes // layout.inner, *inner))


def _growing_axes(
    pixels: dict[str, str] | None, plane: tuple[int, ...]
) -> tuple[tuple[str, ...], tuple[int, ...], int] | None:
    """(grid labels slowest first, T first; the other axes' sizes; planes declared) of an
    image whose plane is ``plane`` and whose T is the slowest axis of more than one plane,
    or None."""
    if pixels is None:
        return None
    try:
        size_yx = (int(pixels["SizeY"]), int(pixels["SizeX"]))
        sizes = {a: int(pixels[f"Size{a}"]) for a in "ZCT"}
        order = pixels["DimensionOrder"]
    except (KeyError, ValueError):
        return None
    slow_first = order[:1:-1]  # "XYCTZ" -> "ZTC"
    if size_yx != plane or order[:2] != "XY" or sorted(slow_first) != ["C", "T", "Z"]:
        return None
    t = slow_first.index("T")
    if any(sizes[a] > 1 for a in slow_first[:t]):
        return None
    inner = [a for a in slow_first[t + 1 :] if sizes[a] > 1]
    return ("t", *(a.lower() for a in inner)), tuple(sizes[a] for a in inner), math.prod(sizes.values())


def _only_pixels(omexml: str | None) -> dict[str, str] | None:
    """The Pixels attributes of the document's one Image, or None."""
    if not omexml:
        return None
    try:
        root = ElementTree.fromstring(omexml)
    except ElementTree.ParseError:
        return None
    images = [el for el in root if el.tag.rsplit("}", 1)[-1] == "Image"]
    if len(images) != 1:
        return None
    pixels = [el for el in images[0] if el.tag.rsplit("}", 1)[-1] == "Pixels"]
    return dict(pixels[0].attrib) if len(pixels) == 1 else None


class LiveOmeTiffAdapter(TiffPlaneGridAdapter):
    """The acquisition's planes (module docstring), T first, grown in place by
    ``refresh_extent``; planes are read where the layout says, before the close and after."""

    def __init__(self, layout: LiveLayout, **info: Any) -> None:
        self.layout = layout
        t = layout.sizes[0]
        block = None if layout.decoder is None else (1,) * len(layout.sizes) + layout.decoder.block()
        super().__init__(
            files=[layout.path],
            file_index=np.zeros((t, *layout.sizes[1:], 1, 1), np.int64),
            plane_index=self._numbered(t),
            grid_labels=layout.labels,
            plane_labels=("y", "x"),
            plane_shape=layout.plane_shape,
            stored_dtype=layout.dtype,
            layouts={0: layout.file_layout(t * layout.inner)},
            read_block=block,
            **info,
        )
        st = os.stat(layout.path)
        #: the file as last looked at: its inode (a new one is another file), size (never
        #: shrinks while it is this acquisition) and stat stamp (unchanged: nothing to look for)
        self._ino, self._size, self._stamp = st.st_ino, st.st_size, file_stat_stamp(st)
        #: the writer closed the file: the extent is final (known of a contiguous file only)
        self.closed = False
        self._looking = threading.Lock()

    def _numbered(self, t: int) -> np.ndarray:
        return np.arange(t * self.layout.inner, dtype=np.int64).reshape(t, *self.layout.sizes[1:], 1, 1)

    def growth_paths(self) -> tuple[Path, ...]:
        return () if self.closed else (self.layout.path,)

    def stale_reason(self, bounds: Bounds, exact: bool = False) -> str | None:
        """Another file in its place, or the file shortened: the writer appends, and closing
        rewrites only IFDs and the OME-XML around pixels that stay where they are."""
        try:
            st = os.stat(self.layout.path)
        except FileNotFoundError:
            return f"{self.layout.path.name} was removed since it was opened"
        if st.st_ino != self._ino or st.st_size < self._size:
            return f"{self.layout.path.name} was rewritten since it was opened"
        return None

    def refresh_extent(self) -> str | None:
        """Publish the complete time points on disk now (module docstring); a reason when the
        file is another one, shorter, or closed with fewer planes than published."""
        why = self.stale_reason(Bounds.full(self.shape))
        if why is not None or self.closed:
            return why
        with self._looking:
            st = os.stat(self.layout.path)
            if file_stat_stamp(st) == self._stamp:
                return None
            closed = False
            if self.layout.decoder is None:
                planes, closed = self.layout.planes(st.st_size, self.shape[0] * self.layout.inner)
            else:
                self.layout = self.layout.more_pages(st.st_size)
                planes = len(self.layout.pages)
            t = planes // self.layout.inner
            if t < self.shape[0]:
                return f"{self.layout.path.name} holds {t} time points, {self.shape[0]} were published"
            self._size, self._stamp = st.st_size, file_stat_stamp(st)
            if t > self.shape[0]:
                self._grow(t)
            self.closed = closed
        return None

    def _grow(self, t: int) -> None:
        """The planes of ``t`` time points, their places first (a read racing the growth finds
        every plane the indices name), then the shape published."""
        self._layouts[0] = self.layout.file_layout(t * self.layout.inner)
        self._plane_index = self._numbered(t)
        self._file_index = np.zeros((t, *self.layout.sizes[1:], 1, 1), np.int64)
        self.grow_to((t, *self.shape[1:]))

    def settled(self, bounds: Bounds) -> bool:
        """Not where ``bounds`` reach the newest time point while the file is written: a chunk
        cut at the extent names other pixels once T grows (its key at the OME-Zarr view)."""
        return self.closed or bounds.stop[0] < self.shape[0]
