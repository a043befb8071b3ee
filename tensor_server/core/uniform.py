"""Uniform ("special") storage blocks: blocks a format's metadata says hold one value.

Masks, label images and sparse acquisitions are mostly blocks of one value: zarr chunk keys
that were never written (they read as ``fill_value``), unallocated HDF5 chunks, sparse TIFF
tiles (offset 0, byte count 0), blosc2 ZERO/VALUE chunks. An adapter that can tell them from
metadata declares ``reports_uniform_blocks`` and answers ``uniform_blocks(bounds)``; the read
engine then answers such pixels in closed form instead of decoding them.

Closed form is exact by construction: the value a method gives a block of one value ``v``
is computed by the same kernel on one block of ``v`` (``reduced_constant``), so ``area`` of a
float64 ``0.1`` is whatever the oracle's float64 sum-then-divide gives, NaN stays NaN and an
integer mean is ``v``. An edge-padded ragged block of ``v`` is the same block of ``v``.

Uniform pixels travel as read-only broadcast arrays (``uniform_array``: every stride 0, one
element of memory); ``constant_value`` recognises them, so the chunk cache can keep a value
instead of megabytes and DoGet can send one shared buffer.

Adding a format (the hook uploads use): set ``reports_uniform_blocks = True`` on the tensor
and answer ``uniform_blocks(bounds)`` from the format's own index, usually with
``grid_uniform_blocks(bounds, chunk, shape, value_at)`` where ``value_at(grid index)`` is the
block's value or None. A ``cache://`` upload member would answer 0 for chunks missing from
its index and the stored value for chunks uploaded as a uniform record (no bytes). Cache the
index per ``content_version`` so a rewrite is seen; a block reported wrongly is wrong pixels,
so the conformance suite decodes every reported block and compares.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from tensor_server.core.bounds import Bounds

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.core.adapter_base import TensorAdapter

__all__ = [
    "UniformBlock",
    "uniform_value",
    "covering_value",
    "grid_uniform_blocks",
    "uniform_array",
    "constant_value",
    "reduced_constant",
    "same_value",
    "fill_uniform_units",
]

#: (storage block extent in tensor coordinates, the one value all its pixels hold)
UniformBlock = tuple[Bounds, np.generic]


def same_value(a: np.generic, b: np.generic) -> bool:
    """Bitwise equality: NaN equals a NaN of the same bits; -0.0 and +0.0 differ (a block of
    -0.0 next to one of +0.0 is decoded, never guessed)."""
    if a is b:  # one fill value object for every absent block: the common case, and cheap
        return True
    return np.asarray(a).tobytes() == np.asarray(b).tobytes() and np.asarray(a).dtype == np.asarray(b).dtype


def uniform_value(tensor: TensorAdapter, bounds: Bounds) -> np.generic | None:
    """The one value every pixel of ``bounds`` holds according to the tensor's metadata, or
    None (not declared, not covered by uniform blocks, or blocks of different values)."""
    if not tensor.reports_uniform_blocks:
        return None
    return covering_value(tensor.uniform_blocks(bounds), bounds)


def covering_value(blocks: Iterable[UniformBlock], bounds: Bounds) -> np.generic | None:
    """The one value ``blocks`` (disjoint) give every pixel of ``bounds``, or None when they
    leave a pixel uncovered or disagree."""
    value: np.generic | None = None
    covered = 0
    for box, v in blocks:
        n = 1
        for a, b, c, d in zip(box.start, box.stop, bounds.start, bounds.stop):
            n *= max(0, min(b, d) - max(a, c))
        if n == 0:
            continue
        if value is None:
            value = v
        elif not same_value(value, v):
            return None
        covered += n
    return value if value is not None and covered == bounds.size else None


def grid_uniform_blocks(
    bounds: Bounds,
    block: Sequence[int],
    shape: Sequence[int],
    value_at: Callable[[tuple[int, ...]], np.generic | None],
) -> list[UniformBlock]:
    """``uniform_blocks`` of a regular block grid (zarr, HDF5, blosc2 chunks): the blocks
    overlapping ``bounds`` for which ``value_at(grid index)`` names a value."""
    ranges = [range(a // c, -(-b // c)) for a, b, c in zip(bounds.start, bounds.stop, block)]
    out: list[UniformBlock] = []
    for idx in itertools.product(*ranges):
        v = value_at(idx)
        if v is not None:
            start = tuple(int(i) * int(c) for i, c in zip(idx, block))
            stop = tuple(min(s + int(c), int(n)) for s, c, n in zip(start, block, shape))
            out.append((Bounds.of_ints(start, stop), v))
    return out


def uniform_array(value: Any, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """A read-only array of ``shape`` holding ``value`` everywhere, one element of memory."""
    return np.broadcast_to(np.asarray(value, dtype=dtype), tuple(shape))


def constant_value(arr: np.ndarray) -> np.generic | None:
    """The value of an array made by ``uniform_array`` (every stride 0), else None. Only the
    layout is looked at: a materialised array of one value is not recognised (that would cost
    a pass over it)."""
    if arr.ndim == 0 or arr.size < 2 or any(s != 0 for s in arr.strides):
        return None
    return arr.reshape(-1)[0]


@lru_cache(maxsize=256)
def _reduced(dtype_str: str, raw: bytes, scale: tuple[int, ...], method: str) -> bytes:
    from tensor_server.core.downsample import downsample_block

    dt = np.dtype(dtype_str)
    block = np.full(scale, np.frombuffer(raw, dtype=dt)[0], dtype=dt)
    return downsample_block(block, scale, method).reshape(-1)[:1].tobytes()


def reduced_constant(value: np.generic, dtype: np.dtype, scale: Sequence[int], method: str) -> np.generic:
    """What ``method`` at ``scale`` gives a block all of whose pixels are ``value``: computed
    by the kernel on one such block (module docstring), memoised."""
    dt = np.dtype(dtype)
    raw = np.asarray(value, dtype=dt).tobytes()
    return np.frombuffer(_reduced(dt.str, raw, tuple(int(s) for s in scale), method), dtype=dt)[0]


def fill_uniform_units(
    units: Iterable[Bounds],
    unit_value: Callable[[Bounds], np.generic | None],
    out: np.ndarray,
    origin: Sequence[int],
    scale: Sequence[int],
) -> Iterable[Bounds]:
    """The streamed reduction's hook: write each unit that ``unit_value`` answers (the reduced
    value of a uniform unit) straight into ``out`` and yield only the others, to be read and
    reduced. A unit starts on a reduction block edge, so its output box is exact."""
    axes = tuple(zip(origin, scale))
    for ub in units:
        v = unit_value(ub)
        if v is None:
            yield ub
            continue
        # ceil on both ends: a unit starts on a block edge, its stop may be the extent's ragged end
        out[tuple(slice((a - b0) // s, -(-(b - b0) // s)) for a, b, (b0, s) in zip(ub.start, ub.stop, axes))] = v
