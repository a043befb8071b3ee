"""Reads of adapters whose pixels are one NumPy memmap (MRC, DeltaVision; NIfTI's strides).

Shared reader machinery, not one format's: a crop of a memmap costs only its own pages (no
read block), and a step indexes the memmap directly, so nearest never touches the skipped
rows. The copy out happens inside the handle's ``use()`` so no view outlives the mapping
(closing an mmap under a live view would crash the reader).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tensor_server.core.arrays import owned_array
from tensor_server.core.bounds import Bounds
from tensor_server.core.handles import LazyHandle
from tensor_server.errors import UnreadableSource

__all__ = ["MemmapReads", "strided_slices"]


def strided_slices(bounds: Bounds, step: Sequence[int] | None = None) -> tuple[slice, ...]:
    """``bounds`` as slices, with ``step`` per axis when given (a decimated read)."""
    if step is None:
        return bounds.to_slices()
    return tuple(slice(a, b, int(s)) for a, b, s in zip(bounds.start, bounds.stop, step))


class MemmapReads:
    """Reads for an adapter whose pixels are one NumPy memmap held by ``self._handle``.

    Subclasses set ``self._handle`` (a LazyHandle) and implement ``_array(handle)`` returning
    the memmap. A crop costs only its own pages, so there is no read block; a step indexes the
    memmap directly, so nearest never touches the skipped rows. The copy happens inside
    ``use()`` so no view outlives the mapping.
    """

    _handle: LazyHandle[Any]
    path: Path

    def _array(self, handle: Any) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def read_block_shape(self) -> tuple[int, ...] | None:
        return None

    def _read(self, bounds: Bounds, step: Sequence[int] | None) -> np.ndarray:
        try:
            with self._handle.use() as handle:
                return owned_array(self._array(handle)[strided_slices(bounds, step)], self.dtype)  # type: ignore[attr-defined]
        except UnreadableSource:
            raise
        except (OSError, ValueError) as exc:  # the file vanished or shrank since it was opened
            raise UnreadableSource(self.path, f"read failed: {type(exc).__name__}: {exc}") from exc

    def read_region(self, bounds: Bounds) -> np.ndarray:
        return self._read(bounds, None)

    def get_decimated_data(self, bounds: Bounds, step: Sequence[int]) -> np.ndarray | None:
        return self._read(bounds, step)

    def close(self) -> None:
        self._handle.close()
