"""A TIFF or OME-TIFF at a URL (``url_source.py`` opens it): tifffile over ``RemoteFile``.

tifffile parses the IFDs through ``RemoteFile`` (aligned ``TIFF_BLOCK`` ranges, the last few
kept in memory: it reads an IFD a few bytes at a time). Compressed tiles and strips are read
by the server's strile reader (``_tiff_striles.py``, as for a local file) through
``RemoteFile.pread``: a window fetches and decodes only the striles it touches. Left alone, a
cold read would be one round trip per strile; so before a read, the adapter names the striles
it will touch and ``RemoteBytes.prefetch`` fetches their blocks at once, adjacent blocks merged
into one request; the reads then hit the cache. What the strile reader does not read (pages
stored raw, volumetric tiles) tifffile reads through its own zarr store, block by block.
"""

from __future__ import annotations

import hashlib
import io
from collections import OrderedDict
from collections.abc import Iterable
from itertools import product
from typing import Any

import numpy as np

from tensor_server.adapters._remote_bytes import remote_bytes
from tensor_server.adapters._tiff_series import TiffHandle
from tensor_server.adapters._tiff_striles import SeriesStriles, StrileWindow, decode_windows, touched_striles
from tensor_server.adapters.ome_tiff import OmeTiffAdapter, _images, _match_images
from tensor_server.adapters.tiff import TiffAdapter, _flavour, build_series_tensors, check_series_extent
from tensor_server.core.adapter_base import SourceAdapter
from tensor_server.core.bounds import Bounds
from tensor_server.errors import UnreadableSource

__all__ = ["TIFF_BLOCK", "RemoteFile", "UrlTiffSource"]

#: TIFF bytes are fetched in aligned blocks of this size
TIFF_BLOCK = 256 << 10


