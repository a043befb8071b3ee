"""NormalizingAdapter: present a tensor in the canonical axis order.

Clients (napari, the biopb tensor browser) expect T, C, Z, Y, X last where present. Files
store axes in their own order (TIFF often ZCYX, ND2 TZCYX, some HDF5 XYZ). The wrapper is a
pure reader like any adapter: it permutes bounds into the wrapped tensor's order, reads there
(so read blocks and decimated reads keep working) and transposes what comes back; its
capabilities are the wrapped tensor's, permuted.

It is the *served* tensor: plans, chunk ids and cache keys are in its (canonical) order, and
the engine reduces in that order, which is what the contract's oracle
``downsample_block(get_data(bounds), ...)`` means. The wrapper never passes a scaled read or
a cache to the wrapped tensor: the wrapped tensor's own keys would name different pixels
(its axes are in another order), which is how a cache-sourced read once served a transposed
source's wrong pixels. It shares the wrapped tensor's array_id and content version.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.core.adapter_base import TensorAdapter, TensorInfo
from tensor_server.core.arrays import owned_array
from tensor_server.core.bounds import Bounds

__all__ = ["NormalizingAdapter", "canonical_axis_order", "normalize_axes"]

_CANONICAL_TAIL = ("t", "c", "z", "y", "x")


def canonical_axis_order(dim_labels: Sequence[str]) -> tuple[int, ...]:
    """Permutation ``order`` so that ``[dim_labels[i] for i in order]`` ends with whichever of
    T, C, Z, Y, X are present, in that order. Other axes (positions, samples, ...) keep their
    relative order in front, except a colour-sample axis, which stays last (interleaved RGB
    is what viewers expect)."""
    low = [str(d).lower() for d in dim_labels]
    tail = [low.index(name) for name in _CANONICAL_TAIL if name in low]
    samples = [i for i, d in enumerate(low) if d in ("s", "rgb", "rgba", "sample", "samples")]
    head = [i for i in range(len(low)) if i not in tail and i not in samples]
    return tuple(head + tail + samples)


class NormalizingAdapter(TensorAdapter):
    """A canonical-order view of ``inner`` (see module docstring)."""

    def __init__(self, inner: TensorAdapter, order: Sequence[int] | None = None) -> None:
        self.inner = inner
        self.order = tuple(order) if order is not None else canonical_axis_order(inner.dim_labels)
        if sorted(self.order) != list(range(inner.ndim)):
            raise ValueError(f"{self.order} is not a permutation of {inner.ndim} axes")
        self.inverse = tuple(int(i) for i in np.argsort(self.order))
        p = self._permute
        super().__init__(
            TensorInfo(
                p(inner.shape),
                inner.dtype,
                dim_labels=p(inner.dim_labels),
                native_chunk_shape=None if inner.native_chunk_shape is None else p(inner.native_chunk_shape),
                physical_scale=None if inner.physical_scale is None else p(inner.physical_scale),
                physical_unit=None if inner.physical_unit is None else p(inner.physical_unit),
                is_labels=inner.is_labels,
                content_version=inner.content_version,
                metadata=inner.metadata,
                transfer_chunk_shape=p(inner.chunk_shape),
            )
        )
        self.native_levels = [
            type(lv)(p(lv.scale), NormalizingAdapter(lv.tensor, self.order)) for lv in inner.native_levels
        ]

    def _permute(self, values: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(values[i] for i in self.order)

    def _to_inner(self, values: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(values[i] for i in self.inverse)

    # array_id is bound on the wrapper by the source; keep the inner one in step so chunk ids
    # minted by either name the same tensor.
    @property
    def array_id(self) -> str:
        return self.inner.array_id

    @array_id.setter
    def array_id(self, value: str) -> None:
        self.inner.array_id = value

    @property
    def decimates(self) -> bool:  # type: ignore[override]
        return self.inner.decimates

    @property
    def reports_uniform_blocks(self) -> bool:  # type: ignore[override]
        return self.inner.reports_uniform_blocks

    @property
    def reads_into(self) -> bool:  # type: ignore[override]
        return self.inner.reads_into

    def read_region_into(self, bounds: Bounds, out: np.ndarray) -> None:
        self.inner.read_region_into(self._inner_bounds(bounds), np.transpose(out, self.inverse))

    def uniform_blocks(self, bounds: Bounds) -> list[tuple[Bounds, np.generic]]:
        return [(box.permute(self.order), v) for box, v in self.inner.uniform_blocks(self._inner_bounds(bounds))]

    @property
    def read_block_shape(self) -> tuple[int, ...] | None:
        rb = self.inner.read_block_shape
        return None if rb is None else self._permute(rb)

    def _inner_bounds(self, bounds: Bounds) -> Bounds:
        return bounds.permute(self.inverse)

    def _out(self, arr: np.ndarray) -> np.ndarray:
        return owned_array(np.transpose(arr, self.order), self.dtype)

    def read_region(self, bounds: Bounds) -> np.ndarray:
        return np.transpose(self.inner.get_data(self._inner_bounds(bounds)), self.order)

    def get_data(self, bounds: Bounds | None = None) -> np.ndarray:
        bounds = self.check_bounds(bounds)
        return self._out(self.inner.get_data(self._inner_bounds(bounds)))

    def get_decimated_data(self, bounds: Bounds, step: Sequence[int]) -> np.ndarray | None:
        dec = self.inner.get_decimated_data(self._inner_bounds(bounds), self._to_inner(step))
        return None if dec is None else self._out(dec)

    def stale_reason(self, bounds: Bounds, exact: bool = False) -> str | None:
        return self.inner.stale_reason(self._inner_bounds(bounds), exact)

    def refresh_extent(self) -> str | None:
        """The wrapped tensor's growth, taken in this order (its stored levels' too)."""
        why = self.inner.refresh_extent()
        if why is not None:
            return why
        for level in self.native_levels:
            level.tensor.refresh_extent()
        shape = self._permute(self.inner.shape)
        if shape != self.shape:
            self.grow_to(shape)
        return None

    def growth_paths(self) -> tuple[Path, ...]:
        return self.inner.growth_paths()

    def settled(self, bounds: Bounds) -> bool:
        return self.inner.settled(self._inner_bounds(bounds))

    def close(self) -> None:
        self.inner.close()


def normalize_axes(tensor: TensorAdapter) -> TensorAdapter:
    """``tensor`` itself when already canonical, else a NormalizingAdapter over it."""
    order = canonical_axis_order(tensor.dim_labels)
    if order == tuple(range(tensor.ndim)):
        return tensor
    return NormalizingAdapter(tensor, order)
