"""What the read engine needs from a chunk cache (``ChunkStore``), and scaled reads assembled
from it.

Core defines the Protocol; ``tensor_server.cache.CacheManager`` implements it. Core never
imports the cache: the engine is handed a store. Keys are chunk ids (``ChunkId.encode()``) of
the **served** tensor — the tensor the client planned against, in its served axis order —
so an entry means the same pixels to every reader that can name it.

Cache-sourced units (a scaled extent whose full-resolution chunks are all cached): a
plan-minted scaled chunk's extent tiles exactly into the transfer grid, so its
full-resolution chunks are ordinary entries. When every one is cached, units are assembled
from entries instead of decoding the source again, and the pages they touch stay warm for
the full-resolution read that usually follows.

* Declines (None) when the extent is off the chunk grid or any chunk is missing; on a cold
  extent that costs one index probe.
* ``nearest`` sizes its unit at one chunk and borrows the entry's read-only array: the
  reduction picks straight out of it and returns new memory, so nothing borrowed escapes.
* Other methods read every byte anyway: they keep the source path's unit and copy chunks
  into one buffer reused across units (a fresh buffer per unit faults its pages during each
  copy: 31.7 ms against 8.3 ms for 32 MiB). The buffer is reused, so the caller must reduce
  each unit before fetching the next (``serial`` in the returned offer).
* An entry evicted between the probe and the read falls back to a source read of that unit.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from tensor_server.core.bounds import Bounds
from tensor_server.core.chunk_id import UNSCALED, ChunkId

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.core.adapter_base import TensorAdapter

__all__ = ["ChunkStore", "SourcedUnits", "cache_sourced_units", "chunk_boxes"]


@runtime_checkable
class ChunkStore(Protocol):
    """A chunk cache as the engine sees it. Arrays it returns are read-only."""

    def get(self, key: bytes) -> np.ndarray | None:
        """The cached chunk, or None."""

    def contains_all(self, keys: Sequence[bytes]) -> bool:
        """Whether every key is cached (one probe, no reads)."""

    def get_or_compute(self, key: bytes, compute: Callable[[], np.ndarray]) -> np.ndarray:
        """The cached chunk, or ``compute()`` stored and returned; concurrent misses of one
        key compute once."""


@dataclass(frozen=True)
class SourcedUnits:
    """An offer to read a scaled extent's units from the store instead of the source."""

    fetch: Callable[[Bounds], np.ndarray]
    unit: tuple[int, ...]
    #: the fetch reuses one buffer: reduce each unit before fetching the next
    serial: bool


def chunk_boxes(bounds: Bounds, chunk: Sequence[int], shape: Sequence[int]) -> list[Bounds]:
    """Transfer-grid chunks overlapping ``bounds`` (row-major)."""
    ranges = [range((a // c) * c, b, c) for a, b, c in zip(bounds.start, bounds.stop, chunk)]
    return [Bounds(vs, tuple(min(v + c, n) for v, c, n in zip(vs, chunk, shape))) for vs in itertools.product(*ranges)]


def _on_grid(bounds: Bounds, chunk: Sequence[int], shape: Sequence[int]) -> bool:
    return all(a % c == 0 for a, c in zip(bounds.start, chunk)) and all(
        b % c == 0 or b == n for b, c, n in zip(bounds.stop, chunk, shape)
    )


def cache_sourced_units(
    store: ChunkStore,
    tensor: TensorAdapter,
    bounds: Bounds,
    unit: tuple[int, ...],
    scale: tuple[int, ...],
    method: str,
) -> SourcedUnits | None:
    """Units of ``bounds`` assembled from ``store``, or None to read the source (docstring)."""
    chunk = tensor.chunk_shape
    shape = tensor.shape
    if not _on_grid(bounds, chunk, shape):
        return None
    ones = (1,) * tensor.ndim

    def key(box: Bounds) -> bytes:
        return ChunkId.for_extent(tensor.array_id, box, ones, UNSCALED, tensor.content_version).encode()

    boxes = chunk_boxes(bounds, chunk, shape)
    if not store.contains_all([key(b) for b in boxes]):
        return None

    if method == "nearest" and all(c % s == 0 for c, s in zip(chunk, scale)):

        def borrow(ub: Bounds) -> np.ndarray:
            arr = store.get(key(ub))
            if arr is None:  # evicted since the probe
                return tensor.get_data(ub)
            return arr  # read-only; the reduction materialises new memory

        return SourcedUnits(borrow, tuple(chunk), serial=False)

    buffer = np.empty(int(np.prod(unit)), dtype=tensor.dtype)

    def assemble(ub: Bounds) -> np.ndarray:
        out = buffer[: ub.size].reshape(ub.shape)
        for box in chunk_boxes(ub, chunk, shape):
            part = store.get(key(box))
            if part is None:  # evicted since the probe: read the whole unit from the source
                return tensor.get_data(ub)
            inter = box.intersect(ub)
            assert inter is not None  # chunk_boxes yields only chunks that meet the unit
            out[inter.relative_to(ub.start).to_slices()] = part[inter.relative_to(box.start).to_slices()]
        return out

    return SourcedUnits(assemble, tuple(unit), serial=True)
