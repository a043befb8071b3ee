"""Numba kernel for channel compositing, bit-identical to
:mod:`tensor_server_kernels.composite_reference` (whose docstring is the semantics; its
``prepare`` builds the tables both read).

One pass per output row: the row's float32 accumulator (``W × 3``, one row, so it stays in
L1) takes each visible channel's light in channel order, which is the oracle's order of
float32 additions, so the sums agree to the bit; then the row is encoded to sRGB through the
table. Per pixel and channel: a float64 subtraction and multiplication, a rounding, three
table reads and three adds; no ``pow`` (the tables hold it).

``@njit(cache=True, nogil=True)``: tiles are rendered on the server's worker threads, several
at once, and a fresh process loads the kernel from numba's cache (one signature per planes
dtype, compiled on first call: ``warm.py`` leaves it, as it leaves the decode kernels).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from tensor_server_kernels.composite_reference import (
    DTYPES,
    ENCODE_STEPS,
    LEVELS,
    MAX_CHANNELS,
    Channel,
    Tables,
    check_planes,
    prepare,
)

__all__ = [
    "LEVELS",
    "ENCODE_STEPS",
    "MAX_CHANNELS",
    "DTYPES",
    "Channel",
    "Tables",
    "prepare",
    "composite",
    "composite_with",
]


@njit(cache=True, nogil=True)
def _composite_rows(planes, lo, scale, light, encode, out, acc):  # type: ignore[no-untyped-def]
    """``planes`` (C, H, W) -> ``out`` (H, W, 3) uint8; ``acc`` is a (W, 3) float32 scratch row.
    Untyped: numba specialises it per planes dtype."""
    channels, rows, cols = planes.shape
    top_step = LEVELS - 1
    top_code = ENCODE_STEPS - 1
    for y in range(rows):
        for x in range(cols):
            acc[x, 0] = 0
            acc[x, 1] = 0
            acc[x, 2] = 0
        for c in range(channels):
            row = planes[c, y]
            off = lo[c]
            mul = scale[c]
            tab = light[c]
            for x in range(cols):
                u = (float(row[x]) - off) * mul + 0.5
                if u >= top_step:
                    q = top_step
                elif u > 0:
                    q = int(u)
                else:
                    q = 0
                acc[x, 0] += tab[q, 0]
                acc[x, 1] += tab[q, 1]
                acc[x, 2] += tab[q, 2]
        for x in range(cols):
            for k in range(3):
                a = float(acc[x, k])
                if a >= 1.0:
                    i = top_code
                elif a > 0:
                    i = int(a * top_code + 0.5)
                else:
                    i = 0
                out[y, x, k] = encode[i]


def composite(planes: np.ndarray, channels: Sequence[Channel]) -> np.ndarray:
    """``(H, W, 3)`` uint8: ``planes`` (one plane per entry of ``channels``) composited."""
    return composite_with(planes, prepare(channels))


def composite_with(planes: np.ndarray, tables: Tables) -> np.ndarray:
    """``composite`` with the tables made (a server keeps a spec's tables for every tile)."""
    planes = check_planes(planes, len(tables.lo))
    out = np.empty(planes.shape[1:] + (3,), np.uint8)
    acc = np.empty((planes.shape[2], 3), np.float32)
    _composite_rows(planes, tables.lo, tables.scale, tables.light, tables.encode, out, acc)
    return out
