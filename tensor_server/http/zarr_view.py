"""A served tensor as a virtual OME-Zarr image: its levels, metadata documents and chunk keys.

Pure mapping, no web framework (``http/app.py`` serves it). The invariant: zarr chunk ``k`` of
level ``L`` is exactly the engine chunk the planner mints for that level's grid cell ``k``,
so a zarr client reading the store gets the same bytes as a biopb client reading the plan,
and both fill and hit the same chunk cache entries.

* Levels are the tensor's published pyramid (``core.level_grid.grid_levels``): level 0,
  then stored levels (``precompute``) or computed ones (the tensor's default method). A
  computed level's chunk grid is the transfer grid in output pixels (plan cell ``k`` covers
  level-0 ``[k·c·s, (k+1)·c·s)``); a stored level's is the level tensor's own grid.
* Zarr wants every chunk whole: an edge chunk is padded with the fill value (0).
* Chunks are raw little-endian C-order bytes (zarr v2 ``compressor: null``, v3 ``bytes``
  codec): every zarr client decodes them, and on loopback compression costs more than it saves.
* NGFF 0.4 (zarr v2: ``.zgroup``/``.zattrs``/``.zarray``) and NGFF 0.5 (zarr v3:
  ``zarr.json``) describe the same levels and chunks; ``core/ngff.py`` writes the documents
  (the export writes the same ones) and decides which tensors are the image's labels.
* zarr v3 levels are sharded (``sharding_indexed``, index at the end, no index checksum): a
  shard is one transfer-grid chunk (the same engine chunk and cache entry as the v2 chunk),
  split into inner chunks of ``INNER`` per axis where that divides it, so neuroglancer reads
  the index with a suffix range and fetches only the inner chunks it draws.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tensor_server.core.chunk_id import ChunkId
from tensor_server.core.level_grid import GridLevel as ZarrLevel
from tensor_server.core.level_grid import grid_levels, level_chunk_id, scales_on
from tensor_server.core.ngff import NgffImage, NgffLevel, encode_shard, image_attributes
from tensor_server.core.pyramid import PyramidPolicy

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.core.adapter_base import TensorAdapter

__all__ = ["ZarrLevel", "ZarrImage", "NGFF_VERSIONS"]

#: inner chunk side of a sharded zarr v3 level (a shard is one transfer-grid chunk)
INNER = 64

#: URL flavour -> (NGFF version, zarr format)
NGFF_VERSIONS = {"0.4": 2, "0.5": 3}


class ZarrImage:
    """The OME-Zarr view of ``tensor`` and of its label tensors under ``labels/``.

    ``labels_of()`` answers the label images by name (``core.ngff.image_labels``) when a
    path asks for them, not when the view is made: a label set attached to the image after
    its view was cached is listed at once, and a chunk request never lists them."""

    def __init__(
        self,
        tensor: TensorAdapter,
        *,
        name: str,
        labels_of: Callable[[], Mapping[str, TensorAdapter]] | None = None,
        policy: PyramidPolicy | None = None,
        label_of: ZarrImage | None = None,
    ) -> None:
        """``label_of``: the image whose ``labels/`` this label image is under; it is
        published on that image's levels (``core.level_grid.scales_on``), as an export
        writes it."""
        self.tensor = tensor
        self.name = name
        self.labels_of = labels_of
        self.policy = policy
        self.is_label_of = label_of is not None
        scales = None if label_of is None else scales_on(label_of.tensor, [lv.scale for lv in label_of.levels], tensor)
        self.levels: list[ZarrLevel] = grid_levels(tensor, policy, scales=scales)

    @property
    def labels(self) -> Mapping[str, TensorAdapter]:
        return {} if self.labels_of is None else self.labels_of()

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
        the shard (``core.ngff.encode_shard``) when the level is sharded."""
        if tuple(data.shape) != level.chunks:
            padded = np.zeros(level.chunks, dtype=data.dtype)
            padded[tuple(slice(0, n) for n in data.shape)] = data
            data = padded
        little = data.dtype.newbyteorder("<") if data.dtype.byteorder not in ("|", "<") else data.dtype
        if zarr_format == 3 and inner_chunks(level.chunks) != level.chunks:
            return encode_shard(np.asarray(data, dtype=little), inner_chunks(level.chunks))
        return np.ascontiguousarray(data, dtype=little).data.cast("B")

    # ---- metadata (core/ngff.py writes the documents) -------------------------------------------
    def ngff(self) -> NgffImage:
        """The tensor's axes as they are, its physical size, and its published levels."""
        t = self.tensor
        return NgffImage(
            self.name,
            tuple(t.dim_labels),
            tuple(t.physical_unit or (None,) * t.ndim),
            tuple(t.physical_scale or (None,) * t.ndim),
            tuple(NgffLevel(lv.path, lv.scale, lv.method) for lv in self.levels),
        )

    def group_attributes(self, version: str) -> dict[str, Any]:
        montage = self.tensor.metadata.get("montage")
        return image_attributes(self.ngff(), version, label_of=self.is_label_of, montage=montage)

    def zarray(self, level: ZarrLevel) -> dict[str, Any]:
        dtype = self.tensor.dtype
        return {
            "zarr_format": 2,
            "shape": list(level.shape),
            "chunks": list(level.chunks),
            "dtype": dtype.newbyteorder("<").str if dtype.byteorder != "|" else dtype.str,
            "compressor": None,
            "fill_value": _fill(dtype),
            "order": "C",
            "filters": None,
            "dimension_separator": ".",
        }

    def array_json_v3(self, level: ZarrLevel) -> dict[str, Any]:
        return {
            "zarr_format": 3,
            "node_type": "array",
            "shape": list(level.shape),
            "data_type": self.tensor.dtype.name,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(level.chunks)}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": _fill(self.tensor.dtype),
            "codecs": self._codecs_v3(level),
            "dimension_names": list(self.tensor.dim_labels),
            "attributes": {},
        }

    def _codecs_v3(self, level: ZarrLevel) -> list[dict[str, Any]]:
        raw = [{"name": "bytes", "configuration": {"endian": "little"}}]
        inner = inner_chunks(level.chunks)
        if inner == level.chunks:
            return raw
        return [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": list(inner),
                    "codecs": raw,
                    "index_location": "end",
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                },
            }
        ]


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


def _fill(dtype: np.dtype) -> Any:
    if dtype.kind == "b":
        return False
    if dtype.kind == "f":
        return 0.0
    return 0


def dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, indent=1).encode()
