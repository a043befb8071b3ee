"""Array ownership rules shared by every reader and the engine.

Why a module of its own: what leaves a read must be memory the caller owns (writeable,
C-contiguous, native byte order, no view onto a reader's mmap or a cache entry), and both
adapters and the engine enforce that rule. One definition keeps them from drifting.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["native_dtype", "owned_array"]


def native_dtype(dtype: Any) -> np.dtype:
    """``dtype`` in native byte order (the wire sends little-endian; the server is LE)."""
    dt = np.dtype(dtype)
    return dt.newbyteorder("=") if dt.byteorder not in ("=", "|") else dt


def owned_array(arr: np.ndarray, dtype: np.dtype | None = None) -> np.ndarray:
    """``arr`` as memory this call owns: writeable, C-contiguous, native byte order, not a
    view onto anything else (a reader's mmap, a cache entry, the caller's array). Copies
    only when one of those does not already hold."""
    arr = np.asarray(arr)
    target = native_dtype(dtype if dtype is not None else arr.dtype)
    if (
        arr.dtype == target
        and arr.flags.owndata
        and arr.flags.writeable
        and arr.flags.c_contiguous
        and type(arr) is np.ndarray
    ):
        return arr
    out = np.empty(arr.shape, dtype=target)
    np.copyto(out, arr, casting="unsafe" if arr.dtype.kind == target.kind else "same_kind")
    return out
