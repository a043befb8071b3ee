"""``downsample_block``: the one entry point the read path uses to reduce a block of pixels.

Semantics are defined by the NumPy oracle :mod:`tensor_server_kernels.reference` (read its
docstring); the work is done by the numba kernels in :mod:`tensor_server_kernels.downsample`,
which are bit-identical to the oracle.

numba is imported lazily, on the first reduction (or :func:`warm_up`): ``import tensor_server``
must stay cheap for the CLI and for processes that never reduce (a test checks that
``numba`` is not in ``sys.modules`` after importing the package).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from tensor_server_kernels.reference import check_arguments

from tensor_server.errors import InvalidArgument

__all__ = ["downsample_block", "warm_up"]

log = logging.getLogger(__name__)

# Methods reach this module canonical: aliases (stride, mean, ...) are resolved by
# ``tensor_server.core.methods`` first.

_kernels: Any = None


def _kernel_module() -> Any:
    """The numba kernel module, imported on first use (it imports numba)."""
    global _kernels
    if _kernels is None:
        from tensor_server_kernels import downsample as mod

        _kernels = mod
    return _kernels


def downsample_block(data: np.ndarray, scale_hint: Sequence[int], method: str) -> np.ndarray:
    """Reduce ``data`` by ``scale_hint`` (one positive int per axis) with ``method``.

    Returns a fresh C-contiguous array of shape ``ceil(n / s)`` per axis and the input's dtype;
    never a view of ``data`` (which is not modified). Raises
    :class:`~tensor_server.errors.InvalidArgument` (a ``ValueError``) naming the argument for an
    unknown method, a malformed scale, an array of 0 or more than 6 dimensions, or a dtype the
    method refuses (complex for area/min/max/median).
    """
    arr, scale, method = check_arguments(data, scale_hint, method, error=InvalidArgument)
    return _kernel_module().downsample_unchecked(arr, scale, method)


# Signatures compiled by warm_up: what a server most often reduces (2-D planes and 3-D
# stacks of 8/16-bit intensities and float32, the default area and label mode, nearest).
_WARM_DTYPES = (np.uint8, np.uint16, np.float32)
_WARM_METHODS = ("nearest", "area", "mode")
_WARM_SCALES = {2: ((2, 2), (4, 4)), 3: ((2, 2, 2), (1, 2, 2))}


def warm_up() -> float:
    """Compile (or load from numba's on-disk cache) the kernels a server needs first.

    Why: a first scaled read would otherwise pay 0.5-1.5 s of compilation per kernel; calling
    this at server start moves the cost off the request path. Returns the elapsed seconds (also
    logged at INFO): ~0.7 s with numba's on-disk cache warm (every later start), ~20 s on a
    machine's very first start (about 24 kernels compiled and cached). Kernels for other dtypes
    and scales still compile on first use (and are cached too).
    """
    t0 = time.perf_counter()
    for ndim, scales in _WARM_SCALES.items():
        for dt in _WARM_DTYPES:
            data = np.zeros((9,) * ndim, dtype=dt)
            for scale in scales:
                for method in _WARM_METHODS:
                    downsample_block(data, scale, method)
    elapsed = time.perf_counter() - t0
    log.info("downsample kernels warmed up in %.2f s", elapsed)
    return elapsed
