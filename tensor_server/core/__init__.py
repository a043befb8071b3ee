"""The read path's contract and machinery (no format libraries, no numba at import)."""

from __future__ import annotations

from tensor_server.core.adapter_base import NativeLevel, SourceAdapter, TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.core.chunk_id import ChunkId
from tensor_server.core.normalizing import NormalizingAdapter, normalize_axes
from tensor_server.core.plan import PlannedChunk, ReadPlan, plan_read

__all__ = [
    "Bounds",
    "ChunkId",
    "NativeLevel",
    "NormalizingAdapter",
    "PlannedChunk",
    "ReadPlan",
    "SourceAdapter",
    "TensorAdapter",
    "TensorInfo",
    "normalize_axes",
    "plan_read",
]
