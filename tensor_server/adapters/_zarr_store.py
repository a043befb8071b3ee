"""A zarr store's tree read into tensors: the metadata of its nodes (arrays and groups),
parsed with ``json``, and the walker that decides which node becomes which tensor.

Shared by the local stores (``zarr.py``) and the object stores (``zarr_remote.py``, whose
listing presents the few ``pathlib`` methods the walker uses), so the OME-Zarr rules stay in
one place. It used to live inside zarr.py. What a store holds:

* an OME-Zarr image: level 0 is the tensor, the other datasets are its stored pyramid
  (``NativeLevel`` with the integer factor per axis); its ``labels/<name>`` are label tensors,
  served as ``<image field>/@labels/<name>``, the form label sets are addressed in by the biopb
  clients (and uploaded in), so a viewer files them under their image (the store's
  ``labels/<name>`` field still resolves: ``former_fields``);
* a bioformats2raw layout: one image per series group (``0``, ``1``, ...);
* an HCS plate (or a single well): one image per field of view (``A/1/0``); a plate also as
  one image, ``plate``: its fields on the plate grid (``core/montage.py``);
* a plain group: one tensor per array (field = array path; OME images nested in it are
  served as images); a plain array: one tensor ``data``.

Group metadata is parsed here with ``json``, so a corrupt document is reported naming the
file, and sniffing needs no zarr import; the arrays are served by ``_zarr_array.py``.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging
import os
import re
import stat
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.adapters._ngff import AXIS_ALIASES, dataset_scale, integer_factor, jsonable, ngff_axes
from tensor_server.adapters._zarr_array import ChunkFileStamps, StoredArray, ZarrAdapter
from tensor_server.adapters.encoded_zarr import EncodedArrayError, RefTargets, open_encoded
from tensor_server.adapters.registry import montage_gap
from tensor_server.core.adapter_base import NativeLevel, TensorAdapter
from tensor_server.core.identity import (
    LABEL_SETS,
    file_content_version,
    stamps_content_version,
    stat_stamp_bytes,
)
from tensor_server.core.label_sets import carry_image_scale
from tensor_server.core.montage import PLATE_FIELD, Tile, build_montage
from tensor_server.core.normalizing import normalize_axes
from tensor_server.errors import UnreadableSource

__all__ = ["OME_KEYS", "PLATE_FIELD", "StoreWalker", "ZarrNode", "is_zarr_folder", "read_node", "root_is_ome"]

#: the zarr adapter's logger: skipped nodes and levels are reported under the format's name
_log = logging.getLogger("tensor_server.adapters.zarr")

#: Keys of a group's (NGFF) attributes that make the store an OME-Zarr.
OME_KEYS = ("multiscales", "plate", "well", "bioformats2raw.layout")
#: Plain groups nested deeper than this are skipped, not walked.
_MAX_GROUP_DEPTH = 32


class _NoPixels(UnreadableSource):
    """An array that holds no servable pixels (0-D, empty, strings, objects): a plain group
    skips it, a store or image that consists of it is unreadable."""


# ---- zarr metadata, parsed without zarr ------------------------------------------------------
class ZarrNode:
    """One zarr node (array or group) of a local store: its format, kind and attributes."""

    __slots__ = ("folder", "rel", "zarr_format", "kind", "attributes", "meta_files", "stamps", "document")

    def __init__(
        self,
        folder: Path,
        rel: str,
        zarr_format: int,
        kind: str,
        attributes: dict[str, Any],
        meta_files: tuple[str | Path, ...],
        stamps: bytes = b"",
        document: bytes | None = None,
    ) -> None:
        self.folder = folder
        self.rel = rel
        self.zarr_format = zarr_format
        self.kind = kind
        self.attributes = attributes
        self.meta_files = meta_files
        #: the meta files' ``stat_stamp_bytes`` as they were read (``b""`` in an object store)
        self.stamps = stamps
        #: an array's metadata document as read (``.zarray`` or ``zarr.json``): its tensor's
        #: zarr array is built from it when first needed (``_zarr_array.StoredArray``)
        self.document = document

    @property
    def ome(self) -> dict[str, Any]:
        """The NGFF block: ``attributes["ome"]`` (0.5, zarr v3) or the attributes themselves."""
        block = self.attributes.get("ome")
        return block if isinstance(block, dict) else self.attributes

    def is_ome(self) -> bool:
        return self.kind == "group" and any(k in self.ome for k in OME_KEYS)


def _read_file(path: str | Path) -> tuple[bytes, bytes] | None:
    """A metadata file's bytes and its ``stat_stamp_bytes`` (``b""`` for an object store's
    key: its listing versions it), or None when there is no such file. One open and fstat
    instead of a stat, a read and another stat for the content version: a big plate reads
    70,000 of them (``StoreWalker.add_plate``)."""
    if not isinstance(path, str | Path):  # an object store's listing (zarr_remote.ObjectPath)
        return (path.read_bytes(), b"") if path.is_file() else None
    try:
        # non-blocking: a FIFO named like a metadata file must not hang the walk (it is no file)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise UnreadableSource(path, f"cannot read zarr metadata: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        raw = os.read(fd, st.st_size + 1)  # a short read is the end: one call, not a second for EOF
        while len(raw) > st.st_size and (more := os.read(fd, 1 << 16)):  # grew since the fstat
            raw += more
        return raw, stat_stamp_bytes(st)
    except OSError as exc:
        raise UnreadableSource(path, f"cannot read zarr metadata: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _parse(path: str | Path, raw: bytes) -> dict[str, Any]:
    """A metadata document's JSON object; corrupt or non-object JSON is an UnreadableSource."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise UnreadableSource(path, f"corrupt zarr metadata: {exc}") from None
    if not isinstance(doc, dict):
        raise UnreadableSource(path, f"corrupt zarr metadata: a JSON object was expected, got {type(doc).__name__}")
    return doc


