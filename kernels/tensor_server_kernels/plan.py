"""Pure-Python planning for the downsampling kernels: which kernel, which accumulator, and the
"rows" layout every kernel reads. No numba here, so it is importable and testable on its own.

Layout: every input becomes "rows"
----------------------------------
After validation the array is brought to C order (C input as is; F-ordered input is read through
its transpose, which is C-contiguous, with the scales reversed - no copy - except for float
``area``, whose summation order is part of the result and is therefore copied to C order; any other
strided input is copied with ``np.ascontiguousarray``, because vectorised inner loops need unit
stride). Then:

* axes of length 1 get scale 1 (an edge-padded block along such an axis repeats every value the same
  number of times, which changes no method's result - except the float-area summation order, where
  they are kept);
* adjacent scale-1 axes are merged (free in C order);
* a trailing scale-1 axis (interleaved channels, e.g. RGB) is folded into the last scaled axis as
  ``C`` interleaved lanes;
* all remaining axes but the last are flattened into *rows*: ``x2`` is ``(rows, L * C)``. A NumPy
  ``table[o, k]`` lists, for output row ``o``, the input rows of its block in C order of the block
  offsets, with indices clamped to the last row: the clamp IS the edge padding of ragged blocks.

Accumulators (integer ``area``)
-------------------------------
``_plan_integer_area`` sizes the accumulator from ``block_size * max(|dtype min|, dtype max)`` of
the summed (unsigned) values: uint16 where that fits (16 lanes per AVX2 add for 8-bit input),
else uint32, else int64, else the exact two-limb path (``_area_wide``: 64-bit inputs, or blocks
of 2**31+ elements of 32-bit ones). Never a fixed narrow width: a narrow accumulator wraps
silently.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tensor_server_kernels.reference import output_shape

__all__ = ["area_path", "output_shape"]

# Integer area with power-of-two scales: blocks of at most this many elements use the strided-add
# kernel, larger blocks the reshape-sum kernel (docs: scaled-read-path §7). The value is measured:
# ``python -m tensor_server.bench area-crossover`` (this machine, 2 cores shared with other jobs,
# load 9-11; numba 0.68, one thread, C order, median of 11 interleaved rounds, ms):
#   block                    4     8    16    32    64   128   256   512  1024  2048  4096
#   8192^2 u16   strided  38.8  30.8  69.3 130.8  95.8 124.5 108.7  71.0 114.2 113.9 155.0
#                reshape  43.9  36.8  73.3 170.8 130.1 108.6 111.5  85.8 158.3 155.6 248.7
#   8192^2 u8    strided 123.8       107.7  91.0  53.6  69.3  68.3       55.7
#                reshape 111.6       101.2  83.0  70.3  73.2  86.7       68.3
#   512x1024^2   strided       584.1       367.3 333.2 308.4       339.0
#   u8           reshape       511.8       366.2 352.2 366.2       434.3
# A second run (9 rounds) agreed on every block >= 64. Strided-add (full-width vector row adds,
# then one fold) wins from block 64 up to the largest measured, 4096, by 20-60% above 256; the
# reshape-sum wins only on uint8 blocks <= 32, by ~10% (a range the single gate cannot give it
# without losing uint16, the common case, where the two tie or strided-add wins). So the gate
# sits at the largest block measured; beyond it (unmeasured) the reshape-sum keeps its place.
# The older design value was 256, from a quiet-machine run that found the reshape-sum 10-30%
# faster on the smallest blocks; both kernels are exact on both sides (tests/kernels).
_STRIDED_ADD_MAX_BLOCK = 4096

# Last-axis scales with a "plain rows" kernel (``plain.py``: no interleaved channels, the scale a
# compile-time constant, 8/16-bit integers summed two pixels per word). Measured on 8192² uint16
# (numba 0.68, one thread, load 9-11, against a numba sum of the same plane, 3.3-3.7 ms): area
# 7.5 / 5.3 / 5.8 / 5.0 / 5.3 ms at scales 2-32 where the strided-add kernel took 16.7 / 8.9 /
# 8.7 / 9.3 / 7.8. Tests set it to () to exercise the general kernels on the same cases.
_PLAIN_S2 = (2, 4, 8, 16, 32)
# nearest: the plain kernels win at scale 2 and win or tie at 4 (8192², ms, against NumPy's
# strided copy in the same run, 2026-12-03: uint8 2.0 vs 5.4 and 0.84 vs 1.34, uint16 10.2 vs
# 15.9 and 1.6 vs 1.6, uint32 23 vs 28 and 3.6 vs 4.3); at 8 they tie: the copy touches little.
_PLAIN_NEAREST_S2 = (2, 4)

# The dtypes the kernels are compiled for. bool runs as uint8; signed integers run as their
# unsigned view with the sign bit flipped (``scalars.flip_sign``), which preserves order, equality and - since
# the flip is a bias of 2**(bits-1), an even number - the half-to-even rounding of a mean. So a
# cold test run compiles each kernel for 6 dtypes instead of 11, and int16 gets the fast
# constant-scale kernels of uint16.
_KERNEL_DTYPES = frozenset(np.dtype(t) for t in ("uint8", "uint16", "uint32", "uint64", "float32", "float64"))


@functools.lru_cache(maxsize=256)
def _plan_integer_area(dtype: np.dtype, block_size: int) -> np.dtype | None:
    """Accumulator dtype that holds any sum of ``block_size`` values of ``dtype`` exactly.

    Sized from ``block_size * max(|dtype min|, dtype max)`` of the dtype the kernel sums, never a
    fixed width. Signed data is summed as its sign-flipped unsigned view (see ``_KERNEL_DTYPES``),
    so the bound is that of the unsigned dtype of the same width. ``None`` means no 64-bit integer
    fits (64-bit inputs, or blocks of 2**32+ elements of 32-bit ones): use the exact two-limb
    kernel ``_area_wide``. uint64 is never chosen (numba turns uint64/int64 mixes into float64);
    int64 covers every case below 2**63.
    """
    dtype = np.dtype(dtype)
    if dtype.kind in "bi":
        dtype = np.dtype(f"u{dtype.itemsize}")
    bound = block_size * int(np.iinfo(dtype).max)
    candidates = ((np.uint16, 2**16 - 1), (np.uint32, 2**32 - 1), (np.int64, 2**63 - 1))
    for acc, limit in candidates:
        if np.dtype(acc).itemsize >= dtype.itemsize and bound <= limit:
            return np.dtype(acc)
    return None


def plain_area_accumulator(dtype: Any, scale: Sequence[int]) -> np.dtype | None:
    """The accumulator of the plain-rows area kernel for this case, or None when it has none:
    8/16-bit integers (bool and signed included), power-of-two scales whose last one is in
    ``_PLAIN_S2``, and a sum that fits uint16 or uint32 (its rounding shift is the difference in
    width, so the accumulator must be wider than the input)."""
    dt = np.dtype(dtype)
    if dt.kind not in "biu" or dt.itemsize > 2 or int(scale[-1]) not in _PLAIN_S2:
        return None
    if not all(_is_pow2(int(s)) for s in scale):
        return None
    acc = _plan_integer_area(dt, math.prod(int(s) for s in scale))
    return acc if acc is not None and acc.kind == "u" and acc.itemsize > dt.itemsize else None


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def area_path(dtype: Any, scale: Sequence[int]) -> str:
    """Which area kernel ``downsample_area`` uses for this dtype and scale (observable for tests).

    ``"identity"`` (all scales 1), ``"float"`` (float64 accumulator in oracle order), ``"half"``
    (float16: the float kernel on the pixels' bits, widened exactly through a table),
    ``"reference"`` (other floats and complex: the oracle), ``"wide"`` (exact two-limb integer path), ``"strided-add"`` /
    ``"reshape-sum"`` (integer, power-of-two scales, gated by block size at
    ``_STRIDED_ADD_MAX_BLOCK``), ``"plain"`` (8/16-bit integers, power-of-two scales, last-axis
    scale in ``_PLAIN_S2``, a uint16/uint32 accumulator; used when the rows are plain and of even
    width, else the block-size gate decides), ``"generic"`` (integer, non-dyadic: reshape-sum with runtime
    scale and exact division). ``downsample_area`` asks it about the block the kernel actually
    reduces (the layout step sets scale 1 on length-1 axes, which can only shrink the block).
    """
    dt = np.dtype(dtype)
    block = math.prod(int(s) for s in scale)
    if block == 1:
        return "identity"
    if dt.kind == "f":
        return "float" if dt in _KERNEL_DTYPES else "half" if dt == np.float16 else "reference"
    if dt.kind not in "biu":
        return "reference"
    if block >= 2**31 or _plan_integer_area(dt, block) is None:
        return "wide"
    if not all(_is_pow2(int(s)) for s in scale):
        return "generic"
    if plain_area_accumulator(dt, scale) is not None:
        return "plain"
    return "strided-add" if block <= _STRIDED_ADD_MAX_BLOCK else "reshape-sum"


class _Layout:
    """The rows view of one call: ``x2 (rows, L*C)``, its output ``(orows, oL*C)``, the row
    table, and how to turn the 2-D output back into the caller's shape and dtype."""

    __slots__ = ("x2", "table", "C", "s2", "out2_shape", "out_shape", "transposed", "dtype", "kernel_scale")

    def __init__(self, x: np.ndarray, scale: tuple[int, ...], keep_unit_axes: bool) -> None:
        self.dtype = x.dtype
        self.transposed = False
        if not x.flags.aligned:
            x = np.ascontiguousarray(x)  # (an unaligned array would be one more numba type)
        elif x.flags.c_contiguous:
            pass
        elif x.flags.f_contiguous and not keep_unit_axes:
            x = x.T  # C-contiguous view; block membership does not depend on axis order
            scale = scale[::-1]
            self.transposed = True
        else:
            x = np.ascontiguousarray(x)
        self.out_shape = output_shape(x.shape, scale)
        shape = list(x.shape)
        sc = list(scale)
        if not keep_unit_axes:
            sc = [1 if n == 1 else s for n, s in zip(shape, sc)]
        # merge runs of adjacent scale-1 axes
        mshape: list[int] = []
        mscale: list[int] = []
        for n, s in zip(shape, sc):
            if mscale and s == 1 and mscale[-1] == 1:
                mshape[-1] *= n
            else:
                mshape.append(n)
                mscale.append(s)
        C = 1
        if len(mshape) > 1 and mscale[-1] == 1:
            C = mshape.pop()
            mscale.pop()
        L, s2 = mshape[-1], mscale[-1]
        row_shape, row_scale = mshape[:-1], mscale[:-1]
        self.C, self.s2 = C, s2
        self.kernel_scale = tuple(row_scale) + (s2,)
        rows = math.prod(row_shape)
        # Always hand the kernels a read-only view: numba compiles a separate specialisation for
        # read-only arrays (memmaps, frozen cache entries), so typing every input the same way
        # halves the kernels a mixed workload compiles.
        self.x2 = x.reshape(rows, L * C).view()
        self.x2.flags.writeable = False
        self.table = _row_table(tuple(row_shape), tuple(row_scale))
        self.out2_shape = (self.table.shape[0], -(-L // s2) * C)

    def finish(self, out2: np.ndarray) -> np.ndarray:
        out = out2.reshape(self.out_shape)
        if self.transposed:
            out = np.ascontiguousarray(out.T)
        return out


@functools.lru_cache(maxsize=64)
def _row_table(row_shape: tuple[int, ...], row_scale: tuple[int, ...]) -> np.ndarray:
    """``(out_rows, rows_per_block)`` input row indices, offsets in C order, clamped at the end
    of each axis (edge padding). Memoised, and the kernels only read it: a streamed reduction
    reduces units of one shape over and over, and building the table was 53 of a 1024² uint16
    unit's 260 us of area-kernel call (the kernel itself 90). Writable, as every table was:
    numba compiles read-only arrays as another type."""
    if not row_shape:
        return np.zeros((1, 1), dtype=np.intp)
    strides = np.cumprod([1] + list(row_shape[::-1][:-1]))[::-1]
    total = np.zeros((1,) * (2 * len(row_shape)), dtype=np.intp)
    nd = len(row_shape)
    for k, (n, s, st) in enumerate(zip(row_shape, row_scale, strides)):
        o = -(-n // s)
        idx = np.minimum(np.arange(o)[:, None] * s + np.arange(s)[None, :], n - 1) * int(st)
        shape = [1] * (2 * nd)
        shape[k] = o
        shape[nd + k] = s
        total = total + idx.reshape(shape).astype(np.intp)
    out_rows = math.prod(total.shape[:nd])
    return np.ascontiguousarray(total.reshape(out_rows, -1))
