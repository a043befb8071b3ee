"""Read plans: which chunks answer a (tensor, region, scale, method) request.

The algorithm is wire-protocol §3.4 (the reference server's): per axis, the virtual chunk is
``V = transfer × scale`` level-0 pixels (``scaled_virtual_chunk_size``, clamped to the axis); the request is snapped outward to whole V (the
*realized* region, which goes in ``descriptor.slice_hint``); the output is
``ceil(realized / scale)``; each grid cell becomes one chunk with an id naming its level-0
extent and output bounds relative to the realized region. Because the realized start is a
multiple of V (hence of the scale), output pixel ``i`` maps to level-0 ``start + i·scale``,
which is what the client's crop assumes, and scaled chunks are independent of the request.

Two grids, one per request (``grid``): the transfer grid (``tensor.chunk_shape``), and for a
read far smaller than its transfer chunks, the tile grid (``tensor.tile_shape``,
``transfer_grid.tile_chunk_shape``). ``"fit"`` takes the tile grid when the region snapped to the transfer grid is at least
``TILE_SAVING`` times the region snapped to the tile grid: a viewer's 512² tile then moves
and computes its own extent, while a whole-tensor read, a dask graph and a write plan keep the
transfer grid (a write plan must: an upload stores that grid). Either grid's chunks tile the
realized region and name their own extent, so the engine, the cache and the client need not
know which grid minted them.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tensor_server_kernels.reference import output_shape

from tensor_server.core.adapter_base import TensorAdapter
from tensor_server.core.bounds import Bounds
from tensor_server.core.chunk_id import PRECOMPUTE, UNSCALED, ChunkId
from tensor_server.core.methods import effective_method
from tensor_server.core.request import MAX_PLAN_CHUNKS, check_scale
from tensor_server.core.transfer_grid import CEILING_BYTES, scaled_virtual_chunk_size
from tensor_server.errors import InvalidArgument, InvalidBounds

__all__ = ["PlannedChunk", "ReadPlan", "plan_read", "GRIDS", "TILE_SAVING", "grid_of"]

#: ``plan_read``'s grid choices (module docstring)
GRIDS = ("fit", "transfer", "tile")
#: how much smaller (realized level-0 pixels) the tile grid's region must be for ``"fit"`` to
#: take it: below that, the transfer grid's fewer, larger chunks cost fewer round trips
TILE_SAVING = 4


@dataclass(frozen=True)
class PlannedChunk:
    chunk_id: ChunkId
    #: Bounds inside the realized output array (scaled pixels, 0-based): ChunkBounds on the wire.
    out_bounds: Bounds


@dataclass(frozen=True)
class ReadPlan:
    array_id: str
    #: The realized region in level-0 coordinates (the request snapped outward to the grid).
    realized: Bounds
    #: ceil(realized extent / scale): the realized output array's shape.
    shape: tuple[int, ...]
    scale: tuple[int, ...]
    #: The effective canonical method ("none" for unscaled reads).
    method: str
    #: The nominal delivered chunk shape in output pixels.
    chunk_shape: tuple[int, ...]
    chunks: tuple[PlannedChunk, ...]


def plan_read(
    tensor: TensorAdapter,
    region: Bounds | None = None,
    scale: Sequence[int] | None = None,
    method: str | None = None,
    grid: str = "fit",
) -> ReadPlan:
    """Plan a read of ``region`` (level-0, default the whole tensor) at ``scale`` on ``grid``
    (one of ``GRIDS``, module docstring).

    ``method`` is a wire method string; label tensors get their label-safe method
    (``effective_method``). Stops beyond the axis are clamped (the client's crop clips too);
    negative starts, empty or reversed intervals and wrong ranks raise InvalidBounds.

    A plan is a function of the tensor's geometry at its content version and of the request,
    so small plans (a viewer's tiles, asked again by every viewer and every pass) are kept
    (``_PLANS``): planning a 512² tile is ~100 us of Python under the GIL, a third of a warm
    SDK tile's server time.
    """
    key = _plan_key(tensor, region, scale, method, grid)
    with _PLANS_LOCK:
        plan = _PLANS.get(key)
        if plan is not None:
            _PLANS.move_to_end(key)
            return plan
    plan = _planned(tensor, region, scale, method, grid)
    if len(plan.chunks) <= REMEMBERED_PLAN_CHUNKS:
        with _PLANS_LOCK:
            _PLANS[key] = plan
            while len(_PLANS) > REMEMBERED_PLANS:
                _PLANS.popitem(last=False)
    return plan


#: plans kept by ``plan_read``, and the largest kept (a plan of more chunks is a bulk read,
#: planned once; its ids would hold memory for nothing)
REMEMBERED_PLANS = 2048
REMEMBERED_PLAN_CHUNKS = 64
_PLANS: OrderedDict[tuple[Any, ...], ReadPlan] = OrderedDict()
_PLANS_LOCK = threading.Lock()


def _plan_key(
    tensor: TensorAdapter, region: Bounds | None, scale: Sequence[int] | None, method: str | None, grid: str
) -> tuple[Any, ...]:
    """Everything ``_planned`` reads: the request, and the tensor's geometry at its content
    version (the tensor object too: a reopened source's tensor plans afresh)."""
    return (
        id(tensor),
        tensor.array_id,
        tensor.content_version,
        tensor.shape,
        tensor.chunk_shape,
        tensor.tile_shape,
        None if region is None else (region.start, region.stop),
        None if scale is None else tuple(scale),
        method,
        grid,
    )


def _planned(
    tensor: TensorAdapter,
    region: Bounds | None,
    scale: Sequence[int] | None,
    method: str | None,
    grid: str,
) -> ReadPlan:
    """``plan_read`` computed."""
    shape = tensor.shape
    ndim = tensor.ndim
    scale_t = check_scale(scale, shape)
    scaled = any(s != 1 for s in scale_t)
    if region is None:
        region = Bounds.full(shape)
    if region.ndim != ndim:
        raise InvalidBounds(f"slice has {region.ndim} axes but {tensor.array_id} has {ndim}")
    region = region.clamp(shape)
    region.validate(shape)
    if scaled:
        eff = effective_method(method, is_labels=tensor.is_labels)
    else:
        eff = UNSCALED
    if eff == PRECOMPUTE:
        return _plan_stored_level(tensor, region, scale_t)
    chunk = _grid_chunk(tensor, region, scale_t, grid)
    virtual = scaled_virtual_chunk_size(chunk, scale_t, shape)
    realized = _snapped(region, virtual, shape)
    rs, re = realized.start, realized.stop
    out_shape = output_shape(realized.shape, scale_t)
    out_chunk = tuple(min(c, n) for c, n in zip(chunk, out_shape))
    if _prod(out_chunk) * tensor.dtype.itemsize > CEILING_BYTES:
        raise InvalidArgument(f"{tensor.array_id}: chunk {out_chunk} exceeds the 64 MiB ceiling")

    starts_per_axis = [range(a, b, v) for a, b, v in zip(rs, re, virtual)]
    _check_plan_size(tensor, [len(r) for r in starts_per_axis])
    chunks = []
    for vs in itertools.product(*starts_per_axis):
        ve = tuple(min(a + v, n) for a, v, n in zip(vs, virtual, shape))
        cid = ChunkId.for_extent(tensor.array_id, Bounds(vs, ve), scale_t, eff, tensor.content_version)
        o0 = tuple((a - r) // s for a, r, s in zip(vs, rs, scale_t))  # exact: vs - rs is whole virtual chunks
        chunks.append(PlannedChunk(cid, Bounds(o0, tuple(o + n for o, n in zip(o0, cid.output_shape)))))
    return ReadPlan(
        array_id=tensor.array_id,
        realized=realized,
        shape=out_shape,
        scale=scale_t,
        method=eff,
        chunk_shape=out_chunk,
        chunks=tuple(chunks),
    )


def grid_of(tensor: TensorAdapter, cid: ChunkId) -> str:
    """The grid a computed chunk id was planned on, as far as its extent tells: ``"tile"``
    when it fits one tile-grid chunk and that grid is finer, else ``"transfer"`` (a transfer
    chunk cut short at the tensor's edge may read as a tile; either answer plans valid ids)."""
    tile = tensor.tile_shape
    if cid.method == PRECOMPUTE or tile == tensor.chunk_shape:
        return "transfer"
    fits = all(e <= t * s for e, t, s in zip(cid.bounds.shape, tile, cid.scale))
    return "tile" if fits else "transfer"


def _grid_chunk(tensor: TensorAdapter, region: Bounds, scale: tuple[int, ...], grid: str) -> tuple[int, ...]:
    """The chunk shape of the grid this plan is laid on."""
    if grid not in GRIDS:
        raise ValueError(f"grid must be one of {GRIDS}, not {grid!r}")
    transfer = tensor.chunk_shape
    if grid == "transfer":
        return transfer
    tile = tensor.tile_shape
    if grid == "tile" or tile == transfer:
        return tile
    shape = tensor.shape
    on_transfer = _snapped(region, scaled_virtual_chunk_size(transfer, scale, shape), shape)
    on_tile = _snapped(region, scaled_virtual_chunk_size(tile, scale, shape), shape)
    return tile if _prod(on_transfer.shape) >= TILE_SAVING * _prod(on_tile.shape) else transfer


def _snapped(region: Bounds, virtual: Sequence[int], shape: Sequence[int]) -> Bounds:
    """``region`` snapped outward to whole virtual chunks (clamped to the tensor)."""
    return Bounds(
        tuple((a // v) * v for a, v in zip(region.start, virtual)),
        tuple(min(-(-b // v) * v, n) for b, v, n in zip(region.stop, virtual, shape)),
    )


def _plan_stored_level(tensor: TensorAdapter, region: Bounds, scale: tuple[int, ...]) -> ReadPlan:
    """Plan a read of a level the file stores (``precompute``).

    The level has its own shape (often floor(S / s), not ceil) and its own transfer grid, so
    the grid is laid in the level's coordinates; its chunk ids carry level coordinates and
    the level's scale. The realized region is reported in level-0 coordinates (level start ×
    scale), which keeps the client's crop rule: output pixel i ↔ level-0 start + i·scale.
    """
    level = tensor.native_level(scale)
    if level is None:
        raise InvalidArgument(
            f"{tensor.array_id} stores no level at scale {scale}; "
            f"stored: {[lv.scale for lv in tensor.native_levels] or 'none'}"
        )
    lt = level.tensor
    a = tuple(min(r // s, n - 1) for r, s, n in zip(region.start, scale, lt.shape))
    b = tuple(max(min(-(-r // s), n), ai + 1) for r, s, n, ai in zip(region.stop, scale, lt.shape, a))
    chunk = lt.chunk_shape
    rl = tuple((ai // c) * c for ai, c in zip(a, chunk))
    rel = tuple(min(-(-bi // c) * c, n) for bi, c, n in zip(b, chunk, lt.shape))
    realized = Bounds(
        tuple(r * s for r, s in zip(rl, scale)),
        tuple(min(r * s, n) for r, s, n in zip(rel, scale, tensor.shape)),
    )
    starts_per_axis = [range(r0, r1, c) for r0, r1, c in zip(rl, rel, chunk)]
    _check_plan_size(tensor, [len(r) for r in starts_per_axis])
    chunks = []
    for vs in itertools.product(*starts_per_axis):
        ve = tuple(min(v + c, n) for v, c, n in zip(vs, chunk, lt.shape))
        cid = ChunkId.for_extent(tensor.array_id, Bounds(vs, ve), scale, PRECOMPUTE, tensor.content_version)
        chunks.append(PlannedChunk(cid, Bounds(vs, ve).relative_to(rl)))
    out_shape = tuple(r1 - r0 for r0, r1 in zip(rl, rel))
    return ReadPlan(
        array_id=tensor.array_id,
        realized=realized,
        shape=out_shape,
        scale=scale,
        method=PRECOMPUTE,
        chunk_shape=tuple(min(c, n) for c, n in zip(chunk, out_shape)),
        chunks=tuple(chunks),
    )


def _check_plan_size(tensor: TensorAdapter, per_axis: Sequence[int]) -> None:
    """Refuse a plan too large to serve (``MAX_PLAN_CHUNKS``) before minting it."""
    n = _prod(per_axis)
    if n > MAX_PLAN_CHUNKS:
        raise InvalidArgument(
            f"{tensor.array_id}: the request covers {n} chunks (more than {MAX_PLAN_CHUNKS}); "
            "ask for a region or a coarser scale"
        )


def _prod(values: Sequence[int]) -> int:
    out = 1
    for v in values:
        out *= v
    return out
