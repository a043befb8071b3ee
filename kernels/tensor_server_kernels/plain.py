"""Fast kernels for the reductions a server runs all day: plain rows, small power-of-two scales.

"Plain" means the rows layout of :mod:`tensor_server_kernels.plan` with no interleaved channels
(``C == 1``) and a last-axis scale ``S`` in :data:`PLAIN_S2`, compiled as a constant. The
general kernels in :mod:`tensor_server_kernels.downsample` serve everything else and stay
exact for these cases too (the tests force them). Semantics are the oracle's; the kernels here
only change how the work is laid out:

* **Lanes as narrow as the sum allows.** numba types integer arithmetic at 64 bits, so a sum of
  uint16 pixels ran in 8-lane int64 vectors. Every intermediate here is cast back to the
  accumulator dtype ``A`` (uint16 or uint32, sized by ``plan._plan_integer_area``), which LLVM
  then narrows: 16 or 32 lanes per AVX-512 op.
* **No division, no run-time shift.** The block sum ``v`` (at most ``block * max``) is scaled by
  ``m = 2**(K - log2(block))`` with the constant ``K = bits(A) - bits(input)``, so every block
  size rounds with the same constant shift ``K``: ``(v*m + 2**(K-1) - 1 + ((v*m >> K) & 1)) >> K``
  is ``v / block`` rounded half to even (the odd quotient bit supplies the tie), and ``v*m`` never
  exceeds ``2**bits(A)`` because ``block * 2**bits(input) <= 2**bits(A)``. A run-time shift
  kept the whole chain at 64 bits.
* **Row-wise accumulation.** Block rows are added element-wise into one row buffer of ``A``
  (contiguous, vectorised; two rows fused into each pass, four where rows are long:
  ``QUAD_MIN_ROW_BYTES``), then the buffer is folded ``S`` lanes at a time into the output row.
  2x2 blocks skip the buffer: both rows are read once, side by side (min and max too).

Signed data arrives as its unsigned view with the sign bit as ``f`` (xor-ed on every read and
on the result; see ``plan._KERNEL_DTYPES``). All kernels are ``cache=True, nogil=True`` and
single-threaded, like the others.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
from numba import njit

__all__ = ["PLAIN_S2", "area_kernel", "extreme_kernel", "nearest_kernel", "nearest_words_kernel"]

#: last-axis scales with a plain-rows kernel
PLAIN_S2 = (2, 4, 8, 16, 32)

#: Rows of at least this many bytes are combined four block rows a pass (one pass over the
#: row buffer instead of three or four, four rows streaming at once); shorter rows one or two
#: a pass, where consecutive rows read as one stream. Measured (uint16, one thread, ms, old /
#: four a pass, max and area): 8192-pixel rows at scale 8 9.0 / 8.0 and 11.1 / 8.6; 2048-pixel
#: rows 9.3 / 8.4 and 10.6 / 8.6; 1024-pixel rows 9.0 / 11.3 and 10.2 / 13.0, and a 512x1024²
#: uint8 volume at 2x2x2 52 / 59 (area). The hardware prefetcher follows a stream within a 4 KiB
#: page: rows shorter than a page end before four streams pay off. The area kernel and
#: ``_combine_rows`` (min/max) each spell out this pass schedule: a jitted helper shared by
#: both would be compiled by two warm-up families into one numba cache index, which
#: ``tests/kernels/warm_test.py`` forbids (the families compile in parallel).
QUAD_MIN_ROW_BYTES = 4096

# Helpers are module-level functions taking the factory's constants as arguments (LLVM inlines
# them and folds the constants): a kernel's closure cells are part of numba's on-disk cache
# key, and a dispatcher in a cell pickles differently in every process, so a kernel closing
# over its helpers recompiled at every start.


@njit(cache=True, nogil=True)
def _rounded(v, m, A, half, k, one):  # type: ignore[no-untyped-def]
    """``v / block`` rounded half to even, with ``m = 2**(k - log2 block)`` (module docstring)."""
    w = A(v * m)
    return A(A(w + half) + A(A(w >> k) & one)) >> k


@njit(cache=True, nogil=True)
def _pair(w, fw, A, mask, bits):  # type: ignore[no-untyped-def]
    """The sum of the two pixels of a word: no lane shuffles, unlike widening each pixel."""
    w = w ^ fw
    return A(A(w & mask) + A(w >> bits))


@njit(cache=True, nogil=True)
def _quad(a, b, c, d, fw, A, mask, bits):  # type: ignore[no-untyped-def]
    """The sum of the pixels of four words (the same word of four block rows)."""
    return A(
        A(_pair(a, fw, A, mask, bits) + _pair(b, fw, A, mask, bits))
        + A(_pair(c, fw, A, mask, bits) + _pair(d, fw, A, mask, bits))
    )


@njit(cache=True, nogil=True)
def _pick(a, b, is_max):  # type: ignore[no-untyped-def]
    if is_max:
        return a if a > b else b
    return a if a < b else b


@njit(cache=True, nogil=True)
def _pick4(a, b, c, d, is_max):  # type: ignore[no-untyped-def]
    return _pick(_pick(a, b, is_max), _pick(c, d, is_max), is_max)


@njit(cache=True, nogil=True)
def _combine_rows(x, o, table, n, buf, f, is_max, quads):  # type: ignore[no-untyped-def]
    """``buf[:n]``: the element-wise min or max of output row ``o``'s block rows, four rows a
    pass where there are four and ``quads`` (see ``QUAD_MIN_ROW_BYTES``)."""
    nrows = table.shape[1]
    k = 0
    while k < nrows:
        if nrows - k >= 4 and quads:
            ra, rb = x[table[o, k]], x[table[o, k + 1]]
            rc, rd = x[table[o, k + 2]], x[table[o, k + 3]]
            if k == 0:
                for e in range(n):
                    buf[e] = _pick4(ra[e] ^ f, rb[e] ^ f, rc[e] ^ f, rd[e] ^ f, is_max)
            else:
                for e in range(n):
                    buf[e] = _pick(buf[e], _pick4(ra[e] ^ f, rb[e] ^ f, rc[e] ^ f, rd[e] ^ f, is_max), is_max)
            k += 4
        elif k == 0 and nrows >= 2:
            ra, rb = x[table[o, 0]], x[table[o, 1]]
            for e in range(n):
                buf[e] = _pick(ra[e] ^ f, rb[e] ^ f, is_max)
            k = 2
        elif k == 0:
            r = x[table[o, 0]]
            for e in range(n):
                buf[e] = r[e] ^ f
            k = 1
        else:
            r = x[table[o, k]]
            for e in range(n):
                buf[e] = _pick(buf[e], r[e] ^ f, is_max)
            k += 1


@cache
def area_kernel(S: int, acc: np.dtype, K: int, B: int) -> Callable[..., Any]:
    """``area_plain(x, xw, out, table, buf, m, f, fw)`` for last-axis scale ``S``, accumulator
    ``acc``, rounding shift ``K`` and ``B``-bit input (module docstring). ``xw`` is ``x`` viewed
    as words of two pixels, ``fw`` the flip of both; ``buf`` holds ``L * S // 2`` accumulators."""
    A = np.dtype(acc).type
    HALF = (1 << (K - 1)) - 1
    ONE = A(1)
    MASK = (1 << B) - 1
    H = S // 2

    @njit(cache=True, nogil=True)
    def area_plain(x, xw, out, table, buf, m, f, fw):  # type: ignore[no-untyped-def]
        L = x.shape[1]
        oL = out.shape[1]
        full = L // S
        nw = full * H
        nrows = table.shape[1]
        mA = A(m)
        quads = L * B >= 8 * QUAD_MIN_ROW_BYTES
        for o in range(out.shape[0]):
            orow = out[o]
            w0 = xw[table[o, 0]]
            if nrows == 1:
                for q in range(full):
                    v = _pair(w0[q * H], fw, A, MASK, B)
                    for j in range(1, H):
                        v = A(v + _pair(w0[q * H + j], fw, A, MASK, B))
                    orow[q] = _rounded(v, mA, A, HALF, K, ONE) ^ f
            elif S == 2 and nrows == 2:
                w1 = xw[table[o, 1]]
                for q in range(full):
                    v = A(_pair(w0[q], fw, A, MASK, B) + _pair(w1[q], fw, A, MASK, B))
                    orow[q] = _rounded(v, mA, A, HALF, K, ONE) ^ f
            else:
                k = 0
                while k < nrows:
                    if nrows - k >= 4 and quads:
                        wa, wb = xw[table[o, k]], xw[table[o, k + 1]]
                        wc, wd = xw[table[o, k + 2]], xw[table[o, k + 3]]
                        if k == 0:
                            for i in range(nw):
                                buf[i] = _quad(wa[i], wb[i], wc[i], wd[i], fw, A, MASK, B)
                        else:
                            for i in range(nw):
                                buf[i] = A(buf[i] + _quad(wa[i], wb[i], wc[i], wd[i], fw, A, MASK, B))
                        k += 4
                    elif k == 0:
                        w1 = xw[table[o, 1]]
                        for i in range(nw):
                            buf[i] = A(_pair(w0[i], fw, A, MASK, B) + _pair(w1[i], fw, A, MASK, B))
                        k = 2
                    else:
                        w = xw[table[o, k]]
                        for i in range(nw):
                            buf[i] = A(buf[i] + _pair(w[i], fw, A, MASK, B))
                        k += 1
                for q in range(full):
                    v = buf[q * H]
                    for j in range(1, H):
                        v = A(v + buf[q * H + j])
                    orow[q] = _rounded(v, mA, A, HALF, K, ONE) ^ f
            for q in range(full, oL):  # the ragged block: clamped lanes are the edge padding
                v = A(0)
                for k in range(nrows):
                    r = x[table[o, k]]
                    for j in range(S):
                        v = A(v + A(r[min(q * S + j, L - 1)] ^ f))
                orow[q] = _rounded(v, mA, A, HALF, K, ONE) ^ f

    return area_plain


