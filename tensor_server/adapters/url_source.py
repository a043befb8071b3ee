"""One image opened by its URL: an OME-Zarr (v2, v3, sharded v3, bioformats2raw, plates) or
an OME-TIFF / TIFF on an HTTP(S) host, read range by range.

Why no listing: a static host cannot be listed, and needs not be: an image's own metadata
names its arrays (``multiscales`` datasets, ``labels``, a plate's wells, bioformats2raw's
series), so the zarr walker of local stores (``_zarr_store.py``) runs over ``UrlPath``, which
answers "is there a ``zarr.json`` here" by fetching it. Pixels are read by zarr-python over
``url_store`` (a sharded array: the shard index by a suffix range, then the inner chunks by
range, all of a read's fetched at once before zarr asks: ``_url_shards.py``) and by tifffile
over ``RemoteFile`` (the IFDs once, then tiles by range). Every byte goes through
``_remote_bytes.py``: the host rule, the deadline, the persistent cache, coalescing; so a
second session over the same region asks the host nothing.

A source's content version is made of the validators (ETags) of what it was opened from: its
metadata documents, or the TIFF file; a TIFF rewritten on the host is refused mid-read
(pinned reads) rather than decoded against its old IFDs.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from tensor_server.adapters._remote_bytes import FETCHERS, remote_bytes
from tensor_server.adapters._url_rules import (
    RemoteSettings,
    checked_addresses,
    remote_settings,
    set_remote_settings,
    url_scheme,
)
from tensor_server.adapters._url_shards import prefetch_shards
from tensor_server.adapters._zarr_store import StoreWalker, ZarrNode, is_zarr_folder
from tensor_server.core.adapter_base import SourceAdapter
from tensor_server.core.bounds import Bounds
from tensor_server.errors import UnreadableSource

__all__ = [
    "RemoteSettings",
    "UrlPath",
    "checked_addresses",
    "is_image_url",
    "open_url_source",
    "remote_settings",
    "set_remote_settings",
    "url_scheme",
    "url_store",
]


def _read(url: str, byte_range: str = "", pinned: str | None = None) -> bytes | None:
    return remote_bytes().read(url, byte_range, pinned=pinned)[0]


# ---- zarr ----------------------------------------------------------------------------------------
class UrlPath:
    """A URL with the few ``pathlib`` methods the zarr walker uses; ``is_file`` fetches."""

    __slots__ = ("url",)

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def __truediv__(self, name: str) -> UrlPath:
        return UrlPath(f"{self.url}/{name.strip('/')}")

    @property
    def name(self) -> str:
        return self.url.rpartition("/")[2]

    def is_file(self) -> bool:
        return _read(self.url) is not None

    def is_dir(self) -> bool:
        return True  # a folder on a static host cannot be told from a missing one; read_node decides

    def iterdir(self) -> Iterator[UrlPath]:
        return iter(())  # no listing: the metadata names the children

    def read_bytes(self) -> bytes:
        data = _read(self.url)
        if data is None:
            raise FileNotFoundError(2, "not found on the host (HTTP 404)", self.url)
        return data

    def __fspath__(self) -> str:
        return self.url

    __str__ = __fspath__

    def __repr__(self) -> str:
        return f"UrlPath({self.url!r})"


def _http_range(byte_range: Any) -> str:
    """zarr's ByteRequest as HTTP's inclusive range text ("" for the whole object)."""
    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

    if byte_range is None:
        return ""
    if isinstance(byte_range, RangeByteRequest):
        return f"{byte_range.start}-{byte_range.end - 1}"
    if isinstance(byte_range, OffsetByteRequest):
        return f"{byte_range.offset}-"
    if isinstance(byte_range, SuffixByteRequest):
        return f"-{byte_range.suffix}"
    raise TypeError(f"unexpected byte range {byte_range!r}")


@functools.cache
def _url_store_class() -> type:
    """``url_store``'s class, made on first use (zarr is imported only when a zarr is read)."""
    from zarr.abc.store import Store

    class _UrlStore(Store):
        """A read-only zarr store over ``base``: ``get`` is a (cached, coalesced) range read."""

        supports_writes = False
        supports_deletes = False
        supports_partial_writes = False
        supports_listing = False

        def __init__(self, base: str) -> None:
            super().__init__(read_only=True)
            self.base = base.rstrip("/")

        def __eq__(self, other: object) -> bool:
            return isinstance(other, _UrlStore) and other.base == self.base

        def __hash__(self) -> int:
            return hash(self.base)

        async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
            loop = asyncio.get_running_loop()
            data = await loop.run_in_executor(FETCHERS, _read, f"{self.base}/{key}", _http_range(byte_range))
            return None if data is None else prototype.buffer.from_bytes(data)

        def prefetch_region(self, array: Any, bounds: Bounds) -> None:
            """Before zarr reads ``bounds`` of ``array``: its inner chunks fetched at once."""
            prefetch_shards(self.base, array, bounds)

        async def get_partial_values(self, prototype: Any, key_ranges: Iterable[tuple[str, Any]]) -> list[Any]:
            return list(await asyncio.gather(*(self.get(k, prototype, r) for k, r in key_ranges)))

        async def exists(self, key: str) -> bool:
            from zarr.core.buffer import default_buffer_prototype

            return await self.get(key, default_buffer_prototype()) is not None

        async def set(self, key: str, value: Any) -> None:
            raise PermissionError(f"{self.base}: a remote image is read-only")

        async def delete(self, key: str) -> None:
            raise PermissionError(f"{self.base}: a remote image is read-only")

        async def list(self) -> AsyncIterator[str]:
            return
            yield

        async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
            return
            yield

        async def list_dir(self, prefix: str) -> AsyncIterator[str]:
            return
            yield

    return _UrlStore


