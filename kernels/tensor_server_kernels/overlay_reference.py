"""Pure-NumPy oracle for drawing a label image over a composite. This module DEFINES the
semantics; the numba kernel in :mod:`tensor_server_kernels.overlay` returns bit-identical
results (tests/kernels/overlay_test.py, jitted and under ``NUMBA_DISABLE_JIT=1``).

What an overlay is
------------------
``rgb`` is ``(H, W, 3)`` uint8 sRGB (a composite, ``tensor_server_kernels.composite``);
``ids`` is ``(H, W)`` label ids of any integer or boolean dtype, taken as 64-bit patterns
(:func:`check_ids`: signed ids by their two's complement, so -1 is ``2**64 - 1``). Each pixel
whose id is not 0 (the background, never drawn) takes its label's colour at ``alpha``
(0-255, the opacity of 0-1 rounded): ``out = (rgb * (255 - alpha) + colour * alpha + 127) // 255``
per component, in integers, so oracle and kernel agree to the bit without a float in sight.

A label's colour is the entry ``overrides`` gives it (``ids`` sorted ascending, as 64-bit
patterns, beside ``(n, 3)`` uint8 colours), else :func:`label_colour`'s: a stable hash of the
id (splitmix64's first round) with each component at least 64, so an object has the same
colour at every level, in every tile and in every process, and never looks like background.

Why in sRGB and not linear light: an overlay is a stencil over the picture, not light added
to it; blending display values is what napari and QuPath do, so an opacity of 0.5 looks as
the same slider does there.
"""

from __future__ import annotations

import numpy as np

__all__ = ["HASH_ADD", "HASH_MUL", "label_colours", "check_ids", "check_overrides", "alpha_of", "overlay"]

HASH_ADD = 0x9E3779B97F4A7C15
HASH_MUL = 0xBF58476D1CE4E5B9
#: every component of a hashed colour is at least this (bit 6 set)
FLOOR_BIT = 64


def check_ids(ids: np.ndarray) -> np.ndarray:
    """``ids`` as a C-contiguous uint64 array of their bit patterns (signed ids by two's complement)."""
    ids = np.asarray(ids)
    if ids.dtype.kind not in "biu":
        raise ValueError(f"label ids must be integers; got dtype {ids.dtype}")
    if ids.dtype.kind in "ub":
        return np.ascontiguousarray(ids.astype(np.uint64, copy=False))
    return np.ascontiguousarray(ids.astype(np.int64, copy=False).view(np.uint64))


def label_colours(ids: np.ndarray) -> np.ndarray:
    """``(…, 3)`` uint8 hashed colours of ``ids`` (0 black; module docstring)."""
    v = check_ids(ids)
    with np.errstate(over="ignore"):
        h = (v + np.uint64(HASH_ADD)) * np.uint64(HASH_MUL)
        h ^= h >> np.uint64(31)
    rgb = np.stack([(h >> np.uint64(s)) & np.uint64(255) for s in (8, 24, 40)], axis=-1).astype(np.uint8)
    rgb |= FLOOR_BIT
    rgb[v == 0] = 0
    return rgb


def check_overrides(override_ids: np.ndarray, override_colours: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The overrides as ``(n,)`` uint64 ids sorted ascending and ``(n, 3)`` uint8 colours."""
    given = np.asarray(override_ids).reshape(-1)
    keys = check_ids(given) if given.size else np.zeros(0, np.uint64)
    colours = np.asarray(override_colours, np.uint8).reshape(-1, 3)
    if colours.shape != (len(keys), 3):
        raise ValueError(f"overrides: {len(keys)} ids but {colours.shape[0]} colours")
    order = np.argsort(keys, kind="stable")
    keys, colours = keys[order], colours[order]
    if len(keys) > 1 and np.any(keys[1:] == keys[:-1]):
        raise ValueError("overrides: an id is given two colours")
    return np.ascontiguousarray(keys), np.ascontiguousarray(colours)


def alpha_of(opacity: float) -> int:
    """The integer alpha (0-255) of an opacity in [0, 1], rounded half up."""
    if not (np.isfinite(opacity) and 0 <= opacity <= 1):
        raise ValueError(f"opacity {opacity} must be a number from 0 to 1")
    return int(np.floor(float(opacity) * 255 + 0.5))


def _check(rgb: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rgb = np.asarray(rgb)
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"rgb must be (rows, cols, 3) uint8; got {rgb.dtype} {rgb.shape}")
    ids = check_ids(ids)
    if ids.shape != rgb.shape[:2]:
        raise ValueError(f"ids must be {rgb.shape[:2]} like rgb; got shape {ids.shape}")
    return np.ascontiguousarray(rgb), ids


def overlay(
    rgb: np.ndarray, ids: np.ndarray, opacity: float, override_ids: np.ndarray, override_colours: np.ndarray
) -> np.ndarray:
    """``(H, W, 3)`` uint8: ``ids`` drawn over ``rgb`` (module docstring)."""
    rgb, v = _check(rgb, ids)
    keys, colours = check_overrides(override_ids, override_colours)
    alpha = alpha_of(opacity)
    colour = label_colours(v)
    if len(keys):
        at = np.minimum(np.searchsorted(keys, v), len(keys) - 1)
        hit = keys[at] == v
        colour[hit] = colours[at[hit]]
    blended = (rgb.astype(np.int64) * (255 - alpha) + colour.astype(np.int64) * alpha + 127) // 255
    return np.where((v != 0)[..., None], blended, rgb).astype(np.uint8)