@cache
def extreme_kernel(S: int, is_max: bool, B: int) -> Callable[..., Any]:
    """``extreme_plain(x, out, table, buf, bufw, f)``: block min or max of ``B``-bit integers
    (floats keep the general kernel, which propagates NaN). Block rows are combined
    element-wise in the input's own lanes into ``buf`` (one input row; ``bufw`` is the same
    memory as words of two pixels), then folded a word at a time; 2x2 blocks go straight to
    the output (8192² uint16: 12.1 -> 10.4 ms through the buffer and without). One kernel per
    method: a run-time choice inside the loop stops it vectorising."""
    MASK = (1 << B) - 1
    H = S // 2
    W = np.uint16 if B == 8 else np.uint32  # the word of two pixels

    @njit(cache=True, nogil=True)
    def extreme_plain(x, out, table, buf, bufw, f):  # type: ignore[no-untyped-def]
        L = x.shape[1]
        oL = out.shape[1]
        full = L // S
        n = full * S
        nrows = table.shape[1]
        quads = L * B >= 8 * QUAD_MIN_ROW_BYTES
        for o in range(out.shape[0]):
            orow = out[o]
            r0 = x[table[o, 0]]
            if S == 2 and nrows == 2:  # 2x2 blocks: both rows read once, side by side
                r1 = x[table[o, 1]]
                for q in range(full):
                    orow[q] = (
                        _pick(
                            _pick(r0[2 * q] ^ f, r0[2 * q + 1] ^ f, is_max),
                            _pick(r1[2 * q] ^ f, r1[2 * q + 1] ^ f, is_max),
                            is_max,
                        )
                        ^ f
                    )
            else:
                _combine_rows(x, o, table, n, buf, f, is_max, quads)
                for q in range(full):
                    w = bufw[q * H]
                    v = _pick(W(w & MASK), W(w >> B), is_max)
                    for j in range(1, H):
                        w = bufw[q * H + j]
                        v = _pick(v, _pick(W(w & MASK), W(w >> B), is_max), is_max)
                    orow[q] = v ^ f
            for q in range(full, oL):
                v = r0[q * S] ^ f
                for k in range(nrows):
                    r = x[table[o, k]]
                    for j in range(S):
                        v = _pick(v, r[min(q * S + j, L - 1)] ^ f, is_max)
                orow[q] = v ^ f

    return extreme_plain


