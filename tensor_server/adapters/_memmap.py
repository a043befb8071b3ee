"""Reads of adapters whose pixels are one NumPy memmap (MRC, DeltaVision; NIfTI's strides).

Shared reader machinery, not one format's: a crop of a memmap costs only its own pages (no
read block), and a step indexes the memmap directly, so nearest never touches the skipped
rows. The copy out happens inside the handle's ``use()`` so no view outlives the mapping
(closing an mmap under a live view would crash the reader).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.adapters._strided import StridedReads, strided_slices
from tensor_server.core.arrays import owned_array
from tensor_server.core.bounds import Bounds
from tensor_server.core.handles import LazyHandle
from tensor_server.errors import UnreadableSource

__all__ = ["MemmapReads"]


class MemmapReads(StridedReads):
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

    def _read_strided(self, bounds: Bounds, step: tuple[int, ...]) -> np.ndarray:
        try:
            with self._handle.use() as handle:
                return owned_array(self._array(handle)[strided_slices(bounds, step)], self.dtype)  # type: ignore[attr-defined]
        except UnreadableSource:
            raise
        except (OSError, ValueError) as exc:  # the file vanished or shrank since it was opened
            raise UnreadableSource(self.path, f"read failed: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        self._handle.close()
