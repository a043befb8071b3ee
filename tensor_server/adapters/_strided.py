"""StridedReads: readers whose one read method takes a step serve both reads from it.

A reader that can pick every ``step``-th pixel as cheaply as it reads a crop (a memmap, a
plane-by-plane decoder, a tile grid, DICOM frames) writes one method,
``_read_strided(bounds, step)`` = ``get_data(bounds)[::step]`` for validated ``bounds``;
this mixin derives ``read_region`` (step 1) and ``get_decimated_data`` (nearest, design §4)
from it and declares ``decimates``. Put it before TensorAdapter in the bases.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from tensor_server.core.bounds import Bounds

__all__ = ["StridedReads", "strided_slices"]


def strided_slices(bounds: Bounds, step: Sequence[int]) -> tuple[slice, ...]:
    """``bounds`` as slices with ``step`` per axis."""
    return tuple(slice(a, b, int(s)) for a, b, s in zip(bounds.start, bounds.stop, step))


class StridedReads:
    """``read_region`` and ``get_decimated_data`` from one ``_read_strided`` (module docstring)."""

    decimates: ClassVar[bool] = True

    def _read_strided(self, bounds: Bounds, step: tuple[int, ...]) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def read_region(self, bounds: Bounds) -> np.ndarray:
        return self._read_strided(bounds, (1,) * bounds.ndim)

    def get_decimated_data(self, bounds: Bounds, step: Sequence[int]) -> np.ndarray | None:
        bounds = self.check_bounds(bounds)  # type: ignore[attr-defined]
        return self._read_strided(bounds, tuple(int(s) for s in step))