@cache
def nearest_kernel(S: int) -> Callable[..., Any]:
    """``nearest_plain(x, out, table)``: the first element of each block (any dtype, run on
    its same-width unsigned view), one element at a time. For rows that cannot be read as
    words (``nearest_words_kernel``)."""

    @njit(cache=True, nogil=True)
    def nearest_plain(x, out, table):  # type: ignore[no-untyped-def]
        oL = out.shape[1]
        for o in range(out.shape[0]):
            r = x[table[o, 0]]
            orow = out[o]
            for q in range(oL):
                orow[q] = r[q * S]

    return nearest_plain


@cache
def nearest_words_kernel(S: int, B: int) -> Callable[..., Any]:
    """``nearest_words(x, xw, out, table)``: the first element of each block, read as the low
    ``B`` bytes of the block's word (``xw``: the rows' whole blocks viewed as ``S * B``-byte
    words, little-endian), so each output element is one narrowing of a contiguous load, which
    vectorises as a pack; the element-wise loop (``nearest_kernel``) compiled to a strided
    gather. 8192² uint16 at scale 2: 11.1 ms against 20.8 (NumPy's strided copy: 16.3)."""
    T = np.dtype(f"u{B}").type

    @njit(cache=True, nogil=True)
    def nearest_words(x, xw, out, table):  # type: ignore[no-untyped-def]
        oL = out.shape[1]
        full = xw.shape[1]
        for o in range(out.shape[0]):
            r = table[o, 0]
            w = xw[r]
            orow = out[o]
            for q in range(full):
                orow[q] = T(w[q])
            for q in range(full, oL):  # the ragged block
                orow[q] = x[r, q * S]

    return nearest_words
