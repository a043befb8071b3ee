"""The transfer grid: how a tensor is cut into the chunks that travel over the wire.

A chunk should be big enough to amortise a round trip and small enough to pipeline (the
biopb client fetches chunks in parallel and caps a message at 80 MiB). The sizer starts from
the backend's native granularity, the *seed* (a zarr chunk, an HDF5 chunk, a TIFF page, ...),
and either coalesces whole seeds up to ``TARGET_BYTES`` or divides a larger seed down to it:

* coalesce: grow Y and X together (the smaller one first, so tiles stay square), then the
  other axes from the innermost outwards, always by whole seeds, while the chunk stays within
  the target;
* divide: halve the plane axes T/C/Z/... first (outermost first) down to 1, then Y and X
  together, the larger first so tiles stay square, until the chunk fits the target.

A chunk never exceeds ``CEILING_BYTES``. Scaled chunks reuse the grid: a scaled chunk's source
extent is ``transfer × scale`` (``scaled_virtual_chunk_size``), so a delivered scaled chunk is
one transfer chunk and chunks tile without splitting a reduction block.

A second, finer grid serves small reads (``tile_chunk_shape``): a viewer's 512² tile on the
transfer grid of a uint8 image is one 2048×4096 chunk, so it moved and copied 32× its bytes,
and a tile of a computed level reduced 32× its extent (at scale 8 of an 8192² image, the whole
image for every tile). The tile grid halves the transfer chunk's plane axes down to
``TILE_MIN_PX``, never splitting a block the reader decodes whole, so a tile costs about what
it shows; the plan picks it per request (``core/plan.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

__all__ = [
    "TARGET_BYTES",
    "CEILING_BYTES",
    "spatial_axes",
    "default_seed",
    "transfer_chunk_shape",
    "scaled_virtual_chunk_size",
    "TILE_MIN_PX",
    "tile_chunk_shape",
]

TARGET_BYTES = 8 << 20
CEILING_BYTES = 64 << 20
#: The tile grid's least plane extent: the tile viewers ask for (OpenSeadragon's IIIF and
#: DeepZoom tiles, napari's are 256-1024). Smaller would cost a round trip per 256² of a
#: 512² tile, and a round trip (~1 ms) costs more than the bytes it saves.
TILE_MIN_PX = 512

# Axes a chunk is cut along last when dividing: splitting colour samples of one pixel into
# separate chunks would make every RGB read fetch three chunks.
_SAMPLE_LABELS = frozenset({"s", "rgb", "rgba", "sample", "samples"})


def spatial_axes(ndim: int, dim_labels: Sequence[str] | None = None) -> tuple[int, ...]:
    """Indices of the Y and X axes: by label when labelled, else the last two axes (the last
    non-sample ones when a trailing sample axis is labelled)."""
    if dim_labels is not None and len(dim_labels) == ndim:
        low = [str(d).lower() for d in dim_labels]
        found = tuple(i for i, d in enumerate(low) if d in ("y", "x"))
        if found:
            return found
        candidates = [i for i, d in enumerate(low) if d not in _SAMPLE_LABELS]
        return tuple(candidates[-2:])
    return tuple(range(max(0, ndim - 2), ndim))


def default_seed(shape: Sequence[int], dim_labels: Sequence[str] | None = None) -> tuple[int, ...]:
    """Seed for a reader without native blocks: one whole Y/X plane (plus sample axes)."""
    sp = set(spatial_axes(len(shape), dim_labels))
    low = [str(d).lower() for d in dim_labels] if dim_labels and len(dim_labels) == len(shape) else []
    return tuple(n if (i in sp or (low and low[i] in _SAMPLE_LABELS)) else 1 for i, n in enumerate(shape))


def _nbytes(chunk: Sequence[int], itemsize: int) -> int:
    return prod(chunk) * itemsize


def transfer_chunk_shape(
    shape: Sequence[int],
    itemsize: int,
    seed: Sequence[int] | None = None,
    dim_labels: Sequence[str] | None = None,
    target_bytes: int = TARGET_BYTES,
) -> tuple[int, ...]:
    """The transfer chunk shape for a tensor of ``shape`` (see module docstring)."""
    shape = tuple(max(int(n), 1) for n in shape)
    ndim = len(shape)
    if ndim == 0:
        return ()
    target_bytes = min(int(target_bytes), CEILING_BYTES)
    if seed is None:
        seed = default_seed(shape, dim_labels)
    seed = tuple(min(max(int(c), 1), n) for c, n in zip(seed, shape))
    spatial = spatial_axes(ndim, dim_labels)
    low = [str(d).lower() for d in dim_labels] if dim_labels and len(dim_labels) == ndim else []
    samples = [i for i in range(ndim) if low and low[i] in _SAMPLE_LABELS and i not in spatial]
    others = [i for i in range(ndim) if i not in spatial and i not in samples]

    if _nbytes(seed, itemsize) <= target_bytes:
        return _coalesce(shape, seed, itemsize, spatial, others + samples, target_bytes)
    return _divide(shape, seed, itemsize, spatial, others, samples, target_bytes)


def _coalesce(shape, seed, itemsize, spatial, others, target) -> tuple[int, ...]:
    mult = [1] * len(shape)

    def extent(axis: int, m: int) -> int:
        return min(seed[axis] * m, shape[axis])

    def chunk_with(axis: int, m: int) -> list[int]:
        c = [extent(i, mult[i]) for i in range(len(shape))]
        c[axis] = extent(axis, m)
        return c

    def max_fitting(axis: int) -> int:
        """Largest whole-seed multiple of ``axis`` that keeps the chunk within the target."""
        c = [extent(i, mult[i]) for i in range(len(shape))]
        c[axis] = 1
        per = _nbytes(c, itemsize)
        limit = max(target // per, 1)  # elements allowed along axis
        m = max(limit // seed[axis], 1)
        full = -(-shape[axis] // seed[axis])
        return min(m, full)

    # Y/X: double the smaller of the two (in elements) while it fits; when doubling no longer
    # fits, take the largest multiple that does, then stop growing the plane.
    while True:
        growable = [a for a in spatial if extent(a, mult[a]) < shape[a]]
        if not growable:
            break
        axis = min(growable, key=lambda a: (extent(a, mult[a]), -a))
        if _nbytes(chunk_with(axis, mult[axis] * 2), itemsize) <= target:
            mult[axis] *= 2
            continue
        best = max_fitting(axis)
        if best > mult[axis]:
            mult[axis] = best
            continue
        # The smaller axis cannot grow; the other may still (a very wide plane).
        rest = [a for a in growable if a != axis]
        grew = False
        for a in rest:
            best = max_fitting(a)
            if best > mult[a]:
                mult[a] = best
                grew = True
        if not grew:
            break
    # Then the other axes, innermost first, each as far as it fits at once.
    for axis in reversed(others):
        best = max_fitting(axis)
        if best > mult[axis]:
            mult[axis] = best
    return tuple(extent(i, mult[i]) for i in range(len(shape)))


def _divide(shape, seed, itemsize, spatial, others, samples, target) -> tuple[int, ...]:
    chunk = list(seed)

    def fits() -> bool:
        return _nbytes(chunk, itemsize) <= target

    for axis in others:  # outermost first: T before C before Z
        while chunk[axis] > 1 and not fits():
            chunk[axis] = -(-chunk[axis] // 2)
        if fits():
            return tuple(chunk)
    while not fits() and any(chunk[a] > 1 for a in spatial):
        # Halve the larger plane axis; equal ones together, so square tiles stay square.
        largest = max(chunk[a] for a in spatial)
        for axis in spatial:
            if chunk[axis] == largest:
                chunk[axis] = -(-chunk[axis] // 2)
    for axis in samples:
        while chunk[axis] > 1 and not fits():
            chunk[axis] = -(-chunk[axis] // 2)
    if _nbytes(chunk, itemsize) > CEILING_BYTES:  # only a single huge element could do this
        raise ValueError(f"one element of {itemsize} bytes exceeds the {CEILING_BYTES} B ceiling")
    return tuple(chunk)


def scaled_virtual_chunk_size(
    chunk_shape: Sequence[int], scale: Sequence[int], shape: Sequence[int]
) -> tuple[int, ...]:
    """Source extent of one scaled chunk: ``transfer × scale``, clamped to the tensor."""
    return tuple(min(int(c) * int(s), int(n)) for c, s, n in zip(chunk_shape, scale, shape))


def tile_chunk_shape(transfer: Sequence[int], blocks: Sequence[int], spatial: Sequence[int]) -> tuple[int, ...]:
    """The tile grid: ``transfer`` with its plane axes halved, the largest first (equal ones
    together, so square tiles stay square), while each halved extent is even, at least
    ``TILE_MIN_PX`` and a whole number of ``blocks`` (what the reader decodes whole: a zarr
    chunk, a TIFF tile; 1 where it crops cheaply). A block is never split: the tiles of one
    block would each decode all of it (a 4096² zarr chunk decoded 64 times for its 512²
    tiles), so where the transfer chunk is within one block the tile grid is the transfer
    grid. Other axes keep the transfer extent."""
    chunk = [int(c) for c in transfer]

    def halvable(axis: int) -> bool:
        c, half = chunk[axis], chunk[axis] // 2
        return c % 2 == 0 and half >= TILE_MIN_PX and half % int(blocks[axis]) == 0

    while spatial:
        largest = max(chunk[a] for a in spatial)
        axes = [a for a in spatial if chunk[a] == largest]
        if not all(halvable(a) for a in axes):
            break
        for a in axes:
            chunk[a] //= 2
    return tuple(chunk)
