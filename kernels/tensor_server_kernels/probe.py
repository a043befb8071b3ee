"""The bandwidth probe the kernel benchmarks measure the kernels against.

One pass over an array's memory on one core, as fast as that core can read it: a numba sum of
the bytes as uint64 words (one vector add per cache line, so memory-bound, unlike NumPy's
``sum`` of uint16, which is compute-bound at ~4 GB/s, or a float64 ``sum``, whose pairwise
additions cap it near 15 GB/s here). A kernel's time over the probe's on the same array, in
the same interleaved rounds, is the fraction of one core's read bandwidth it reaches.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["read_probe"]


@njit(cache=True, nogil=True)
def _sum_words(words):  # type: ignore[no-untyped-def]
    total = np.uint64(0)
    for i in range(words.shape[0]):
        total += words[i]
    return total


def read_probe(arr: np.ndarray) -> int:
    """Read every byte of ``arr`` (C-contiguous) once; returns the wrapped word sum."""
    flat = arr.reshape(-1).view(np.uint8)
    n = flat.size // 8 * 8
    return int(_sum_words(flat[:n].view(np.uint64)))
