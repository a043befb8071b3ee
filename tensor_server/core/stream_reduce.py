"""Streamed reduction of a scaled chunk's source extent (design: scaled-read-path.md §2).

A scaled chunk's level-0 extent can be large (transfer chunk × scale, e.g. 2048² × 32² px).
Instead of holding it, the extent is cut into *units* aligned to reduction blocks; each unit
is read, reduced with ``downsample_block`` and written into a preallocated output. Because
unit edges land on block edges, every output element depends on exactly one unit, and the
only ragged block is where the extent itself ends, so the streamed result is identical to
reducing the whole extent, for every method and dtype. Peak residency is one unit.
"""
from __future__ import annotations

import itertools
from typing import Callable, Sequence

import numpy as np

from tensor_server.core.bounds import Bounds
from tensor_server.core.uniform import fill_uniform_units

__all__ = ["streaming_unit", "stream_reduce", "scaled_output_shape", "iter_units"]

Fetch = Callable[[Bounds], np.ndarray]


def scaled_output_shape(extent: Sequence[int], scale: Sequence[int]) -> tuple[int, ...]:
    """ceil(extent / scale) per axis: the contract's output shape (edge padding included)."""
    return tuple(-(-int(n) // int(s)) for n, s in zip(extent, scale))


def streaming_unit(
    transfer: Sequence[int],
    read_block: Sequence[int] | None,
    scale: Sequence[int],
) -> tuple[int, ...]:
    """The unit a scaled read streams its extent in.

    Start from the transfer grid (a unit of about one transfer chunk of source pixels), floor
    it at ``read_block`` (what the reader cannot read below: a smaller unit would make every
    unit overlapping a block pay for decoding all of it; ``None`` = the reader crops cheaply),
    then round up to whole reduction blocks so units never split a block.
    """
    unit = []
    for axis, (t, s) in enumerate(zip(transfer, scale)):
        u = max(int(t), 1)
        if read_block is not None and read_block[axis] is not None:
            u = max(u, int(read_block[axis]))
        u = -(-u // s) * s
        unit.append(u)
    return tuple(unit)


def iter_units(bounds: Bounds, unit: Sequence[int]):
    """Yield the units covering ``bounds`` in row-major order (last axis fastest)."""
    ranges = [range(a, b, u) for a, b, u in zip(bounds.start, bounds.stop, unit)]
    for starts in itertools.product(*ranges):
        stops = tuple(min(a + u, b) for a, u, b in zip(starts, unit, bounds.stop))
        yield Bounds(starts, stops)


def stream_reduce(
    bounds: Bounds,
    unit: Sequence[int],
    scale: Sequence[int],
    method: str,
    fetch: Fetch,
    dtype: np.dtype,
    out: np.ndarray | None = None,
    *,
    unit_value: Callable[[Bounds], object | None] | None = None,
) -> np.ndarray:
    """Reduce ``bounds`` unit by unit into ``out`` (allocated when None); return ``out``.

    ``unit`` must be a whole number of reduction blocks on every axis (``streaming_unit``
    guarantees it); ``fetch(unit_bounds)`` returns that unit's level-0 pixels.
    ``unit_value(unit_bounds)``, consulted before each fetch, may answer a unit's reduced
    value in closed form (a uniform unit, ``core/uniform.py``): that unit is never fetched.
    """
    from tensor_server.core.downsample import downsample_block

    scale = tuple(int(s) for s in scale)
    if any(u % s for u, s in zip(unit, scale)):
        raise ValueError(f"unit {tuple(unit)} is not a whole number of blocks of scale {scale}")
    out_shape = scaled_output_shape(bounds.shape, scale)
    if out is None:
        out = np.empty(out_shape, dtype=dtype)
    elif out.shape != out_shape:
        raise ValueError(f"out has shape {out.shape}, expected {out_shape}")
    units = iter_units(bounds, unit)
    if unit_value is not None:
        units = fill_uniform_units(units, unit_value, out, bounds.start, scale)
    for ub in units:
        block = fetch(ub)
        reduced = downsample_block(block, scale, method)
        del block  # drop the unit before fetching the next: peak residency is one unit
        o0 = tuple((a - b0) // s for a, b0, s in zip(ub.start, bounds.start, scale))
        out[tuple(slice(a, a + n) for a, n in zip(o0, reduced.shape))] = reduced
    return out
