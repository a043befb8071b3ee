"""A served tensor as a virtual OME-Zarr image: its levels, metadata documents and chunk keys.

Pure mapping, no web framework (``http/app.py`` serves it). The invariant: zarr chunk ``k`` of
level ``L`` is exactly the engine chunk the planner mints for that level's grid cell ``k``,
so a zarr client reading the store gets the same bytes as a biopb client reading the plan,
and both fill and hit the same chunk cache entries.

* Levels are the tensor's advertised pyramid (``core.pyramid.advertised_levels``): level 0,
  then stored levels (``precompute``) or computed ones (the tensor's default method). A
  computed level's chunk grid is the transfer grid in output pixels (plan cell ``k`` covers
  level-0 ``[k·c·s, (k+1)·c·s)``); a stored level's is the level tensor's own grid.
* Zarr wants every chunk whole: an edge chunk is padded with the fill value (0).
* Chunks are raw little-endian C-order bytes (zarr v2 ``compressor: null``, v3 ``bytes``
  codec): every zarr client decodes them, and on loopback compression costs more than it saves.
* NGFF 0.4 (zarr v2: ``.zgroup``/``.zattrs``/``.zarray``) and NGFF 0.5 (zarr v3:
  ``zarr.json``) describe the same levels and chunks.
* zarr v3 levels are sharded (``sharding_indexed``, index at the end, no index checksum): a
  shard is one transfer-grid chunk (the same engine chunk and cache entry as the v2 chunk),
  split into inner chunks of ``INNER`` per axis where that divides it, so neuroglancer reads
  the index with a suffix range and fetches only the inner chunks it draws.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tensor_server.core.chunk_id import UNSCALED, ChunkId
from tensor_server.core.level_grid import GridLevel as ZarrLevel
from tensor_server.core.level_grid import grid_levels, level_chunk_id
from tensor_server.core.ngff import AXIS_TYPES, ngff_unit
from tensor_server.core.pyramid import PyramidPolicy

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.core.adapter_base import TensorAdapter

__all__ = ["ZarrLevel", "ZarrImage", "NGFF_VERSIONS"]

#: inner chunk side of a sharded zarr v3 level (a shard is one transfer-grid chunk)
INNER = 64

#: URL flavour -> (NGFF version, zarr format)
NGFF_VERSIONS = {"0.4": 2, "0.5": 3}


class ZarrImage:
    """The OME-Zarr view of ``tensor`` (and of its label tensors under ``labels/``)."""

    def __init__(
        self,
        tensor: TensorAdapter,
        *,
        name: str,
        labels: dict[str, TensorAdapter] | None = None,
        policy: PyramidPolicy | None = None,
        is_label_of: bool = False,
    ) -> None:
        self.tensor = tensor
        self.name = name
        self.labels = dict(labels or {})
        self.policy = policy
        self.is_label_of = is_label_of
        self.levels = grid_levels(tensor, policy)

    # ---- levels and chunks ---------------------------------------------------------------------
    def level(self, path: str) -> ZarrLevel | None:
        if not (path.isascii() and path.isdigit()):  # "²".isdigit() is True, int("²") raises
            return None
        i = int(path)
        return self.levels[i] if i < len(self.levels) else None

    def chunk_id(self, level: ZarrLevel, key: Sequence[int]) -> ChunkId | None:
        """The engine chunk behind zarr chunk ``key`` of ``level``, or None off the grid."""
        return level_chunk_id(self.tensor, level, key)

    def encode_chunk(self, level: ZarrLevel, data: np.ndarray, zarr_format: int = 2) -> memoryview:
        """A whole chunk's bytes: zarr v2, raw little-endian C order (edge chunks padded with
        0), a view of the chunk where no padding or byte swap is needed (no 8 MiB copy); zarr v3,
        the shard (``encode_shard``) when the level is sharded."""
        if tuple(data.shape) != level.chunks:
            padded = np.zeros(level.chunks, dtype=data.dtype)
            padded[tuple(slice(0, n) for n in data.shape)] = data
            data = padded
        little = data.dtype.newbyteorder("<") if data.dtype.byteorder not in ("|", "<") else data.dtype
        if zarr_format == 3 and inner_chunks(level.chunks) != level.chunks:
            return encode_shard(np.asarray(data, dtype=little), inner_chunks(level.chunks))
        return np.ascontiguousarray(data, dtype=little).data.cast("B")

    # ---- metadata ------------------------------------------------------------------------------
    def _axes(self) -> list[dict[str, Any]]:
        t = self.tensor
        units = t.physical_unit or (None,) * t.ndim
        axes = []
        for label, unit in zip(t.dim_labels, units):
            axis: dict[str, Any] = {"name": label}
            kind = AXIS_TYPES.get(label)
            if kind:
                axis["type"] = kind
                name = ngff_unit(unit) if kind in ("space", "time") else None
                if name:
                    axis["unit"] = name
            axes.append(axis)
        return axes

    def multiscales(self, version: str) -> list[dict[str, Any]]:
        t = self.tensor
        physical = t.physical_scale or (None,) * t.ndim
        datasets = []
        for lv in self.levels:
            scale = [float(p) * s if p else float(s) for p, s in zip(physical, lv.scale)]
            datasets.append({"path": lv.path, "coordinateTransformations": [{"type": "scale", "scale": scale}]})
        entry: dict[str, Any] = {"name": self.name, "axes": self._axes(), "datasets": datasets}
        if version == "0.4":
            entry["version"] = "0.4"
        method = next((lv.method for lv in self.levels if lv.method != UNSCALED), None)
        if method:
            entry["type"] = method
        return [entry]

    def group_attributes(self, version: str) -> dict[str, Any]:
        attrs: dict[str, Any] = {"multiscales": self.multiscales(version)}
        if self.is_label_of:
            attrs["image-label"] = {"version": version, "source": {"image": "../../"}}
        if version == "0.5":
            attrs = {"ome": {"version": "0.5", **attrs}}
            if self.is_label_of:
                attrs["ome"]["image-label"].pop("version")
        return attrs

    def labels_attributes(self, version: str) -> dict[str, Any]:
        names = sorted(self.labels)
        return {"labels": names} if version == "0.4" else {"ome": {"version": "0.5", "labels": names}}

    def zarray(self, level: ZarrLevel) -> dict[str, Any]:
        dtype = self.tensor.dtype
        return {
            "zarr_format": 2, "shape": list(level.shape), "chunks": list(level.chunks),
            "dtype": dtype.newbyteorder("<").str if dtype.byteorder != "|" else dtype.str,
            "compressor": None, "fill_value": _fill(dtype), "order": "C", "filters": None,
            "dimension_separator": ".",
        }

    def array_json_v3(self, level: ZarrLevel) -> dict[str, Any]:
        return {
            "zarr_format": 3, "node_type": "array", "shape": list(level.shape),
            "data_type": self.tensor.dtype.name,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(level.chunks)}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": _fill(self.tensor.dtype), "codecs": self._codecs_v3(level),
            "dimension_names": list(self.tensor.dim_labels), "attributes": {},
        }


    def _codecs_v3(self, level: ZarrLevel) -> list[dict[str, Any]]:
        raw = [{"name": "bytes", "configuration": {"endian": "little"}}]
        inner = inner_chunks(level.chunks)
        if inner == level.chunks:
            return raw
        return [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": list(inner), "codecs": raw, "index_location": "end",
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}}]


def inner_chunks(shard: Sequence[int]) -> tuple[int, ...]:
    """The inner chunks of a shard: ``INNER`` along an axis it divides, else the largest
    divisor of the axis in ``[INNER // 4, INNER]``, else the whole axis (1 along an axis of 1)."""
    out = []
    for n in shard:
        if n <= INNER:
            out.append(n)
            continue
        out.append(next((d for d in range(INNER, INNER // 4 - 1, -1) if n % d == 0), n))
    return tuple(out)


def encode_shard(data: np.ndarray, inner: Sequence[int]) -> memoryview:
    """A ``sharding_indexed`` shard of raw inner chunks (C order of the inner grid), then the
    index at the end: per inner chunk ``(offset, nbytes)`` as little-endian uint64. Every inner
    chunk is the same size, so the index is arithmetic and the body one transpose."""
    grid = [n // c for n, c in zip(data.shape, inner)]
    split = data.reshape([v for g, c in zip(grid, inner) for v in (g, c)])
    nd = data.ndim
    body = np.ascontiguousarray(split.transpose(list(range(0, 2 * nd, 2)) + list(range(1, 2 * nd, 2))))
    count = int(np.prod(grid))
    nbytes = body.nbytes // count
    index = np.empty((count, 2), "<u8")
    index[:, 0] = np.arange(count, dtype=np.uint64) * nbytes
    index[:, 1] = nbytes
    out = bytearray(body.nbytes + index.nbytes)
    out[:body.nbytes] = body.data.cast("B")
    out[body.nbytes:] = index.tobytes()
    return memoryview(out)


def _fill(dtype: np.dtype) -> Any:
    if dtype.kind == "b":
        return False
    if dtype.kind == "f":
        return 0.0
    return 0


def dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, indent=1).encode()
