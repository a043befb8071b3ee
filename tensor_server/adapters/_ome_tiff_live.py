"""An OME-TIFF that ome-writers is still writing, served while it grows (issue 46).

ome-writers (its tifffile backend, uncompressed) writes an acquisition as one tifffile
*contiguous* series: the first page's IFD (with the OME-XML) and then every frame's pixels
appended back to back; the other pages' IFDs are written only when the file is closed
(``TiffWriter._write_remaining_pages``), and the OME-XML says ``SizeT="1"`` for an unbounded
T until then. So while acquiring, tifffile finds one page, squeezes T away and reads the
declared planes it cannot find as zeros; and at close the file is rewritten around pixels
that never move. Here the file is read as what it is: planes at ``data offset + k × plane
bytes``, the complete ones counted from the file's size (one ``stat`` a look: there are no
new IFDs to read while acquiring), T growing by whole time points, and the close taken as
the end of growth, counted from the IFD chain it appends (``count``), without reopening:
the shape, the content version and the cached chunks stay (the pixels did not change).

Two writes make a close: the IFD chain after the pixels, then the first IFD's next-IFD
pointer patched to it. A look between the two sees a file longer by the chain and a pointer
still 0; the chain would pass for frames, so each new frame's first bytes are checked not to
be an IFD of this image (``_starts_an_ifd``) before it is counted.

Recognised (``live_layout``): one OME image in one file of one IFD whose next-IFD pointer is
0, its first plane stored raw (uncompressed, contiguous), T the slowest axis of the
DimensionOrder with more than one plane (ome-writers grows its first storage axis, T in an
acquisition), at least one complete time point on disk, and either more planes declared
than the one IFD or a whole plane past the first on disk. A compressed acquisition (an IFD
written per frame) is not recognised and is served as tifffile reads it.
"""

from __future__ import annotations

import math
import os
import struct
import threading
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from tensor_server.adapters._tiff_planes import FileLayout, TiffPlaneGridAdapter, raw_offset
from tensor_server.core.bounds import Bounds
from tensor_server.core.identity import file_stat_stamp

__all__ = ["LiveLayout", "LiveOmeTiffAdapter", "live_layout"]

#: IFDs walked at most when counting a closed file's pages (a loop in a damaged chain ends)
_MAX_PAGES = 10_000_000
#: (bytes of an IFD's entry count, of one entry, of an offset): classic TIFF, BigTIFF
_CLASSIC, _BIG = (2, 12, 4), (8, 20, 8)


