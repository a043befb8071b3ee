"""float16 pixels for the float kernels: numba has no float16 arithmetic, so a kernel reads
float16 pixels as their bits (uint16) and widens each through a table of the 65536 bit
patterns' exact float64 values (``half_lut``). ``widen`` is the one spelling of that step the
kernels call; for float pixels it is the identity."""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import overload

__all__ = ["widen", "half_lut"]


def widen(v, lut):  # type: ignore[no-untyped-def]
    """A float pixel as it is; a float16 pixel's bits through ``lut``. Python version for
    NUMBA_DISABLE_JIT; the overload below is what kernels compile."""
    if isinstance(v, (float, np.floating)):
        return v
    return lut[v]


@overload(widen)
def _widen_overload(v, lut):  # type: ignore[no-untyped-def]
    if isinstance(v, types.Float):
        return lambda v, lut: v
    return lambda v, lut: lut[v]


_HALF_LUT: np.ndarray | None = None


def half_lut() -> np.ndarray:
    """float64 of each of the 65536 float16 bit patterns (512 KiB, made on first use)."""
    global _HALF_LUT
    if _HALF_LUT is None:
        _HALF_LUT = np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float64)
    return _HALF_LUT
