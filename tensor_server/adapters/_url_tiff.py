"""A TIFF or OME-TIFF at a URL (``url_source.py`` opens it): tifffile over ``RemoteFile``.

tifffile parses the IFDs through ``RemoteFile`` (aligned ``TIFF_BLOCK`` ranges, the last few
kept in memory: it reads an IFD a few bytes at a time). Compressed tiles and strips are read
by the server's strile reader (``_tiff_striles.py``, as for a local file) through
``RemoteFile.pread``: a window fetches and decodes only the striles it touches. Left alone, a
cold read would be one round trip per strile; so before a read, the adapter names the striles
it will touch and ``RemoteBytes.prefetch`` fetches their blocks at once, adjacent blocks merged
into one request; the reads then hit the cache. What the strile reader does not read (pages
stored raw, volumetric tiles) tifffile reads through its own zarr store, block by block.

A multi-file OME-TIFF (several files of one image, their OME-XML naming each by UUID and
FileName; or a companion ``.companion.ome`` / ``BinaryOnly`` metadata file) opens as the local
one does (``ome_tiff.resolve_ome_set``, tifffile assembling the series), its other files read
by URL beside the one given, each a ``RemoteFile`` under the same rules (host, redirects,
pinned versions). tifffile opens a set's other files by path only (and not at all from a file
object), so it is handed them already open: ``_SetTiffFile`` seeds the table of open files
(by UUID) its OME series reader consults before it would open one.
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import os
import posixpath
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import product
from typing import Any
from urllib.parse import quote, unquote

import numpy as np

from tensor_server.adapters._remote_bytes import FETCHERS, remote_bytes
from tensor_server.adapters._tiff_series import TiffHandle
from tensor_server.adapters._tiff_striles import Pread, SeriesStriles, StrileWindow, decode_windows, touched_striles
from tensor_server.adapters.ome_tiff import (
    MAX_XML_BYTES,
    OmeTiffAdapter,
    _images,
    _match_images,
    binary_only_metadata_file,
    set_file_names,
)
from tensor_server.adapters.tiff import TiffAdapter, _flavour, build_series_tensors, check_series_extent, is_tiff_head
from tensor_server.core.adapter_base import SourceAdapter
from tensor_server.core.bounds import Bounds
from tensor_server.errors import UnreadableSource

__all__ = ["TIFF_BLOCK", "RemoteFile", "UrlTiffSource", "resolve_url_set"]

log = logging.getLogger(__name__)

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
        """Block ``index``'s range as asked: whole even past the end (the host answers what
        there is), so it is the very range, and cache key, the constructor's first read was:
        a file under one block costs one request, not two."""
        return index * TIFF_BLOCK, (index + 1) * TIFF_BLOCK

    def blocks(self, spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """The (start, stop) byte ranges of the aligned blocks under ``spans``."""
        blocks = {
            i for start, stop in spans if stop > start for i in range(start // TIFF_BLOCK, (stop - 1) // TIFF_BLOCK + 1)
        }
        return [self._range(i) for i in sorted(blocks)]

    def prefetch(self, spans: Iterable[tuple[int, int]]) -> None:
        """Have the blocks under ``spans`` ((start, stop) byte offsets) cached."""
        remote_bytes().prefetch(self.name, self.blocks(spans), pinned=self.validator)

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


# ---- multi-file sets -----------------------------------------------------------------------------
def sibling_url(url: str, name: str) -> str:
    """The URL of ``name`` (a FileName or MetadataFile of ``url``'s OME-XML) beside ``url``. A
    set's files lie in its folder or below, so a name that would leave it (a scheme, an
    absolute path, ``..``) is refused rather than fetched: the host rule is the URL's."""
    clean = posixpath.normpath(unquote(name).replace("\\", "/"))
    if "://" in name or clean.startswith(("/", "..")) or clean == ".":
        raise UnreadableSource(url, f"its OME-XML names {name!r}: a file of the set must be a relative name beside it")
    return f"{url.rpartition('/')[0]}/{quote(clean)}"