class RemoteFile(io.RawIOBase):
    """A read-only, seekable file over a URL for tifffile, pinned to the version it was
    opened at (a range of another version raises, naming the URL)."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.name = url
        data, self.validator = remote_bytes().read(url, f"0-{TIFF_BLOCK - 1}")
        if data is None:
            raise UnreadableSource(url, "not found on the host (HTTP 404)")
        size = remote_bytes().size(url)
        if size is None and len(data) < TIFF_BLOCK:
            size = len(data)  # the whole object fitted in the first block
        if size is None:
            raise UnreadableSource(url, "the host does not say the object's size (no Content-Range or Content-Length)")
        self.size: int = size
        self.pos = 0
        self._recent: OrderedDict[int, bytes] = OrderedDict({0: data})

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self.pos + len(view), self.size)
        if end <= self.pos:
            return 0
        first, last = self.pos // TIFF_BLOCK, (end - 1) // TIFF_BLOCK
        if last > first:
            self.prefetch([(self.pos, end)])
        got = 0
        while self.pos < end:
            index, offset = divmod(self.pos, TIFF_BLOCK)
            piece = self._block(index)[offset : offset + end - self.pos]
            view[got : got + len(piece)] = piece
            got += len(piece)
            self.pos += len(piece)
        return got

    def _range(self, index: int) -> tuple[int, int]:
        return index * TIFF_BLOCK, min((index + 1) * TIFF_BLOCK, self.size)

    def prefetch(self, spans: Iterable[tuple[int, int]]) -> None:
        """Have the blocks under ``spans`` ((start, stop) byte offsets) cached."""
        blocks = {
            i for start, stop in spans if stop > start for i in range(start // TIFF_BLOCK, (stop - 1) // TIFF_BLOCK + 1)
        }
        remote_bytes().prefetch(self.name, [self._range(i) for i in sorted(blocks)], pinned=self.validator)

    def pread(self, nbytes: int, pos: int, what: str = "") -> bytes:
        """``nbytes`` at ``pos``, from the cached blocks (thread-safe: no position, no
        ``_recent``; the strile reader's, ``_tiff_striles.decode_windows``)."""
        out = bytearray()
        end = min(pos + nbytes, self.size)
        for index in range(pos // TIFF_BLOCK, -(-end // TIFF_BLOCK)):
            start, stop = self._range(index)
            data = remote_bytes().read(self.name, f"{start}-{stop - 1}", pinned=self.validator)[0]
            if data is None:
                raise UnreadableSource(self.name, "gone from the host (HTTP 404) while being read")
            out += data[max(pos, start) - start : min(end, stop) - start]
        if len(out) != nbytes:
            raise UnreadableSource(
                self.name, f"truncated: {what} needs bytes {pos}..{pos + nbytes}, the file ends at {self.size}"
            )
        return bytes(out)

    def _block(self, index: int) -> bytes:
        data = self._recent.get(index)
        if data is None:
            start, stop = self._range(index)
            data = remote_bytes().read(self.name, f"{start}-{stop - 1}", pinned=self.validator)[0]
            if data is None:
                raise UnreadableSource(self.name, "gone from the host (HTTP 404) while being read")
            self._recent[index] = data
            while len(self._recent) > 16:
                self._recent.popitem(last=False)
        return data


class _UrlTiffHandle(TiffHandle):
    """A TIFF at a URL: the content version is its validator; staleness is found by the
    pinned reads (the object changed mid-read), not by a stat."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.file = RemoteFile(url)
        super().__init__(url, opener=self._open_remote, files=[])

    def _open_remote(self) -> Any:
        import tifffile

        if self.file.closed:
            self.file = RemoteFile(self.url)
        return tifffile.TiffFile(self.file, name=self.url.rpartition("/")[2])

    def content_version(self) -> bytes:
        return hashlib.blake2b(f"{self.url}\0{self.file.validator}".encode(), digest_size=16).digest()

    def stale_reason(self) -> str | None:
        return None


class _RemoteSeries:
    """What a remote series does differently: the strile reader reads through ``RemoteFile``
    (a URL has no path to pread), and the striles of a read are prefetched together (the
    module docstring). So a window of a page fetches and decodes only its own tiles, where
    tifffile's page read fetched and decoded the whole page (a viewer's 63-tile corner of a
    3584 × 4608 level: 27 MB fetched in 4 requests, every tile decoded)."""

    handle: Any  # the _UrlTiffHandle TiffPageSeriesAdapter holds
    series_index: int
    level: int

    def _strile_read(self, bounds: Bounds, step: tuple[int, ...]) -> np.ndarray | None:
        self._prefetch(bounds)
        return super()._strile_read(bounds, step)  # type: ignore[misc]

    def _decode_windows(self, jobs: list[Any]) -> None:
        decode_windows(jobs, pread=self.handle.file.pread)

    def _prefetch(self, bounds: Bounds) -> None:
        """The byte spans of the striles ``bounds`` touches, fetched at once; nothing when the
        series is not read strile by strile (tifffile then reads as it goes)."""
        spans = []
        with self.handle.use() as opened:
            series = opened.level_series(self.series_index, self.level)
            striles = SeriesStriles.of(opened.tf, series)
            if striles is None:
                return
            lead = len(striles.lead_shape)
            window = tuple(slice(a, b, 1) for a, b in zip(bounds.start[lead:], bounds.stop[lead:]))
            nothing = np.broadcast_to(np.empty((), striles.decoder.dtype), tuple(w.stop - w.start for w in window))
            for index in product(*(range(a, b) for a, b in zip(bounds.start[:lead], bounds.stop[:lead]))):
                page = striles.page(int(np.ravel_multi_index(index, striles.lead_shape)) if lead else 0, series)
                if page is None:
                    continue
                job = StrileWindow(page.path, striles.decoder, page.offsets, page.counts, None, window, nothing)
                spans += [(page.offsets[i], page.offsets[i] + page.counts[i]) for i in touched_striles(job)]
        self.handle.file.prefetch([(a, b) for a, b in spans if b > a])


class _UrlTiffAdapter(_RemoteSeries, TiffAdapter):
    pass


class _UrlOmeTiffAdapter(_RemoteSeries, OmeTiffAdapter):
    pass


class UrlTiffSource(SourceAdapter):
    """A single TIFF or OME-TIFF file at a URL: its series and stored levels as tensors."""

    format_name = "tiff"

    def __init__(self, url: str, source_id: str) -> None:
        handle = _UrlTiffHandle(url)
        try:
            with handle.use() as opened:
                tf = opened.tf
                check_series_extent(handle.path, tf)
                flavour = _flavour(tf)
                images = _match_images(list(opened.series), _images(tf.ome_metadata)) if tf.is_ome else None
            if images is None:
                tensors, summaries = build_series_tensors(handle, _UrlTiffAdapter)
            else:
                tensors, summaries = build_series_tensors(
                    handle,
                    _UrlOmeTiffAdapter,
                    physical=lambda tf, i, s: dict(images[i]["sizes"]) if images[i] else {},
                    tensor_metadata=lambda tf, i, s: (
                        {"ome_image": images[i]["name"], "channel_names": images[i]["channel_names"]}
                        if images[i]
                        else {}
                    ),
                )
        except BaseException:
            handle.close()
            raise
        self.handle = handle
        self._url = url
        super().__init__(
            None,
            tensors,
            source_id=source_id,
            metadata={"flavour": flavour, "series": summaries, "remote": url.partition("://")[0]},
            source_type=flavour,
        )

    @property
    def url(self) -> str:
        return self._url

    def close(self) -> None:
        super().close()
        self.handle.close()
