"""Numba kernels for block downsampling (placeholder: delegates to the oracle)."""
from __future__ import annotations

from tensor_server_kernels.reference import (  # noqa: F401
    METHODS,
    downsample,
    downsample_area,
    downsample_max,
    downsample_median,
    downsample_min,
    downsample_mode,
    downsample_nearest,
)
