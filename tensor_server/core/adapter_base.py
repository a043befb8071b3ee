"""The adapter contract: SourceAdapter (a file or folder) and TensorAdapter (one N-D tensor).

Every format module implements ``TensorAdapter.read_region`` and inherits the read path:
``get_data`` (owned level-0 pixels), ``get_scaled_data`` (a reduced region, streamed, design
scaled-read-path.md §1–§2), ``get_decimated_data`` (nearest as a strided read, §4) and
``resolve_chunk_data`` (chunk id → pixels, the one seam the server calls).

Capabilities are declared, not probed: ``read_block_shape`` says what the reader cannot read
below (None = it crops cheaply), ``decimates`` says whether ``get_decimated_data`` is
offered. The conformance suite ``tensor_server.testing.AdapterTests`` checks both.
"""
from __future__ import annotations

import hashlib
import json
import os
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from tensor_server.core.bounds import Bounds
from tensor_server.core.cache_source import cache_sourced_units
from tensor_server.core.chunk_id import PRECOMPUTE, SERVING_EPOCH, UNSCALED, ChunkId
from tensor_server.core.methods import CANONICAL_METHODS, normalize_method
from tensor_server.core.stream_reduce import scaled_output_shape, stream_reduce, streaming_unit
from tensor_server.core.transfer_grid import default_seed, transfer_chunk_shape
from tensor_server.errors import InvalidArgument, InvalidBounds, InvalidChunkId, StaleChunkId

__all__ = [
    "TensorAdapter",
    "SourceAdapter",
    "NativeLevel",
    "owned_array",
    "file_content_version",
    "minted_content_version",
    "source_id_for_path",
    "check_scale",
]


# ---- helpers shared by adapters ------------------------------------------------------------
def native_dtype(dtype: Any) -> np.dtype:
    """``dtype`` in native byte order (the wire sends little-endian; the server is LE)."""
    dt = np.dtype(dtype)
    return dt.newbyteorder("=") if dt.byteorder not in ("=", "|") else dt


def owned_array(arr: np.ndarray, dtype: np.dtype | None = None) -> np.ndarray:
    """``arr`` as memory this call owns: writeable, C-contiguous, native byte order, not a
    view onto anything else (a reader's mmap, a cache entry, the caller's array). Copies
    only when one of those does not already hold."""
    arr = np.asarray(arr)
    target = native_dtype(dtype if dtype is not None else arr.dtype)
    if (
        arr.dtype == target
        and arr.flags.owndata
        and arr.flags.writeable
        and arr.flags.c_contiguous
        and type(arr) is np.ndarray
    ):
        return arr
    out = np.empty(arr.shape, dtype=target)
    np.copyto(out, arr, casting="unsafe" if arr.dtype.kind == target.kind else "same_kind")
    return out


_UNIT_ALIASES = {
    "µm": "micrometer", "μm": "micrometer", "um": "micrometer", "micron": "micrometer", "microns": "micrometer",
    "micrometre": "micrometer", "micrometers": "micrometer",
    "nm": "nanometer", "nanometre": "nanometer", "nanometers": "nanometer",
    "mm": "millimeter", "millimetre": "millimeter", "cm": "centimeter", "m": "meter", "metre": "meter",
    "å": "angstrom", "Å": "angstrom", "a": "angstrom", "ang": "angstrom", "angstroms": "angstrom",
    "pm": "picometer",
    "s": "second", "sec": "second", "seconds": "second", "ms": "millisecond", "µs": "microsecond", "us": "microsecond",
    "min": "minute", "h": "hour", "ev": "electronvolt",
    "1/nm": "1/nanometer", "nm^-1": "1/nanometer", "1/a": "1/angstrom", "a^-1": "1/angstrom", "å^-1": "1/angstrom",
    "1/um": "1/micrometer", "um^-1": "1/micrometer", "µm^-1": "1/micrometer",
}


def normalize_unit(unit: str | None) -> str | None:
    """One spelling per unit across formats: the UDUNITS names OME-NGFF uses
    ("micrometer", "nanometer", "angstrom", "second", ...). Unknown units pass through."""
    if unit is None:
        return None
    u = str(unit).strip()
    if not u:
        return None
    return _UNIT_ALIASES.get(u, _UNIT_ALIASES.get(u.lower(), u))