def read_node(folder: Path, rel: str) -> ZarrNode | None:
    """The node at ``folder`` or None when it holds no zarr metadata. Zarr v3 (``zarr.json``)
    wins over v2 (``.zarray`` / ``.zgroup``, attributes in ``.zattrs``)."""
    local = f"{folder}/" if isinstance(folder, Path) else None  # its files by string: pathlib's
    # joins were a fifth of a big plate's walk (three files a node, 70,000 nodes)

    def file(name: str) -> Any:
        return folder / name if local is None else local + name

    v3 = file("zarr.json")
    read = _read_file(v3)
    if read is not None:
        raw, stamp = read
        doc = _parse(v3, raw)
        kind = doc.get("node_type")
        if doc.get("zarr_format") != 3 or kind not in ("array", "group"):
            raise UnreadableSource(
                v3, f"not zarr v3 metadata (zarr_format={doc.get('zarr_format')!r}, node_type={kind!r})"
            )
        attrs = doc.get("attributes") or {}
        attrs = attrs if isinstance(attrs, dict) else {}
        return ZarrNode(folder, rel, 3, kind, attrs, (v3,), stamp, raw if kind == "array" else None)
    for name, kind in ((".zarray", "array"), (".zgroup", "group")):
        meta = file(name)
        read = _read_file(meta)
        if read is not None:
            raw, stamp = read
            doc = _parse(meta, raw)
            if doc.get("zarr_format") != 2:
                raise UnreadableSource(meta, f"not zarr v2 metadata (zarr_format={doc.get('zarr_format')!r})")
            zattrs = file(".zattrs")
            attributes = _read_file(zattrs)
            if attributes is None:
                return ZarrNode(folder, rel, 2, kind, {}, (meta,), stamp, raw if kind == "array" else None)
            attrs = _parse(zattrs, attributes[0])
            files, stamps = (meta, zattrs), stamp + attributes[1]
            return ZarrNode(folder, rel, 2, kind, attrs, files, stamps, raw if kind == "array" else None)
    return None


def is_zarr_folder(path: Path) -> bool:
    return any((path / n).is_file() for n in ("zarr.json", ".zgroup", ".zarray"))


def root_is_ome(path: Path) -> bool:
    """Sniff: the root group's attributes carry NGFF keys. Never raises (corrupt metadata is
    left for the plain zarr entry, whose opener reports it)."""
    try:
        node = read_node(path, "")
        return node is not None and node.is_ome()
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


def _grid_names(plate: Mapping[str, Any], key: str) -> list[str]:
    """A plate's row or column names (``[{"name": "A"}, ...]``), in the plate's order."""
    entries = plate.get(key)
    if not isinstance(entries, list):
        return []
    return [str(e.get("name")) if isinstance(e, Mapping) else str(e) for e in entries]


def _well_place(well: Mapping[str, Any], path: str, rows: list[str], columns: list[str]) -> tuple[int, int] | str:
    """A well's (row, column) on the plate grid: ``rowIndex``/``columnIndex`` (NGFF 0.4+), else
    its path's ``<row>/<column>`` names; a string says why it has no place."""
    place = [well.get("rowIndex"), well.get("columnIndex")]
    for i, (names, name) in enumerate(zip((rows, columns), path.split("/")[-2:] if "/" in path else ("", ""))):
        if not isinstance(place[i], int) or isinstance(place[i], bool):
            place[i] = names.index(name) if name in names else None
    row, column = place
    if row is None or column is None or not (0 <= row < len(rows) and 0 <= column < len(columns)):
        return (
            f"well {path!r} at row {row!r}, column {column!r} is not on the plate's {len(rows)} × {len(columns)} grid"
        )
    return row, column


