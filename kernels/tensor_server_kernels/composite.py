"""Numba kernel for channel compositing, bit-identical to
:mod:`tensor_server_kernels.composite_reference` (whose docstring is the semantics; its
``prepare`` builds the tables both read).

One pass per output row: the row's float32 accumulator (``W × 3``, one row, so it stays in
L1) takes each visible channel's light in channel order, which is the oracle's order of
float32 additions, so the sums agree to the bit; then the row is encoded to sRGB through the
table. Per pixel and channel of integer planes: a clamp, the step read from the channel's
``ValueSteps`` (every value's step, made once per tables and dtype by the oracle's own
rounding), three table reads and three adds; of float32 planes (and integer ones whose windows
span more values than ``MAX_VALUE_STEPS`` tabulates) the step is computed (a float64
subtraction, multiplication and rounding). No ``pow`` either way (the tables hold it).

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
    value_steps,
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
def _encode_row(acc, encode, out_row):  # type: ignore[no-untyped-def]
    """One row's float32 sums ``acc`` (W, 3) -> sRGB ``out_row`` (W, 3) uint8 through ``encode``."""
    top_code = ENCODE_STEPS - 1
    for x in range(acc.shape[0]):
        for k in range(3):
            a = float(acc[x, k])
            if a >= 1.0:
                i = top_code
            elif a > 0:
                i = int(a * top_code + 0.5)
            else:
                i = 0
            out_row[x, k] = encode[i]


@njit(cache=True, nogil=True)
def _composite_rows(planes, lo, scale, light, encode, out, acc):  # type: ignore[no-untyped-def]
    """``planes`` (C, H, W) -> ``out`` (H, W, 3) uint8; ``acc`` is a (W, 3) float32 scratch
    row. Each pixel's step is computed: float32 planes have too many values for a table, and
    integer ones may (``MAX_VALUE_STEPS``). Untyped: numba specialises it per planes dtype."""
    channels, rows, cols = planes.shape
    top_step = LEVELS - 1
    for y in range(rows):
        acc[:] = 0
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
        _encode_row(acc, encode, out[y])


@njit(cache=True, nogil=True)
def _composite_rows_by_value(planes, first, last, steps, light, encode, out, acc):  # type: ignore[no-untyped-def]
    """``_composite_rows`` for integer planes, each pixel's step read from its channel's
    ``ValueSteps``. Untyped: numba specialises it per planes dtype."""
    channels, rows, cols = planes.shape
    for y in range(rows):
        acc[:] = 0
        for c in range(channels):
            row = planes[c, y]
            base = first[c]
            end = last[c]
            to_step = steps[c]
            tab = light[c]
            for x in range(cols):
                k = int(row[x]) - base
                if k < 0:
                    k = 0
                elif k > end:
                    k = end
                q = to_step[k]
                acc[x, 0] += tab[q, 0]
                acc[x, 1] += tab[q, 1]
                acc[x, 2] += tab[q, 2]
        _encode_row(acc, encode, out[y])


def composite(planes: np.ndarray, channels: Sequence[Channel]) -> np.ndarray:
    """``(H, W, 3)`` uint8: ``planes`` (one plane per entry of ``channels``) composited."""
    return composite_with(planes, prepare(channels))


def composite_with(planes: np.ndarray, tables: Tables) -> np.ndarray:
    """``composite`` with the tables made (a server keeps a spec's tables for every tile)."""
    planes = check_planes(planes, len(tables.lo))
    out = np.empty(planes.shape[1:] + (3,), np.uint8)
    acc = np.empty((planes.shape[2], 3), np.float32)
    if planes.dtype.kind == "f":
        _composite_rows(planes, tables.lo, tables.scale, tables.light, tables.encode, out, acc)
        return out
    name = planes.dtype.name
    if name not in tables.value_steps:  # two threads may both make it: the same table, either kept
        tables.value_steps[name] = value_steps(tables, planes.dtype)
    by_value = tables.value_steps[name]
    if by_value is None:  # too many values to tabulate: each pixel's step is computed
        _composite_rows(planes, tables.lo, tables.scale, tables.light, tables.encode, out, acc)
        return out
    _composite_rows_by_value(
        planes, by_value.first, by_value.last, by_value.steps, tables.light, tables.encode, out, acc
    )
    return out
