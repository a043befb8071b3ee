"""Scaled reads assembled from cached full-resolution chunks (scaled-read-path.md §6).

A plan-minted scaled chunk's extent tiles exactly into the transfer grid, so its
full-resolution chunks are ordinary cache entries. When every one of them is cached, units
are assembled from the entries instead of decoding the source again, and the pages they
touch stay warm for the full-resolution read that usually follows.

* It declines (returns None) when the extent is off the chunk grid or any chunk is missing;
  on a cold extent that costs one index lookup (the first key misses).
* ``nearest`` sizes its unit at one chunk and borrows the entry's read-only mapping: the
  reduction picks straight out of it and returns new memory, so nothing borrowed escapes.
* Other methods read every byte anyway, so they keep the source path's unit and copy chunks
  into a fresh buffer per unit: ``stream_reduce`` reads units ahead on several threads, so a
  buffer reused across units would be overwritten while an earlier unit is still reduced.
* An entry evicted between the probe and the read falls back to a source read of that unit.
"""
from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from tensor_server.core.bounds import Bounds
from tensor_server.core.chunk_id import UNSCALED

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.cache.manager import CacheManager
    from tensor_server.core.adapter_base import TensorAdapter

__all__ = ["cache_sourced_fetch", "chunk_boxes"]


def chunk_boxes(bounds: Bounds, chunk: Sequence[int], shape: Sequence[int]) -> list[Bounds]:
    """Transfer-grid chunks overlapping ``bounds`` (row-major)."""
    ranges = [range((a // c) * c, b, c) for a, b, c in zip(bounds.start, bounds.stop, chunk)]
    return [Bounds(vs, tuple(min(v + c, n) for v, c, n in zip(vs, chunk, shape))) for vs in itertools.product(*ranges)]


def _on_grid(bounds: Bounds, chunk: Sequence[int], shape: Sequence[int]) -> bool:
    return all(a % c == 0 for a, c in zip(bounds.start, chunk)) and all(
        b % c == 0 or b == n for b, c, n in zip(bounds.stop, chunk, shape)
    )


def cache_sourced_fetch(
    cache: CacheManager,
    tensor: TensorAdapter,
    bounds: Bounds,
    unit: tuple[int, ...],
    scale: tuple[int, ...],
    method: str,
) -> tuple[Callable[[Bounds], np.ndarray], tuple[int, ...]] | None:
    chunk = tensor.chunk_shape
    shape = tensor.shape
    if not _on_grid(bounds, chunk, shape):
        return None
    ones = (1,) * tensor.ndim

    def key(box: Bounds) -> bytes:
        return tensor.mint_chunk_id(box, ones, UNSCALED).encode()

    boxes = chunk_boxes(bounds, chunk, shape)
    if not cache.contains_all([key(b) for b in boxes]):
        return None

    if method == "nearest" and all(c % s == 0 for c, s in zip(chunk, scale)):
        def borrow(ub: Bounds) -> np.ndarray:
            arr = cache.get(key(ub))
            if arr is None:  # evicted since the probe
                return tensor.get_data(ub)
            return arr  # read-only view; the reduction materialises new memory

        return borrow, tuple(chunk)

    def assemble(ub: Bounds) -> np.ndarray:
        out = np.empty(ub.shape, dtype=tensor.dtype)
        for box in chunk_boxes(ub, chunk, shape):
            part = cache.get(key(box))
            if part is None:  # evicted since the probe: read the whole unit from the source
                return tensor.get_data(ub)
            inter = box.intersect(ub)
            out[inter.relative_to(ub.start).to_slices()] = part[inter.relative_to(box.start).to_slices()]
        return out

    return assemble, tuple(unit)