def check_scale(scale_hint: Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    if scale_hint is None or len(scale_hint) == 0:
        return (1,) * ndim
    if len(scale_hint) != ndim:
        raise InvalidArgument(f"scale_hint has {len(scale_hint)} axes but the tensor has {ndim}")
    out = []
    for s in scale_hint:
        if isinstance(s, bool) or not hasattr(s, "__index__") or int(s) < 1:
            raise InvalidArgument(f"scale_hint must be positive integers, got {tuple(scale_hint)}")
        out.append(int(s))
    return tuple(out)


def file_content_version(*paths: str | os.PathLike[str]) -> bytes:
    """A data version from file stats: mtime_ns and size of each path (16 bytes for one
    file, a digest for several), so a rewritten file never matches an old chunk id."""
    parts = []
    for p in paths:
        st = os.stat(p)
        parts.append(st.st_mtime_ns.to_bytes(8, "little", signed=True) + st.st_size.to_bytes(8, "little"))
    if len(parts) == 1:
        return parts[0]
    return hashlib.blake2b(b"".join(parts), digest_size=16).digest()


def minted_content_version() -> bytes:
    """A fresh random version for in-memory data (no file to stat)."""
    return uuid.uuid4().bytes


def source_id_for_path(path: str | os.PathLike[str]) -> str:
    """Stable id for a source at ``path``: readable stem plus a hash of the resolved path.
    Same across restarts, unique per path, never contains ``/``."""
    resolved = str(Path(path).resolve())
    name = Path(resolved).name
    for suffix in (".ome.zarr", ".ome.tiff", ".ome.tif", ".zarr", ".nii.gz"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    else:
        name = Path(name).stem or name
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:48] or "source"
    digest = hashlib.blake2b(resolved.encode(), digest_size=4).hexdigest()
    return f"{stem}-{digest}"


@dataclass(frozen=True)
class NativeLevel:
    """A pyramid level the file stores (advertised with method ``precompute``)."""

    scale: tuple[int, ...]
    tensor: TensorAdapter


# ---- TensorAdapter ---------------------------------------------------------------------------
class TensorAdapter(ABC):
    """One N-D tensor of a source. Subclasses implement :meth:`read_region`.

    Attributes set by the constructor: ``shape``, ``dtype`` (native byte order),
    ``dim_labels`` (lower-case), ``physical_scale``/``physical_unit`` (per axis or None),
    ``is_labels``, ``content_version``, ``metadata``; ``array_id`` is bound by the source.
    """

    #: Whether get_decimated_data serves nearest as a strided read (scaled-read-path.md §4).
    decimates: ClassVar[bool] = False

    def __init__(
        self,
        shape: Sequence[int],
        dtype: Any,
        *,
        dim_labels: Sequence[str] | None = None,
        native_chunk_shape: Sequence[int] | None = None,
        physical_scale: Sequence[float | None] | None = None,
        physical_unit: Sequence[str | None] | None = None,
        is_labels: bool = False,
        content_version: bytes | None = None,
        array_id: str = "",
        metadata: Mapping[str, Any] | None = None,
        transfer_chunk_shape: Sequence[int] | None = None,
    ) -> None:
        self.shape: tuple[int, ...] = tuple(int(n) for n in shape)
        self.dtype: np.dtype = native_dtype(dtype)
        ndim = len(self.shape)
        if dim_labels is None:
            dim_labels = _default_labels(ndim)
        if len(dim_labels) != ndim:
            raise ValueError(f"{len(dim_labels)} dim_labels for a {ndim}-D tensor")
        self.dim_labels: tuple[str, ...] = tuple(str(d).lower() for d in dim_labels)
        self.native_chunk_shape: tuple[int, ...] | None = (
            None if native_chunk_shape is None else tuple(int(c) for c in native_chunk_shape)
        )
        self.physical_scale = None if physical_scale is None else tuple(physical_scale)
        self.physical_unit = None if physical_unit is None else tuple(normalize_unit(u) for u in physical_unit)
        self.is_labels = bool(is_labels)
        self.content_version: bytes = content_version or minted_content_version()
        self.array_id = array_id
        self.metadata: dict[str, Any] = dict(metadata or {})
        self._transfer_override = (
            None if transfer_chunk_shape is None else tuple(int(c) for c in transfer_chunk_shape)
        )
        self.native_levels: list[NativeLevel] = []

    # ---- geometry ---------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def seed_shape(self) -> tuple[int, ...]:
        """The backend's native granularity that the transfer grid grows from."""
        if self.native_chunk_shape is not None:
            return self.native_chunk_shape
        return default_seed(self.shape, self.dim_labels)

    @cached_property
    def chunk_shape(self) -> tuple[int, ...]:
        """The transfer grid (level-0 pixels per chunk)."""
        if self._transfer_override is not None:
            return tuple(min(c, n) for c, n in zip(self._transfer_override, self.shape))
        return transfer_chunk_shape(self.shape, self.dtype.itemsize, self.seed_shape, self.dim_labels)

    @property
    def read_block_shape(self) -> tuple[int, ...] | None:
        """What this reader cannot read below (§3). Default: the native seed when there is
        one; ``None`` means the reader can crop cheaply (memmap, ROI reads)."""
        return self.native_chunk_shape

    def get_output_dtype(self, method: str | None = None) -> np.dtype:
        """Scaled reads keep the input dtype, for every method."""
        return self.dtype

    # ---- reads ------------------------------------------------------------------------------
    @abstractmethod
    def read_region(self, bounds: Bounds) -> np.ndarray:
        """Level-0 pixels of validated ``bounds``, shape ``bounds.shape``. May return a view
        onto reader memory: ``get_data`` makes it owned."""

    def check_bounds(self, bounds: Bounds | Sequence[slice] | None) -> Bounds:
        if bounds is None:
            return Bounds.full(self.shape)
        if not isinstance(bounds, Bounds):
            bounds = Bounds.from_slices(bounds, self.shape)
        return bounds.validate(self.shape)

    def get_data(self, bounds: Bounds | None = None) -> np.ndarray:
        """Owned level-0 pixels of ``bounds`` (the whole tensor when None)."""
        bounds = self.check_bounds(bounds)
        arr = self.read_region(bounds)
        if tuple(arr.shape) != bounds.shape:
            raise RuntimeError(
                f"{type(self).__name__}.read_region returned shape {arr.shape} for {bounds}"
            )
        return owned_array(arr, self.dtype)

    def get_decimated_data(self, bounds: Bounds, step: Sequence[int]) -> np.ndarray | None:
        """``get_data(bounds)[::step]`` read with a stride, or None when the reader cannot
        skip the unpicked pixels (the caller then streams). Offer it by overriding and
        setting ``decimates = True``."""
        return None

    def get_scaled_data(
        self,
        bounds: Bounds | None,
        scale_hint: Sequence[int],
        reduction_method: str | None,
        cache_manager: Any | None = None,
    ) -> np.ndarray:
        """Reduced pixels of ``bounds``: ``downsample_block(get_data(bounds), scale, method)``
        exactly (shape ceil(extent/scale), input dtype, owned), computed by streaming."""
        from tensor_server.core.downsample import downsample_block

        bounds = self.check_bounds(bounds)
        scale = check_scale(scale_hint, self.ndim)
        method = normalize_method(reduction_method)
        if method not in CANONICAL_METHODS:
            raise InvalidArgument(f"method {method!r} cannot be computed; it names stored levels")
        if all(s == 1 for s in scale):
            return self.get_data(bounds)
        expected = scaled_output_shape(bounds.shape, scale)
        if method == "nearest" and self.decimates:
            dec = self.get_decimated_data(bounds, scale)
            if dec is not None:
                if tuple(dec.shape) != expected:
                    raise RuntimeError(
                        f"{type(self).__name__}.get_decimated_data returned {dec.shape}, "
                        f"expected {expected}"
                    )
                return owned_array(dec, self.dtype)
        unit = streaming_unit(self.chunk_shape, self.read_block_shape, scale)
        fetch = self.get_data
        offered = cache_sourced_units(self, bounds, unit, scale, method, cache_manager)
        if offered is not None:
            fetch, unit = offered
        if all(u >= n for u, n in zip(unit, bounds.shape)):
            return owned_array(downsample_block(fetch(bounds), scale, method), self.dtype)
        return stream_reduce(bounds, unit, scale, method, fetch, self.dtype)

    # ---- chunk ids --------------------------------------------------------------------------
    def mint_chunk_id(self, bounds: Bounds, scale: Sequence[int], method: str) -> ChunkId:
        """The id of the chunk reducing level-0 ``bounds`` by ``scale`` with ``method``."""
        return ChunkId.for_extent(self.array_id, bounds, scale, method, self.content_version)

    def check_chunk_id(self, chunk_id: bytes | ChunkId) -> ChunkId:
        """Decode and validate a chunk id of this tensor: foreign, stale or out-of-range ids
        raise instead of reading (a stale id is refused even if its bytes are still cached)."""
        cid = chunk_id if isinstance(chunk_id, ChunkId) else ChunkId.decode(chunk_id)
        if cid.array_id != self.array_id:
            raise InvalidChunkId(f"chunk id names {cid.array_id!r}, not {self.array_id!r}")
        if cid.content_version != self.content_version or cid.epoch != SERVING_EPOCH:
            raise StaleChunkId(f"{self.array_id}: the data changed since this chunk was planned; re-plan")
        level = self.native_level(cid.scale) if cid.method == PRECOMPUTE else None
        if cid.method == PRECOMPUTE and level is None:
            raise InvalidChunkId(f"{self.array_id} stores no level at scale {cid.scale}")
        try:
            cid.bounds.validate(level.tensor.shape if level is not None else self.shape)
        except InvalidBounds as exc:
            raise InvalidChunkId(f"chunk id extent does not fit {self.array_id}: {exc}") from None
        return cid

    def compute_chunk_data(self, cid: ChunkId, cache_manager: Any | None = None) -> np.ndarray:
        """A validated chunk's pixels, computed (never looked up as a cache entry):
        unscaled → get_data, stored level → the level, scaled → get_scaled_data (which may
        assemble its units from cached full-resolution chunks)."""
        if cid.method == UNSCALED:
            return self.get_data(cid.bounds)
        if cid.method == PRECOMPUTE:
            return self.get_native_level_data(cid.bounds, cid.scale)
        return self.get_scaled_data(cid.bounds, cid.scale, cid.method, cache_manager)

    def resolve_chunk_data(self, chunk_id: bytes | ChunkId, cache_manager: Any | None = None) -> np.ndarray:
        """Owned pixels of a chunk this tensor minted. With a cache: a hit is the stored
        chunk (no decode), a miss is computed then stored."""
        cid = self.check_chunk_id(chunk_id)
        if cache_manager is None:
            return self.compute_chunk_data(cid)
        data = cache_manager.get_or_compute(cid.encode(), lambda: self.compute_chunk_data(cid, cache_manager))
        return owned_array(data, self.dtype)  # cache entries are read-only: hand out a copy

    def stale_reason(self, bounds: Bounds) -> str | None:
        """Why the bytes under ``bounds`` may differ from what this tensor saw at open (a
        chunk file or the file rewritten in place), or None. Called before serving every
        chunk, cached or not, so it must be cheap (stats, never reads). A reason makes the
        server refuse the chunk as stale and reopen the source under a new content version.
        Default None: nothing cheap to check (in-memory data, formats not overriding it)."""
        return None

    def native_level(self, scale: Sequence[int]) -> NativeLevel | None:
        scale = tuple(int(s) for s in scale)
        for level in self.native_levels:
            if level.scale == scale:
                return level
        return None

    def get_native_level_data(self, bounds: Bounds, scale: Sequence[int]) -> np.ndarray:
        """Pixels of a stored pyramid level (``precompute``); ``bounds`` are in that level's
        own coordinates (see plan._plan_stored_level)."""
        level = self.native_level(scale)
        if level is None:
            raise InvalidArgument(f"{self.array_id}: no stored level at scale {tuple(scale)}")
        return level.tensor.get_data(bounds)

    def describe(self) -> dict[str, Any]:
        """Plain-data summary (for listings and metadata_json)."""
        return {
            "array_id": self.array_id,
            "shape": list(self.shape),
            "dtype": self.dtype.str,
            "dim_labels": list(self.dim_labels),
            "chunk_shape": list(self.chunk_shape),
            "read_block_shape": None if self.read_block_shape is None else list(self.read_block_shape),
            "physical_scale": None if self.physical_scale is None else list(self.physical_scale),
            "physical_unit": None if self.physical_unit is None else list(self.physical_unit),
            "is_labels": self.is_labels,
            "native_levels": [list(lv.scale) for lv in self.native_levels],
        }

    def close(self) -> None:
        """Release file handles (the reader reopens lazily on the next read)."""

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.array_id or '?'} {self.shape} {self.dtype.str} "
            f"{''.join(self.dim_labels) if all(len(d) == 1 for d in self.dim_labels) else self.dim_labels}>"
        )