@dataclass(frozen=True)
class LiveLayout:
    """Where an acquisition's planes are (module docstring). ``labels``/``sizes``: the grid
    axes slowest first, T first with its extent at open; ``next_at``: the byte offset of the
    first IFD's next-IFD pointer."""

    path: Path
    data_offset: int
    plane_shape: tuple[int, ...]
    dtype: np.dtype
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    next_at: int
    byteorder: str
    sizes_of: tuple[int, int, int]  # _CLASSIC or _BIG

    @property
    def plane_bytes(self) -> int:
        return math.prod(self.plane_shape) * self.dtype.itemsize

    @property
    def inner(self) -> int:
        """Planes per time point."""
        return math.prod(self.sizes[1:])

    def planes(self, size: int, known: int) -> tuple[int, bool]:
        """(complete planes on disk, whether the writer closed the file) for a file of
        ``size`` bytes of which ``known`` planes were counted before."""
        with open(self.path, "rb") as fh:
            nxt = self._offset(fh, self.next_at)
            if nxt:
                return self._count(fh, nxt), True
            n = max(0, (size - self.data_offset) // self.plane_bytes)
            for k in range(known, n):
                if self._starts_an_ifd(fh, self.data_offset + k * self.plane_bytes):
                    return k, False
            return n, False

    def _offset(self, fh: BinaryIO, at: int) -> int:
        size = self.sizes_of[2]
        fh.seek(at)
        raw = fh.read(size)
        if len(raw) < size:
            return 0
        return int.from_bytes(raw, "little" if self.byteorder == "<" else "big")

    def _count(self, fh: BinaryIO, first: int) -> int:
        """Pages in the chain from the first IFD (1) through ``first`` onwards."""
        count_size, entry_size, _ = self.sizes_of
        pages, at, seen = 1, first, set()
        while at and at not in seen and pages < _MAX_PAGES:
            seen.add(at)
            pages += 1
            entries = self._offset_sized(fh, at, count_size)
            at = self._offset(fh, at + count_size + entries * entry_size)
        return pages

    def _offset_sized(self, fh: BinaryIO, at: int, size: int) -> int:
        fh.seek(at)
        raw = fh.read(size)
        return int.from_bytes(raw, "little" if self.byteorder == "<" else "big") if len(raw) == size else 0

    def _starts_an_ifd(self, fh: BinaryIO, at: int) -> bool:
        """Whether an IFD of this image (its ImageWidth and ImageLength) begins at ``at`` or
        the byte after (tifffile aligns the chain to a word)."""
        return any(self._is_ifd(fh, at + pad) for pad in (0, 1))

    def _is_ifd(self, fh: BinaryIO, at: int) -> bool:
        count_size, entry_size, _ = self.sizes_of
        n = self._offset_sized(fh, at, count_size)
        if not 2 <= n <= 64:
            return False
        fh.seek(at + count_size)
        raw = fh.read(n * entry_size)
        if len(raw) < n * entry_size:
            return False
        bo = self.byteorder
        codes = [struct.unpack_from(bo + "H", raw, i * entry_size)[0] for i in range(n)]
        if codes != sorted(set(codes)) or 256 not in codes or 257 not in codes:
            return False
        width, height = (self._short_value(raw, codes.index(c) * entry_size) for c in (256, 257))
        return (height, width) == self.plane_shape

    def _short_value(self, raw: bytes, at: int) -> int:
        """An ImageWidth/ImageLength entry's value (SHORT or LONG, stored in the entry)."""
        bo = self.byteorder
        kind = struct.unpack_from(bo + "H", raw, at + 2)[0]
        value_at = at + 4 + self.sizes_of[2]
        return struct.unpack_from(bo + ("H" if kind == 3 else "I"), raw, value_at)[0]


def live_layout(path: Path, tf: Any, omexml: str | None) -> LiveLayout | None:
    """The layout of an acquisition ome-writers is still writing to ``path`` (opened as
    ``tf``), or None when the file is not one (module docstring). The IFD is looked at
    first: a finished file of many pages is told apart by one read, before its OME-XML."""
    if not tf.is_ome or len(tf.series) != 1 or tf.series[0].is_multifile or len(tf.series[0].levels) != 1:
        return None
    page = tf.pages.first
    offset = raw_offset(page, page)
    if offset < 0 or page.samplesperpixel != 1 or page.offset > offset:
        return None
    if any(tag.valueoffset >= offset for tag in page.tags.values()):
        return None  # something of the IFD after the pixels: the bytes past them are not frames
    bo, sizes_of = tf.byteorder, (_BIG if tf.is_bigtiff else _CLASSIC)
    entries = int.from_bytes(_read_at(path, page.offset, sizes_of[0]), "little" if bo == "<" else "big")
    axes = _growing_axes(_only_pixels(omexml), tuple(page.shape))
    if axes is None:
        return None
    labels, inner, declared = axes
    layout = LiveLayout(
        path=path,
        data_offset=offset,
        plane_shape=tuple(page.shape),
        dtype=np.dtype(page.dtype).newbyteorder(bo),
        labels=labels,
        sizes=(0, *inner),
        next_at=page.offset + sizes_of[0] + entries * sizes_of[1],
        byteorder=bo,
        sizes_of=sizes_of,
    )
    planes, closed = layout.planes(os.stat(path).st_size, 1)
    if closed or planes < layout.inner or (declared <= 1 and planes < 2):
        return None
    return LiveLayout(**{**layout.__dict__, "sizes": (planes // layout.inner, *inner)})


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


def _read_at(path: Path, at: int, size: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(at)
        return fh.read(size)


class LiveOmeTiffAdapter(TiffPlaneGridAdapter):
    """The acquisition's planes (module docstring), T first, grown in place by
    ``refresh_extent``; every plane is read raw from its offset, before the close and after."""

    def __init__(self, layout: LiveLayout, **info: Any) -> None:
        self.layout = layout
        t = layout.sizes[0]
        super().__init__(
            files=[layout.path],
            file_index=np.zeros((t, *layout.sizes[1:], 1, 1), np.int64),
            plane_index=self._numbered(t),
            grid_labels=layout.labels,
            plane_labels=("y", "x"),
            plane_shape=layout.plane_shape,
            stored_dtype=layout.dtype,
            layouts={0: self._planes_at(t)},
            **info,
        )
        st = os.stat(layout.path)
        #: the file as last looked at: its inode (a new one is another file), size (never
        #: shrinks while it is this acquisition) and stat stamp (unchanged: nothing to look for)
        self._ino, self._size, self._stamp = st.st_ino, st.st_size, file_stat_stamp(st)
        #: the writer closed the file: the extent is final
        self.closed = False
        self._looking = threading.Lock()

    def _numbered(self, t: int) -> np.ndarray:
        return np.arange(t * self.layout.inner, dtype=np.int64).reshape(t, *self.layout.sizes[1:], 1, 1)

    def _planes_at(self, t: int) -> FileLayout:
        n = t * self.layout.inner
        lay = self.layout
        return FileLayout(lay.dtype, lay.data_offset + np.arange(n, dtype=np.int64) * lay.plane_bytes)

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
            planes, closed = self.layout.planes(st.st_size, self.shape[0] * self.layout.inner)
            t = planes // self.layout.inner
            if t < self.shape[0]:
                return f"{self.layout.path.name} holds {t} time points, {self.shape[0]} were published"
            self._size, self._stamp = st.st_size, file_stat_stamp(st)
            if t > self.shape[0]:
                self._grow(t)
            self.closed = closed
        return None

    def _grow(self, t: int) -> None:
        """The planes of ``t`` time points, offsets first (a read racing the growth finds every
        plane the indices name), then the shape published."""
        self._layouts[0] = self._planes_at(t)
        self._plane_index = self._numbered(t)
        self._file_index = np.zeros((t, *self.layout.sizes[1:], 1, 1), np.int64)
        self.grow_to((t, *self.shape[1:]))

    def settled(self, bounds: Bounds) -> bool:
        """Not where ``bounds`` reach the newest time point while the file is written: a chunk
        cut at the extent names other pixels once T grows (its key at the OME-Zarr view)."""
        return self.closed or bounds.stop[0] < self.shape[0]
