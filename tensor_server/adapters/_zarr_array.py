"""One zarr array served as a tensor (``ZarrAdapter``: an OME-Zarr level, a label level or a
plain array) and the stamps of its chunk files (``ChunkFileStamps``) that tell a chunk
rewritten in place.

Shared by every zarr source, not one format's: local stores and OME-Zarr (``zarr.py``, whose
walker ``_zarr_store.py`` builds these tensors), object stores (``zarr_remote.py``) and the
upload subsystem's zarr members (imported through ``zarr.py``). It used to live inside zarr.py.

Arrays are opened with zarr-python 3 once, when the source opens, and reused. The pixels of a
local store are read by the server's own chunk reader (``_zarr_chunks``: pread and numcodecs
on every core); zarr-python reads the rest, its sync API submitting every read to its own
event loop, so concurrent reads from server threads are safe without a lock either way. There
is no file handle to reap: each chunk (or shard) file is opened and closed per read.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.adapters._store_listing import ABSENT, file_stamp_of, stored_files
from tensor_server.adapters._verified_extents import VerifiedExtents
from tensor_server.adapters._zarr_chunks import LocalChunks, ShardIndexes
from tensor_server.core.adapter_base import TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.core.identity import file_stat_stamp
from tensor_server.core.uniform import UniformBlock, grid_uniform_blocks
from tensor_server.errors import UnreadableSource

__all__ = ["ChunkFileStamps", "ZarrAdapter"]

#: arrays with at most this many storage chunks have every chunk file stat'ed at open
_EAGER_CHUNKS = 1 << 16


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

    def __init__(self, folder: Path, array: Any) -> None:
        self.folder = folder
        self._prefix = os.path.join(folder, "")
        grid = getattr(array, "shards", None) or array.chunks
        self.grid = tuple(max(int(g), 1) for g in grid)  # a 0-size chunk (empty array): no cells
        counts = tuple(-(-int(n) // g) for n, g in zip(array.shape, self.grid))
        self._encode = array.metadata.encode_chunk_key
        self.eager = math.prod(counts) <= _EAGER_CHUNKS
        self._stamps: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.verified = VerifiedExtents(folder)
        #: the store keys of the files under the folder at open (eager arrays), else None
        self.listed: frozenset[str] | None = None
        if self.eager:
            entries = stored_files(folder)
            self.listed = frozenset(entries)
            for cell in itertools.product(*(range(c) for c in counts)):
                self._stamps[cell] = file_stamp_of(entries.get(self._encode(cell)))

    def _stat(self, key: str) -> tuple[int, ...]:
        try:
            st = os.stat(self._prefix + key)  # not os.path.join of a Path: 2 of its 3.5 us a file
        except FileNotFoundError:
            return ABSENT
        return file_stat_stamp(st)

    def digest(self) -> bytes:
        stamps = np.array(list(self._stamps.values()) if self.eager else [], np.int64)
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
        for cell, key in zip(cells, keys):
            now = self._stat(key)
            if self._stamps.setdefault(cell, now) != now:
                return f"chunk file {key!r} changed since the store was opened"
        self.verified.verified(extent, verification)
        return None


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
        self._array = array
        self._chunk_files = chunk_files
        self.store_path = store_path
        self.zarr_path = zarr_path
        chunks = tuple(int(c) for c in array.chunks)
        shards = getattr(array, "shards", None)
        meta = {
            "zarr_path": zarr_path,
            "zarr_format": int(array.metadata.zarr_format),
            "chunks": list(chunks),
            "shards": None if shards is None else [int(s) for s in shards],
        }
        meta.update(metadata or {})
        self._listing: tuple[bytes, frozenset[str]] | None = None
        #: the chunk files' listing made at open, used by the first _stored_keys while the
        #: content version is still the one it was made under
        listed = None if chunk_files is None else chunk_files.listed
        self._listed_at_open = None if listed is None else (content_version, listed)
        local = isinstance(store_path, Path) and type(array.store).__name__ == "LocalStore"
        folder = store_path / zarr_path if zarr_path else store_path
        self._indexes = ShardIndexes(array, folder) if local and shards is not None else None
        #: the server's own chunk reader (``_zarr_chunks``), None where zarr-python reads
        self._chunks = LocalChunks.of(array, folder, self._indexes) if local else None
        self._fill: np.generic | None = None
        self._lock = threading.Lock()
        super().__init__(
            TensorInfo(
                array.shape,
                array.dtype,
                dim_labels=dim_labels,
                native_chunk_shape=chunks,
                physical_scale=physical_scale,
                physical_unit=physical_unit,
                is_labels=is_labels,
                content_version=content_version,
                metadata=meta,
            )
        )

    def stale_reason(self, bounds: Bounds, exact: bool = False) -> str | None:
        # no chunk files tracked: an upload member, whose writes are its lifecycle's business
        why = None if self._chunk_files is None else self._chunk_files.changed(bounds, exact)
        return None if why is None else f"zarr array {self.zarr_path or '/'!r}: {why}"

    def read_region(self, bounds: Bounds) -> np.ndarray:
        if self._chunks is not None:
            return self._read(bounds, (1,) * bounds.ndim)
        try:
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
        """The array's stored chunk (or shard) keys, listed once per content version; the
        first time, also the value zarr returns for an absent chunk (read from one)."""
        listing = self._listing
        if listing is not None and listing[0] == self.content_version:
            return listing[1]
        with self._lock:
            at_open, self._listed_at_open = self._listed_at_open, None
            if at_open is not None and at_open[0] == self.content_version:
                keys = at_open[1]
            else:
                keys = frozenset(stored_files(self.store_path / self.zarr_path if self.zarr_path else self.store_path))
            if self._indexes is not None:
                self._indexes.clear()
            self._fill = self._absent_value(keys)
            self._listing = (self.content_version, keys)
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
