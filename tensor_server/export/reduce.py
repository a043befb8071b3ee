"""A unit's pyramid: every level's pixels of one read unit, the oracle's bits, without numba
where NumPy gets them as cheaply.

Why not always ``core.downsample_block`` (the numba kernels). A local export is one process
doing one kind of reduction over a stream; importing numba and loading its compiled kernels
costs about 130 MB of resident memory (numba, llvmlite and the scipy it pulls in) and a
second of start-up, more than the export's own pixels in flight. For the reductions a
pyramid mostly is, NumPy's vectorised strided adds give the oracle's bits
(``tensor_server_kernels.reference``: its rules are restated where used) at about the
kernels' speed, and release the GIL the same way:

* ``nearest``: ``data[::s]`` (the first element of every block), any dtype;
* ``area`` on integers and bool: exact integer block sums, **cascaded** (a level's sums are
  the sums of the previous level's sums, exact, so each level costs a fraction of the one
  before), then the division rounded half to even; on floats: the float64 sum of the block's
  elements in C order of the block offsets, from level 0 (the order is the definition);
* ``min``/``max``: ``np.minimum``/``np.maximum`` over the block offsets (NaN propagates),
  cascaded (an extreme of extremes);
* a ragged last block (only at the tensor's end) is completed by edge repetition first —
  padding level 0 to a whole number of every level's block does that for every level at once.

``mode`` and ``median`` (and integers too wide for an exact int64 sum) go to the kernels.
tests/export/reduce_test.py checks every path against the oracle on the kernels' case table.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from math import prod

import numpy as np

__all__ = ["unit_levels", "numpy_handles"]

#: A unit is reduced in slabs of about this many bytes along its first axis that splits into
#: whole blocks of every level: blocks never cross a slab and the ragged end stays last, so
#: each slab's levels are the whole's bits. The fold's accumulators and the mean's temporaries
#: were 1.5x the unit again: reducing a 16x1024² uint16 unit at once peaked at 109 MiB for
#: 42.5 MiB of levels (tracemalloc), which set a 30x4096² export's peak RSS.
SLAB_BYTES = 2 << 20


def numpy_handles(method: str, dtype: np.dtype) -> bool:
    """Whether ``unit_levels`` reduces ``method`` on ``dtype`` itself (else: the kernels)."""
    if method == "nearest":
        return True
    if method in ("min", "max"):
        return dtype.kind in "biuf"
    if method == "area":
        return dtype.kind in "bf" or (dtype.kind in "iu" and dtype.itemsize <= 4)
    return False


def unit_levels(
    data: np.ndarray,
    scales: Sequence[Sequence[int]],
    method: str,
    slab_bytes: int = SLAB_BYTES,
    checkpoint: Callable[[], None] | None = None,
) -> list[np.ndarray]:
    """``[level 0, level 1, ...]`` of ``data`` for the per-level ``scales`` (the first all
    ones), each bit-identical to ``downsample_block(data, scale, method)``, reduced one slab of
    about ``slab_bytes`` at a time (see ``SLAB_BYTES``). ``checkpoint()`` is called before each
    slab: it raises to stop a unit's reduction part way (an export asked to stop)."""
    scales = [tuple(int(v) for v in s) for s in scales]
    whole = tuple(int(np.lcm.reduce([s[i] for s in scales])) for i in range(data.ndim))
    axis = next((a for a in range(data.ndim) if data.shape[a] > whole[a]), None)
    if axis is None or method == "nearest":  # nearest's strided copies need no temporaries
        return _levels(data, scales, method, whole)
    whole_rows = data[(slice(None),) * axis + (slice(0, whole[axis]),)]
    step = whole[axis] * max(1, slab_bytes // max(1, whole_rows.nbytes))
    if step >= data.shape[axis]:
        return _levels(data, scales, method, whole)
    out = [data]
    for lo in range(0, data.shape[axis], step):
        if checkpoint is not None:
            checkpoint()
        piece = data[(slice(None),) * axis + (slice(lo, lo + step),)]
        blocks = _levels(piece, scales, method, whole)[1:]
        if lo == 0:  # each level's dtype is its first slab's
            out += [
                np.empty(tuple(-(-n // v) for n, v in zip(data.shape, s)), b.dtype) for s, b in zip(scales[1:], blocks)
            ]
        for level, s, block in zip(out[1:], scales[1:], blocks):
            at = lo // s[axis]
            level[(slice(None),) * axis + (slice(at, at + block.shape[axis]),)] = block
    return out


def _levels(data: np.ndarray, scales: Sequence[Sequence[int]], method: str, whole: tuple[int, ...]) -> list[np.ndarray]:
    """``unit_levels`` of one slab (``whole``: the least common multiple of the scales)."""
    too_wide = method == "area" and data.dtype.kind in "iu" and _sum_dtype(data.dtype, prod(whole)) is None
    if not numpy_handles(method, data.dtype) or too_wide:
        from tensor_server.core.downsample import downsample_block

        return [data] + [downsample_block(data, s, method) for s in scales[1:]]
    if method == "nearest":
        return [data] + [np.array(data[tuple(slice(None, None, v) for v in s)], order="C") for s in scales[1:]]
    out_shapes = [tuple(-(-n // v) for n, v in zip(data.shape, s)) for s in scales]
    padded = _edge_padded(data, whole)
    if method in ("min", "max"):
        levels = _cascade(padded, scales, np.minimum if method == "min" else np.maximum, None)
    elif data.dtype.kind == "f":
        levels = [_float_mean(padded, s) for s in scales[1:]]
    else:
        sums = _cascade(padded, scales, np.add, _sum_dtype(data.dtype, prod(whole)))
        levels = [_integer_mean(total, prod(s), data.dtype) for total, s in zip(sums, scales[1:])]
    return [data] + [
        np.ascontiguousarray(lv[tuple(slice(0, n) for n in shape)]) for lv, shape in zip(levels, out_shapes[1:])
    ]


def _edge_padded(data: np.ndarray, coarsest: Sequence[int]) -> np.ndarray:
    widths = [(0, -n % v) for n, v in zip(data.shape, coarsest)]
    return np.pad(data, widths, mode="edge") if any(w for _, w in widths) else data


def _offsets(scale: Sequence[int]) -> list[tuple[slice, ...]]:
    """One strided view per block offset, in C order of the offsets."""
    return [
        tuple(slice(o, None, v) for o, v in zip(offset, scale))
        for offset in itertools.product(*(range(v) for v in scale))
    ]


def _fold(data: np.ndarray, scale: Sequence[int], op: np.ufunc, dtype: np.dtype | None) -> np.ndarray:
    """``op`` over each block's elements of ``data`` (whose shape is a whole number of
    blocks), one axis at a time, leading axes first (their slices are whole rows: the data
    shrinks before the strided last axis is folded). For an exact ``op`` (integer sums,
    extremes) the grouping does not change a bit."""
    acc, fresh = data, False
    for axis, step in enumerate(scale):
        if step == 1:
            continue
        lead = (slice(None),) * axis
        folded = np.array(acc[lead + (slice(0, None, step),)], dtype=dtype or data.dtype)
        for o in range(1, step):
            op(folded, acc[lead + (slice(o, None, step),)], out=folded)
        acc, fresh = folded, True
    return acc if fresh else np.array(acc, dtype=dtype or data.dtype)


def _fold_in_order(data: np.ndarray, scale: Sequence[int], op: np.ufunc, dtype: np.dtype) -> np.ndarray:
    """``op`` over each block's elements in C order of the block offsets (the float sum's
    defined order)."""
    views = _offsets(scale)
    acc = np.array(data[views[0]], dtype=dtype)
    for view in views[1:]:
        op(acc, data[view], out=acc)
    return acc


def _cascade(
    data: np.ndarray, scales: Sequence[Sequence[int]], op: np.ufunc, dtype: np.dtype | None
) -> list[np.ndarray]:
    """Each level folded from the previous level where its scale is a multiple of the
    previous one (exact for sums of integers and for extremes), else from level 0."""
    out: list[np.ndarray] = []
    prev, prev_scale = data, scales[0]
    for scale in scales[1:]:
        if all(s % p == 0 for s, p in zip(scale, prev_scale)):
            step = tuple(s // p for s, p in zip(scale, prev_scale))
            level = _fold(prev, step, op, dtype)
        else:
            level = _fold(data, scale, op, dtype)
        out.append(level)
        prev, prev_scale = level, scale
    return out


def _sum_dtype(dtype: np.dtype, block: int) -> np.dtype | None:
    """An accumulator that holds ``block`` values of ``dtype`` exactly (None: none does)."""
    if dtype.kind == "b":
        return np.dtype(np.uint32) if block < 2**32 else np.dtype(np.int64)
    info = np.iinfo(dtype)
    biggest = (block + 1) * max(-int(info.min), int(info.max))  # room for the rounding's + block // 2
    if dtype.kind == "u" and biggest < 2**32:
        return np.dtype(np.uint32)
    if biggest < 2**31:
        return np.dtype(np.int32)
    return np.dtype(np.int64) if biggest < 2**63 else None


def _integer_mean(sums: np.ndarray, block: int, dtype: np.dtype) -> np.ndarray:
    """``sums / block`` rounded half to even (bool: the majority, a tie False), in the
    accumulator's own type (``_sum_dtype`` leaves room for ``sums + block``): ``q =
    floor((s + block // 2) / block)`` rounds half up (floor division: negative sums too), and
    a tie — only for an even block, where that remainder is 0 — that landed on an odd ``q``
    goes back down by one."""
    if dtype.kind == "b":
        return 2 * sums.astype(np.int64) > block
    t = sums + sums.dtype.type(block // 2)
    if block & (block - 1) == 0:  # a power of two: shift and mask
        k = block.bit_length() - 1
        q, tie = t >> k, (t & (block - 1)) == 0
    else:
        q = t // block
        tie = (t - q * block) == 0
    if block % 2 == 0:
        tie &= (q & 1).astype(bool)
        q -= tie
    info = np.iinfo(dtype)
    if dtype.kind == "u" or (int(q.min(initial=0)) >= info.min and int(q.max(initial=0)) <= info.max):
        return q.astype(dtype)  # a true mean is in range: the clip is a no-op
    return np.clip(q, int(info.min), int(info.max)).astype(dtype)


def _float_mean(data: np.ndarray, scale: Sequence[int]) -> np.ndarray:
    """The float64 sum of each block in C order of its offsets, over the block size, cast."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf = NaN is the rule
        acc = _fold_in_order(data, scale, np.add, np.dtype(np.float64))
        return (acc / prod(scale)).astype(data.dtype)
