"""Numba kernels for block downsampling, bit-identical to :mod:`tensor_server_kernels.reference`.

Public names are the oracle's (``downsample`` and ``downsample_<method>``); the semantics are the
oracle's docstring. This module only explains how the kernels get there fast.

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

So one kernel per method serves 1-6 dimensions. The last-axis scale ``s2`` is a compile-time
constant for the common cases (``_CONST_S2`` x ``_CONST_DTYPES``): measured 3-8x faster than a
runtime trip count because the inner loop unrolls and vectorises. Everything else uses the same
kernel with ``s2`` at run time, so a test table or a random property test compiles a bounded
number of kernels (one runtime variant per dtype, plus the constant ones actually used).

All kernels are ``@njit(cache=True, nogil=True)``: the server reduces on worker threads, and a fresh
process loads them from numba's cache instead of recompiling. Outputs and scratch rows are
allocated with NumPy and passed in (numba's allocator was 3-4x slower for large arrays here).
Scratch is one row: input width in the accumulator dtype for strided-add area and min/max (tens
of KiB for an image; for 1-D input that is the whole array), output width otherwise. Kernels
are single-threaded: the server's other core is busy serving.

Accumulators (integer ``area``)
-------------------------------
``_plan_integer_area`` sizes the accumulator from ``block_size * max(|dtype min|, dtype max)`` of
the summed (unsigned) values: uint16 where that fits (16 lanes per AVX2 add for 8-bit input),
else uint32, else int64, else the exact two-limb path (``_area_wide``: 64-bit inputs, or blocks
of 2**31+ elements of 32-bit ones). Never a fixed narrow width: a narrow accumulator wraps
silently.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
from numba import njit, types
from numba.extending import overload

from tensor_server_kernels import reference as _ref
from tensor_server_kernels.reference import METHODS, check_arguments, output_shape

__all__ = [
    "METHODS",
    "downsample",
    "downsample_nearest",
    "downsample_area",
    "downsample_min",
    "downsample_max",
    "downsample_mode",
    "downsample_median",
    "area_path",
    "downsample_unchecked",
]

# Integer area with power-of-two scales: blocks of at most this many elements use the strided-add
# kernel, larger blocks the reshape-sum kernel (the design's gate, docs: scaled-read-path §7).
# Measured with these kernels (this machine, numba 0.68, one thread, C order, min of 7, ms):
#   block                 4     8    16    64   256  1024
#   8192^2 u16 strided  22.6        17.3  15.1  10.7  10.6   (16x64: 14.9)
#              reshape  21.8        16.2  15.7  15.6  16.4   (16x64: 52.1, s2 = 64 at run time)
#   8192^2 u8  strided  17.9         9.1   8.0   7.3   8.6
#              reshape  14.6         8.7  14.2  14.1  13.0
#   512x1024^2 u8 strided     70.8        44.7  50.6  66.7 (512)
#                 reshape     57.7        59.9 104.5 115.7 (512)
# So in numba the crossover is the other way round from the NumPy-era design table: the
# reshape-sum (contiguous s2-lane sums) wins by 3-20% for blocks <= 16, the strided adds
# (full-width vector row adds, then one fold) win by 1.5-3.5x from block 64 up, including 1024.
# The bound is kept at the design's 256 (both kernels meet the area targets on both sides);
# flipping the gate is a one-line change in ``area_path``.
_STRIDED_ADD_MAX_BLOCK = 256

# Last-axis scales compiled as constants, and the dtypes for which they are (the image dtypes a
# server reduces all day). Other (dtype, s2) pairs use the runtime-s2 variant of the same kernel.
_CONST_S2 = (2, 4, 8, 16, 32)
# Per kernel, since each (kernel, dtype, s2) is one more compile (~0.5-1.5 s cold): 8/16-bit
# intensities (and their signed and bool views) for area and min/max, float32 for area and
# min/max, 8/16/32-bit labels for mode/median.
_CONST_DTYPES: dict[str, frozenset[np.dtype]] = {
    "area_strided": frozenset(map(np.dtype, ("uint8", "uint16"))),
    "area_reshape": frozenset(map(np.dtype, ("uint8", "uint16"))),
    "area_float": frozenset(map(np.dtype, ("float32",))),
    "extreme": frozenset(map(np.dtype, ("uint8", "uint16", "float32"))),
    "gather": frozenset(map(np.dtype, ("uint8", "uint16", "uint32"))),
}

# Count-distinct mode (blocks of more than 64 values) keeps at most this many distinct values per
# block before switching to a sort (label blocks hold a few labels; noise would make
# count-distinct quadratic).
_MODE_DISTINCT_CAP = 8

# The dtypes the kernels are compiled for. bool runs as uint8; signed integers run as their
# unsigned view with the sign bit flipped (``_flip``), which preserves order, equality and - since
# the flip is a bias of 2**(bits-1), an even number - the half-to-even rounding of a mean. So a
# cold test run compiles each kernel for 6 dtypes instead of 11, and int16 gets the fast
# constant-scale kernels of uint16.
_KERNEL_DTYPES = frozenset(
    np.dtype(t) for t in ("uint8", "uint16", "uint32", "uint64", "float32", "float64")
)


# --------------------------------------------------------------------------------------------
# Scalar helpers (inlined by LLVM)
# --------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _round_shift(v: int, shift: int) -> int:
    """``v / 2**shift`` rounded half to even, in int64 (arithmetic shift = floor, also for
    negative sums)."""
    q = v >> shift
    twice = (v - (q << shift)) << 1
    block = np.int64(1) << shift
    return q + (np.int64(twice > block) | (np.int64(twice == block) & (q & 1)))


@njit(cache=True, nogil=True)
def _round_div(v: int, block: int) -> int:
    """``v / block`` rounded half to even, in int64 (numba's ``//`` floors like Python)."""
    q = v // block
    twice = (v - q * block) << 1
    return q + (np.int64(twice > block) | (np.int64(twice == block) & (q & 1)))


def _flip(v, f):  # type: ignore[no-untyped-def]
    """``v ^ f`` for integers (f = sign bit for signed data viewed unsigned, else 0); identity for
    floats. Python version for NUMBA_DISABLE_JIT; the overload below is what kernels compile."""
    if isinstance(v, (float, np.floating)):
        return v
    return v ^ f


@overload(_flip)
def _flip_overload(v, f):  # type: ignore[no-untyped-def]
    if isinstance(v, types.Float):
        return lambda v, f: v
    return lambda v, f: v ^ f


@njit(cache=True, nogil=True)
def _pick_max(a, b):  # type: ignore[no-untyped-def]
    """max with NaN propagation (for integers ``a != a`` folds away); bitwise ops keep it branch-free."""
    return a if (a > b) | (a != a) else b


@njit(cache=True, nogil=True)
def _pick_min(a, b):  # type: ignore[no-untyped-def]
    return a if (a < b) | (a != a) else b


@njit(cache=True, nogil=True)
def _same(a, b):  # type: ignore[no-untyped-def]
    """Equality in which NaN equals NaN (mode counts all NaNs as one value)."""
    return (a == b) | ((a != a) & (b != b))


@njit(cache=True, nogil=True)
def _less(a, b):  # type: ignore[no-untyped-def]
    """NumPy sort order: NaN above everything."""
    return (a < b) | ((b != b) & (a == a))


@njit(cache=True, nogil=True)
def _sort(buf):  # type: ignore[no-untyped-def]
    """Shell sort (Knuth gaps) in NumPy order (NaN last). Why not ``buf.sort()``: numba's
    quicksort doubled the compile time of the gather kernel for every dtype, and blocks are
    small (a block of 1024 takes some 10-30k comparisons)."""
    n = buf.shape[0]
    h = 1
    while h < n // 3:
        h = 3 * h + 1
    while h >= 1:
        for i in range(h, n):
            v = buf[i]
            j = i
            while j >= h and _less(v, buf[j - h]):
                buf[j] = buf[j - h]
                j -= h
            buf[j] = v
        h //= 3


@njit(cache=True, nogil=True)
def _mode_of(buf, s, vals, cnts):  # type: ignore[no-untyped-def]
    """Most frequent value of ``buf`` (the whole block, as rows of ``s``), ties to the smallest.

    Blocks of up to 64 values: vectorised pairwise counts (below). Larger blocks: distinct values
    are counted in the short list ``vals``/``cnts`` (label blocks hold a few labels), and a block
    with more than ``len(vals)`` distinct values is sorted instead and scanned for the longest
    run (count-distinct would be quadratic on noise). ``buf`` may be reordered.
    """
    B = buf.shape[0]
    if B <= 64:
        # Small blocks: count each value against the whole block with a branch-free, vectorised
        # loop, skipping a value equal to its left or upper neighbour (``buf`` holds the block as
        # rows of ``s``): that value was already counted, and in a label image nearly every
        # value repeats a neighbour. Count-distinct's data-dependent branches mispredicted
        # enough to cost more than the whole uniform-block pass.
        best = buf[0]
        best_n = 0
        for i in range(B):
            v = buf[i]
            if (i > 0 and _same(v, buf[i - 1])) or (i >= s and _same(v, buf[i - s])):
                continue
            n = 0
            for j in range(B):
                n += _same(buf[j], v)
            better = (n > best_n) | ((n == best_n) & _less(v, best))
            best = v if better else best
            best_n = n if better else best_n
        return best
    cap = vals.shape[0]
    nd = 0
    for i in range(B):
        v = buf[i]
        t = 0
        while t < nd and not _same(vals[t], v):
            t += 1
        if t < nd:
            cnts[t] += 1
        elif nd < cap:
            vals[nd] = v
            cnts[nd] = 1
            nd += 1
        else:
            nd = -1
            break
    if nd > 0:
        bi = 0
        for t in range(1, nd):
            if cnts[t] > cnts[bi] or (cnts[t] == cnts[bi] and _less(vals[t], vals[bi])):
                bi = t
        return vals[bi]
    _sort(buf)  # NaN last, as in NumPy
    best = buf[0]
    best_n = 0
    i = 0
    while i < B:
        j = i + 1
        while j < B and _same(buf[j], buf[i]):
            j += 1
        if j - i > best_n:  # strictly longer: ties keep the earlier, smaller value
            best_n = j - i
            best = buf[i]
        i = j
    return best


# --------------------------------------------------------------------------------------------
# Kernel factory: one set of kernels per constant last-axis scale (0 = runtime ``s2``)
# --------------------------------------------------------------------------------------------


def _build(const_s2: int) -> dict[str, Callable[..., Any]]:
    """Kernels with ``s2`` fixed to ``const_s2`` (a closure constant LLVM folds), or read from the
    ``s2`` argument when ``const_s2 == 0``. numba caches each closure variant separately."""
    S = const_s2

    @njit(cache=True, nogil=True)
    def area_strided(x, out, table, C, s2, acc, shift, f):  # type: ignore[no-untyped-def]
        """Strided adds (power-of-two blocks, ``block == 2**shift``): one pass per block row
        offset adds a whole input row into a full-width accumulator row (contiguous,
        vectorised), then one strided fold over the last-axis offsets yields the output row."""
        s = S if S > 0 else s2
        W = x.shape[1]
        L = W // C
        oL = out.shape[1] // C
        full = L // s
        nrows = table.shape[1]
        for o in range(out.shape[0]):
            row = x[table[o, 0]]
            for e in range(W):
                acc[e] = row[e] ^ f
            for k in range(1, nrows):
                row = x[table[o, k]]
                for e in range(W):
                    acc[e] += row[e] ^ f
            orow = out[o]
            if C == 1:
                for q in range(full):
                    v = np.int64(acc[q * s])
                    for j in range(1, s):
                        v += acc[q * s + j]
                    orow[q] = _round_shift(v, shift) ^ f
            for q in range(full if C == 1 else 0, oL):  # ragged tail (clamp = edge padding)
                for c in range(C):
                    v = np.int64(0)
                    for j in range(s):
                        v += acc[min(q * s + j, L - 1) * C + c]
                    orow[q * C + c] = _round_shift(v, shift) ^ f

    @njit(cache=True, nogil=True)
    def area_reshape(x, out, table, C, s2, acc, block, shift, f):  # type: ignore[no-untyped-def]
        """Reshape-sum, last axis first: each input row is reduced over its s2-wide block lanes
        (contiguous), and those partial sums are added over the block rows into an output-width
        accumulator row. ``shift >= 0`` means ``block == 2**shift``; otherwise (non-dyadic
        scales) the exact division by ``block`` is used."""
        s = S if S > 0 else s2
        L = x.shape[1] // C
        oL = out.shape[1] // C
        full = L // s
        nrows = table.shape[1]
        for o in range(out.shape[0]):
            acc[:] = 0
            for k in range(nrows):
                row = x[table[o, k]]
                if C == 1:
                    for q in range(full):
                        t = acc[q]
                        for j in range(s):
                            t += row[q * s + j] ^ f
                        acc[q] = t
                for q in range(full if C == 1 else 0, oL):
                    for c in range(C):
                        t = acc[q * C + c]
                        for j in range(s):
                            t += row[min(q * s + j, L - 1) * C + c] ^ f
                        acc[q * C + c] = t
            orow = out[o]
            if shift >= 0:
                for e in range(oL * C):
                    orow[e] = _round_shift(np.int64(acc[e]), shift) ^ f
            else:
                for e in range(oL * C):
                    orow[e] = _round_div(np.int64(acc[e]), block) ^ f

    @njit(cache=True, nogil=True)
    def area_float(x, out, table, C, s2, acc, block):  # type: ignore[no-untyped-def]
        """Float mean in float64, adding the block's elements one at a time in C order of the
        block offsets: exactly the oracle's order, so the result is bit-identical."""
        s = S if S > 0 else s2
        L = x.shape[1] // C
        oL = out.shape[1] // C
        full = L // s
        nrows = table.shape[1]
        for o in range(out.shape[0]):
            acc[:] = 0.0
            for k in range(nrows):
                row = x[table[o, k]]
                if C == 1:
                    for q in range(full):
                        t = acc[q]
                        for j in range(s):
                            t += row[q * s + j]
                        acc[q] = t
                for q in range(full if C == 1 else 0, oL):
                    for c in range(C):
                        t = acc[q * C + c]
                        for j in range(s):
                            t += row[min(q * s + j, L - 1) * C + c]
                        acc[q * C + c] = t
            orow = out[o]
            for e in range(oL * C):
                orow[e] = acc[e] / block

    @njit(cache=True, nogil=True)
    def extreme(x, out, table, C, s2, acc, is_max, f):  # type: ignore[no-untyped-def]
        """min/max: element-wise over the block rows into a full-width row (vectorised), then a
        fold over the s2 last-axis lanes. min and max share one compiled kernel per dtype (half
        the compile time); the hot loops are written out per branch so each one vectorises
        (a select between min and max inside the loop cost 3x at scale 2)."""
        s = S if S > 0 else s2
        W = x.shape[1]
        L = W // C
        oL = out.shape[1] // C
        full = L // s
        nrows = table.shape[1]
        for o in range(out.shape[0]):
            r = table[o, 0]
            for e in range(W):
                acc[e] = _flip(x[r, e], f)
            for k in range(1, nrows):
                r = table[o, k]
                if is_max:
                    for e in range(W):
                        acc[e] = _pick_max(acc[e], _flip(x[r, e], f))
                else:
                    for e in range(W):
                        acc[e] = _pick_min(acc[e], _flip(x[r, e], f))
            if C == 1 and is_max:  # the hot cases, written out so each loop vectorises
                for q in range(full):
                    m = acc[q * s]
                    for j in range(1, s):
                        m = _pick_max(m, acc[q * s + j])
                    out[o, q] = _flip(m, f)
            elif C == 1:
                for q in range(full):
                    m = acc[q * s]
                    for j in range(1, s):
                        m = _pick_min(m, acc[q * s + j])
                    out[o, q] = _flip(m, f)
            first = full if C == 1 else 0
            for q in range(first, oL):  # ragged tail, and interleaved channels
                for c in range(C):
                    m = acc[q * s * C + c]
                    for j in range(1, s):
                        v = acc[min(q * s + j, L - 1) * C + c]
                        m = _pick_max(m, v) if is_max else _pick_min(m, v)
                    out[o, q * C + c] = _flip(m, f)

    @njit(cache=True, nogil=True)
    def gather(x, out, table, C, s2, buf, vals, cnts, flags, is_median, f):  # type: ignore[no-untyped-def]
        """mode and median share the block gather (one compiled kernel per dtype).

        median: sort the block (NaN last, as NumPy) and take element (B - 1) // 2.
        mode: see ``_mode_of``. Most blocks of a label image are uniform, so for plain rows
        (C == 1) uniformity is checked straight from the input before anything is gathered.
        """
        s = S if S > 0 else s2
        L = x.shape[1] // C
        oL = out.shape[1] // C
        full = L // s
        nrows = table.shape[1]
        B = nrows * s
        for o in range(out.shape[0]):
            first_q = 0
            if C == 1 and not is_median:
                # Pass 1, branch-free and vectorised: the block's first value, and whether
                # every value equals it (uniform blocks: most of a label image).
                first_q = full
                orow = out[o]
                row = x[table[o, 0]]
                for q in range(full):
                    orow[q] = row[q * s]
                    flags[q] = 1
                for k in range(nrows):
                    row = x[table[o, k]]
                    for j in range(s):
                        for q in range(full):
                            flags[q] &= _same(row[q * s + j], orow[q])
                # Pass 2: the mixed blocks.
                for q in range(full):
                    if flags[q]:
                        continue
                    n = 0
                    for k in range(nrows):
                        r = table[o, k]
                        for j in range(s):
                            buf[n] = _flip(x[r, q * s + j], f)
                            n += 1
                    orow[q] = _flip(_mode_of(buf, np.int64(s), vals, cnts), f)
            for q in range(first_q, oL):
                for c in range(C):
                    n = 0
                    for k in range(nrows):
                        r = table[o, k]
                        for j in range(s):
                            buf[n] = _flip(x[r, min(q * s + j, L - 1) * C + c], f)
                            n += 1
                    if is_median:
                        _sort(buf)
                        out[o, q * C + c] = _flip(buf[(B - 1) // 2], f)
                    else:
                        out[o, q * C + c] = _flip(_mode_of(buf, np.int64(s), vals, cnts), f)

    return {
        "area_strided": area_strided,
        "area_reshape": area_reshape,
        "area_float": area_float,
        "extreme": extreme,
        "gather": gather,
    }


_VARIANTS: dict[int, dict[str, Callable[..., Any]]] = {s: _build(s) for s in (0,) + _CONST_S2}


@njit(cache=True, nogil=True)
def _area_wide(x, out, table, C, s2, block, bias):  # type: ignore[no-untyped-def]
    """Exact integer mean for 64-bit inputs (and absurdly large blocks), without a 128-bit type.

    ``x``/``out`` are uint64 views; signed input is biased by ``bias = 2**63`` (xor of the sign
    bit) so that every value is a non-negative uint64 and the order is kept. Each value is split
    into 32-bit limbs whose sums ``hi``/``lo`` cannot overflow for ``block < 2**31``; the
    quotient of ``hi * 2**32 + lo`` by ``block`` is then formed limb by limb, exactly, and rounded
    half to even. Rounding commutes with the bias because 2**63 is even. Only uint64 arithmetic
    is used (numba turns mixed int64/uint64 arithmetic into float64).
    """
    L = x.shape[1] // C
    oL = out.shape[1] // C
    nrows = table.shape[1]
    mask32 = np.uint64(0xFFFFFFFF)
    sh32 = np.uint64(32)
    one = np.uint64(1)
    for o in range(out.shape[0]):
        for q in range(oL):
            for c in range(C):
                hi = np.uint64(0)
                lo = np.uint64(0)
                for k in range(nrows):
                    r = table[o, k]
                    for j in range(s2):
                        u = x[r, min(q * s2 + j, L - 1) * C + c] ^ bias
                        hi += u >> sh32
                        lo += u & mask32
                qa = hi // block
                ra = hi - qa * block
                t = (ra << sh32) + lo
                qt = t // block
                rt = t - qt * block
                quot = (qa << sh32) + qt
                twice = rt + rt
                if twice > block or (twice == block and (quot & one) == one):
                    quot += one
                out[o, q * C + c] = quot ^ bias


# --------------------------------------------------------------------------------------------
# Planning (pure Python, cheap)
# --------------------------------------------------------------------------------------------


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


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def area_path(dtype: Any, scale: Sequence[int]) -> str:
    """Which area kernel ``downsample_area`` uses for this dtype and scale (observable for tests).

    ``"identity"`` (all scales 1), ``"reference"`` (float16), ``"float"`` (float64 accumulator in
    oracle order), ``"wide"`` (exact two-limb integer path), ``"strided-add"`` /
    ``"reshape-sum"`` (integer, power-of-two scales, gated by block size at
    ``_STRIDED_ADD_MAX_BLOCK``), ``"generic"`` (integer, non-dyadic: reshape-sum with runtime
    scale and exact division). ``downsample_area`` asks it about the block the kernel actually
    reduces (the layout step sets scale 1 on length-1 axes, which can only shrink the block).
    """
    dt = np.dtype(dtype)
    block = math.prod(int(s) for s in scale)
    if block == 1:
        return "identity"
    if dt.kind == "f":
        return "float" if dt in _KERNEL_DTYPES else "reference"
    if dt.kind not in "biu":
        return "reference"
    if block >= 2**31 or _plan_integer_area(dt, block) is None:
        return "wide"
    if not all(_is_pow2(int(s)) for s in scale):
        return "generic"
    return "strided-add" if block <= _STRIDED_ADD_MAX_BLOCK else "reshape-sum"


class _Layout:
    """The rows view of one call: ``x2 (rows, L*C)``, its output ``(orows, oL*C)``, the row
    table, and how to turn the 2-D output back into the caller's shape and dtype."""

    __slots__ = ("x2", "table", "C", "s2", "out2_shape", "out_shape", "transposed", "dtype",
                 "kernel_scale")

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
        self.table = _row_table(row_shape, row_scale)
        self.out2_shape = (self.table.shape[0], -(-L // s2) * C)

    def finish(self, out2: np.ndarray) -> np.ndarray:
        out = out2.reshape(self.out_shape)
        if self.transposed:
            out = np.ascontiguousarray(out.T)
        return out


def _row_table(row_shape: list[int], row_scale: list[int]) -> np.ndarray:
    """``(out_rows, rows_per_block)`` input row indices, offsets in C order, clamped at the end
    of each axis (edge padding)."""
    if not row_shape:
        return np.zeros((1, 1), dtype=np.intp)
    strides = np.cumprod([1] + row_shape[::-1][:-1])[::-1]
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


def _kernel(name: str, dtype: np.dtype, s2: int) -> Callable[..., Any]:
    """The compiled kernel ``name`` for this dtype: constant-``s2`` variant or runtime one."""
    if s2 in _CONST_S2 and dtype in _CONST_DTYPES[name]:
        return _VARIANTS[s2][name]
    return _VARIANTS[0][name]


# --------------------------------------------------------------------------------------------
# Public API (same names as the oracle)
# --------------------------------------------------------------------------------------------


def _early(arr: np.ndarray, sc: tuple[int, ...], method: str) -> np.ndarray | None:
    """The answers that need no kernel: empty input, and all-ones scales (a copy)."""
    if arr.size == 0:
        return np.empty(output_shape(arr.shape, sc), dtype=arr.dtype)
    if all(s == 1 for s in sc) and not (method == "area" and arr.dtype.kind == "f"):
        return np.array(arr, order="C", copy=True)
    return None


def _native(arr: np.ndarray) -> np.ndarray:
    return arr if arr.dtype.isnative else arr.astype(arr.dtype.newbyteorder("="))


def _epilogue(out: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Kernel dtype (unsigned view, uint8 for bool) back to the caller's dtype and byte order."""
    native = dtype.newbyteorder("=")
    if out.dtype != native:
        out = out.view(native)
    if native != dtype:
        out = out.astype(dtype)
    return out


def _as_kernel_input(arr: np.ndarray) -> tuple[np.ndarray, Any]:
    """(view the kernels run on, flip): bool as uint8, signed as unsigned with the sign bit as
    ``flip`` (xor-ed on every read and on the result), unsigned and floats as they are."""
    if arr.dtype == np.bool_:
        return arr.view(np.uint8), np.uint8(0)
    if arr.dtype.kind == "i":
        u = np.dtype(f"u{arr.dtype.itemsize}")
        return arr.view(u), u.type(1 << (8 * arr.dtype.itemsize - 1))
    return arr, arr.dtype.type(0)


def _nearest(arr: np.ndarray, sc: tuple[int, ...]) -> np.ndarray:
    # No kernel: a strided NumPy copy is within 1.3x of anything measured, takes every dtype.
    return np.array(arr[tuple(slice(None, None, s) for s in sc)], order="C", copy=True)


def _area(arr: np.ndarray, sc: tuple[int, ...]) -> np.ndarray:
    early = _early(arr, sc, "area")
    if early is not None:
        return early
    orig = arr.dtype
    arr = _native(arr)
    if area_path(arr.dtype, sc) == "reference":
        return _ref.downsample_area(arr, sc).astype(orig, copy=False)
    float_area = arr.dtype.kind == "f"
    x, flip = _as_kernel_input(arr)
    lay = _Layout(x, sc, keep_unit_axes=float_area)
    block = lay.table.shape[1] * lay.s2
    out2 = np.empty(lay.out2_shape, dtype=x.dtype)
    if float_area:
        acc = np.empty(lay.out2_shape[1], dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):  # (pure-Python mode: inf - inf)
            _kernel("area_float", x.dtype, lay.s2)(
                lay.x2, out2, lay.table, lay.C, lay.s2, acc, float(block))
        return _epilogue(lay.finish(out2), orig)
    path = area_path(x.dtype, lay.kernel_scale)  # the block the kernel actually reduces
    if path == "identity":
        return _epilogue(lay.finish(lay.x2.copy()), orig)
    if path == "wide":
        if block >= 2**31:  # beyond the two-limb bound: Python integers
            return _ref.downsample_area(arr, sc).astype(orig, copy=False)
        w = np.empty(lay.out2_shape, dtype=np.uint64)
        _area_wide(lay.x2.astype(np.uint64, copy=False), w, lay.table, lay.C, lay.s2,
                   np.uint64(block), np.uint64(flip))
        return _epilogue(lay.finish(w.astype(x.dtype, copy=False)), orig)
    plan = _plan_integer_area(x.dtype, block)
    shift = block.bit_length() - 1 if _is_pow2(block) else -1
    if path == "strided-add":
        acc = np.empty(lay.x2.shape[1], dtype=plan)
        _kernel("area_strided", x.dtype, lay.s2)(
            lay.x2, out2, lay.table, lay.C, lay.s2, acc, shift, flip)
    else:  # "reshape-sum", and "generic" (non-dyadic: same kernel, exact division)
        acc = np.empty(lay.out2_shape[1], dtype=plan)
        _kernel("area_reshape", x.dtype, lay.s2)(
            lay.x2, out2, lay.table, lay.C, lay.s2, acc, block, shift, flip)
    return _epilogue(lay.finish(out2), orig)


def _extreme(arr: np.ndarray, sc: tuple[int, ...], method: str) -> np.ndarray:
    early = _early(arr, sc, method)
    if early is not None:
        return early
    orig = arr.dtype
    arr = _native(arr)
    if arr.dtype.kind == "f" and arr.dtype not in _KERNEL_DTYPES:  # float16
        return _ref.downsample(arr, sc, method).astype(orig, copy=False)
    x, flip = _as_kernel_input(arr)
    lay = _Layout(x, sc, keep_unit_axes=False)
    out2 = np.empty(lay.out2_shape, dtype=x.dtype)
    acc = np.empty(lay.x2.shape[1], dtype=x.dtype)
    _kernel("extreme", x.dtype, lay.s2)(
        lay.x2, out2, lay.table, lay.C, lay.s2, acc, method == "max", flip)
    return _epilogue(lay.finish(out2), orig)


def _gathering(arr: np.ndarray, sc: tuple[int, ...], method: str) -> np.ndarray:
    early = _early(arr, sc, method)
    if early is not None:
        return early
    orig = arr.dtype
    arr = _native(arr)
    if arr.dtype.kind not in "biu" and arr.dtype not in _KERNEL_DTYPES:  # complex, float16
        return _ref.downsample(arr, sc, method).astype(orig, copy=False)
    x, flip = _as_kernel_input(arr)
    lay = _Layout(x, sc, keep_unit_axes=False)
    out2 = np.empty(lay.out2_shape, dtype=x.dtype)
    block = lay.table.shape[1] * lay.s2
    buf = np.empty(block, dtype=x.dtype)
    cap = min(block, _MODE_DISTINCT_CAP)
    _kernel("gather", x.dtype, lay.s2)(
        lay.x2, out2, lay.table, lay.C, lay.s2, buf,
        np.empty(cap, dtype=x.dtype), np.empty(cap, dtype=np.int64),
        np.empty(lay.out2_shape[1], dtype=np.uint8), method == "median", flip)
    return _epilogue(lay.finish(out2), orig)


_UNCHECKED: dict[str, Callable[[np.ndarray, tuple[int, ...]], np.ndarray]] = {
    "nearest": _nearest,
    "area": _area,
    "min": lambda a, s: _extreme(a, s, "min"),
    "max": lambda a, s: _extreme(a, s, "max"),
    "mode": lambda a, s: _gathering(a, s, "mode"),
    "median": lambda a, s: _gathering(a, s, "median"),
}


def downsample_unchecked(arr: np.ndarray, scale: tuple[int, ...], method: str) -> np.ndarray:
    """:func:`downsample` for arguments already returned by ``reference.check_arguments``
    (an ndarray, a tuple of positive ints, a canonical method). The server validates once with
    its own error type and calls this, saving the re-validation (a few us matter for nearest at
    coarse scales, where the whole copy takes ~50 us)."""
    return _UNCHECKED[method](arr, scale)


def downsample(data: np.ndarray, scale: Sequence[int], method: str) -> np.ndarray:
    """Reduce ``data`` by ``scale`` with ``method``; bit-identical to the oracle."""
    arr, sc, method = check_arguments(data, scale, method)
    return _UNCHECKED[method](arr, sc)


def downsample_nearest(data: np.ndarray, scale: Sequence[int]) -> np.ndarray:
    """First element of each block, as an owned C-contiguous array (any dtype)."""
    return downsample(data, scale, "nearest")


def downsample_area(data: np.ndarray, scale: Sequence[int]) -> np.ndarray:
    """Block mean (integers: exact, round half to even; floats: float64 in oracle order;
    bool: majority, ties False). See :func:`area_path` for the kernel chosen."""
    return downsample(data, scale, "area")


def downsample_min(data: np.ndarray, scale: Sequence[int]) -> np.ndarray:
    """Block minimum; NaN propagates."""
    return downsample(data, scale, "min")


def downsample_max(data: np.ndarray, scale: Sequence[int]) -> np.ndarray:
    """Block maximum; NaN propagates."""
    return downsample(data, scale, "max")


def downsample_mode(data: np.ndarray, scale: Sequence[int]) -> np.ndarray:
    """Most frequent value per block, ties to the smallest (NaN sorts last)."""
    return downsample(data, scale, "mode")


def downsample_median(data: np.ndarray, scale: Sequence[int]) -> np.ndarray:
    """Lower median per block (NaN sorts last)."""
    return downsample(data, scale, "median")
