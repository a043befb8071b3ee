"""Numba kernels for block downsampling, bit-identical to :mod:`tensor_server_kernels.reference`.

Public names are the oracle's (``downsample`` and ``downsample_<method>``); the semantics are the
oracle's docstring. This module only explains how the kernels get there fast.

Layout: every input becomes "rows" (see :mod:`tensor_server_kernels.plan`): a C-ordered
``(rows, L * C)`` view plus a table of the input rows of each output row's block, clamped at the
end of each axis, which is the edge padding.

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

float16 ``area`` (numba has no float16 arithmetic) runs the float kernel on the pixels' bits,
each widened exactly through a table of the 65536 bit patterns' float64 values: 10x the
oracle's speed on a 64x512² volume at scale 4 (128 -> 12.4 ms), 5x on an 8192² plane at scale 2.

Integer ``area`` sums into the accumulator ``plan._plan_integer_area`` sizes from the block
(never a fixed narrow width: it would wrap silently) and rounds half to even with shifts
(power-of-two blocks) or an exact division.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numba import njit

from tensor_server_kernels import plain as _plain_kernels
from tensor_server_kernels import plan as _plan
from tensor_server_kernels import reference as _ref
from tensor_server_kernels.half import half_lut, widen
from tensor_server_kernels.plan import (  # noqa: F401  (re-exported for tests and callers)
    _KERNEL_DTYPES,
    _STRIDED_ADD_MAX_BLOCK,
    _is_pow2,
    _Layout,
    _plan_integer_area,
    area_path,
    plain_area_accumulator,
)
from tensor_server_kernels.reference import METHODS, check_arguments, output_shape
from tensor_server_kernels.scalars import (
    flip_sign,
    mode4,
    mode_of,
    pick_max,
    pick_min,
    round_div,
    round_shift,
    same,
    sort,
)

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
                    orow[q] = round_shift(v, shift) ^ f
            for q in range(full if C == 1 else 0, oL):  # ragged tail (clamp = edge padding)
                for c in range(C):
                    v = np.int64(0)
                    for j in range(s):
                        v += acc[min(q * s + j, L - 1) * C + c]
                    orow[q * C + c] = round_shift(v, shift) ^ f

    @njit(cache=True, nogil=True)
    def area_reshape(x, out, table, C, s2, acc, tmp, block, shift, f):  # type: ignore[no-untyped-def]
        """Reshape-sum, last axis first: each input row is reduced over its s2-wide block lanes,
        and those partial sums are added over the block rows into an output-width accumulator
        row. ``shift >= 0`` means ``block == 2**shift``; otherwise (non-dyadic scales) the exact
        division by ``block`` is used.

        For power-of-two s2 >= 8 the last-axis sums are a pairwise tree (log2(s2) halving passes
        through ``tmp``, each a stride-2 de-interleave that vectorises): summing s2 contiguous
        lanes per output element is a horizontal reduction, 1.5x slower at s2 = 32."""
        s = S if S > 0 else s2
        L = x.shape[1] // C
        oL = out.shape[1] // C
        full = L // s
        nrows = table.shape[1]
        tree = C == 1 and shift >= 0 and s >= 8 and tmp.shape[0] >= full * (s // 2)
        for o in range(out.shape[0]):
            acc[:] = 0
            for k in range(nrows):
                row = x[table[o, k]]
                if tree:
                    w = full * (s // 2)
                    for e in range(w):
                        tmp[e] = row[2 * e] ^ f
                        tmp[e] += row[2 * e + 1] ^ f
                    while w > full:
                        w //= 2
                        for e in range(w):
                            tmp[e] = tmp[2 * e] + tmp[2 * e + 1]
                    for q in range(full):
                        acc[q] += tmp[q]
                elif C == 1:
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
                    orow[e] = round_shift(np.int64(acc[e]), shift) ^ f
            else:
                for e in range(oL * C):
                    orow[e] = round_div(np.int64(acc[e]), block) ^ f

    @njit(cache=True, nogil=True)
    def area_float(x, out, table, C, s2, acc, block, lut):  # type: ignore[no-untyped-def]
        """Float mean in float64, adding the block's elements one at a time in C order of the
        block offsets: exactly the oracle's order, so the result is bit-identical. float16
        pixels come as their bits and are widened through ``lut`` (``half.widen``) into a float64
        ``out``, which the caller rounds to float16 once, as the oracle does."""
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
                            t += widen(row[q * s + j], lut)
                        acc[q] = t
                for q in range(full if C == 1 else 0, oL):
                    for c in range(C):
                        t = acc[q * C + c]
                        for j in range(s):
                            t += widen(row[min(q * s + j, L - 1) * C + c], lut)
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
                acc[e] = flip_sign(x[r, e], f)
            for k in range(1, nrows):
                r = table[o, k]
                if is_max:
                    for e in range(W):
                        acc[e] = pick_max(acc[e], flip_sign(x[r, e], f))
                else:
                    for e in range(W):
                        acc[e] = pick_min(acc[e], flip_sign(x[r, e], f))
            if C == 1 and is_max:  # the hot cases, written out so each loop vectorises
                for q in range(full):
                    m = acc[q * s]
                    for j in range(1, s):
                        m = pick_max(m, acc[q * s + j])
                    out[o, q] = flip_sign(m, f)
            elif C == 1:
                for q in range(full):
                    m = acc[q * s]
                    for j in range(1, s):
                        m = pick_min(m, acc[q * s + j])
                    out[o, q] = flip_sign(m, f)
            first = full if C == 1 else 0
            for q in range(first, oL):  # ragged tail, and interleaved channels
                for c in range(C):
                    m = acc[q * s * C + c]
                    for j in range(1, s):
                        v = acc[min(q * s + j, L - 1) * C + c]
                        m = pick_max(m, v) if is_max else pick_min(m, v)
                    out[o, q * C + c] = flip_sign(m, f)

    @njit(cache=True, nogil=True)
    def gather(x, out, table, C, s2, buf, vals, cnts, flags, down, mixed, is_median, f):  # type: ignore[no-untyped-def]
        """mode and median share the block gather (one compiled kernel per dtype).

        median: sort the block (NaN last, as NumPy) and take element (B - 1) // 2.
        mode: see ``scalars.mode_of``. Most blocks of a label image are uniform, so for plain rows
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
            if C == 1 and not is_median and s == 2 and nrows == 2:
                # 2x2 blocks (a plane, or a stack of planes at scale 1x2x2): the branch-free
                # mode of four for every block, no uniformity test needed.
                first_q = full
                r0 = x[table[o, 0]]
                r1 = x[table[o, 1]]
                orow = out[o]
                if f == 0:  # (unsigned, float: keep the native width, twice the SIMD lanes)
                    for q in range(full):
                        orow[q] = mode4(r0[2 * q], r0[2 * q + 1], r1[2 * q], r1[2 * q + 1])
                else:
                    for q in range(full):
                        orow[q] = flip_sign(
                            mode4(
                                flip_sign(r0[2 * q], f),
                                flip_sign(r0[2 * q + 1], f),
                                flip_sign(r1[2 * q], f),
                                flip_sign(r1[2 * q + 1], f),
                            ),
                            f,
                        )
            elif C == 1 and not is_median:
                # Pass 1, branch-free and vectorised: whether every value of a block equals its
                # first (uniform blocks: most of a label image). Each block row is compared with
                # the first, element by element (contiguous), then each block's first row is
                # checked lane by lane: 8192² uint32 labels at scale 4 took 27.7 ms comparing
                # each lane offset with the first value (strided), 21.7 like this.
                first_q = full
                orow = out[o]
                r0 = x[table[o, 0]]
                n = full * s
                for e in range(n):
                    down[e] = 1
                for k in range(1, nrows):
                    row = x[table[o, k]]
                    for e in range(n):
                        down[e] &= same(row[e], r0[e])
                for q in range(full):
                    v = r0[q * s]
                    orow[q] = v
                    u = down[q * s]
                    for j in range(1, s):
                        u &= down[q * s + j] & same(r0[q * s + j], v)
                    flags[q] = u
                # Pass 2: the mixed blocks, listed first (a branch per block mispredicted:
                # 56.3 -> 51.5 ms at scale 4, 46.2 -> 43.8 at 8).
                m = 0
                for q in range(full):
                    mixed[m] = q
                    m += 1 - flags[q]
                for i in range(m):
                    q = mixed[i]
                    n = 0
                    for k in range(nrows):
                        r = table[o, k]
                        for j in range(s):
                            buf[n] = flip_sign(x[r, q * s + j], f)
                            n += 1
                    orow[q] = flip_sign(mode_of(buf, np.int64(s), vals, cnts), f)
            for q in range(first_q, oL):
                for c in range(C):
                    n = 0
                    for k in range(nrows):
                        r = table[o, k]
                        for j in range(s):
                            buf[n] = flip_sign(x[r, min(q * s + j, L - 1) * C + c], f)
                            n += 1
                    if is_median:
                        sort(buf)
                        out[o, q * C + c] = flip_sign(buf[(B - 1) // 2], f)
                    else:
                        out[o, q * C + c] = flip_sign(mode_of(buf, np.int64(s), vals, cnts), f)

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


def _kernel(name: str, dtype: np.dtype, s2: int) -> Callable[..., Any]:
    """The compiled kernel ``name`` for this dtype: constant-``s2`` variant or runtime one."""
    if s2 in _CONST_S2 and dtype in _CONST_DTYPES[name]:
        return _VARIANTS[s2][name]
    return _VARIANTS[0][name]


def _plain(name: str, *key: Any) -> Callable[..., Any]:
    """The plain-rows kernel ``name`` (``plain.py``) for ``key`` (its factory's arguments)."""
    return getattr(_plain_kernels, f"{name}_kernel")(*key)


def _word(dtype: np.dtype) -> np.dtype:
    """The unsigned dtype of two pixels of ``dtype`` (8 or 16 bits)."""
    return np.dtype(f"u{2 * dtype.itemsize}")


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
    """Plain rows at a ``_PLAIN_NEAREST_S2`` last-axis scale: a plain kernel on the same-width
    unsigned view (a bit copy, so any 1/2/4/8-byte dtype), reading each block's word where the
    rows allow (``_block_words``). Anything else: NumPy's strided copy, which takes every dtype
    (at scale 8 and above the copy is so small that building the rows layout costs more than
    the kernel saves)."""
    if (
        arr.size
        and sc[-1] in _plan._PLAIN_NEAREST_S2
        and arr.dtype.itemsize in (1, 2, 4, 8)
        and arr.dtype.kind in "biuf"
    ):
        lay = _Layout(arr.view(f"u{arr.dtype.itemsize}"), sc, keep_unit_axes=False)
        if lay.C == 1 and lay.s2 in _plan._PLAIN_NEAREST_S2:
            out2 = np.empty(lay.out2_shape, dtype=lay.x2.dtype)
            xw = _block_words(lay.x2, lay.s2)
            if xw is None:
                _plain("nearest", lay.s2)(lay.x2, out2, lay.table)
            else:
                _plain("nearest_words", lay.s2, arr.dtype.itemsize)(lay.x2, xw, out2, lay.table)
            return lay.finish(out2).view(arr.dtype)
    return np.array(arr[tuple(slice(None, None, s) for s in sc)], order="C", copy=True)


def _block_words(x2: np.ndarray, s2: int) -> np.ndarray | None:
    """The whole blocks of each row of ``x2`` as one unsigned word per block (``s2`` pixels,
    at most 8 bytes), whose low bytes are the block's first pixel on a little-endian machine;
    None where there is no such word or the rows do not start on a word boundary."""
    nbytes = s2 * x2.dtype.itemsize
    if nbytes > 8 or sys.byteorder != "little":
        return None
    words = x2[:, : x2.shape[1] // s2 * s2].view(f"u{nbytes}")
    return words if words.flags.aligned else None


def _area_half(lay: _Layout, out2: np.ndarray, block: float) -> np.ndarray:
    """float16 area into ``out2`` (the float16 bits, as uint16): ``area_float`` on the pixels'
    bits into float64 rows, a band of about 1 MiB at a time, each rounded to float16 once (the
    oracle's single rounding). One float64 output the size of the whole (4x a float16 one) cost
    its page faults: 8192² at scale 2 took 192 ms against 48 for float32."""
    rows = max(1, (1 << 17) // max(1, out2.shape[1]))
    band = np.empty((min(rows, out2.shape[0]), out2.shape[1]), np.float64)
    acc = np.empty(out2.shape[1], dtype=np.float64)
    kernel, lut = _kernel("area_float", lay.x2.dtype, lay.s2), half_lut()
    with np.errstate(invalid="ignore", over="ignore"):  # (pure-Python mode: inf - inf)
        for o in range(0, out2.shape[0], rows):
            n = min(rows, out2.shape[0] - o)
            kernel(lay.x2, band[:n], lay.table[o : o + n], lay.C, lay.s2, acc, block, lut)
            out2[o : o + n] = band[:n].astype(np.float16).view(np.uint16)
    return out2


def _area(arr: np.ndarray, sc: tuple[int, ...]) -> np.ndarray:
    early = _early(arr, sc, "area")
    if early is not None:
        return early
    orig = arr.dtype
    arr = _native(arr)
    path = area_path(arr.dtype, sc)
    if path == "reference":
        return _ref.downsample_area(arr, sc).astype(orig, copy=False)
    float_area = arr.dtype.kind == "f"
    half = arr.dtype == np.float16  # (also at scale 1, where area_path says "identity")
    x, flip = (arr.view(np.uint16), 0) if half else _as_kernel_input(arr)
    lay = _Layout(x, sc, keep_unit_axes=float_area)
    block = lay.table.shape[1] * lay.s2
    out2 = np.empty(lay.out2_shape, dtype=x.dtype)
    if half:
        return lay.finish(_area_half(lay, out2, float(block))).view(np.float16).astype(orig, copy=False)
    if float_area:
        acc = np.empty(lay.out2_shape[1], dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):  # (pure-Python mode: inf - inf)
            _kernel("area_float", x.dtype, lay.s2)(
                lay.x2, out2, lay.table, lay.C, lay.s2, acc, float(block), np.empty(0, np.float64)
            )
        return _epilogue(lay.finish(out2), orig)
    path = area_path(x.dtype, lay.kernel_scale)  # the block the kernel actually reduces
    if path == "identity":
        return _epilogue(lay.finish(lay.x2.copy()), orig)
    if path == "wide":
        if block >= 2**31:  # beyond the two-limb bound: Python integers
            return _ref.downsample_area(arr, sc).astype(orig, copy=False)
        w = np.empty(lay.out2_shape, dtype=np.uint64)
        _area_wide(lay.x2.astype(np.uint64, copy=False), w, lay.table, lay.C, lay.s2, np.uint64(block), np.uint64(flip))
        return _epilogue(lay.finish(w.astype(x.dtype, copy=False)), orig)
    plan = _plan_integer_area(x.dtype, block)
    assert plan is not None  # area_path answered "wide" (handled above) for every block without one
    shift = block.bit_length() - 1 if _is_pow2(block) else -1
    if path == "plain" and lay.C == 1 and lay.x2.shape[1] % 2 == 0:
        xw = lay.x2.view(_word(x.dtype))
        if xw.flags.aligned:
            bits = 8 * x.dtype.itemsize
            K = 8 * plan.itemsize - bits
            buf = np.empty((lay.x2.shape[1] // lay.s2) * (lay.s2 // 2), dtype=plan)
            _plain("area", lay.s2, plan, K, bits)(
                lay.x2, xw, out2, lay.table, buf, 1 << (K - shift), flip, xw.dtype.type(int(flip) * ((1 << bits) + 1))
            )
            return _epilogue(lay.finish(out2), orig)
    if path == "plain":  # interleaved channels, odd width: the block-size gate decides
        path = "strided-add" if block <= _plan._STRIDED_ADD_MAX_BLOCK else "reshape-sum"
    if path == "strided-add":
        acc = np.empty(lay.x2.shape[1], dtype=plan)
        _kernel("area_strided", x.dtype, lay.s2)(lay.x2, out2, lay.table, lay.C, lay.s2, acc, shift, flip)
    else:  # "reshape-sum", and "generic" (non-dyadic: same kernel, exact division)
        acc = np.empty(lay.out2_shape[1], dtype=plan)
        tree = lay.C == 1 and shift >= 0 and lay.s2 >= 8
        tmp = np.empty(lay.x2.shape[1] // 2 if tree else 0, dtype=plan)
        _kernel("area_reshape", x.dtype, lay.s2)(lay.x2, out2, lay.table, lay.C, lay.s2, acc, tmp, block, shift, flip)
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
    if lay.C == 1 and lay.s2 in _plan._PLAIN_S2 and x.dtype.kind == "u" and x.dtype.itemsize <= 2:
        buf = np.empty(lay.x2.shape[1] // 2 * 2, dtype=x.dtype)
        bufw = buf.view(_word(x.dtype))
        _plain("extreme", lay.s2, method == "max", 8 * x.dtype.itemsize)(lay.x2, out2, lay.table, buf, bufw, flip)
        return _epilogue(lay.finish(out2), orig)
    acc = np.empty(lay.x2.shape[1], dtype=x.dtype)
    _kernel("extreme", x.dtype, lay.s2)(lay.x2, out2, lay.table, lay.C, lay.s2, acc, method == "max", flip)
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
        lay.x2,
        out2,
        lay.table,
        lay.C,
        lay.s2,
        buf,
        np.empty(cap, dtype=x.dtype),
        np.empty(cap, dtype=np.int64),
        np.empty(lay.out2_shape[1], dtype=np.uint8),
        np.empty(lay.x2.shape[1], dtype=np.uint8),
        np.empty(lay.out2_shape[1], dtype=np.intp),
        method == "median",
        flip,
    )
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