def _default_labels(ndim: int) -> tuple[str, ...]:
    canonical = ("t", "c", "z", "y", "x")
    if ndim <= 5:
        return canonical[5 - ndim :]
    return tuple(f"dim_{i}" for i in range(ndim - 5)) + canonical


# ---- SourceAdapter ---------------------------------------------------------------------------
class SourceAdapter:
    """A file or folder with one or more tensors (``tensors``: field name → TensorAdapter).

    The first field is the default tensor. A single-tensor source's tensor has
    ``array_id == source_id``; otherwise ``source_id/field``.
    """

    #: Short format name (``"zarr"``, ``"ome-tiff"``, ...), the catalog's source type.
    format_name: ClassVar[str] = "unknown"

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        tensors: Mapping[str, TensorAdapter],
        *,
        source_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        source_type: str | None = None,
    ) -> None:
        self.path = None if path is None else Path(path)
        if source_id is None:
            source_id = source_id_for_path(path) if path is not None else f"mem-{uuid.uuid4().hex[:8]}"
        if "/" in source_id:
            raise ValueError(f"source_id may not contain '/': {source_id!r}")
        self.source_id = source_id
        self.type = source_type or self.format_name
        self.metadata: dict[str, Any] = dict(metadata or {})
        if not tensors:
            raise ValueError(f"{path}: a source needs at least one tensor")
        self.tensors: dict[str, TensorAdapter] = dict(tensors)
        #: Files and folders this source covers (discovery skips them as separate sources:
        #: the five files of a multi-file OME-TIFF are one source). Adapters that span
        #: several files add them.
        self.member_paths: set[Path] = set() if path is None else {Path(path).resolve()}
        single = len(self.tensors) == 1
        for field, tensor in self.tensors.items():
            tensor.array_id = source_id if single else f"{source_id}/{field}"

    @property
    def url(self) -> str:
        return self.path.resolve().as_uri() if self.path is not None else f"memory://{self.source_id}"

    @property
    def default_field(self) -> str:
        return next(iter(self.tensors))

    def tensor(self, field: str | None = None) -> TensorAdapter:
        """The tensor ``field`` (the default tensor when None)."""
        if field is None:
            return self.tensors[self.default_field]
        try:
            return self.tensors[field]
        except KeyError:
            from tensor_server.errors import TensorNotFound

            raise TensorNotFound(f"{self.source_id}: no tensor {field!r}; fields: {list(self.tensors)}") from None

    def metadata_json(self) -> str:
        """The reference server's wrapper: ``{"type", "dim_label", "metadata"}``."""
        t = self.tensor()
        return json.dumps(
            {"type": self.type, "dim_label": list(t.dim_labels), "metadata": self.metadata},
            default=str,
        )

    def close(self) -> None:
        for tensor in self.tensors.values():
            tensor.close()

    def __enter__(self) -> SourceAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.source_id} {self.type} fields={list(self.tensors)}>"
