"""A 2-D view of an N-D tensor: which axes are the image, which plane, and region reads at
the level that serves the requested size.

A viewer names a plane with an identifier suffix: ``<array_id>;z=3;t=0`` selects index 3 of
axis ``z`` and 0 of ``t`` (unnamed axes default to 0), ``;c=1`` shows channel 1 alone (by
default every active channel is composited). The image axes are ``y`` and ``x`` (else the last
two that are not channel or sample axes); a colour-sample axis (``s``/``rgb``/``rgba``) is
kept whole.

The level a region of ``w×h`` pixels shown at ``ow×oh`` is read at (``PlaneView.level_for``;
levels are ``core.level_grid``'s published ones, down to one ``coarsest_tile``² plane)
bounds the read by the output: at most ``READ_PER_OUTPUT_PX`` level pixels per output pixel
(plus one row and column for region edges inside a level pixel).

* Sharp: the coarsest level that upsamples neither axis (scale at most ``w/ow`` on x and
  ``h/oh`` on y), never full resolution for a thumbnail; the caller resizes the rest of the
  way (by less than a factor of 2 on a near-square request). Within the bound for every near-square request:
  every IIIF and DeepZoom tile is read there, as before the bound (bar the one-pixel-high
  DeepZoom levels of a sliver image, read from the coarsest level: fewer pixels).
* A distorted size (``full/8192,64`` of an 8192² image: ``w/ow`` 1, ``h/oh`` 128) would read
  far more than it shows at the sharp level (64 Mpx for 0.5 Mpx); it is read at the finest
  coarser level within the bound instead (there 1024², 2 px per output pixel), and the less
  reduced axis is shown upscaled (8× there; at most ``sqrt`` of the two reductions' ratio).
  The finest level within the bound, not the one the larger reduction names (64² there,
  128× upscaled), keeps what resolution the bound allows.
* Only the coarsest level is left when even that is over the bound: a tiny output of a big
  region (at most one ``coarsest_tile`` tile on a computed pyramid) or a stored pyramid whose
  coarsest level is large. Reading more than ``MAX_LEVEL_READ_PX`` is refused (400).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from tensor_server.core.bounds import Bounds
from tensor_server.core.level_grid import GridLevel, grid_levels
from tensor_server.errors import InvalidArgument
from tensor_server.render.numbers import whole_number

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.core.adapter_base import TensorAdapter
    from tensor_server.core.pyramid import PyramidPolicy
    from tensor_server.render.spec import RenderSpec

__all__ = [
    "PlaneView",
    "Shown",
    "split_identifier",
    "SAMPLE_AXES",
    "MAX_IDENTIFIER",
    "READ_PER_OUTPUT_PX",
    "MAX_LEVEL_READ_PX",
]

SAMPLE_AXES = frozenset({"s", "rgb", "rgba", "sample", "samples"})
MAX_IDENTIFIER = 1024
#: level pixels a region read may take per output pixel: the sharp level of a near-square
#: request reads under 4 (its scale is over half the reduction on both axes)
READ_PER_OUTPUT_PX = 4
#: the most one region read may take when only the coarsest level is left: 4 × the IIIF
#: maxArea, what the sharp level of a ``max`` request may read
MAX_LEVEL_READ_PX = 4 * 4096 * 4096


def split_identifier(identifier: str) -> tuple[str, dict[str, int]]:
    """``"id;z=3;c=1"`` -> ``("id", {"z": 3, "c": 1})``."""
    if len(identifier) > MAX_IDENTIFIER:
        raise InvalidArgument(f"the identifier is {len(identifier)} characters (limit {MAX_IDENTIFIER})")
    array_id, *parts = identifier.split(";")
    selection: dict[str, int] = {}
    for part in parts:
        name, eq, value = part.partition("=")
        if not eq or not name:
            raise InvalidArgument(
                f"plane selector {part[:40]!r} of {array_id[:80]!r} is not axis=index (e.g. ;z=3;t=0;c=1)"
            )
        selection[name.lower()] = whole_number(value, f"plane selector {name[:40]!r}: the index")
    return array_id, selection


def _plane_levels(tensor: TensorAdapter, policy: PyramidPolicy | None, y: int, x: int) -> tuple[GridLevel, ...]:
    """The published levels (``core.level_grid``, down to one ``coarsest_tile``² plane: a
    thumbnail of a huge image is one cached chunk) that keep every non-image axis whole, so
    a plane stays a plane. Their chunks are planned chunks like any other (same ids, cache)."""
    return tuple(
        lv
        for lv in grid_levels(tensor, policy, tiles=True)
        if all(s == 1 for i, s in enumerate(lv.scale) if i not in (y, x))
    )


@dataclass(frozen=True)
class Shown:
    """A full-resolution region ``(x, y, w, h)`` of a plane shown at ``out_w × out_h``: what an
    IIIF request (``render.iiif.ImageRequest``) or a DeepZoom tile (``render.deepzoom``) asks for."""

    x: int
    y: int
    w: int
    h: int
    out_w: int
    out_h: int


@dataclass(frozen=True)
class PlaneView:
    """The plane ``selection`` of ``tensor`` as an image of ``width × height``."""

    tensor: TensorAdapter
    y: int
    x: int
    channel_axis: int | None
    sample_axis: int | None
    #: index per other axis (the channel axis included when one channel is selected)
    fixed: dict[int, int]
    levels: tuple[GridLevel, ...]
    #: the render spec the plane is shown with (``;r=``, ``render.spec``), if any
    spec: RenderSpec | None = None

    @classmethod
    def of(
        cls,
        tensor: TensorAdapter,
        selection: dict[str, int],
        policy: PyramidPolicy | None,
        spec: RenderSpec | None = None,
    ) -> PlaneView:
        """The plane ``selection`` names; a ``spec``'s own ``plane`` fills the axes the
        selection leaves out."""
        if spec is not None:
            selection = {**dict(spec.plane), **selection}
        labels = tensor.dim_labels
        sample = next((i for i, d in enumerate(labels) if d in SAMPLE_AXES and tensor.shape[i] in (3, 4)), None)
        channel = labels.index("c") if "c" in labels else None
        spatial = [i for i in range(tensor.ndim) if i not in (sample, channel)]
        if "y" in labels and "x" in labels:
            y, x = labels.index("y"), labels.index("x")
        elif len(spatial) >= 2:
            y, x = spatial[-2], spatial[-1]
        else:
            raise InvalidArgument(
                f"{tensor.array_id} has no two image axes (axes {''.join(labels)}); it cannot be shown as an image"
            )
        fixed = {}
        for name, index in selection.items():
            if name not in labels or labels.index(name) in (y, x, sample):
                raise InvalidArgument(f"{tensor.array_id} has no selectable axis {name!r} (axes {list(labels)})")
            axis = labels.index(name)
            if index >= tensor.shape[axis]:
                raise InvalidArgument(f"{name}={index} is outside {tensor.array_id} (size {tensor.shape[axis]})")
            fixed[axis] = index
        for axis in range(tensor.ndim):
            if axis not in (y, x, sample, channel):
                fixed.setdefault(axis, 0)
        return cls(tensor, y, x, channel, sample, fixed, _plane_levels(tensor, policy, y, x), spec)

    @property
    def width(self) -> int:
        return self.tensor.shape[self.x]

    @property
    def height(self) -> int:
        return self.tensor.shape[self.y]

    def square_levels(self) -> list[tuple[int, int, int]]:
        """``(factor, width, height)`` of each level reduced alike on both image axes (every
        computed level; a stored one reduced unevenly has no IIIF scale factor), finest first."""
        return [
            (lv.scale[self.x], lv.shape[self.x], lv.shape[self.y])
            for lv in self.levels
            if lv.scale[self.x] == lv.scale[self.y]
        ]

    @property
    def selected_channel(self) -> int | None:
        return None if self.channel_axis is None else self.fixed.get(self.channel_axis)

    def level_for(self, x: int, y: int, w: int, h: int, out_w: int, out_h: int) -> GridLevel:
        """The level region ``(x, y, w, h)`` shown at ``out_w × out_h`` is read at (module
        docstring): the sharp level, else the finest coarser one within the read bound, else
        the coarsest, if its read is at most ``MAX_LEVEL_READ_PX``."""
        sharp = 0
        for i, lv in enumerate(self.levels):
            if lv.scale[self.x] <= w / out_w + 1e-9 and lv.scale[self.y] <= h / out_h + 1e-9:
                sharp = i
        bound = READ_PER_OUTPUT_PX * (out_w + 1) * (out_h + 1)
        for lv in self.levels[sharp:]:
            if self._read_px(lv, x, y, w, h) <= bound:
                return lv
        coarsest = self.levels[-1]
        read_px = self._read_px(coarsest, x, y, w, h)
        if read_px > MAX_LEVEL_READ_PX:
            raise InvalidArgument(
                f"a {w}x{h} region of {self.tensor.array_id} shown at {out_w}x{out_h} would read {read_px} "
                f"pixels even at its coarsest level (limit {MAX_LEVEL_READ_PX}, or {READ_PER_OUTPUT_PX} per "
                "output pixel); ask for a larger size or a smaller region"
            )
        return coarsest

    def _level_window(self, level: GridLevel, x: int, y: int, w: int, h: int) -> tuple[int, int, int, int]:
        """``(y0, y1, x0, x1)``: the level pixels covering full-resolution region ``(x, y, w, h)``."""
        sy, sx = level.scale[self.y], level.scale[self.x]
        return (
            y // sy,
            min(-(-(y + h) // sy), level.shape[self.y]),
            x // sx,
            min(-(-(x + w) // sx), level.shape[self.x]),
        )

    def _read_px(self, level: GridLevel, x: int, y: int, w: int, h: int) -> int:
        y0, y1, x0, x1 = self._level_window(level, x, y, w, h)
        return (y1 - y0) * (x1 - x0)

    def window(self, shown: Shown) -> tuple[GridLevel, Bounds]:
        """The level serving ``shown`` (``level_for``) and the region of it to read (level
        coordinates, one index on every fixed axis): what the service reads
        (``ServingRuntime.level_region``) for ``planes``."""
        x, y, w, h = shown.x, shown.y, shown.w, shown.h
        level = self.level_for(x, y, w, h, shown.out_w, shown.out_h)
        start, stop = [0] * self.tensor.ndim, list(level.shape)
        start[self.y], stop[self.y], start[self.x], stop[self.x] = self._level_window(level, x, y, w, h)
        for axis, index in self.fixed.items():
            start[axis], stop[axis] = index, index + 1
        return level, Bounds(tuple(start), tuple(stop))

    def planes(self, data: np.ndarray) -> np.ndarray:
        """The pixels of a ``window`` as ``(channels, rows, cols)`` (samples as channels)."""
        chan = self.index_axis
        order = ([chan] if chan is not None else []) + [self.y, self.x]
        rest = [i for i in range(data.ndim) if i not in order]
        planes = np.transpose(data, order + rest).reshape([data.shape[i] for i in order])
        return planes[None] if chan is None else planes

    def every_channel(self) -> PlaneView:
        """This plane with every channel (the one selected too): render settings are measured
        on it, so showing one channel alone keeps the window it has among the others."""
        return replace(self, fixed={a: i for a, i in self.fixed.items() if a != self.channel_axis})

    @property
    def index_axis(self) -> int | None:
        """The axis a render spec's channel index counts along: a colour-sample axis, else
        the channel axis, else None (one channel)."""
        return self.sample_axis if self.sample_axis is not None else self.channel_axis

    @property
    def channel_count(self) -> int:
        """The channels a spec may name: the samples of a colour-sample axis, else the
        channel axis's length, else 1."""
        axis = self.index_axis
        return self.tensor.shape[axis] if axis is not None else 1

    def one_channel(self, index: int) -> PlaneView:
        """This plane with channel (or sample) ``index`` alone: what a histogram is measured on."""
        axis = self.index_axis
        return self if axis is None else replace(self, fixed={**self.fixed, axis: index})

    def coarsest_window(self) -> tuple[GridLevel, Bounds]:
        """The whole plane at its coarsest level (``window``): where settings are measured."""
        level = self.levels[-1]
        w, h = self.width, self.height
        return self.window(Shown(0, 0, w, h, -(-w // level.scale[self.x]), -(-h // level.scale[self.y])))
