"""Levels below a stored pyramid's coarsest level, computed from that level (never level 0).

A stored pyramid may end far above an overview: a 384-well plate's montage (``core/montage.py``)
of fields with 4-level pyramids ends at ~6.7k × 2.3k px, 15 Mpx per channel, so a 1024-px
overview read at that level is resized from 15 Mpx, and the engine's computed levels would
reduce the 53k-px level 0. ``levels_below`` adds levels under the coarsest stored one, Y and X
halved until a plane fits ``PyramidPolicy.coarsest_tile``, as ``core/level_grid.py`` ends a
computed pyramid. Each is a ``ReducedLevel``: the coarsest stored level reduced by the engine
(``TensorAdapter.get_scaled_data``, streamed, the stored level's uniform blocks answered in
closed form), so its pixels are exactly the engine's reduction of that stored level, not of
level 0. They are listed with the stored levels (``NativeLevel``, advertised ``precompute``):
every door that serves a stored level serves them, and a read plans on their own grid.

Only the montage adds them today; a TIFF or OME-Zarr image whose stored pyramid ends above
one tile publishes its stored levels only.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from tensor_server.core.adapter_base import NativeLevel, TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.core.methods import default_method
from tensor_server.core.pyramid import PyramidPolicy, plane_axes

__all__ = ["ReducedLevel", "levels_below"]


class ReducedLevel(TensorAdapter):
    """``base`` (a stored level) reduced by ``factor`` with ``method``: a read of ``bounds``
    is the engine's reduction of ``base`` over ``bounds × factor``."""

    def __init__(self, base: TensorAdapter, factor: tuple[int, ...], method: str) -> None:
        self.base, self.factor, self.method = base, factor, method
        shape = tuple(-(-n // f) for n, f in zip(base.shape, factor))
        digest = hashlib.blake2b(base.content_version + repr((factor, method)).encode(), digest_size=16)
        super().__init__(
            TensorInfo(
                shape,
                base.dtype,
                dim_labels=base.dim_labels,
                physical_scale=None
                if base.physical_scale is None
                else tuple(None if v is None else v * f for v, f in zip(base.physical_scale, factor)),
                physical_unit=base.physical_unit,
                is_labels=base.is_labels,
                content_version=digest.digest(),
            )
        )

    @property
    def read_block_shape(self) -> tuple[int, ...] | None:
        """None: any box reduces its own window of the stored level."""
        return None

    def _window(self, bounds: Bounds) -> Bounds:
        """The stored level's pixels under ``bounds``: whole reduction windows, cut at its edge."""
        return Bounds(
            tuple(a * f for a, f in zip(bounds.start, self.factor)),
            tuple(min(b * f, n) for b, f, n in zip(bounds.stop, self.factor, self.base.shape)),
        )

    def read_region(self, bounds: Bounds) -> np.ndarray:
        return self.base.get_scaled_data(self._window(bounds), self.factor, self.method)

    def stale_reason(self, bounds: Bounds, exact: bool = False) -> str | None:
        return self.base.stale_reason(self._window(bounds), exact)


def levels_below(tensor: TensorAdapter, policy: PyramidPolicy | None = None) -> list[NativeLevel]:
    """Levels under ``tensor``'s coarsest stored level (module docstring), finest first:
    Y and X halved until the plane fits ``policy.coarsest_tile`` (at most ``policy.max_levels``
    levels in all), each a ``ReducedLevel`` of that stored level with the default method."""
    if not tensor.native_levels:
        return []
    policy = policy or PyramidPolicy()
    coarsest = max(tensor.native_levels, key=lambda lv: math.prod(lv.scale))
    y, x = plane_axes(tensor)
    axes = [a for a in (y, x) if a is not None]
    method = default_method(tensor.is_labels)
    factor, shape = [1] * tensor.ndim, coarsest.tensor.shape
    out: list[NativeLevel] = []
    while any(shape[a] > policy.coarsest_tile for a in axes) and len(tensor.native_levels) + len(out) + 1 < (
        policy.max_levels
    ):
        for a in axes:
            factor[a] *= 2
        level = ReducedLevel(coarsest.tensor, tuple(factor), method)
        out.append(NativeLevel(tuple(s * f for s, f in zip(coarsest.scale, factor)), level))
        shape = level.shape
    return out