def _xml_at(url: str) -> tuple[str, str]:
    """(text, validator) of the OME-XML document at ``url``, bounded as the local one is."""
    size = remote_bytes().size(url)
    if size is not None and size > MAX_XML_BYTES:
        raise UnreadableSource(url, f"OME metadata file is {size} bytes; refusing to parse more than {MAX_XML_BYTES}")
    data, validator = remote_bytes().read(url)
    if data is None:
        raise UnreadableSource(url, "not found on the host (HTTP 404)")
    return data.decode("utf-8", errors="replace"), validator


def _exists(url: str) -> bool:
    """Whether the host has ``url`` (its first block read, as ``RemoteFile`` reads it)."""
    return remote_bytes().read(url, f"0-{TIFF_BLOCK - 1}")[0] is not None


@dataclass(frozen=True)
class UrlSet:
    """What ``resolve_url_set`` found: the TIFF tifffile opens, the external OME-XML handed to
    it (None: the TIFF's own) and the metadata file it came from, with its validator."""

    root: str
    omexml: str | None = None
    metadata: str | None = None
    metadata_validator: str = ""


def resolve_url_set(url: str) -> UrlSet:
    """``ome_tiff.resolve_ome_set`` for a URL: ``url`` may be any TIFF of a set, the XML
    companion, or a single TIFF (then it is its own root)."""
    import tifffile

    head = remote_bytes().read(url, f"0-{TIFF_BLOCK - 1}")[0] or b""
    if not is_tiff_head(head):  # the companion (or another OME-XML naming TIFFs)
        xml, validator = _xml_at(url)
        names = list(dict.fromkeys(set_file_names(xml, url).values()))
        if not names:
            raise UnreadableSource(url, "OME-XML names no TIFF file (no TiffData/UUID FileName)")
        root = next((u for u in (sibling_url(url, n) for n in names) if _exists(u)), None)
        if root is None:
            raise UnreadableSource(url, f"none of the TIFF files it names is on the host (first: {names[0]!r})")
        return UrlSet(root, xml, url, validator)
    with tifffile.TiffFile(RemoteFile(url), name=url.rpartition("/")[2], _multifile=False) as tf:
        description = tf.pages.first.description
    metadata_file = binary_only_metadata_file(description)
    if metadata_file is None:
        return UrlSet(url)
    target = sibling_url(url, metadata_file)
    data, validator = remote_bytes().read(target, f"0-{TIFF_BLOCK - 1}")
    if data is None:
        log.warning("%s: BinaryOnly metadata file %s is missing; opening this file alone", url, target)
        return UrlSet(url)
    if is_tiff_head(data):  # the master OME-TIFF holds the full XML
        return UrlSet(target, None, target, validator)
    xml, validator = _xml_at(target)
    return UrlSet(url, xml, target, validator)


@functools.cache
def _set_tiff_file() -> type:
    """``_SetTiffFile``, made on first use (tifffile is imported only when a TIFF is read)."""
    import tifffile

    class _SetTiffFile(tifffile.TiffFile):
        """A TiffFile whose OME series reader finds the set's other files open already:
        tifffile keeps them in ``_files`` (UUID -> TiffFile), which the reader resets to
        ``{root UUID: self}`` and then opens by path what it lacks; ``siblings`` are merged in
        at that reset, so it opens nothing."""

        siblings: dict[str, Any] = {}

        @property
        def _files(self) -> dict[Any, Any]:
            return self.__dict__["_set_files"]

        @_files.setter
        def _files(self, value: dict[Any, Any]) -> None:
            self.__dict__["_set_files"] = {**self.siblings, **value}

    return _SetTiffFile


def _member(url: str) -> RemoteFile | None:
    """The set's file at ``url``, or None when the host has none (404); other faults raise."""
    return RemoteFile(url) if _exists(url) else None


