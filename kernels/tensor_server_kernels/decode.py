"""Numba kernels decoding quantized codes (Luxar encodings), one fused pass per element.

The formulas and their operation order are ``tensor_server.adapters._encoded``'s (which
mirror the reference decoder's NumPy expressions): each element is computed in float64 and
rounded once into the float output. NumPy evaluates the same expression as separate passes
with float64 temporaries; one fused loop reads the codes once and writes the output once
(measured by ``python -m tensor_server.bench encoded``; see docs/performance.md).

Exactness: without fast-math, numba does the same IEEE float64 operations (no FMA
contraction), so the linear families (bounded, rgb, linear per-channel) are bit-identical to
the NumPy expression. ``exp``/``expm1`` come from the platform libm here and from NumPy's
own (SIMD) implementations there; those may differ in the last float64 bit, which after
rounding to float32 is at most 1 float32 ULP (tests/adapters/encoded_zarr_test.py).

All kernels are ``@njit(cache=True, nogil=True)`` and write into ``out`` (allocated by the
caller). ``kind`` codes: see the ``SCALAR_*`` and ``PERCHANNEL_*`` constants.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = [
    "SCALAR_BOUNDED",
    "SCALAR_RGB",
    "SCALAR_LOG",
    "SCALAR_GEOLOG",
    "PERCHANNEL_LINEAR",
    "PERCHANNEL_LOG",
    "PERCHANNEL_SIGNED_LOG",
    "PERCHANNEL_GEOLOG",
    "decode_scalar",
    "decode_perchannel",
    "lut_gather",
]

SCALAR_BOUNDED, SCALAR_RGB, SCALAR_LOG, SCALAR_GEOLOG = 0, 1, 2, 3
PERCHANNEL_LINEAR, PERCHANNEL_LOG, PERCHANNEL_SIGNED_LOG, PERCHANNEL_GEOLOG = 0, 1, 2, 3


@njit(cache=True, nogil=True)
def decode_scalar(codes, out, kind, levels, a, b):  # type: ignore[no-untyped-def]
    """Flat ``codes`` -> flat ``out``. bounded: a=min, b=max; log: b=max_log;
    geolog: a=min_log, b=max_log; rgb: neither."""
    lf = float(levels)
    span = b - a
    denom = float(max(levels - 1, 1))
    for i in range(codes.size):
        c = codes[i]
        if kind == SCALAR_BOUNDED:
            out[i] = c / lf * span + a
        elif kind == SCALAR_RGB:
            out[i] = c / lf
        elif kind == SCALAR_LOG:
            out[i] = math.expm1(c / lf * b)
        elif c == 0:
            out[i] = 0.0
        else:
            out[i] = math.exp(a + (c - 1.0) / denom * span)


@njit(cache=True, nogil=True)
def decode_perchannel(codes, lo, hi, out, kind, levels, zero_level):  # type: ignore[no-untyped-def]
    """``codes`` (rows, cols) with per-column ``lo``/``hi`` (float64) -> ``out`` (rows, cols)."""
    rows, cols = codes.shape
    lf = float(levels)
    denom = float(max(levels - 1, 1))
    rng = np.empty(cols, np.float64)
    for j in range(cols):
        rng[j] = max(hi[j] - lo[j], 1e-30)
    for i in range(rows):
        for j in range(cols):
            c = codes[i, j]
            if kind == PERCHANNEL_LINEAR:
                out[i, j] = lo[j] + c / lf * rng[j]
                continue
            if zero_level and c == 0:
                out[i, j] = 0.0
                continue
            if zero_level:
                y = lo[j] + (c - 1.0) / denom * rng[j]
            else:
                y = lo[j] + c / lf * rng[j]
            if kind == PERCHANNEL_LOG:
                out[i, j] = math.expm1(y)
            elif kind == PERCHANNEL_SIGNED_LOG:
                out[i, j] = np.sign(y) * math.expm1(abs(y))
            else:
                out[i, j] = math.exp(y)


@njit(cache=True, nogil=True)
def lut_gather(idx, lut, out):  # type: ignore[no-untyped-def]
    """``out[i] = lut[idx[i]]`` over flat arrays (``lut`` rows for a row LUT); returns the
    first out-of-range index, or -1 (``out`` is then complete)."""
    n = lut.shape[0]
    for i in range(idx.size):
        k = idx[i]
        if k >= n:
            return k
        out[i] = lut[k]
    return -1
