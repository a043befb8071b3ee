"""Scalar helpers the kernels of ``downsample.py`` call per element (LLVM inlines them):
rounding an integer mean half to even, the sign-bit flip of signed data viewed unsigned,
NaN-propagating extremes, and the small sort and mode of a block's values.

Kept apart from the kernels because they are the per-element rules every kernel shares;
``downsample.py`` holds the kernels and the dispatch around them.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

__all__ = ["round_shift", "round_div", "flip_sign", "pick_max", "pick_min", "same", "sort", "mode4", "mode_of"]


@njit(cache=True, nogil=True)
def round_shift(v: int, shift: int) -> np.int64:
    """``v / 2**shift`` rounded half to even, in int64 (arithmetic shift = floor, also for
    negative sums)."""
    q = v >> shift
    twice = (v - (q << shift)) << 1
    block = np.int64(1) << shift
    return q + (np.int64(twice > block) | (np.int64(twice == block) & (q & 1)))


@njit(cache=True, nogil=True)
def round_div(v: int, block: int) -> np.int64:
    """``v / block`` rounded half to even, in int64 (numba's ``//`` floors like Python)."""
    q = v // block
    twice = (v - q * block) << 1
    return q + (np.int64(twice > block) | (np.int64(twice == block) & (q & 1)))


def flip_sign(v, f):  # type: ignore[no-untyped-def]
    """``v ^ f`` for integers (f = sign bit for signed data viewed unsigned, else 0); identity for
    floats. Python version for NUMBA_DISABLE_JIT; the overload below is what kernels compile."""
    if isinstance(v, (float, np.floating)):
        return v
    return v ^ f


@overload(flip_sign)
def _flip_overload(v, f):  # type: ignore[no-untyped-def]
    if isinstance(v, types.Float):
        return lambda v, f: v
    return lambda v, f: v ^ f


@njit(cache=True, nogil=True)
def pick_max(a, b):  # type: ignore[no-untyped-def]
    """max with NaN propagation (for integers ``a != a`` folds away); bitwise ops keep it branch-free."""
    return a if (a > b) | (a != a) else b


@njit(cache=True, nogil=True)
def pick_min(a, b):  # type: ignore[no-untyped-def]
    return a if (a < b) | (a != a) else b


@njit(cache=True, nogil=True)
def same(a, b):  # type: ignore[no-untyped-def]
    """Equality in which NaN equals NaN (mode counts all NaNs as one value)."""
    return (a == b) | ((a != a) & (b != b))


@njit(cache=True, nogil=True)
def _less(a, b):  # type: ignore[no-untyped-def]
    """NumPy sort order: NaN above everything."""
    return (a < b) | ((b != b) & (a == a))


@njit(cache=True, nogil=True)
def sort(buf):  # type: ignore[no-untyped-def]
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
def mode4(a, b, c, d):  # type: ignore[no-untyped-def]
    """Mode of four values, ties to the smallest: six compares and selects, no branches, so a
    loop of these vectorises (2x2 is the most common label reduction)."""
    ab, ac, ad = same(a, b), same(a, c), same(a, d)
    bc, bd, cd = same(b, c), same(b, d), same(c, d)
    na = 1 + ab + ac + ad
    nb = 1 + ab + bc + bd
    nc = 1 + ac + bc + cd
    nd = 1 + ad + bd + cd
    better = (nb > na) | ((nb == na) & _less(b, a))
    best = b if better else a
    best_n = nb if better else na
    better = (nc > best_n) | ((nc == best_n) & _less(c, best))
    best = c if better else best
    best_n = nc if better else best_n
    better = (nd > best_n) | ((nd == best_n) & _less(d, best))
    return d if better else best


@njit(cache=True, nogil=True)
def mode_of(buf, s, vals, cnts):  # type: ignore[no-untyped-def]
    """Most frequent value of ``buf`` (the whole block, as rows of ``s``), ties to the smallest.

    Blocks of up to 64 values: vectorised pairwise counts (below). Larger blocks: distinct values
    are counted in the short list ``vals``/``cnts`` (label blocks hold a few labels), and a block
    with more than ``len(vals)`` distinct values is sorted instead and scanned for the longest
    run (count-distinct would be quadratic on noise). ``buf`` may be reordered.
    """
    B = buf.shape[0]
    if B == 4:
        return mode4(buf[0], buf[1], buf[2], buf[3])
    if B <= 64:
        # A mixed label block mostly holds two labels: count the first value and the first
        # value that differs from it (two vectorised passes); a strict majority or a two-value
        # block is decided there.
        a = buf[0]
        na = 0
        for j in range(B):
            na += same(buf[j], a)
        if 2 * na > B:
            return a
        i = 1
        while same(buf[i], a):
            i += 1
        b = buf[i]
        nb = 0
        for j in range(B):
            nb += same(buf[j], b)
        if na + nb == B or 2 * nb > B or 2 * na == B:
            if nb > na or (nb == na and _less(b, a)):
                return b
            return a
        # Small blocks: count each value against the whole block with a branch-free, vectorised
        # loop, skipping a value equal to its left or upper neighbour (``buf`` holds the block as
        # rows of ``s``): that value was already counted, and in a label image nearly every
        # value repeats a neighbour. Count-distinct's data-dependent branches mispredicted
        # enough to cost more than the whole uniform-block pass.
        best = buf[0]
        best_n = 0
        for i in range(B):
            v = buf[i]
            if (i > 0 and same(v, buf[i - 1])) or (i >= s and same(v, buf[i - s])):
                continue
            n = 0
            for j in range(B):
                n += same(buf[j], v)
            better = (n > best_n) | ((n == best_n) & _less(v, best))
            best = v if better else best
            best_n = n if better else best_n
        return best
    cap = vals.shape[0]
    nd = 0
    for i in range(B):
        v = buf[i]
        t = 0
        while t < nd and not same(vals[t], v):
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
    sort(buf)  # NaN last, as in NumPy
    best = buf[0]
    best_n = 0
    i = 0
    while i < B:
        j = i + 1
        while j < B and same(buf[j], buf[i]):
            j += 1
        if j - i > best_n:  # strictly longer: ties keep the earlier, smaller value
            best_n = j - i
            best = buf[i]
        i = j
    return best