def _open_members(tf: Any, root: str) -> dict[str, tuple[Any, RemoteFile | None]]:
    """UUID -> (TiffFile, RemoteFile) of each other file ``tf``'s OME-XML names, opened by URL
    beside ``root`` (their first blocks fetched at once), set up as tifffile's own reader sets
    up the files it opens; ``tf`` itself for a name that is the root's. A file the host does
    not have is left out: tifffile then reads its planes as zeros, with a warning, as it does
    for a local set with a file missing."""
    import tifffile

    named = {uuid: sibling_url(root, name) for uuid, name in set_file_names(tf.ome_metadata or "", root).items()}
    others = sorted({u for u in named.values() if u != root})
    files = dict(zip(others, FETCHERS.map(_member, others)))
    folder = len(root.rpartition("/")[0]) + 1
    opened: dict[str, tuple[Any, RemoteFile | None]] = {root: (tf, None)}
    for url, file in files.items():
        if file is None:
            log.warning("%s: the set's file %s is not on the host; its planes read as zeros", root, url)
            continue
        member = tifffile.TiffFile(file, name=url[folder:], _root=tf)
        member.pages.cache = member.pages.useframes = True
        member.pages.set_keyframe(0)
        opened[url] = (member, file)
    return {uuid: opened[url] for uuid, url in named.items() if url in opened}


class _UrlTiffHandle(TiffHandle):
    """A TIFF (or a multi-file OME-TIFF set) at a URL: the content version is its files'
    validators; staleness is found by the pinned reads (an object changed mid-read), not by a
    stat. ``members``: each file's ``RemoteFile`` by the path its pages name (``pread_of``)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.set = resolve_url_set(url)
        self.members: dict[str, RemoteFile] = {}
        super().__init__(url, opener=self._open_remote, files=[])

    def _open_remote(self) -> Any:
        root = self.set.root
        file = RemoteFile(root)
        tf = _set_tiff_file()(file, name=root.rpartition("/")[2], omexml=self.set.omexml)
        try:
            members = _open_members(tf, root) if tf.is_ome else {}
        except BaseException:
            tf.close()
            raise
        tf.siblings = {uuid: member for uuid, (member, _) in members.items()}
        self.members = {os.path.realpath(tf.filehandle.path): file}
        self.members.update((os.path.realpath(m.filehandle.path), f) for m, f in members.values() if f is not None)
        return tf

    def pread_of(self, path: str) -> Pread:
        """The ``pread`` of the member file at ``path`` (a page's ``PageStriles.path``)."""
        return self.members[path].pread

    def content_version(self) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{self.url}\0{self.set.metadata}\0{self.set.metadata_validator}\n".encode())
        for file in sorted(self.members.values(), key=lambda f: f.name):
            h.update(f"{file.name}\0{file.validator}\n".encode())
        return h.digest()

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
        decode_windows(jobs, pread_of=self.handle.pread_of)

    def _prefetch(self, bounds: Bounds) -> None:
        """The byte spans of the striles ``bounds`` touches, fetched at once (of every file of a
        set); nothing when the series is not read strile by strile (tifffile then reads as it
        goes)."""
        spans: dict[str, list[tuple[int, int]]] = {}
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
                spans.setdefault(page.path, []).extend(
                    (page.offsets[i], page.offsets[i] + page.counts[i]) for i in touched_striles(job)
                )
        files = [(self.handle.members[path], found) for path, found in spans.items()]
        remote_bytes().prefetch_all([(f.name, f.blocks(found), f.validator) for f, found in files])


class _UrlTiffAdapter(_RemoteSeries, TiffAdapter):
    pass


class _UrlOmeTiffAdapter(_RemoteSeries, OmeTiffAdapter):
    pass


class UrlTiffSource(SourceAdapter):
    """A TIFF or OME-TIFF file, or a multi-file OME-TIFF set (any of its files, or its
    companion), at a URL: its series and stored levels as tensors."""

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
            metadata={
                "flavour": flavour,
                "series": summaries,
                "remote": url.partition("://")[0],
                "files": sorted(f.name for f in handle.members.values()),
                "companion": handle.set.metadata,
            },
            source_type=flavour,
        )

    @property
    def url(self) -> str:
        return self._url

    def close(self) -> None:
        super().close()
        self.handle.close()
