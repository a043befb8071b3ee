"""One zarr array served as a tensor (``ZarrAdapter``: an OME-Zarr level, a label level or a
plain array) and the stamps of its chunk files (``ChunkFileStamps``) that tell a chunk
rewritten in place.

Shared by every zarr source, not one format's: local stores and OME-Zarr (``zarr.py``, whose
walker ``_zarr_store.py`` builds these tensors), object stores (``zarr_remote.py``) and the
upload subsystem's zarr members (imported through ``zarr.py``). It used to live inside zarr.py.

An array's metadata document is read as JSON when the source opens (``StoredArray``); the
zarr-python 3 array is built from it when a read first needs it, and reused. The pixels of a
local store are read by the server's own chunk reader (``_zarr_chunks``: pread and numcodecs
on every core); zarr-python reads the rest, its sync API submitting every read to its own
event loop, so concurrent reads from server threads are safe without a lock either way. There
is no file handle to reap: each chunk (or shard) file is opened and closed per read.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.adapters._store_listing import ABSENT, file_stamp_of, stored_files
from tensor_server.adapters._verified_extents import VerifiedExtents
from tensor_server.adapters._zarr_chunks import LocalChunks, ShardIndexes
from tensor_server.adapters._zarr_growth import ArrayGrowth, Grew
from tensor_server.core.adapter_base import TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.core.identity import file_stat_stamp
from tensor_server.core.uniform import UniformBlock, grid_uniform_blocks
from tensor_server.errors import UnreadableSource

__all__ = ["ChunkFileStamps", "StoredArray", "ZarrAdapter"]

#: arrays with at most this many storage chunks have every chunk file stat'ed at open
_EAGER_CHUNKS = 1 << 16
#: held while a part made on first use is made (a zarr array from its document, a chunk
#: reader, a stamps record): each takes microseconds, once per array, so one lock serves all
#: (a lock of each array's own was 3 more objects for each of a plate's 55,000 arrays)
_MADE_ON_FIRST_USE = threading.RLock()
#: held while a growing array's metadata is looked at (``ZarrAdapter.refresh_extent``): a stat,
#: a parse when it changed; one lock for all arrays, for the same reason as the one above
_LOOKING = threading.Lock()


# ---- an array's metadata, the zarr array made from it on first need ---------------------------
#: zarr v3 ``data_type`` names read as numpy dtypes without zarr (any other: zarr reads the document)
_V3_NUMERIC = re.compile(r"bool|u?int(8|16|32|64)|float(16|32|64)|complex(64|128)")


class StoredArray:
    """One zarr array as its metadata document describes it (``shape``, ``dtype``, ``chunks``,
    ``shards``, ``dimension_names``, read as plain JSON), the zarr-python array built from the
    same document the first time something needs it (``array``: a read, a chunk file's key).

    Why: ``zarr.open_array`` cost ~0.8 ms an array (most of it the round trip to zarr's event
    loop), and a plate opens every level of every field: a 1536-well plate of 9 fields with
    4 levels is 55,000 arrays, half of its 100 s open. Built from the document already read
    (``ArrayV2Metadata``/``ArrayV3Metadata.from_dict``, no I/O) an array costs ~80 us, paid
    only for the arrays a read touches (measured 2026-12-05, 2 shared cores; docs/performance.md
    "Plates"). A document this reading does not know (an extension data type, an irregular
    chunk grid) is handed to zarr at once, which either reads it or reports it.
    """

    __slots__ = (
        *("store", "path", "zarr_format", "shape", "dtype", "chunks", "shards", "dimension_names"),
        *("_document", "_raw", "_array"),
    )

    def __init__(
        self, store: Any, path: str, zarr_format: int, raw: bytes | None, document: Any = "", array: Any = None
    ) -> None:
        """``raw``: the array's metadata document (``.zarray`` or ``zarr.json``), kept to build
        the zarr array from; ``document``: its file, named by an error (default: ``path``)."""
        self.store, self.path, self.zarr_format = store, path, zarr_format
        self._document = document or path
        self._raw, self._array = raw, array
        self.shards: tuple[int, ...] | None = None
        self.dimension_names: tuple[Any, ...] | None = None
        if array is None:
            try:
                self._geometry(json.loads(raw or b"{}"))
                return
            except (KeyError, TypeError, ValueError):
                array = self.array  # a document this reading does not know: zarr's say
        self.shape = tuple(int(n) for n in array.shape)
        self.dtype = np.dtype(array.dtype)
        self.chunks = tuple(int(c) for c in array.chunks)
        shards = getattr(array, "shards", None)
        self.shards = None if shards is None else tuple(int(s) for s in shards)
        names = getattr(array.metadata, "dimension_names", None)
        self.dimension_names = None if names is None else tuple(names)

    @classmethod
    def of_array(cls, array: Any) -> StoredArray:
        """An array zarr-python already opened (an upload member's, writable)."""
        return cls(array.store, str(array.path), int(array.metadata.zarr_format), None, array=array)

    def _geometry(self, doc: dict[str, Any]) -> None:
        self.shape = tuple(int(n) for n in doc["shape"])
        if self.zarr_format == 2:
            if not isinstance(doc["dtype"], str):
                raise TypeError("a structured dtype")
            self.dtype = np.dtype(doc["dtype"])
            self.chunks = tuple(int(c) for c in doc["chunks"])
            return
        if not isinstance(doc["data_type"], str) or not _V3_NUMERIC.fullmatch(doc["data_type"]):
            raise ValueError(f"data type {doc['data_type']!r}")
        grid = doc["chunk_grid"]
        if grid["name"] != "regular":
            raise ValueError(f"chunk grid {grid['name']!r}")
        self.dtype = np.dtype(doc["data_type"])
        self.chunks = tuple(int(c) for c in grid["configuration"]["chunk_shape"])
        codecs = doc.get("codecs") or []
        if codecs and isinstance(codecs[0], dict) and codecs[0].get("name") == "sharding_indexed":
            self.shards = self.chunks
            self.chunks = tuple(int(c) for c in codecs[0]["configuration"]["chunk_shape"])
        names = doc.get("dimension_names")
        self.dimension_names = None if names is None else tuple(names)

    @property
    def array(self) -> Any:
        """The zarr-python array, built from the document on first use (class docstring)."""
        array = self._array
        if array is None:
            with _MADE_ON_FIRST_USE:
                if self._array is None:
                    self._array = self._build()
                array = self._array
        return array

    def _build(self) -> Any:
        from zarr.core.array import Array, AsyncArray
        from zarr.core.metadata import ArrayV2Metadata, ArrayV3Metadata
        from zarr.storage import StorePath

        try:
            doc = json.loads(self._raw or b"{}")
            if self.zarr_format == 2:
                metadata: Any = ArrayV2Metadata.from_dict({**doc, "attributes": {}})
            else:
                metadata = ArrayV3Metadata.from_dict(doc)
        except Exception as exc:  # zarr's own reading of a document it refuses, any error
            raise UnreadableSource(self._document, f"zarr array metadata: {type(exc).__name__}: {exc}") from exc
        return Array(AsyncArray(metadata=metadata, store_path=StorePath(self.store, self.path)))

    @property
    def metadata(self) -> Any:
        return self.array.metadata


# ---- chunk files -------------------------------------------------------------------------------
class ChunkFileStamps:
    """The stored chunk files (shard files, when sharded) of one array and their stamps
    (``file_stat_stamp``: size, mtime_ns, ctime_ns, inode; ABSENT where no file exists), per
    cell of the storage grid.

    Why: a chunk rewritten in place leaves the metadata untouched, so only these stats tell
    that the bytes changed. ``changed`` compares the files under a region with their stamps
    before a chunk is served. Arrays of up to _EAGER_CHUNKS cells are stat'ed whole at open
    and the stamps feed the content version, so after a restart a persistent cache never
    serves chunks rewritten while the server was down (the absent cells are also what a
    reader needs to skip chunks never written). Larger arrays would take too long to open
    that way: a cell is stamped the first time a chunk over it is served, which still keeps
    a running server from serving old bytes, but their version covers the metadata only.
    An extent verified recently is not stat'ed file by file again while its folders are
    unchanged (``verified``; ``_verified_extents`` states the bound on in-place rewrites).

    The eager stamps come from one listing of the folder, kept as ``listed``: the same
    listing tells the adapter's uniform blocks which chunks are stored, so the two never
    disagree and the folder is walked once at open."""

    __slots__ = ("folder", "_array", "grid", "eager", "_stamps", "_verified", "listed", "_encoder", "_prefix", "live")

    def __init__(self, folder: Path, array: StoredArray, at_open: bool = True) -> None:
        """``at_open`` False: stamp every cell when first served, whatever the array's size (a
        plate's fields: ``_zarr_store.StoreWalker.add_plate`` says why); nothing is then made
        before a first check but this record (a plate holds 55,000 of them, and every object
        they made at open was more for the garbage collector to walk)."""
        self.folder = folder
        self._array = array
        grid = array.shards or array.chunks
        self.grid = tuple(max(int(g), 1) for g in grid)  # a 0-size chunk (empty array): no cells
        counts = tuple(-(-int(n) // g) for n, g in zip(array.shape, self.grid))
        self.eager = at_open and math.prod(counts) <= _EAGER_CHUNKS
        self._stamps: dict[tuple[int, ...], tuple[int, ...]] | None = None
        self._verified: VerifiedExtents | None = None
        self._encoder: Callable[[tuple[int, ...]], str] | None = None
        self._prefix = ""
        #: (axis, cell): the live edge of a growing array, cells from ``cell`` on along ``axis``,
        #: whose files its writer still rewrites; they are stamped anew, never "changed"
        #: (their chunks are never cached: ``ZarrAdapter.settled``)
        self.live: tuple[int, int] | None = None
        #: the store keys of the files under the folder at open (eager arrays), else None
        self.listed: frozenset[str] | None = None
        if self.eager:
            entries = stored_files(folder)
            self.listed = frozenset(entries)
            self._stamps = {
                cell: file_stamp_of(entries.get(self._encode(cell)))
                for cell in itertools.product(*(range(c) for c in counts))
            }

    def _encode(self, cell: tuple[int, ...]) -> str:
        """A cell's chunk key: zarr's (its array is built on first need, ``StoredArray``)."""
        if self._encoder is None:
            self._encoder = self._array.metadata.encode_chunk_key
        return self._encoder(cell)

    @property
    def verified(self) -> VerifiedExtents:
        """The extents verified recently (made by the first check)."""
        if self._verified is None:
            with _MADE_ON_FIRST_USE:
                if self._verified is None:
                    self._verified = VerifiedExtents(self.folder)
        return self._verified

    def _stat(self, key: str) -> tuple[int, ...]:
        if not self._prefix:
            self._prefix = os.path.join(self.folder, "")
        try:
            st = os.stat(self._prefix + key)  # not os.path.join of a Path: 2 of its 3.5 us a file
        except FileNotFoundError:
            return ABSENT
        return file_stat_stamp(st)

    def digest(self) -> bytes:
        stamps = np.array(list((self._stamps or {}).values()) if self.eager else [], np.int64)
        return hashlib.blake2b(stamps.tobytes() if self.eager else b"lazy", digest_size=16).digest()

    def changed(self, bounds: Bounds, exact: bool = False) -> str | None:
        """The first chunk file under ``bounds`` whose stamp differs from the one recorded;
        unless ``exact``, not asked again of an extent verified recently whose folders are
        unchanged (``_verified_extents``: what that saves, and the staleness bound it costs)."""
        extent = (bounds.start, bounds.stop)
        if not exact and self.verified.fresh(extent):
            return None
        ranges = [range(a // g, -(-b // g)) for a, b, g in zip(bounds.start, bounds.stop, self.grid)]
        cells = list(itertools.product(*ranges))
        keys = [self._encode(cell) for cell in cells]
        verification = self.verified.begin(keys)
        if self._stamps is None:
            with _MADE_ON_FIRST_USE:
                if self._stamps is None:
                    self._stamps = {}
        live = self.live
        for cell, key in zip(cells, keys):
            now = self._stat(key)
            if live is not None and cell[live[0]] >= live[1]:
                self._stamps[cell] = now
            elif self._stamps.setdefault(cell, now) != now:
                return f"chunk file {key!r} changed since the store was opened"
        self.verified.verified(extent, verification)
        return None

    def grew(self, axis: int, before: int, after: int) -> None:
        """The array grew along ``axis`` from ``before`` to ``after`` elements: the cells from
        the one that held the newest frame on are stamped anew when next read (the writer
        filled them since), and the live edge moves to the cell of the newest frame now."""
        g = self.grid[axis]
        first = max(before - 1, 0) // g
        stamps = self._stamps or {}
        for cell in [c for c in list(stamps) if c[axis] >= first]:
            stamps.pop(cell, None)
        self.live = (axis, (after - 1) // g)


# ---- the tensor ------------------------------------------------------------------------------
class ZarrAdapter(TensorAdapter):
    """One zarr array (an OME-Zarr level, a label level or a plain array).

    The read block is the store chunk: a chunk is the unit of compression, so a whole chunk
    is decoded to return any part of it. In a sharded v3 array it is the shard's *inner*
    chunk (``array.chunks``; ``array.shards`` is the shard): only the inner chunks a
    selection touches are read, located by the shard's index. The same chunk seeds the
    transfer grid.

    Pixels of a local store are read and decoded by the server itself (``_zarr_chunks``: raw
    chunk bytes, numcodecs, every core, each chunk straight into the output where it fits);
    nearest is then a decimated read, each chunk strided into the output as it is decoded.
    zarr-python reads the rest (object stores, codecs the server does not decode, chunks
    never written) and those reads offer no decimated read.

    Uniform blocks: a chunk whose key is absent from the store reads as the fill value (zarr
    does not write chunks equal to it); in a sharded array an inner chunk whose shard is
    absent, or whose shard-index slot is empty (offset and length 2^64-1), does too. One
    listing per array (``stored_files``): the one the chunk-file stamps were taken from at
    open (arrays stamped eagerly), else made on first use; again when the content version
    changes; shard indexes are read once each, when a read first touches the shard.
    """

    @property
    def reports_uniform_blocks(self) -> bool:  # type: ignore[override]
        """Absent chunk keys are found by listing the array's folder on disk; a store that is
        not a local folder (an object store, adapters/zarr_remote.py) has no such listing
        here, and guessing would serve the fill value for stored chunks."""
        return isinstance(self.store_path, Path)

    def __init__(
        self,
        array: Any,
        *,
        store_path: Path,
        zarr_path: str,
        dim_labels: Sequence[str] | None,
        physical_scale: Sequence[float | None] | None,
        physical_unit: Sequence[str | None] | None,
        is_labels: bool,
        content_version: bytes,
        chunk_files: ChunkFileStamps | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        #: the array as its metadata describes it; zarr-python's array made on first need
        self._stored = array if isinstance(array, StoredArray) else StoredArray.of_array(array)
        stored = self._stored
        self._chunk_files = chunk_files
        self.store_path = store_path
        self.zarr_path = zarr_path
        meta = {
            "zarr_path": zarr_path,
            "zarr_format": stored.zarr_format,
            "chunks": list(stored.chunks),
            "shards": None if stored.shards is None else list(stored.shards),
        }
        meta.update(metadata or {})
        self._listing: tuple[tuple[bytes, int], frozenset[str]] | None = None
        #: the chunk files' listing made at open, used by the first _stored_keys while the
        #: content version is still the one it was made under
        listed = None if chunk_files is None else chunk_files.listed
        self._listed_at_open = None if listed is None else ((content_version, 0), listed)
        self._local = isinstance(store_path, Path) and type(stored.store).__name__ == "LocalStore"
        #: (shard indexes, the server's own chunk reader), made by the first read (``_readers``)
        self._made_readers: tuple[ShardIndexes | None, LocalChunks | None] | None = None
        self._fill: np.generic | None = None
        self._lock = threading.Lock()
        #: what the metadata says of growth (a local array whose chunk files are tracked),
        #: made by the first look (``refresh_extent``): an open makes nothing more per array
        self._growth: ArrayGrowth | None = None
        super().__init__(
            TensorInfo(
                stored.shape,
                stored.dtype,
                dim_labels=dim_labels,
                native_chunk_shape=stored.chunks,
                physical_scale=physical_scale,
                physical_unit=physical_unit,
                is_labels=is_labels,
                content_version=content_version,
                metadata=meta,
            )
        )

    @property
    def _array(self) -> Any:
        """The zarr-python array (built on first need: ``StoredArray``)."""
        return self._stored.array

    def _readers(self) -> tuple[ShardIndexes | None, LocalChunks | None]:
        """The shard indexes (a sharded local array) and the server's own chunk reader (None
        where zarr-python reads), made when a read first needs them: they need zarr's parsed
        codecs, which an open does not build (``StoredArray``)."""
        made = self._made_readers
        if made is None:
            with _MADE_ON_FIRST_USE:
                if self._made_readers is None:
                    indexes = chunks = None
                    if self._local:
                        folder = self.store_path / self.zarr_path if self.zarr_path else self.store_path
                        if self._stored.shards is not None:
                            indexes = ShardIndexes(self._array, folder)
                        chunks = LocalChunks.of(self._array, folder, indexes)
                    self._made_readers = (indexes, chunks)
                made = self._made_readers
        return made

    @property
    def _indexes(self) -> ShardIndexes | None:
        return self._readers()[0]

    @property
    def _chunks(self) -> LocalChunks | None:
        return self._readers()[1]

    def stale_reason(self, bounds: Bounds, exact: bool = False) -> str | None:
        """A chunk file changed: first whether the array grew (its writer resized it and then
        wrote the frames, so the files under a read change before the next look), and only a
        change growth does not explain is a reason."""
        if self._chunk_files is None:  # an upload member, whose writes are its lifecycle's business
            return None
        why = self._chunk_files.changed(bounds, exact)
        if why is not None and self._local:
            before = self.extents.sequence
            other = self.refresh_extent()
            if other is not None:
                return other
            if self.extents.sequence != before:
                why = self._chunk_files.changed(bounds, exact)
        return None if why is None else f"zarr array {self.zarr_path or '/'!r}: {why}"

    # ---- growth (``_zarr_growth``) -------------------------------------------------------------
    def refresh_extent(self) -> str | None:
        """The array and its stored levels grown in place when their metadata says so (the
        levels first: a level covers frames that level 0 already has)."""
        for level in self.native_levels:
            why = level.tensor.refresh_extent()
            if why is not None:
                return why
        if self._chunk_files is None or not self._local:
            return None
        growth = self._growth
        if growth is not None and growth.unchanged():
            return None
        with _LOOKING:  # one look at a time: two would publish one growth twice
            if self._growth is None:
                self._growth = ArrayGrowth(self.growth_paths()[0], self._stored, self._chunk_files.grid)
            seen = self._growth.look(self.shape)
            if isinstance(seen, str):
                return f"zarr array {self.zarr_path or '/'!r}: {seen}"
            if seen is not None:
                self._grow(seen)
        return None

    def growth_paths(self) -> tuple[Path, ...]:
        """The array's folder and its stored levels' (where a writer resizes and writes)."""
        if self._chunk_files is None or not self._local:
            return ()
        own = self.store_path / self.zarr_path if self.zarr_path else self.store_path
        return (own, *(p for level in self.native_levels for p in level.tensor.growth_paths()))

    def _grow(self, seen: Grew) -> None:
        """Read the array at its new extent: its metadata as the look found it (the source is
        not reopened), the chunk readers made again over it, the live edge moved."""
        with self._lock:
            before = self.shape[seen.axis]
            self._stored = seen.array
            self._made_readers = None
            assert self._chunk_files is not None  # growth is looked for only with chunk files
            self._chunk_files.grew(seen.axis, before, seen.shape[seen.axis])
            self.grow_to(seen.shape)

    def settled(self, bounds: Bounds) -> bool:
        """Not where ``bounds`` reach the cell of the newest frame of a growing array."""
        live = None if self._chunk_files is None else self._chunk_files.live
        if live is None:
            return True
        axis, cell = live
        return bounds.stop[axis] <= cell * self._chunk_files.grid[axis]

    def read_region(self, bounds: Bounds) -> np.ndarray:
        if self._chunks is not None:
            return self._read(bounds, (1,) * bounds.ndim)
        try:
            ahead = getattr(self._stored.store, "prefetch_region", None)
            if ahead is not None:  # a store at a URL fetches the read's inner chunks at once (_url_shards.py)
                ahead(self._array, bounds)
            return np.asarray(self._array[bounds.to_slices()])
        except UnreadableSource:  # a remote store's own errors (a timeout) name the URL: as they are
            raise
        except Exception as exc:  # a corrupt or truncated chunk surfaces only here
            raise UnreadableSource(
                self.store_path, f"zarr array {self.zarr_path or '/'!r}, region {bounds}: {type(exc).__name__}: {exc}"
            ) from exc

    @property
    def decimates(self) -> bool:  # type: ignore[override]
        """Nearest is a strided read when the server decodes the chunks itself: each chunk is
        strided into the output as it is decoded, with no full-resolution buffer."""
        return self._chunks is not None

    def get_decimated_data(self, bounds: Bounds, step: Sequence[int]) -> np.ndarray | None:
        if self._chunks is None:
            return None
        bounds = self.check_bounds(bounds)
        return self._read(bounds, tuple(int(s) for s in step))

    @property
    def reads_into(self) -> bool:  # type: ignore[override]
        return self._chunks is not None

    def read_region_into(self, bounds: Bounds, out: np.ndarray) -> None:
        """A streamed reduction's unit: its chunks decoded on this thread (the reduction keeps
        the other cores busy with the next units)."""
        if self._chunks is None:
            out[...] = self.read_region(bounds)
        else:
            self._read(bounds, (1,) * bounds.ndim, out, parallel=False)

    def _read(
        self, bounds: Bounds, step: tuple[int, ...], out: np.ndarray | None = None, parallel: bool = True
    ) -> np.ndarray:
        """``array[bounds][::step]`` through the server's own decoder (``_zarr_chunks``), a
        chunk that is not stored through zarr (its fill value)."""
        try:
            return self._chunks.read(bounds, step, lambda sl: np.asarray(self._array[sl]), out, parallel)
        except UnreadableSource:  # a remote store's own errors (a timeout) name the URL: as they are
            raise
        except Exception as exc:  # a corrupt or truncated chunk surfaces only here
            raise UnreadableSource(
                self.store_path, f"zarr array {self.zarr_path or '/'!r}, region {bounds}: {type(exc).__name__}: {exc}"
            ) from exc

    # ---- uniform blocks (class docstring) ------------------------------------------------------
    def uniform_blocks(self, bounds: Bounds) -> list[UniformBlock]:
        if not self.reports_uniform_blocks:
            return []
        keys = self._stored_keys()
        if self._fill is None:
            return []
        meta = self._array.metadata
        chunks = self.native_chunk_shape
        shards = self.metadata.get("shards")
        if shards is None:

            def value_at(idx: tuple[int, ...]) -> np.generic | None:
                return None if meta.encode_chunk_key(idx) in keys else self._fill
        else:
            per_shard = tuple(s // c for s, c in zip(shards, chunks))

            def value_at(idx: tuple[int, ...]) -> np.generic | None:
                shard = tuple(i // p for i, p in zip(idx, per_shard))
                if meta.encode_chunk_key(shard) not in keys:
                    return self._fill
                index = self._shard_index(shard, per_shard)
                if index is None:
                    return None
                slot = np.ravel_multi_index(tuple(i % p for i, p in zip(idx, per_shard)), per_shard)
                return self._fill if index[slot, 0] == _EMPTY_SLOT and index[slot, 1] == _EMPTY_SLOT else None

        return grid_uniform_blocks(bounds, chunks, self.shape, value_at)

    def _stored_keys(self) -> frozenset[str]:
        """The array's stored chunk (or shard) keys, listed once per content version and
        extent (a grown array has new chunks); the first time, also the value zarr returns
        for an absent chunk (read from one)."""
        version = (self.content_version, self.extents.sequence)
        listing = self._listing
        if listing is not None and listing[0] == version:
            return listing[1]
        with self._lock:
            at_open, self._listed_at_open = self._listed_at_open, None
            if at_open is not None and at_open[0] == version:
                keys = at_open[1]
            else:
                keys = frozenset(stored_files(self.store_path / self.zarr_path if self.zarr_path else self.store_path))
            if self._indexes is not None:
                self._indexes.clear()
            self._fill = self._absent_value(keys)
            self._listing = (version, keys)
        return keys

    def _absent_value(self, keys: frozenset[str]) -> np.generic | None:
        """What zarr reads where no chunk is stored: its own answer for one absent chunk (for
        a v2 ``fill_value: null`` too), or the declared fill value when every chunk exists."""
        grid = self.metadata.get("shards") or self.native_chunk_shape
        nblocks = [-(-n // c) for n, c in zip(self.shape, grid)]
        meta = self._array.metadata
        # among len(keys) + 1 chunks at least one is absent, if the array has that many
        for idx in itertools.islice(np.ndindex(*nblocks), len(keys) + 1):
            if meta.encode_chunk_key(idx) not in keys:
                origin = tuple(i * c for i, c in zip(idx, grid))
                return np.asarray(self._array[origin]).astype(self.dtype)[()]
        return None

    def _shard_index(self, shard: tuple[int, ...], per_shard: tuple[int, ...]) -> np.ndarray | None:
        """(n, 2) uint64 offsets and lengths of a stored shard's inner chunks, or None when
        the index encoding is not the default (little-endian bytes, optional crc32c)."""
        return None if self._indexes is None else self._indexes.get(shard)


_EMPTY_SLOT = np.uint64(2**64 - 1)