def url_store(base: str) -> Any:
    """A read-only zarr store over the URL ``base``."""
    return _url_store_class()(base)


class _UrlWalker(StoreWalker):
    """The zarr walker over a URL; versions from the metadata documents' validators."""

    def __init__(self, root: UrlPath) -> None:
        super().__init__(root, store=url_store(root.url))  # type: ignore[arg-type]

    def chunk_files(self, node: ZarrNode, array: Any) -> None:
        return None  # no files to stat: the metadata's ETags make the version

    def version_of(self, *nodes: ZarrNode, chunk_files: Any = None) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        for f in (f for n in nodes for f in n.meta_files):
            h.update(f"{f}\0{remote_bytes().read(str(f))[1]}\n".encode())
        return h.digest()


class UrlZarrSource(SourceAdapter):
    """A zarr / OME-Zarr store at a URL."""

    format_name = "zarr"

    def __init__(self, url: str, source_id: str) -> None:
        walker = _UrlWalker(UrlPath(url))
        tensors, metadata, is_ome = walker.build()
        metadata["remote"] = url.partition("://")[0]
        self._url = url.rstrip("/")
        super().__init__(
            None, tensors, source_id=source_id, metadata=metadata, source_type="ome-zarr" if is_ome else "zarr"
        )
        self.former_fields = walker.former_fields

    @property
    def url(self) -> str:
        return self._url


# ---- opening ------------------------------------------------------------------------------------
def _looks_tiff(url: str) -> bool:
    """A TIFF or the companion of a multi-file OME-TIFF, by its name (no zarr probes)."""
    return url.lower().rstrip("/").endswith((".tif", ".tiff", ".btf", ".tf8", ".svs", ".companion.ome"))


def is_image_url(url: str) -> bool:
    """Whether ``url`` names one image (a TIFF file name, or zarr metadata right there),
    rather than a prefix to list (an ``s3://`` folder of stores)."""
    return _looks_tiff(url) or is_zarr_folder(UrlPath(url))


def open_url_source(url: str, source_id: str) -> SourceAdapter:
    """The image at ``url`` (https, http, s3): a zarr store when its metadata is there, else a
    TIFF (or a multi-file OME-TIFF's companion) when its first bytes say so; otherwise an error
    naming the URL and what was found."""
    url_scheme(url)
    if not _looks_tiff(url) and is_zarr_folder(UrlPath(url)):
        return UrlZarrSource(url, source_id)
    from tensor_server.adapters._url_tiff import TIFF_BLOCK, UrlTiffSource

    head = _read(url, f"0-{TIFF_BLOCK - 1}")
    if head is None:
        raise UnreadableSource(url, "not found on the host (HTTP 404), and no zarr metadata under it")
    from tensor_server.adapters.ome_tiff import is_set_xml
    from tensor_server.adapters.tiff import is_tiff_head

    if is_tiff_head(head) or is_set_xml(url.rpartition("/")[2], head):
        return UrlTiffSource(url, source_id)
    raise UnreadableSource(url, "neither zarr metadata (zarr.json, .zgroup, .zarray) nor a TIFF file or OME companion")
