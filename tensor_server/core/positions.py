"""A multi-position acquisition as one image: the positions of a file that holds several
without a plate (a CZI's scenes, an ND2's or a Micro-Manager dataset's ``p`` axis) laid out
on a grid as one tensor, ``<source_id>/positions``, built by ``core/montage.py``.

Layout: each position is its own cell, in acquisition order (the file's own position index),
row by row on a near-square grid (``ceil(sqrt(n))`` columns), the montage's gap between cells.
What a user browsing positions expects: every position at once, each clearly one field of
view. Not the plate's fields-in-a-well packing (images side by side with no gap between):
positions are separate fields of view, often far apart on the stage, and drawn edge to edge
two of them read as one stitched image, which they are not. Not the stage coordinates: the
positions of an experiment may overlap or lie centimetres apart (a carrier scanned scene by
scene), so a stage-true overview is mostly empty or overdrawn; the acquisition order is the
order the user set up and the file's position list shows. Positions of different sizes (CZI
scenes) sit at their own size at the top-left corner of equal cells, as a plate's fields do.

Published as ``montage`` (the tensor's metadata, on its descriptor alone): ``{"rows": ["0", ...],
"columns": ["0", ...], "cell": [h, w], "gap": [gy, gx], "positions": [{"index": 2, "name":
"Pos2", "box": [[y0, x0], [y1, x1]]}]}``, boxes in level-0 pixels, names from the file.
Vendor files store no pyramid: the engine computes the montage's levels by reducing it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tensor_server.core.adapter_base import TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.core.montage import DEFAULT_GAP_FRACTION, MontageTensor, Tile, build_montage
from tensor_server.core.uniform import UniformBlock

__all__ = ["AxisIndexTensor", "POSITIONS_FIELD", "axis_positions", "positions_montage"]

#: the field of a source's montage of its positions, served beside its own tensors
POSITIONS_FIELD = "positions"


def positions_montage(
    positions: Sequence[tuple[int, str, TensorAdapter]], gap_fraction: float = DEFAULT_GAP_FRACTION
) -> MontageTensor | None:
    """The montage of ``positions`` ((index in the file, name, image), in acquisition order)
    on a near-square grid (module docstring); None for fewer than two (nothing to lay out).
    The positions of one file share dtype, axes and their other extents (indices of one
    tensor, or CZI scenes of one set of planes), so every one is placed."""
    if len(positions) < 2:
        return None
    columns = math.ceil(math.sqrt(len(positions)))
    rows = -(-len(positions) // columns)
    # each position its own group (keyed by its index: names from a file may repeat or be empty)
    tiles = [Tile(str(i), name, k // columns, k % columns, 0, t) for k, (i, name, t) in enumerate(positions)]
    montage, left_out = build_montage(
        tiles, [str(r) for r in range(rows)], [str(c) for c in range(columns)], gap_fraction=gap_fraction
    )
    assert montage is not None and not left_out, f"positions of one file differ: {left_out}"
    plate = montage.metadata["montage"]
    layout: dict[str, Any] = {k: plate[k] for k in ("rows", "columns", "cell", "gap")}
    layout["positions"] = [
        {"index": int(group["path"]), "name": field["path"], "box": field["box"]}
        for group in plate["wells"]
        for field in group["fields"]
    ]
    montage.metadata = {"montage": layout}
    return montage


def axis_positions(
    tensor: TensorAdapter, names: Sequence[str], axis: str = "p"
) -> list[tuple[int, str, TensorAdapter]]:
    """The positions of a tensor whose positions are an axis (``p``): (index, name, the
    tensor at that index); ``names`` from the file where it has one per position, else the
    index. Empty when the tensor has no such axis."""
    if axis not in tensor.dim_labels:
        return []
    a = tensor.dim_labels.index(axis)
    n = tensor.shape[a]
    label = list(names) if len(names) == n and all(names) else [str(i) for i in range(n)]
    return [(i, label[i], AxisIndexTensor(tensor, a, i)) for i in range(n)]


class AxisIndexTensor(TensorAdapter):
    """One index of one axis of ``inner``, as a tensor without that axis (a position of a
    tensor whose positions are its ``p`` axis), so a montage places it like any image. Only
    read inside a montage, which reads into its output: reads go straight into a view of the
    caller's buffer with the axis put back, no copy."""

    reads_into = True
    reports_uniform_blocks = True

    def __init__(self, inner: TensorAdapter, axis: int, index: int) -> None:
        self.inner, self.axis, self.index = inner, axis, index
        digest = hashlib.blake2b(inner.content_version, digest_size=16)
        digest.update(f"{axis}:{index}".encode())
        super().__init__(
            TensorInfo(
                self._drop(inner.shape),
                inner.dtype,
                dim_labels=self._drop(inner.dim_labels),
                native_chunk_shape=None if inner.native_chunk_shape is None else self._drop(inner.native_chunk_shape),
                physical_scale=None if inner.physical_scale is None else self._drop(inner.physical_scale),
                physical_unit=None if inner.physical_unit is None else self._drop(inner.physical_unit),
                content_version=digest.digest(),
            )
        )

    def _drop(self, values: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(v for i, v in enumerate(values) if i != self.axis)

    def _inner_bounds(self, bounds: Bounds) -> Bounds:
        a = self.axis
        return Bounds(
            bounds.start[:a] + (self.index,) + bounds.start[a:], bounds.stop[:a] + (self.index + 1,) + bounds.stop[a:]
        )

    @property
    def read_block_shape(self) -> tuple[int, ...] | None:
        """The inner tensor's block without the axis (one index of it is what is read)."""
        block = self.inner.read_block_shape
        return None if block is None else self._drop(block)

    def read_region(self, bounds: Bounds) -> np.ndarray:
        out = np.empty(bounds.shape, self.dtype)
        self.read_region_into(bounds, out)
        return out

    def read_region_into(self, bounds: Bounds, out: np.ndarray) -> None:
        self.inner.read_region_into(self._inner_bounds(bounds), np.expand_dims(out, self.axis))

    def uniform_blocks(self, bounds: Bounds) -> list[UniformBlock]:
        """The inner tensor's uniform blocks at this index, without the axis."""
        return [
            (Bounds(self._drop(box.start), self._drop(box.stop)), value)
            for box, value in self.inner.uniform_blocks(self._inner_bounds(bounds))
        ]

    def stale_reason(self, bounds: Bounds, exact: bool = False) -> str | None:
        return self.inner.stale_reason(self._inner_bounds(bounds), exact)
