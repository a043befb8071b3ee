"""Numba kernel drawing a label image over a composite, bit-identical to
:mod:`tensor_server_kernels.overlay_reference` (whose docstring is the semantics).

One pass over the pixels in integers: the colour of a pixel's id is the last pixel's when the
id repeats (labels come in runs along a row, so most pixels skip the hash and the override
search), else an override found by binary search, else the hash. ``@njit(cache=True,
nogil=True)`` like the compositing kernel: tiles are drawn on the server's worker threads.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tensor_server_kernels.overlay_reference import (
    FLOOR_BIT,
    HASH_ADD,
    HASH_MUL,
    _check,
    alpha_of,
    check_ids,
    check_overrides,
    label_colours,
)

__all__ = ["label_colours", "check_ids", "check_overrides", "alpha_of", "overlay"]


@njit(cache=True, nogil=True)
def _hashed(v):  # type: ignore[no-untyped-def]
    """The hashed colour components of id ``v`` (uint64), as three ints."""
    h = (v + np.uint64(HASH_ADD)) * np.uint64(HASH_MUL)
    h ^= h >> np.uint64(31)
    r = int((h >> np.uint64(8)) & np.uint64(255)) | FLOOR_BIT
    g = int((h >> np.uint64(24)) & np.uint64(255)) | FLOOR_BIT
    b = int((h >> np.uint64(40)) & np.uint64(255)) | FLOOR_BIT
    return r, g, b


@njit(cache=True, nogil=True)
def _overlay_rows(rgb, ids, alpha, keys, colours, out):  # type: ignore[no-untyped-def]
    rows, cols = ids.shape
    keep = 255 - alpha
    last = np.uint64(0)
    r = g = b = 0
    for y in range(rows):
        for x in range(cols):
            v = ids[y, x]
            if v == 0:
                out[y, x, 0] = rgb[y, x, 0]
                out[y, x, 1] = rgb[y, x, 1]
                out[y, x, 2] = rgb[y, x, 2]
                continue
            if v != last:
                last = v
                at = np.searchsorted(keys, v) if keys.shape[0] else 0
                if at < keys.shape[0] and keys[at] == v:
                    r, g, b = int(colours[at, 0]), int(colours[at, 1]), int(colours[at, 2])
                else:
                    r, g, b = _hashed(v)
            out[y, x, 0] = (int(rgb[y, x, 0]) * keep + r * alpha + 127) // 255
            out[y, x, 1] = (int(rgb[y, x, 1]) * keep + g * alpha + 127) // 255
            out[y, x, 2] = (int(rgb[y, x, 2]) * keep + b * alpha + 127) // 255


def overlay(
    rgb: np.ndarray, ids: np.ndarray, opacity: float, override_ids: np.ndarray, override_colours: np.ndarray
) -> np.ndarray:
    """``(H, W, 3)`` uint8: ``ids`` drawn over ``rgb`` (the oracle's docstring)."""
    rgb, v = _check(rgb, ids)
    keys, colours = check_overrides(override_ids, override_colours)
    out = np.empty_like(rgb)
    with np.errstate(over="ignore"):  # the hash wraps on purpose (NumPy scalars warn without numba)
        _overlay_rows(rgb, v, alpha_of(opacity), keys, colours, out)
    return out
