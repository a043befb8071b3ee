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
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from tensor_server.core.bounds import Bounds
from tensor_server.core.chunk_id import PRECOMPUTE, UNSCALED, ChunkId
from tensor_server.core.ngff import AXIS_TYPES, ngff_unit
from tensor_server.core.pyramid import PyramidPolicy, advertised_levels

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.core.adapter_base import TensorAdapter

__all__ = ["ZarrLevel", "ZarrImage", "NGFF_VERSIONS"]

#: URL flavour -> (NGFF version, zarr format)
NGFF_VERSIONS = {"0.4": 2, "0.5": 3}


@dataclass(frozen=True)
class ZarrLevel:
    """One level of the virtual image: path ``str(index)``."""

    index: int
    scale: tuple[int, ...]
    method: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]

    @property
    def path(self) -> str:
        return str(self.index)

    def grid(self) -> tuple[int, ...]:
        return tuple(-(-n // c) for n, c in zip(self.shape, self.chunks))


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
        self.levels = self._levels()

    # ---- levels and chunks ---------------------------------------------------------------------
    def _levels(self) -> list[ZarrLevel]:
        t = self.tensor
        out = []
        for i, spec in enumerate(advertised_levels(t, self.policy)):
            scale = tuple(spec.scale)
            if spec.method == PRECOMPUTE and any(s != 1 for s in scale):
                lt = t.native_level(scale).tensor
                shape, chunks = tuple(lt.shape), tuple(min(c, n) for c, n in zip(lt.chunk_shape, lt.shape))
            else:
                shape = tuple(spec.shape)
                chunks = tuple(min(c, n) for c, n in zip(t.chunk_shape, shape))
            method = UNSCALED if all(s == 1 for s in scale) else spec.method
            out.append(ZarrLevel(i, scale, method, shape, chunks))
        return out

    def level(self, path: str) -> ZarrLevel | None:
        if not path.isdigit():
            return None
        i = int(path)
        return self.levels[i] if i < len(self.levels) else None

    def chunk_id(self, level: ZarrLevel, key: Sequence[int]) -> ChunkId | None:
        """The engine chunk behind zarr chunk ``key`` of ``level``, or None off the grid."""
        t = self.tensor
        if len(key) != t.ndim or any(k < 0 or k >= g for k, g in zip(key, level.grid())):
            return None
        if level.method == PRECOMPUTE:
            start = tuple(k * c for k, c in zip(key, level.chunks))
            stop = tuple(min(a + c, n) for a, c, n in zip(start, level.chunks, level.shape))
        else:
            virtual = tuple(c * s for c, s in zip(level.chunks, level.scale))
            start = tuple(k * v for k, v in zip(key, virtual))
            stop = tuple(min(a + v, n) for a, v, n in zip(start, virtual, t.shape))
        return ChunkId.for_extent(t.array_id, Bounds(start, stop), level.scale, level.method, t.content_version)

    def encode_chunk(self, level: ZarrLevel, data: np.ndarray) -> memoryview:
        """Raw little-endian C-order bytes of a whole chunk (edge chunks padded with 0), as a
        view of the chunk where no padding or byte swap is needed (no 8 MiB copy)."""
        if tuple(data.shape) != level.chunks:
            padded = np.zeros(level.chunks, dtype=data.dtype)
            padded[tuple(slice(0, n) for n in data.shape)] = data
            data = padded
        little = data.dtype.newbyteorder("<") if data.dtype.byteorder not in ("|", "<") else data.dtype
        return memoryview(np.ascontiguousarray(data, dtype=little)).cast("B")

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
            "fill_value": _fill(self.tensor.dtype), "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "dimension_names": list(self.tensor.dim_labels), "attributes": {},
        }


def _fill(dtype: np.dtype) -> Any:
    if dtype.kind == "b":
        return False
    if dtype.kind == "f":
        return 0.0
    return 0


def dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, indent=1).encode()
