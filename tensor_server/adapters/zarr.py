"""Zarr stores (v2 and v3, sharded or not) and OME-Zarr (NGFF 0.1-0.5) served as tensors.

One walker serves both formats, registered twice: ``ome-zarr`` (priority 10) claims folders
whose root group carries NGFF metadata (``multiscales``, ``plate``, ``well`` or
``bioformats2raw.layout``; under the ``ome`` key of ``zarr.json`` attributes from 0.5 on) and
``zarr`` (priority 20) claims any other zarr folder. What a source holds:

* an OME-Zarr image: level 0 is the tensor, the other datasets are its stored pyramid
  (``NativeLevel`` with the integer factor per axis); its ``labels/<name>`` are label tensors,
  served as ``<image field>/@labels/<name>``, the form label sets are addressed in by the biopb
  clients (and uploaded in), so a viewer files them under their image (the store's
  ``labels/<name>`` field still resolves: ``former_fields``);
* a bioformats2raw layout: one image per series group (``0``, ``1``, ...);
* an HCS plate (or a single well): one image per field of view (``A/1/0``);
* a plain group: one tensor per array (field = array path; OME images nested in it are
  served as images); a plain array: one tensor ``data``.

Group metadata is parsed here with ``json`` (so a corrupt document is reported naming the
file, and sniffing needs no zarr import); arrays are opened with zarr-python 3 once, when the
source opens, and reused. The pixels of a local store are read by the server's own chunk
reader (``_zarr_chunks``: pread and numcodecs on every core); zarr-python reads the rest, its
sync API submitting every read to its own event loop, so concurrent reads from server threads
are safe without a lock either way. There is no file handle to reap: each chunk (or shard)
file is opened and closed per read.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import re
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.adapters._ngff import AXIS_ALIASES, dataset_scale, integer_factor, jsonable, ngff_axes
from tensor_server.adapters._store_listing import ABSENT, file_stamp_of, stored_files
from tensor_server.adapters._verified_extents import VerifiedExtents
from tensor_server.adapters._zarr_chunks import LocalChunks, ShardIndexes, decoder_name
from tensor_server.adapters.encoded_zarr import EncodedArrayError, RefTargets, open_encoded
from tensor_server.adapters.registry import FormatEntry, register_format
from tensor_server.core.adapter_base import NativeLevel, SourceAdapter, TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.core.identity import LABEL_SETS, file_content_version, file_stat_stamp
from tensor_server.core.label_sets import carry_image_scale
from tensor_server.core.normalizing import normalize_axes
from tensor_server.core.uniform import UniformBlock, grid_uniform_blocks
from tensor_server.errors import UnreadableSource

__all__ = ["ZarrAdapter", "ZarrSource", "decoder_name"]

_log = logging.getLogger(__name__)

#: Keys of a group's (NGFF) attributes that make the store an OME-Zarr.
_OME_KEYS = ("multiscales", "plate", "well", "bioformats2raw.layout")
#: Long axis names some writers use, mapped to the single letters the server orders by.
_MAX_GROUP_DEPTH = 32
#: arrays with at most this many storage chunks have every chunk file stat'ed at open
_EAGER_CHUNKS = 1 << 16
#: The attribute block the upload subsystem writes on its zarr:// members (uploads/marker.py
#: takes the key from here). Both zarr claims decline a group carrying it: what lies under a
#: write_dir is registered by the upload subsystem, never discovered, even when a write_dir
#: was misplaced inside a served root.
UPLOAD_MEMBER_KEY = "tensor_server_upload"


class _NoPixels(UnreadableSource):
    """An array that holds no servable pixels (0-D, empty, strings, objects): a plain group
    skips it, a store or image that consists of it is unreadable."""


# ---- zarr metadata, parsed without zarr ------------------------------------------------------
class _Node:
    """One zarr node (array or group) of a local store: its format, kind and attributes."""

    __slots__ = ("folder", "rel", "zarr_format", "kind", "attributes", "meta_files")

    def __init__(
        self,
        folder: Path,
        rel: str,
        zarr_format: int,
        kind: str,
        attributes: dict[str, Any],
        meta_files: tuple[Path, ...],
    ) -> None:
        self.folder = folder
        self.rel = rel
        self.zarr_format = zarr_format
        self.kind = kind
        self.attributes = attributes
        self.meta_files = meta_files

    @property
    def ome(self) -> dict[str, Any]:
        """The NGFF block: ``attributes["ome"]`` (0.5, zarr v3) or the attributes themselves."""
        block = self.attributes.get("ome")
        return block if isinstance(block, dict) else self.attributes

    def is_ome(self) -> bool:
        return self.kind == "group" and any(k in self.ome for k in _OME_KEYS)


def _read_json(path: Path) -> dict[str, Any]:
    """A metadata document; corrupt or non-object JSON is an UnreadableSource naming it."""
    try:
        doc = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        raise UnreadableSource(path, f"corrupt zarr metadata: {exc}") from None
    except OSError as exc:
        raise UnreadableSource(path, f"cannot read zarr metadata: {exc.strerror or exc}") from None
    if not isinstance(doc, dict):
        raise UnreadableSource(path, f"corrupt zarr metadata: a JSON object was expected, got {type(doc).__name__}")
    return doc


def _read_node(folder: Path, rel: str) -> _Node | None:
    """The node at ``folder`` or None when it holds no zarr metadata. Zarr v3 (``zarr.json``)
    wins over v2 (``.zarray`` / ``.zgroup``, attributes in ``.zattrs``)."""
    v3 = folder / "zarr.json"
    if v3.is_file():
        doc = _read_json(v3)
        kind = doc.get("node_type")
        if doc.get("zarr_format") != 3 or kind not in ("array", "group"):
            raise UnreadableSource(
                v3, f"not zarr v3 metadata (zarr_format={doc.get('zarr_format')!r}, node_type={kind!r})"
            )
        attrs = doc.get("attributes") or {}
        return _Node(folder, rel, 3, kind, attrs if isinstance(attrs, dict) else {}, (v3,))
    for name, kind in ((".zarray", "array"), (".zgroup", "group")):
        meta = folder / name
        if meta.is_file():
            doc = _read_json(meta)
            if doc.get("zarr_format") != 2:
                raise UnreadableSource(meta, f"not zarr v2 metadata (zarr_format={doc.get('zarr_format')!r})")
            zattrs = folder / ".zattrs"
            attrs = _read_json(zattrs) if zattrs.is_file() else {}
            files = (meta, zattrs) if zattrs.is_file() else (meta,)
            return _Node(folder, rel, 2, kind, attrs, files)
    return None


def _is_zarr_folder(path: Path) -> bool:
    return any((path / n).is_file() for n in ("zarr.json", ".zgroup", ".zarray"))


def is_upload_member(path: Path) -> bool:
    """The folder is an upload subsystem's zarr:// member (never raises)."""
    try:
        node = _read_node(path, "")
        return node is not None and UPLOAD_MEMBER_KEY in node.attributes
    except Exception:
        return False


