"""Pure-NumPy oracle for block downsampling. This module DEFINES the semantics.

The numba kernels in :mod:`tensor_server_kernels.downsample` expose the same public names and
must return bit-identical results (tests/kernels/downsample_test.py checks it). The oracle is
written for clarity, not speed: it materialises every block as the last axis of a
``(*out_shape, block_size)`` array and reduces along that axis.

Rules shared by every method
----------------------------
* ``data`` has 1-6 dimensions; ``scale`` has one positive integer per axis (1 = untouched,
  non-dyadic factors such as 3, 5, 7 allowed).
* Output shape per axis is ``ceil(n / s)``; output dtype is the input dtype; the output is a
  fresh C-contiguous array (never a view of, never aliasing, the input); the input is never
  modified.
* Blocks are ``[p*s, (p+1)*s)`` anchored at 0. A ragged last block is first completed by
  repeating its last in-bounds element along that axis (``np.pad(mode="edge")``) and is then
  reduced as a full block - one rule for every method. (Why: the server streams an extent in
  units that end on block boundaries, so only the tensor's own end can be ragged, and edge
  padding keeps every method's result a plausible value of the block, with no bias towards 0.)

Methods
-------
``nearest``  first element of each block, ``data[::s0, ::s1, ...]``. Any dtype.
``area``     block mean.
             * integers: exact integer sum (no fixed-width accumulator can wrap: the oracle uses
               int64 when ``block_size * max(|min|, max)`` fits, Python ints otherwise), then
               division rounding **half to even**, then clip to the dtype range (a no-op for a
               true mean, kept as the documented last step).
             * floats: the padded block is summed in float64 in C order of the block offsets
               (offset ``(i0, i1, ...)`` row-major), divided by the block size in float64, and
               cast to the input dtype. The summation order is part of the definition so that a
               kernel can be bit-identical rather than "close"; NaN propagates, ``inf - inf``
               gives NaN as IEEE says.
             * bool: True where the count of True is more than half the block; a tie is False.
               (This is round-half-to-even of the 0/1 mean, so it is the integer rule too.)
``min/max``  per block; NaN propagates for floats (any NaN in the block gives NaN). bool: all/any.
``mode``     most frequent value in the block; ties go to the smallest value. Exact, meant for
             label images. Floats: NaNs count as one value that sorts above +inf (NumPy's sort
             order), so NaN wins only with a strict plurality.
``median``   lower median: element ``(B - 1) // 2`` of the sorted block (always a value present
             in the block, as TensorStore's ``median`` defines it). Floats: NaN sorts above +inf
             as in ``np.sort`` (NaN is not propagated: median is the robust statistic), so NaN is
             returned only when at least ``B - (B - 1) // 2`` of the block's values are NaN.

For bool, mode and median and area all reduce to "majority, ties False".

Signed zeros compare equal: which zero min, max, mode and median return where ``-0.0`` and
``+0.0`` meet in a block is unspecified, and float area turns a ``-0.0`` mean into ``+0.0`` (the
sum starts at ``+0.0``); tests compare signed zeros as equal.

Dtypes: ``nearest`` accepts any dtype. The other methods accept bool, signed and unsigned
integers of 8-64 bits and float16/32/64; ``mode`` also accepts complex (compared for exact
equality, ordered as ``np.sort`` orders them). Complex input to area/min/max/median is refused:
there is no order for min/max/median, and a complex mean is not what an image pyramid means.
bool arrays are assumed to hold only 0/1 bytes (as NumPy produces them).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "METHODS",
    "MAX_NDIM",
    "check_arguments",
    "output_shape",
    "downsample",
    "downsample_nearest",
    "downsample_area",
    "downsample_min",
    "downsample_max",
    "downsample_mode",
    "downsample_median",
]

METHODS = ("nearest", "area", "min", "max", "mode", "median")
MAX_NDIM = 6

_REAL_KINDS = "biuf"


def output_shape(shape: Sequence[int], scale: Sequence[int]) -> tuple[int, ...]:
    """``ceil(n / s)`` per axis."""
    return tuple(-(-int(n) // int(s)) for n, s in zip(shape, scale))


def _check_scale(scale_hint: Any, ndim: int, error: type[Exception]) -> tuple[int, ...]:
    if isinstance(scale_hint, (str, bytes)) or not hasattr(scale_hint, "__len__"):
        raise error(f"scale_hint must be a sequence of {ndim} positive integers; got {scale_hint!r}")
    if len(scale_hint) != ndim:
        raise error(
            f"scale_hint has {len(scale_hint)} entries but data has {ndim} dimensions; got {tuple(scale_hint)!r}"
        )
    out = []
    for s in scale_hint:
        if isinstance(s, (bool, np.bool_)):
            raise error(f"scale_hint entries must be positive integers; got {tuple(scale_hint)!r}")
        try:
            v = operator.index(s)
        except TypeError:
            raise error(f"scale_hint entries must be positive integers; got {tuple(scale_hint)!r}") from None
        if v < 1:
            raise error(f"scale_hint entries must be positive; got {tuple(scale_hint)!r}")
        out.append(int(v))
    return tuple(out)


def check_arguments(
    data: Any, scale_hint: Any, method: str, error: type[Exception] = ValueError
) -> tuple[np.ndarray, tuple[int, ...], str]:
    """Validate ``(data, scale_hint, method)``; return ``(array, scale tuple, method)``.

    Raises ``error`` (a ValueError subclass by default) naming the offending argument:
    ``method`` (not one of :data:`METHODS`), ``scale_hint`` (wrong length, not an integer,
    not positive), ``data`` (0 or more than 6 dimensions, or a dtype the method refuses).
    ``error`` lets the server pass its own ``InvalidArgument`` without this package
    depending on the server.
    """
    if not isinstance(method, str) or method not in METHODS:
        raise error(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    arr = data if isinstance(data, np.ndarray) else np.asarray(data)
    if not 1 <= arr.ndim <= MAX_NDIM:
        raise error(f"data must have 1 to {MAX_NDIM} dimensions; got {arr.ndim}")
    scale = _check_scale(scale_hint, arr.ndim, error)
    kind = arr.dtype.kind
    if method != "nearest":
        ok = kind in _REAL_KINDS or (method == "mode" and kind == "c")
        if kind == "f" and arr.dtype.itemsize > 8:
            ok = False  # longdouble: no kernel, no use in images
        if not ok:
            raise error(f"data dtype {arr.dtype} is not supported by method {method!r}")
    return arr, scale, method


def _blocks(data: np.ndarray, scale: tuple[int, ...]) -> np.ndarray:
    """``(*out_shape, block_size)`` array of edge-padded blocks, offsets in C order."""
    pad = [(0, (-n) % s) for n, s in zip(data.shape, scale)]
    padded = np.pad(data, pad, mode="edge") if any(p for _, p in pad) else data
    oshape = output_shape(data.shape, scale)
    split: list[int] = []
    for o, s in zip(oshape, scale):
        split += [o, s]
    nd = data.ndim
    perm = list(range(0, 2 * nd, 2)) + list(range(1, 2 * nd, 2))
    return padded.reshape(split).transpose(perm).reshape(oshape + (-1,))


def _empty_result(data: np.ndarray, scale: tuple[int, ...]) -> np.ndarray | None:
    if data.size == 0:
        return np.empty(output_shape(data.shape, scale), dtype=data.dtype)
    return None


def downsample_nearest(data: np.ndarray, scale: Sequence[int]) -> np.ndarray:
    """First element of each block, as an owned C-contiguous array."""
    data, scale, _ = check_arguments(data, scale, "nearest")
    picked = data[tuple(slice(None, None, s) for s in scale)]
    return np.array(picked, order="C", copy=True)


def _round_half_even_div(sums: np.ndarray, block: int) -> np.ndarray:
    """``sums / block`` rounded half to even, exactly (floor division keeps it exact for
    negative sums too, and works on int64 and on object arrays of Python ints)."""
    q = sums // block
    twice_r = 2 * (sums - q * block)
    up = (twice_r > block) | ((twice_r == block) & (q % 2 == 1))
    return q + up.astype(np.int64) if q.dtype != object else q + up.astype(object)


def downsample_area(data: np.ndarray, scale: Sequence[int]) -> np.ndarray:
    """Block mean; see the module docstring for the integer / float / bool rules."""
    data, scale, _ = check_arguments(data, scale, "area")
    empty = _empty_result(data, scale)
    if empty is not None:
        return empty
    blocks = _blocks(data, scale)
    block = blocks.shape[-1]
    dt = data.dtype
    if dt.kind == "f":
        acc = np.zeros(blocks.shape[:-1], dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf = NaN is the rule
            for k in range(block):  # the documented summation order: block offsets in C order
                acc += blocks[..., k]
            return np.ascontiguousarray((acc / block).astype(dt))
    if dt.kind == "b":
        count = blocks.sum(axis=-1, dtype=np.int64)
        return np.ascontiguousarray(2 * count > block)
    info = np.iinfo(dt)
    if block * max(-int(info.min), int(info.max)) < 2**63:
        sums = blocks.sum(axis=-1, dtype=np.int64)
    else:  # exact at any width: Python integers
        sums = blocks.astype(object).sum(axis=-1)
    mean = _round_half_even_div(sums, block)
    mean = np.minimum(np.maximum(mean, int(info.min)), int(info.max))
    return np.ascontiguousarray(np.asarray(mean).astype(dt))


def downsample_min(data: np.ndarray, scale: Sequence[int]) -> np.ndarray:
    """Block minimum; NaN propagates."""
    data, scale, _ = check_arguments(data, scale, "min")
    empty = _empty_result(data, scale)
    if empty is not None:
        return empty
    return np.ascontiguousarray(_blocks(data, scale).min(axis=-1))


def downsample_max(data: np.ndarray, scale: Sequence[int]) -> np.ndarray:
    """Block maximum; NaN propagates."""
    data, scale, _ = check_arguments(data, scale, "max")
    empty = _empty_result(data, scale)
    if empty is not None:
        return empty
    return np.ascontiguousarray(_blocks(data, scale).max(axis=-1))


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Equality in which NaN equals NaN (a run of NaNs is one value)."""
    eq = a == b
    if a.dtype.kind in "fc":
        eq |= np.isnan(a) & np.isnan(b)
    return eq


