"""The chunk cache: Arrow IPC segments with sidecar indexes, a memory tier, budgeted eviction,
and scaled reads assembled from cached full-resolution chunks."""

from __future__ import annotations

from tensor_server.cache.manager import CacheLocked, CacheManager, Location

__all__ = ["CacheManager", "CacheLocked", "Location"]