def _natural_key(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def _import_zarr() -> Any:
    import zarr
    from zarr.errors import ZarrUserWarning

    # bioformats2raw writes "filters": [] in every .zarray, which zarr 3 tolerates with a
    # warning per array; the data is fine, so the warning is noise in a server log.
    warnings.filterwarnings("ignore", message="Found an empty list of filters", category=ZarrUserWarning)
    return zarr


# ---- chunk files -------------------------------------------------------------------------------
class _ChunkFiles:
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
        chunk_files: _ChunkFiles | None = None,
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


# ---- the store walker --------------------------------------------------------------------------
class _StoreWalker:
    """Builds the tensors of one store (see the module docstring for what becomes a tensor)."""

    def __init__(self, root: Path, store: Any = None) -> None:
        """``store``: the zarr store to read pixels from (default: a read-only LocalStore of
        ``root``); ``zarr_remote`` passes an object store's, with ``root`` a path-like view
        of its listing."""
        self.root = root
        self.zarr = _import_zarr()
        if store is None:
            from zarr.storage import LocalStore

            store = LocalStore(root, read_only=True)
        self.store = store
        self.tensors: dict[str, TensorAdapter] = {}
        self.skipped: list[dict[str, str]] = []
        self.ngff_version = ""  # of the first image served, for the source's metadata
        self.encodings: dict[str, str] = {}  # field -> encoding name of encoded arrays
        self.ref_targets = RefTargets()  # array_ref targets shared by this store's arrays
        self.former_fields: dict[str, str] = {}  # a label image's store path -> its field

    # -- nodes and arrays --
    def node(self, rel: str) -> _Node | None:
        folder = self.root / rel if rel else self.root
        return _read_node(folder, rel) if folder.is_dir() else None

    def children(self, node: _Node) -> list[_Node]:
        out = []
        for sub in sorted((p for p in node.folder.iterdir() if p.is_dir()), key=lambda p: _natural_key(p.name)):
            if sub.name.startswith("."):
                continue
            child = _read_node(sub, _join(node.rel, sub.name))
            if child is not None:
                out.append(child)
        return out

    def skip(self, rel: str, reason: str) -> None:
        _log.warning("%s: skipping %r: %s", self.root, rel or "/", reason)
        self.skipped.append({"path": rel or "/", "reason": reason})

    def open_array(self, node: _Node) -> Any:
        array = self.zarr.open_array(store=self.store, path=node.rel, mode="r", zarr_format=node.zarr_format)
        dt = np.dtype(array.dtype)
        if dt.hasobject or dt.fields is not None or dt.kind in "USVOMmT":
            raise _NoPixels(self.root, f"zarr array {node.rel or '/'!r}: dtype {dt} is not a numeric pixel type")
        if len(array.shape) == 0 or any(n < 1 for n in array.shape):
            raise _NoPixels(self.root, f"zarr array {node.rel or '/'!r}: shape {array.shape} has no pixels")
        return array

    def chunk_files(self, node: _Node, array: Any) -> _ChunkFiles | None:
        """The stamps of an array's chunk files (stale-data checks); a store with no local
        files to stat (an object store) answers None and versions by its own listing."""
        return _ChunkFiles(node.folder, array)

    def version_of(self, *nodes: _Node, chunk_files: _ChunkFiles | None) -> bytes:
        """Content version from the served metadata documents, the store root and the stats
        of the array's chunk files (a chunk rewritten in place changes only the latter)."""
        files = [self.root] + [f for n in nodes for f in n.meta_files]
        digest = b"" if chunk_files is None else chunk_files.digest()
        return hashlib.blake2b(file_content_version(*files) + digest, digest_size=16).digest()

    def array_dim_names(self, node: _Node, array: Any) -> list[str] | None:
        """Plain-array labels: zarr v3 ``dimension_names`` or xarray's ``_ARRAY_DIMENSIONS``."""
        names = getattr(array.metadata, "dimension_names", None) or node.attributes.get("_ARRAY_DIMENSIONS")
        if not names or len(names) != len(array.shape) or any(n is None for n in names):
            return None
        low = [AXIS_ALIASES.get(str(n).lower(), str(n).lower()) for n in names]
        return low if len(set(low)) == len(low) and all(low) else None

    # -- plain zarr --
    def add_plain_array(self, node: _Node, field: str) -> None:
        if "encoding" in node.attributes:
            self.add_encoded_array(node, field)
            return
        array = self.open_array(node)
        chunk_files = self.chunk_files(node, array)
        tensor = ZarrAdapter(
            array,
            store_path=self.root,
            zarr_path=node.rel,
            dim_labels=self.array_dim_names(node, array),
            physical_scale=None,
            physical_unit=None,
            is_labels=False,
            content_version=self.version_of(node, chunk_files=chunk_files),
            chunk_files=chunk_files,
        )
        self.tensors[field] = normalize_axes(tensor)

    def add_encoded_array(self, node: _Node, field: str) -> None:
        """An array with an ``encoding`` block (Luxar): served decoded by encoded_zarr."""

        def open_codes(rel: str) -> tuple[Any, dict[str, Any], bytes]:
            n = self.node(rel)
            if n is None or n.kind != "array":
                raise UnreadableSource(self.root, f"no zarr array at {rel!r}")
            array = self.zarr.open_array(store=self.store, path=n.rel, mode="r", zarr_format=n.zarr_format)
            return array, n.attributes, self.version_of(n, chunk_files=self.chunk_files(n, array))

        tensor = open_encoded(node.rel, store_path=self.root, open_codes=open_codes, targets=self.ref_targets)
        self.tensors[field] = normalize_axes(tensor)
        self.encodings[field] = tensor.encoding.name

    def walk_group(self, node: _Node, depth: int = 0) -> None:
        if depth > _MAX_GROUP_DEPTH:
            self.skip(node.rel, f"deeper than {_MAX_GROUP_DEPTH} nested groups")
            return
        for child in self.children(node):
            if child.kind == "array":
                try:
                    self.add_plain_array(child, child.rel)
                except (_NoPixels, EncodedArrayError) as exc:
                    self.skip(child.rel, exc.reason)
            elif child.is_ome() and "multiscales" in child.ome:
                self.add_image(child, child.rel, is_labels="image-label" in child.ome)
            else:
                self.walk_group(child, depth + 1)

    # -- OME-Zarr --
    def add_image(self, node: _Node, field: str, *, is_labels: bool = False) -> None:
        """An NGFF image group: level 0 with its integer-factor levels, then its labels."""
        ome = node.ome
        multiscales = ome.get("multiscales")
        if not isinstance(multiscales, list) or not multiscales or not isinstance(multiscales[0], Mapping):
            raise UnreadableSource(node.meta_files[-1], "multiscales is not a non-empty list of objects")
        ms = multiscales[0]
        version = str(ms.get("version") or ome.get("version") or node.attributes.get("version") or "")
        self.ngff_version = self.ngff_version or version
        datasets = ms.get("datasets")
        well_formed = isinstance(datasets, list) and all(
            isinstance(d, Mapping) and d.get("path") is not None for d in datasets
        )
        if not well_formed or not datasets:
            raise UnreadableSource(node.meta_files[-1], "multiscales datasets must be a non-empty list with paths")
        level_nodes = []
        for i, ds in enumerate(datasets):
            rel = _join(node.rel, str(ds["path"]))
            lnode = self.node(rel)
            if lnode is None or lnode.kind != "array":
                if i == 0:
                    raise UnreadableSource(self.root, f"multiscales level 0 {rel!r} is not a zarr array")
                self.skip(rel, "multiscales dataset is not a zarr array")
                continue
            level_nodes.append((ds, lnode))
        ds0, node0 = level_nodes[0]
        array0 = self.open_array(node0)
        ndim = len(array0.shape)
        labels, types, units = ngff_axes(ms, ndim, version)
        if labels is None:
            labels = self.array_dim_names(node0, array0)
        image_meta: dict[str, Any] = {"ngff_version": version}
        for key in ("name", "type", "metadata"):
            if key in ms:
                image_meta[f"multiscale_{key}"] = jsonable(ms[key])
        for key in ("omero", "image-label"):
            if key in ome:
                image_meta[key] = jsonable(ome[key])
        if len(multiscales) > 1:
            image_meta["other_multiscales_ignored"] = len(multiscales) - 1

        def level_tensor(
            lnode: _Node,
            array: Any,
            scale: list[float] | None,
            extra: dict[str, Any],
            stored: Sequence[ZarrAdapter] = (),
        ) -> ZarrAdapter:
            physical_scale = physical_unit = None
            if scale is not None:
                physical_scale = [
                    None if t == "channel" or (t is None and lab == "c") else s
                    for s, t, lab in zip(scale, types, labels or [""] * ndim)
                ]
                physical_unit = [None if ps is None else u for ps, u in zip(physical_scale, units)]
            elif any(units):
                physical_unit = units
                physical_scale = [None] * ndim
            chunk_files = self.chunk_files(lnode, array)
            version = self.version_of(node, lnode, chunk_files=chunk_files)
            if stored:  # level 0 mints the ids of its stored levels' chunks too: cover their bytes
                version = hashlib.blake2b(
                    version + b"".join(t.content_version for t in stored), digest_size=16
                ).digest()
            return ZarrAdapter(
                array,
                store_path=self.root,
                zarr_path=lnode.rel,
                dim_labels=labels,
                physical_scale=physical_scale,
                physical_unit=physical_unit,
                is_labels=is_labels,
                content_version=version,
                chunk_files=chunk_files,
                metadata={**image_meta, **extra},
            )

        scale0 = dataset_scale(ms, ds0, ndim)
        levels_meta = [{"path": node0.rel, "shape": list(array0.shape), "scale": [1] * ndim}]
        skipped_meta: list[dict[str, str]] = []
        accepted: list[tuple[tuple[int, ...], _Node, Any, list[float] | None]] = []
        for ds, lnode in level_nodes[1:]:
            array = self.open_array(lnode)
            scale = dataset_scale(ms, ds, ndim)
            if len(array.shape) != ndim or np.dtype(array.dtype) != np.dtype(array0.dtype):
                factor, reason = None, f"rank or dtype differs from level 0 ({array.shape} {array.dtype})"
            else:
                factor, reason = integer_factor(array0.shape, array.shape, scale0, scale)
            if factor is not None and (all(f == 1 for f in factor) or any(factor == a[0] for a in accepted)):
                factor, reason = None, f"factor {factor} repeats level 0 or an earlier level"
            if factor is None:
                _log.info("%s: level %r is not served as a stored level: %s", self.root, lnode.rel, reason)
                skipped_meta.append({"path": lnode.rel, "reason": reason})
                continue
            levels_meta.append({"path": lnode.rel, "shape": list(array.shape), "scale": list(factor)})
            accepted.append((factor, lnode, array, scale))
        stored = [
            NativeLevel(factor, level_tensor(lnode, array, scale, {})) for factor, lnode, array, scale in accepted
        ]
        level0 = level_tensor(
            node0, array0, scale0, {"levels": levels_meta, "skipped_levels": skipped_meta}, [lv.tensor for lv in stored]
        )
        level0.native_levels.extend(stored)
        self.tensors[field] = normalize_axes(level0)
        if not is_labels:
            self.add_labels(node, field)

    def add_labels(self, image: _Node, image_field: str) -> None:
        """``labels/<name>`` of an image: each named label image is a label tensor, served as
        ``<image field>/@labels/<name>`` (the module docstring says why)."""
        labels_node = self.node(_join(image.rel, "labels"))
        if labels_node is None or labels_node.kind != "group":
            return
        names = labels_node.ome.get("labels")
        if isinstance(names, list) and names:
            candidates = []
            for name in names:
                child = self.node(_join(labels_node.rel, str(name)))
                if child is None:
                    self.skip(_join(labels_node.rel, str(name)), "listed label image is missing")
                candidates.append(child)
        else:  # an empty or missing list: take whatever label images the group holds
            candidates = self.children(labels_node)
        for child in candidates:
            if child is not None and child.kind == "group" and "multiscales" in child.ome:
                # image/@labels/<name> for a root image, 0/@labels/<name> for a bioformats2raw
                # series, A/1/0/@labels/<name> in a plate
                field = f"{image_field}/{LABEL_SETS}/{child.rel.rsplit('/', 1)[-1]}"
                self.add_image(child, field, is_labels=True)
                self.former_fields[child.rel] = field
                carry_image_scale(self.tensors[field], self.tensors[image_field])

    def add_plate(self, node: _Node) -> None:
        """An HCS plate: one image per field of view, named ``<row>/<column>/<field>``."""
        plate = node.ome["plate"]
        wells = plate.get("wells") if isinstance(plate, Mapping) else None
        if not isinstance(wells, list):
            raise UnreadableSource(node.meta_files[-1], "plate metadata has no wells list")
        for well in wells:
            path = well.get("path") if isinstance(well, Mapping) else None
            wnode = self.node(str(path)) if path else None
            if wnode is None or wnode.kind != "group":
                self.skip(str(path), "listed well is missing")
                continue
            self.add_well(wnode)

    def add_well(self, wnode: _Node) -> None:
        well = wnode.ome.get("well")
        images = well.get("images") if isinstance(well, Mapping) else None
        if not isinstance(images, list):
            raise UnreadableSource(wnode.meta_files[-1], "well metadata has no images list")
        for img in images:
            path = img.get("path") if isinstance(img, Mapping) else None
            inode = self.node(_join(wnode.rel, str(path))) if path is not None else None
            if inode is None or "multiscales" not in inode.ome:
                self.skip(_join(wnode.rel, str(path)), "listed field of view is not an image group")
                continue
            self.add_image(inode, inode.rel)

    def add_bioformats2raw(self, node: _Node) -> None:
        """bioformats2raw layout: series groups listed in ``OME/.zattrs`` ``series`` or, absent
        that, numbered ``0``, ``1``, ... until the first gap."""
        ome_group = self.node("OME")
        series = ome_group.ome.get("series") if ome_group is not None else None
        if isinstance(series, list) and series:
            paths = [str(s) for s in series]
        else:
            paths = []
            while (snode := self.node(str(len(paths)))) is not None and "multiscales" in snode.ome:
                paths.append(snode.rel)
        for path in paths:
            snode = self.node(path)
            if snode is None or "multiscales" not in snode.ome:
                self.skip(path, "listed series is not an image group")
                continue
            self.add_image(snode, path)

    def build(self) -> tuple[dict[str, TensorAdapter], dict[str, Any], bool]:
        root = self.node("")
        if root is None:
            raise UnreadableSource(self.root, "not a zarr store: no zarr.json, .zgroup or .zarray")
        ome = root.ome
        layout = "group"
        if root.kind == "array":
            layout = "array"
            self.add_plain_array(root, "data")
        elif "plate" in ome:
            layout = "plate"
            self.add_plate(root)
        elif "bioformats2raw.layout" in ome:
            layout = "bioformats2raw"
            self.add_bioformats2raw(root)
        elif "multiscales" in ome:
            layout = "image"
            self.add_image(root, "image")
        elif "well" in ome:
            layout = "well"
            self.add_well(root)
        else:
            self.walk_group(root)
        if not self.tensors:
            detail = f" (skipped: {self.skipped})" if self.skipped else ""
            raise UnreadableSource(self.root, f"zarr {layout} holds no readable array{detail}")
        metadata: dict[str, Any] = {"zarr_format": root.zarr_format, "layout": layout}
        if root.is_ome():
            metadata["ngff_version"] = str(ome.get("version") or self.ngff_version)
            for key in ("plate", "well", "bioformats2raw.layout", "omero"):
                if key in ome:
                    metadata[key] = jsonable(ome[key])
        if self.encodings:
            metadata["encodings"] = self.encodings
        if self.skipped:
            metadata["skipped"] = self.skipped
        return self.tensors, metadata, root.is_ome()


# ---- the source and its registration -----------------------------------------------------------
class ZarrSource(SourceAdapter):
    """A zarr or OME-Zarr folder (type ``ome-zarr`` when its root carries NGFF metadata)."""

    format_name = "zarr"

    def __init__(self, path: str | Path, *, require_ome: bool = False) -> None:
        root = Path(path)
        walker = _StoreWalker(root)
        tensors, metadata, is_ome = walker.build()
        if require_ome and not is_ome:
            raise UnreadableSource(root, f"no OME-Zarr metadata ({', '.join(_OME_KEYS)}) in the root group")
        super().__init__(root, tensors, metadata=metadata, source_type="ome-zarr" if is_ome else "zarr")
        self.former_fields = walker.former_fields


def _root_is_ome(path: Path) -> bool:
    """Sniff: the root group's attributes carry NGFF keys. Never raises (corrupt metadata is
    left for the plain zarr entry, whose opener reports it)."""
    try:
        node = _read_node(path, "")
        return node is not None and node.is_ome()
    except Exception:
        return False


register_format(
    FormatEntry(
        name="ome-zarr",
        opener=lambda path: ZarrSource(path, require_ome=True),
        sniff=lambda path, head: path.is_dir() and _root_is_ome(path) and not is_upload_member(path),
        extensions=(".ome.zarr",),
        priority=10,
        folders=True,
        files=False,
        description="OME-Zarr (NGFF 0.1-0.5): multiscale images, labels, HCS plates, bioformats2raw",
    )
)
register_format(
    FormatEntry(
        name="zarr",
        opener=ZarrSource,
        sniff=lambda path, head: path.is_dir() and _is_zarr_folder(path) and not is_upload_member(path),
        extensions=(".zarr",),
        priority=20,
        folders=True,
        files=False,
        description="Zarr v2/v3 store (sharded v3 included): one tensor per array",
    )
)
