"""Numba kernel for channel compositing, bit-identical to
:mod:`tensor_server_kernels.composite_reference` (whose docstring is the semantics; its
``prepare`` builds the tables both read).

One pass per output row: the row's float32 accumulator (three rows of ``W``, one per colour
component, so it stays in L1) takes each visible channel's light in channel order, which is
the oracle's order of float32 additions, so the sums agree to the bit; then the row is encoded
to sRGB through the table. Per pixel and channel of integer planes: a clamp and three reads
of the channel's ``ValueLight`` (the light of every value its window tells apart, made once
per tables and dtype by the oracle's own rounding) and three adds; of float32 planes (and
integer ones whose windows span more values than ``MAX_VALUE_LIGHTS`` tabulates) the step is
computed (a float64 subtraction, multiplication and rounding) and its light read. No ``pow``
either way (the tables hold it). 256² uint16 tile, 16 channels, windows of 3800 values, min of
200 calls, loaded 2-core machine, 2026-12-05: 2.35 ms computing each step, 1.64 reading it from
a table of steps, 1.29 reading the light from a table of values (the components in rows apart: 1.51 with them
interleaved).

``@njit(cache=True, nogil=True)``: tiles are rendered on the server's worker threads, several
at once, and a fresh process loads the kernel from numba's cache (one signature per planes
dtype, compiled on first call: ``warm.py`` leaves it, as it leaves the decode kernels).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit, uintp

from tensor_server_kernels.composite_reference import (
    DTYPES,
    ENCODE_STEPS,
    LEVELS,
    MAX_CHANNELS,
    Channel,
    Tables,
    check_planes,
    prepare,
    value_light,
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
    """One row's float32 sums ``acc`` (3, W) -> sRGB ``out_row`` (W, 3) uint8 through ``encode``."""
    top_code = ENCODE_STEPS - 1
    for x in range(acc.shape[1]):
        for k in range(3):
            a = float(acc[k, x])
            if a >= 1.0:
                i = top_code
            elif a > 0:
                i = int(a * top_code + 0.5)
            else:
                i = 0
            out_row[x, k] = encode[i]


@njit(cache=True, nogil=True)
def _composite_rows(planes, lo, scale, light, encode, out, acc):  # type: ignore[no-untyped-def]
    """``planes`` (C, H, W) -> ``out`` (H, W, 3) uint8; ``acc`` is a (3, W) float32 scratch
    row. Each pixel's step is computed: float32 planes have too many values for a table, and
    integer ones may (``MAX_VALUE_LIGHTS``). Untyped: numba specialises it per planes dtype."""
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
                acc[0, x] += tab[q, 0]
                acc[1, x] += tab[q, 1]
                acc[2, x] += tab[q, 2]
        _encode_row(acc, encode, out[y])


@njit(cache=True, nogil=True)
def _add_channel_row(row, first, last, lr, lg, lb, red, green, blue):  # type: ignore[no-untyped-def]
    """Add one channel's light of each pixel of ``row`` (``lr``, ``lg``, ``lb``: its
    ``ValueLight`` rows) to the component rows. Apart, each row an array of its own, and with
    unsigned indices, so the loop has no wraparound check (1.42 -> 1.29 ms for the tile of the
    module docstring)."""
    for x in range(row.shape[0]):
        k = uintp(min(max(np.int64(row[x]) - first, 0), last))
        red[x] += lr[k]
        green[x] += lg[k]
        blue[x] += lb[k]


@njit(cache=True, nogil=True)
def _composite_rows_by_value(planes, first, last, light, encode, out, acc):  # type: ignore[no-untyped-def]
    """``_composite_rows`` for integer planes, each pixel's light read from its channel's
    ``ValueLight``. Untyped: numba specialises it per planes dtype."""
    channels, rows, cols = planes.shape
    for y in range(rows):
        acc[:] = 0
        for c in range(channels):
            lit = light[c]
            _add_channel_row(planes[c, y], first[c], last[c], lit[0], lit[1], lit[2], acc[0], acc[1], acc[2])
        _encode_row(acc, encode, out[y])


def composite(planes: np.ndarray, channels: Sequence[Channel]) -> np.ndarray:
    """``(H, W, 3)`` uint8: ``planes`` (one plane per entry of ``channels``) composited."""
    return composite_with(planes, prepare(channels))


def composite_with(planes: np.ndarray, tables: Tables) -> np.ndarray:
    """``composite`` with the tables made (a server keeps a spec's tables for every tile)."""
    planes = check_planes(planes, len(tables.lo))
    out = np.empty(planes.shape[1:] + (3,), np.uint8)
    acc = np.empty((3, planes.shape[2]), np.float32)
    name = planes.dtype.name
    if planes.dtype.kind != "f" and name not in tables.value_light:  # two threads may both make it: either kept
        tables.value_light[name] = value_light(tables, planes.dtype)
    by_value = tables.value_light.get(name)
    if by_value is None:  # float32, or too many values to tabulate: each pixel's step is computed
        _composite_rows(planes, tables.lo, tables.scale, tables.light, tables.encode, out, acc)
    else:
        _composite_rows_by_value(planes, by_value.first, by_value.last, by_value.light, tables.encode, out, acc)
    return out
