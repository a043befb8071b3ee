"""The published levels of a tensor, as chunk grids: the one list of levels every door that
publishes an image shares (the OME-Zarr view, IIIF and DeepZoom, ``export --levels auto``).

Which levels (``published_levels``): the file's stored levels where it has them; else level
0 and factors of 2 in Y and X until a plane fits one 512² tile (``PyramidPolicy.coarsest_tile``),
as viewers and converters (bioformats2raw, ngff-zarr) expect a pyramid to end, so an overview
is one tile, not a resize of a large level. Flight's descriptor pyramid is the reference's plane budget
(``core.pyramid.advertised_levels``: 4 Mpx planes, one XYZ level for a large volume), kept
because the biopb clients choose levels by that budget; its levels are a prefix of these
for a plane (both halve Y and X by 2), so the cache entries they fill are shared.

A level is one published level with the chunk grid a client addresses it by: a computed
level's grid is the transfer grid (the OME-Zarr view) or the tile grid (IIIF, DeepZoom) in
output pixels (cell ``k`` covers level-0 ``[k·c·s, (k+1)·c·s)``), a stored level's is the
level tensor's own grid. Cell ``k`` of a level is exactly the engine chunk the planner mints
for it on that grid, so the OME-Zarr view and a whole read over Flight, and the tile doors
and a viewer's tile reads over Flight, fill and hit the same chunk cache entries, and a
region of a level (``read_level_region``) is assembled from those chunks: a warm tile costs
cache hits and a crop, never a reduction.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from tensor_server_kernels.reference import output_shape

from tensor_server.core.bounds import Bounds
from tensor_server.core.chunk_id import PRECOMPUTE, UNSCALED, ChunkId
from tensor_server.core.methods import default_method
from tensor_server.core.pyramid import PyramidLevelSpec, PyramidPolicy, advertised_levels, plane_axes
from tensor_server.core.transfer_grid import scaled_virtual_chunk_size

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.core.adapter_base import TensorAdapter

__all__ = [
    "GridLevel",
    "published_levels",
    "grid_levels",
    "scales_on",
    "level_chunk_id",
    "level_extent",
    "read_level_region",
    "region_cells",
    "MAX_REGION_CHUNKS",
]

#: chunks one level region may assemble (a budget on client-sized input: a 512² tile over
#: 64² chunks is 64; a whole coarsest level of the default 4 Mpx budget at 256² is 64)
MAX_REGION_CHUNKS = 4096


@dataclass(frozen=True)
class GridLevel:
    """One served level: path ``str(index)``, its level-0 ``scale``, shape and chunk shape."""

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


def published_levels(tensor: TensorAdapter, policy: PyramidPolicy | None = None) -> list[PyramidLevelSpec]:
    """Level 0 first, coarsest last (module docstring): the stored levels, else factors of 2
    in Y and X down to one ``policy.coarsest_tile``² plane (at most ``policy.max_levels``)."""
    if tensor.native_levels:
        return advertised_levels(tensor, policy)
    policy = policy or PyramidPolicy()
    method = default_method(tensor.is_labels)
    y, x = plane_axes(tensor)
    axes = [a for a in (y, x) if a is not None]
    scale, shape = [1] * tensor.ndim, tuple(tensor.shape)
    levels = [PyramidLevelSpec(tuple(scale), method, shape, False)]
    while any(shape[a] > policy.coarsest_tile for a in axes) and len(levels) < policy.max_levels:
        for a in axes:
            scale[a] *= 2
        shape = output_shape(tensor.shape, scale)
        levels.append(PyramidLevelSpec(tuple(scale), method, shape, False))
    return levels


def scales_on(image: TensorAdapter, scales: Sequence[Sequence[int]], label: TensorAdapter) -> list[tuple[int, ...]]:
    """An image's level ``scales`` on a label image's axes (by axis label; 1 where the image
    has no such axis): a label image is published on its image's levels (NGFF wants them to
    coincide), whatever levels it stores itself."""
    names = image.dim_labels
    return [tuple(s[names.index(a)] if a in names else 1 for a in label.dim_labels) for s in scales]


def _levels_at(tensor: TensorAdapter, scales: Sequence[Sequence[int]]) -> list[PyramidLevelSpec]:
    """``tensor`` at given ``scales``: its stored level where it stores that scale, else
    computed with its default method."""
    stored = {tuple(lv.scale): lv for lv in tensor.native_levels}
    out = []
    for scale in map(tuple, scales):
        if scale in stored:
            out.append(PyramidLevelSpec(scale, PRECOMPUTE, tuple(stored[scale].tensor.shape), True))
        else:
            out.append(
                PyramidLevelSpec(scale, default_method(tensor.is_labels), output_shape(tensor.shape, scale), False)
            )
    return out


def grid_levels(
    tensor: TensorAdapter,
    policy: PyramidPolicy | None = None,
    *,
    tiles: bool = False,
    scales: Sequence[Sequence[int]] | None = None,
) -> list[GridLevel]:
    """Level 0 first, coarsest last (``published_levels``, or the levels of ``scales``: a
    label image's under its image, ``scales_on``). ``tiles``: computed levels on the tile
    grid (``tensor.tile_shape``, what a tile viewer's reads plan on), else on the transfer
    grid (the OME-Zarr view's chunks)."""
    grid = tensor.tile_shape if tiles else tensor.chunk_shape
    specs = published_levels(tensor, policy) if scales is None else _levels_at(tensor, scales)
    out = []
    for i, spec in enumerate(specs):
        scale = tuple(spec.scale)
        if spec.method == PRECOMPUTE and any(s != 1 for s in scale):
            stored = tensor.native_level(scale)
            assert stored is not None  # advertised_levels lists PRECOMPUTE only for stored levels
            lt = stored.tensor
            shape, chunks = tuple(lt.shape), tuple(min(c, n) for c, n in zip(lt.chunk_shape, lt.shape))
        else:
            shape = tuple(spec.shape)
            chunks = tuple(min(c, n) for c, n in zip(grid, shape))
        method = UNSCALED if all(s == 1 for s in scale) else spec.method
        out.append(GridLevel(i, scale, method, shape, chunks))
    return out


def level_chunk_id(tensor: TensorAdapter, level: GridLevel, key: Sequence[int]) -> ChunkId | None:
    """The engine chunk behind grid cell ``key`` of ``level``, or None off the grid."""
    return _grid_chunk_id(tensor.array_id, tensor.content_version, tuple(tensor.shape), level, tuple(key))


#: chunk ids ``level_chunk_id`` keeps: a tile's are minted again for every request, 11 µs and
#: 6 µs more for their bytes (``ChunkId.encode``) each, 16 of them for a 16-channel render-spec
#: tile (timeit, loaded 2-core machine, 2026-12-05); 4096 ids are about 4 MB
CHUNK_IDS_KEPT = 4096


@functools.lru_cache(maxsize=CHUNK_IDS_KEPT)
def _grid_chunk_id(
    array_id: str, content_version: bytes, shape: tuple[int, ...], level: GridLevel, key: tuple[int, ...]
) -> ChunkId | None:
    """``level_chunk_id`` of the tensor ``array_id`` at ``content_version`` and ``shape`` (all
    the id depends on, so a tensor that changed or grew gets new ids, never a kept one)."""
    if len(key) != len(shape) or any(k < 0 or k >= g for k, g in zip(key, level.grid())):
        return None
    if level.method == PRECOMPUTE:
        start = tuple(k * c for k, c in zip(key, level.chunks))
        stop = tuple(min(a + c, n) for a, c, n in zip(start, level.chunks, level.shape))
    else:
        virtual = scaled_virtual_chunk_size(level.chunks, level.scale, shape)
        start = tuple(k * v for k, v in zip(key, virtual))
        stop = tuple(min(a + v, n) for a, v, n in zip(start, virtual, shape))
    return ChunkId.for_extent(array_id, Bounds(start, stop), level.scale, level.method, content_version)


def region_cells(tensor: TensorAdapter, level: GridLevel, region: Bounds) -> list[tuple[tuple[int, ...], ChunkId]]:
    """(grid cell, engine chunk id) of every chunk of ``level`` under ``region`` (level
    coordinates, clipped by the caller to its shape). Refuses more than ``MAX_REGION_CHUNKS``.
    Counted and walked in plain Python (``math.prod``, ``itertools.product``): NumPy's took
    10 of the 21 µs a one-chunk region took, a render-spec tile lists one per visible channel."""
    from tensor_server.errors import RequestTooLarge

    first = tuple(a // c for a, c in zip(region.start, level.chunks))
    last = tuple((b - 1) // c for b, c in zip(region.stop, level.chunks))
    count = math.prod(b - a + 1 for a, b in zip(first, last))
    if count > MAX_REGION_CHUNKS:
        raise RequestTooLarge(
            f"a region of {region.shape} at level {level.path} of {tensor.array_id} spans "
            f"{count} chunks (limit {MAX_REGION_CHUNKS}); ask for a smaller region or size"
        )
    out = []
    for cell in itertools.product(*[range(a, b + 1) for a, b in zip(first, last)]):
        cid = level_chunk_id(tensor, level, cell)
        assert cid is not None  # the caller clipped the region to the level: every cell is on its grid
        out.append((cell, cid))
    return out


def level_extent(tensor: TensorAdapter, level: GridLevel, region: Bounds) -> Bounds | None:
    """The level-0 extent a computed level's ``region`` is reduced from (reading it at the
    level's scale gives exactly the region: windows start at multiples of the scale, as the
    chunks' do); None for a stored level, whose region is not computed from level 0."""
    if level.method == PRECOMPUTE:
        return None
    return Bounds(
        tuple(a * s for a, s in zip(region.start, level.scale)),
        tuple(min(b * s, n) for b, s, n in zip(region.stop, level.scale, tensor.shape)),
    )


def read_level_region(
    tensor: TensorAdapter,
    level: GridLevel,
    region: Bounds,
    chunk: Callable[[ChunkId], np.ndarray],
    cancelled: Callable[[], bool] | None = None,
    cells: list[tuple[tuple[int, ...], ChunkId]] | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Pixels of ``region`` (in ``level`` coordinates, clipped by the caller to its shape)
    assembled from the level's chunks, each got by ``chunk(id)`` (the engine's cached chunk
    read). Refuses more than ``MAX_REGION_CHUNKS`` chunks; stops when ``cancelled()``.
    ``cells``: ``region_cells`` of the region when the caller has them (listing them a second
    time was 65 µs per read, 1 ms of a warm 16-channel render-spec tile's 10 ms, under cProfile
    on a loaded 2-core machine, 2026-12-05: that tile reads 16 times). ``out``: an array of
    ``region``'s shape to fill (a slice of a larger one), else a new one."""
    from tensor_server.errors import ReadCancelled

    if out is None:
        out = np.empty(region.shape, dtype=tensor.dtype)
    for cell, cid in cells if cells is not None else region_cells(tensor, level, region):
        if cancelled is not None and cancelled():
            raise ReadCancelled(f"the read of a region of {tensor.array_id} was cancelled by the client")
        data = chunk(cid)
        lo = tuple(k * c for k, c in zip(cell, level.chunks))
        a = tuple(max(r, c0) for r, c0 in zip(region.start, lo))
        b = tuple(min(r, c0 + n) for r, c0, n in zip(region.stop, lo, data.shape))
        out[tuple(slice(x - r, y - r) for x, y, r in zip(a, b, region.start))] = data[
            tuple(slice(x - c0, y - c0) for x, y, c0 in zip(a, b, lo))
        ]
    return out