def downsample_mode(data: np.ndarray, scale: Sequence[int]) -> np.ndarray:
    """Most frequent value per block, ties to the smallest value (NaN sorts last)."""
    data, scale, _ = check_arguments(data, scale, "mode")
    empty = _empty_result(data, scale)
    if empty is not None:
        return empty
    srt = np.sort(_blocks(data, scale), axis=-1)
    block = srt.shape[-1]
    pos = np.arange(block)
    new_run = np.ones(srt.shape, dtype=bool)
    new_run[..., 1:] = ~_same(srt[..., 1:], srt[..., :-1])
    run_start = np.maximum.accumulate(np.where(new_run, pos, 0), axis=-1)
    run_len = pos - run_start + 1
    # The first position at which the longest run length is reached lies in the earliest
    # (smallest-valued) of the longest runs: ties go to the smallest value.
    best = np.argmax(run_len, axis=-1)
    return np.ascontiguousarray(np.take_along_axis(srt, best[..., None], axis=-1)[..., 0])


def downsample_median(data: np.ndarray, scale: Sequence[int]) -> np.ndarray:
    """Lower median per block: sorted element ``(B - 1) // 2`` (NaN sorts last)."""
    data, scale, _ = check_arguments(data, scale, "median")
    empty = _empty_result(data, scale)
    if empty is not None:
        return empty
    srt = np.sort(_blocks(data, scale), axis=-1)
    return np.ascontiguousarray(srt[..., (srt.shape[-1] - 1) // 2])


_BY_METHOD = {
    "nearest": downsample_nearest,
    "area": downsample_area,
    "min": downsample_min,
    "max": downsample_max,
    "mode": downsample_mode,
    "median": downsample_median,
}


def downsample(data: np.ndarray, scale: Sequence[int], method: str) -> np.ndarray:
    """Reduce ``data`` by ``scale`` with ``method`` (one of :data:`METHODS`)."""
    data, scale, method = check_arguments(data, scale, method)
    return _BY_METHOD[method](data, scale)