# ---- the garbage collector, paused while a walk builds ------------------------------------------
_pauses = 0
_pauses_lock = threading.Lock()
_resume = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a plate's walk runs (back on when the last
    such walk under way ends, if it was on before the first).

    Why: a plate's walk builds long-lived objects only (1536 wells of 9 fields: about 1.5
    million), and the collector walked every one of them again each time they grew by a
    quarter: half of that plate's open (1536 × 9 fields of 4 levels, metadata only, 2 shared
    cores: 15.0 s, 8.2 s paused; 2026-12-05). Nothing the walk makes is garbage in a cycle;
    another thread's cyclic garbage waits for the next collection, which the first
    allocation after the walk starts. Plates only: a scan opens many small stores at once on
    several threads, whose pauses would overlap into one as long as the scan."""
    global _pauses, _resume
    with _pauses_lock:
        if _pauses == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pauses_lock:
            _pauses -= 1
            if _pauses == 0 and _resume:
                gc.enable()


# ---- the store walker --------------------------------------------------------------------------
class StoreWalker:
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
        #: chunk files stamped at open (``ChunkFileStamps``); a plate's fields are stamped when
        #: first served instead (``add_plate`` says why)
        self.stamp_at_open = True
        self._root_stamp: bytes | None = None  # the root folder's, taken once per open
        #: each distinct array metadata document once: a plate's fields mostly share theirs
        self._documents: dict[bytes, bytes] = {}

    # -- nodes and arrays --
    def node(self, rel: str) -> ZarrNode | None:
        folder = self.root / rel if rel else self.root
        # a missing local folder reads as no node (``_read_file``): no stat of it first
        return read_node(folder, rel) if isinstance(folder, Path) or folder.is_dir() else None

    def children(self, node: ZarrNode) -> list[ZarrNode]:
        out = []
        for sub in sorted((p for p in node.folder.iterdir() if p.is_dir()), key=lambda p: _natural_key(p.name)):
            if sub.name.startswith("."):
                continue
            child = read_node(sub, _join(node.rel, sub.name))
            if child is not None:
                out.append(child)
        return out

    def skip(self, rel: str, reason: str) -> None:
        _log.warning("%s: skipping %r: %s", self.root, rel or "/", reason)
        self.skipped.append({"path": rel or "/", "reason": reason})

    def open_array(self, node: ZarrNode) -> StoredArray:
        """The array as its metadata document describes it, no zarr-python array built yet
        (``StoredArray``: a plate's fields are too many to open each with zarr)."""
        raw = node.document
        if raw is not None:
            raw = self._documents.setdefault(raw, raw)
        array = StoredArray(self.store, node.rel, node.zarr_format, raw, node.meta_files[0])
        dt = array.dtype
        if dt.hasobject or dt.fields is not None or dt.kind in "USVOMmT":
            raise _NoPixels(self.root, f"zarr array {node.rel or '/'!r}: dtype {dt} is not a numeric pixel type")
        if len(array.shape) == 0 or any(n < 1 for n in array.shape):
            raise _NoPixels(self.root, f"zarr array {node.rel or '/'!r}: shape {array.shape} has no pixels")
        return array

    def chunk_files(self, node: ZarrNode, array: StoredArray) -> ChunkFileStamps | None:
        """The stamps of an array's chunk files (stale-data checks); a store with no local
        files to stat (an object store) answers None and versions by its own listing."""
        return ChunkFileStamps(node.folder, array, at_open=self.stamp_at_open)

    def version_of(self, *nodes: ZarrNode, chunk_files: ChunkFileStamps | None) -> bytes:
        """Content version from the served metadata documents, the store root and the stats
        of the array's chunk files (a chunk rewritten in place changes only the latter)."""
        if self._root_stamp is None:
            self._root_stamp = stat_stamp_bytes(os.stat(self.root))
        stamps = [n.stamps for n in nodes]
        if all(stamps):  # taken as the documents were read: file_content_version's digest
            files = stamps_content_version(self._root_stamp + b"".join(stamps))
        else:
            files = file_content_version(self.root, *(f for n in nodes for f in n.meta_files))
        digest = b"" if chunk_files is None else chunk_files.digest()
        return hashlib.blake2b(files + digest, digest_size=16).digest()

    def array_dim_names(self, node: ZarrNode, array: StoredArray) -> list[str] | None:
        """Plain-array labels: zarr v3 ``dimension_names`` or xarray's ``_ARRAY_DIMENSIONS``."""
        names = array.dimension_names or node.attributes.get("_ARRAY_DIMENSIONS")
        if not names or len(names) != len(array.shape) or any(n is None for n in names):
            return None
        low = [AXIS_ALIASES.get(str(n).lower(), str(n).lower()) for n in names]
        return low if len(set(low)) == len(low) and all(low) else None

    # -- plain zarr --
    def add_plain_array(self, node: ZarrNode, field: str) -> None:
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

    def add_encoded_array(self, node: ZarrNode, field: str) -> None:
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

    def walk_group(self, node: ZarrNode, depth: int = 0) -> None:
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
    def add_image(self, node: ZarrNode, field: str, *, is_labels: bool = False) -> None:
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
            lnode: ZarrNode,
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
        accepted: list[tuple[tuple[int, ...], ZarrNode, Any, list[float] | None]] = []
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

    def add_labels(self, image: ZarrNode, image_field: str) -> None:
        """``labels/<name>`` of an image: each named label image is a label tensor, served as
        ``<image field>/@labels/<name>`` (the module docstring says why)."""
        if not (image.folder / "labels").is_dir():  # one stat, not a node's three misses (most images)
            return
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

    def add_plate(self, node: ZarrNode) -> None:
        """An HCS plate: one image per field of view, named ``<row>/<column>/<field>``, and the
        plate as one image (``plate``, ``core/montage.py``) of the fields on the plate grid.

        Its fields' chunk files are stamped when first served, not at open (``stamp_at_open``):
        listing every level's folder was a quarter of a big plate's open (1536 wells of 9
        fields of 4 levels: 55,000 folders) while a plate is read a few fields at a time. What
        that costs: a field's content version covers its metadata files only, as a large
        array's does (``ChunkFileStamps``), so a chunk rewritten in place while the server was
        down may be served from the persistent cache; a running server still refuses it.
        The garbage collector is paused while it builds (``collector_paused``)."""
        self.stamp_at_open = False
        with collector_paused():
            self._add_plate(node)

    def _add_plate(self, node: ZarrNode) -> None:
        plate = node.ome["plate"]
        wells = plate.get("wells") if isinstance(plate, Mapping) else None
        if not isinstance(wells, list):
            raise UnreadableSource(node.meta_files[-1], "plate metadata has no wells list")
        rows, columns = _grid_names(plate, "rows"), _grid_names(plate, "columns")
        tiles: list[Tile] = []
        for well in wells:
            path = well.get("path") if isinstance(well, Mapping) else None
            wnode = self.node(str(path)) if path else None
            if wnode is None or wnode.kind != "group":
                self.skip(str(path), "listed well is missing")
                continue
            fields = self.add_well(wnode)
            place = _well_place(well, wnode.rel, rows, columns)
            if isinstance(place, str):
                self.skip(wnode.rel, f"left out of the plate image: {place}")
                continue
            for slot, name, field in fields:
                tiles.append(Tile(wnode.rel, name, place[0], place[1], slot, self.tensors[field]))
        self.add_montage(tiles, rows, columns)

    def add_montage(self, tiles: list[Tile], rows: list[str], columns: list[str]) -> None:
        """The plate image, beside the fields (``PLATE_FIELD``); the fields it cannot place
        are left out of it (and still served on their own), each with the reason."""
        if not tiles:
            return
        montage, left_out = build_montage(tiles, rows, columns, gap_fraction=montage_gap())
        for tile, reason in left_out:
            self.skip(_join(tile.group, tile.name), f"left out of the plate image: {reason}")
        if montage is not None:
            self.tensors[PLATE_FIELD] = montage

    def add_well(self, wnode: ZarrNode) -> list[tuple[int, str, str]]:
        """A well's fields of view, each an image; (slot in the well, path, field) of each."""
        well = wnode.ome.get("well")
        images = well.get("images") if isinstance(well, Mapping) else None
        if not isinstance(images, list):
            raise UnreadableSource(wnode.meta_files[-1], "well metadata has no images list")
        added = []
        for slot, img in enumerate(images):
            path = img.get("path") if isinstance(img, Mapping) else None
            inode = self.node(_join(wnode.rel, str(path))) if path is not None else None
            if inode is None or "multiscales" not in inode.ome:
                self.skip(_join(wnode.rel, str(path)), "listed field of view is not an image group")
                continue
            self.add_image(inode, inode.rel)
            added.append((slot, str(path), inode.rel))
        return added

    def add_bioformats2raw(self, node: ZarrNode) -> None:
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
