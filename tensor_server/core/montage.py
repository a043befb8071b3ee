"""A montage: many images of one kind laid out on a grid as one tensor (an HCS plate's wells
and their fields of view, ``adapters/_zarr_store.py``; a vendor file's positions, each its own
group, ``core/positions.py``), so a viewer opens a whole plate as one image instead of one
tensor per field.

Layout. Groups (wells) sit on a ``rows`` × ``columns`` grid; the images (fields) of a group on
a near-square grid inside the group's cell block (``ceil(sqrt(n))`` columns, filled row by row
in the group's own order, a field's slot kept empty where it is missing). Every image gets an
equal cell, the largest image's Y and X, and is placed at its own size at the cell's top-left
corner; groups are separated by a gap of ``gap_fraction`` of the cell's longer side (the
server's ``montage_gap`` setting, ``DEFAULT_GAP_FRACTION`` unless set; 0 puts groups edge to
edge, 1 a whole cell apart). What no image covers reads as 0. Channels, z and t (every axis but Y and X) are the images' own:
images whose dtype, axes or extents on those axes differ from the most common ones are left
out, with the reason, and the rest is served.

Levels. Where every image stores a level at the same factor (``native_levels``), the montage
stores that level too: a montage of each image's stored level, so a coarse read of a plate
reads each field's stored pyramid, never its full resolution (its pixels are the files', not
a reduction of the montage). For the boxes to scale exactly, the cell and the gap are rounded
up to a multiple of every stored factor: a box ``[y0, y1)`` at level 0 is ``[y0 / f,
y0 / f + h_f)`` at factor ``f``, where ``h_f`` is the image's stored extent there (``y1 / f``
rounded down or up, as the file stores it), and it never leaves its cell. Below the coarsest
stored level, levels down to one 512² tile are computed from it (``core/reduced_level.py``: a
384-well plate's fields' 4-level pyramids end at a 6.7k-px montage, too large for an
overview), so an overview never reads full resolution either. Without a level common to every
image the montage stores none, and the engine computes its levels by reducing it, as it does
for any tensor (bit-identical to reducing the full montage).

Reads (``read_region_into``) read only the images the box overlaps, each for its own part of
the box, straight into the output; the rest of the output is the fill. A box under no image
(an empty well, a gap) is a uniform block of the fill, and the images' own uniform blocks
(never-written chunks) are the montage's, so the engine answers them without reading.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensor_server.core.adapter_base import NativeLevel, TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.core.reduced_level import levels_below
from tensor_server.core.uniform import UniformBlock
from tensor_server.errors import InvalidArgument

__all__ = ["DEFAULT_GAP_FRACTION", "PLATE_FIELD", "MontageTensor", "Tile", "build_montage", "check_gap_fraction"]

#: The field of a plate's image of all its fields (``adapters/_zarr_store.py``), served beside
#: them (a file's positions image is ``core/positions.POSITIONS_FIELD``)
PLATE_FIELD = "plate"

#: the gap between groups (wells, positions), as a fraction of a cell's longer side: wide
#: enough to see where one well ends at a plate's overview, narrow enough to waste little
DEFAULT_GAP_FRACTION = 1 / 16


def check_gap_fraction(value: object) -> float:
    """``value`` as a gap fraction, or InvalidArgument naming the setting and the range: the
    one check of the server setting (``config.py``) and of every montage built."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1
    if not ok:
        raise InvalidArgument(
            f"montage gap must be a fraction of a cell between 0 and 1 (default {DEFAULT_GAP_FRACTION}), got {value!r}"
        )
    return float(value)  # type: ignore[arg-type]  # checked above: a real number


@dataclass(frozen=True)
class Tile:
    """One image to place: its ``group`` (a well's path) at grid ``row`` and ``column``, its
    ``name`` (the field's path) and ``slot`` (its place in the group's own order)."""

    group: str
    name: str
    row: int
    column: int
    slot: int
    tensor: TensorAdapter


@dataclass(frozen=True)
class _Placed:
    """An image at its level-0 (y, x) origin in the montage."""

    tile: Tile
    origin: tuple[int, int]


def _signature(t: TensorAdapter, y: int, x: int) -> tuple[Any, ...]:
    """What images must share to sit in one montage: dtype, axes and every non-plane extent."""
    return (t.dtype.str, t.dim_labels, tuple(n for i, n in enumerate(t.shape) if i not in (y, x)))


def _describe(t: TensorAdapter, y: int, x: int) -> str:
    other = {a: n for i, (a, n) in enumerate(zip(t.dim_labels, t.shape)) if i not in (y, x)}
    return f"dtype {t.dtype}, axes {''.join(t.dim_labels)}, {other}"


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def _common_levels(tiles: Sequence[Tile], y: int, x: int) -> list[tuple[int, ...]]:
    """The stored-level factors every image has, with the same non-plane extents in each."""
    common = set.intersection(*({lv.scale for lv in t.tensor.native_levels} for t in tiles))
    out = []
    for scale in sorted(common, key=math.prod):
        if len({_signature(_level(t.tensor, scale), y, x) for t in tiles}) == 1:
            out.append(scale)
    return out


def _alike(tiles: Sequence[Tile]) -> tuple[list[Tile], list[tuple[Tile, str]]]:
    """The tiles that can share one montage (Y and X axes, and the most common dtype, axes and
    non-plane extents) and the others, each with the reason."""
    left_out: list[tuple[Tile, str]] = []
    placeable = []
    for t in tiles:
        if {"y", "x"} <= set(t.tensor.dim_labels):
            placeable.append(t)
        else:
            left_out.append((t, f"axes {''.join(t.tensor.dim_labels)} have no y and x"))
    if not placeable:
        return [], left_out
    labels = placeable[0].tensor.dim_labels
    y, x = labels.index("y"), labels.index("x")
    reference = Counter(_signature(t.tensor, y, x) for t in placeable).most_common(1)[0][0]
    kept = [t for t in placeable if _signature(t.tensor, y, x) == reference]
    plate = _describe(kept[0].tensor, y, x)
    for t in placeable:
        if _signature(t.tensor, y, x) != reference:
            left_out.append((t, f"{_describe(t.tensor, y, x)} differs from the plate's ({plate})"))
    return kept, left_out


def build_montage(
    tiles: Sequence[Tile],
    rows: Sequence[str],
    columns: Sequence[str],
    *,
    gap_fraction: float = DEFAULT_GAP_FRACTION,
) -> tuple[MontageTensor | None, list[tuple[Tile, str]]]:
    """The montage of ``tiles`` on a ``rows`` × ``columns`` grid (module docstring) and the
    tiles left out with the reason; None when no tile can be placed."""
    gap_fraction = check_gap_fraction(gap_fraction)
    kept, left_out = _alike(tiles)
    if not kept:
        return None, left_out
    labels = kept[0].tensor.dim_labels
    y, x = labels.index("y"), labels.index("x")
    levels = _common_levels(kept, y, x)
    align = (math.lcm(1, *(s[y] for s in levels)), math.lcm(1, *(s[x] for s in levels)))
    raw = (max(t.tensor.shape[y] for t in kept), max(t.tensor.shape[x] for t in kept))
    cell = (_round_up(raw[0], align[0]), _round_up(raw[1], align[1]))
    gap_base = math.ceil(gap_fraction * max(raw))
    gap = (_round_up(gap_base, align[0]), _round_up(gap_base, align[1]))
    per_group = max(t.slot for t in kept) + 1
    grid_cols = math.ceil(math.sqrt(per_group))
    grid_rows = -(-per_group // grid_cols)
    pitch = (grid_rows * cell[0] + gap[0], grid_cols * cell[1] + gap[1])
    placed = [
        _Placed(
            t, (t.row * pitch[0] + t.slot // grid_cols * cell[0], t.column * pitch[1] + t.slot % grid_cols * cell[1])
        )
        for t in kept
    ]
    shape = list(kept[0].tensor.shape)
    shape[y] = len(rows) * pitch[0] - gap[0]
    shape[x] = len(columns) * pitch[1] - gap[1]
    montage = MontageTensor(placed, tuple(shape), y, x, {"montage": _layout(placed, rows, columns, cell, gap)})
    for scale in levels:
        montage.native_levels.append(NativeLevel(scale, _montage_level(placed, shape, y, x, scale)))
    montage.native_levels.extend(levels_below(montage))
    return montage, left_out


def _montage_level(
    placed: Sequence[_Placed], shape: Sequence[int], y: int, x: int, scale: tuple[int, ...]
) -> MontageTensor:
    """The montage of every image's stored level at ``scale``: origins and plane extents
    divided by the factor (exact: the layout is aligned to it), other extents the level's."""
    level_placed = [
        _Placed(
            Tile(t.group, t.name, t.row, t.column, t.slot, _level(t.tensor, scale)),  # not replace(): 4x slower
            (p.origin[0] // scale[y], p.origin[1] // scale[x]),
        )
        for p in placed
        for t in (p.tile,)
    ]
    level_shape = list(level_placed[0].tile.tensor.shape)
    level_shape[y], level_shape[x] = shape[y] // scale[y], shape[x] // scale[x]
    return MontageTensor(level_placed, tuple(level_shape), y, x, {})


def _level(t: TensorAdapter, scale: tuple[int, ...]) -> TensorAdapter:
    level = t.native_level(scale)
    assert level is not None  # _common_levels kept only the factors every image stores
    return level.tensor


def _layout(
    placed: Sequence[_Placed], rows: Sequence[str], columns: Sequence[str], cell: tuple[int, int], gap: tuple[int, int]
) -> dict[str, Any]:
    """The published layout: every placed image's level-0 box ``[[y0, x0], [y1, x1]]`` under
    its group, groups and images in the order given."""
    wells: dict[str, list[dict[str, Any]]] = {}
    for p in placed:
        t = p.tile.tensor
        size = (t.shape[t.dim_labels.index("y")], t.shape[t.dim_labels.index("x")])
        box = [list(p.origin), [p.origin[0] + size[0], p.origin[1] + size[1]]]
        wells.setdefault(p.tile.group, []).append({"path": p.tile.name, "box": box})
    return {
        "rows": list(rows),
        "columns": list(columns),
        "cell": list(cell),
        "gap": list(gap),
        "wells": [{"path": path, "fields": fields} for path, fields in wells.items()],
    }


class MontageTensor(TensorAdapter):
    """The montage (module docstring): one level of it, its images placed at their origins."""

    reads_into = True
    reports_uniform_blocks = True
    published_metadata = ("montage",)

    def __init__(
        self, placed: Sequence[_Placed], shape: tuple[int, ...], y: int, x: int, metadata: dict[str, Any]
    ) -> None:
        self._placed = list(placed)
        self._y, self._x = y, x
        first = self._placed[0].tile.tensor
        # each image's box, as arrays, so a read finds the images it overlaps in one pass
        self._y0 = np.array([p.origin[0] for p in self._placed], np.int64)
        self._x0 = np.array([p.origin[1] for p in self._placed], np.int64)
        self._y1 = self._y0 + np.array([p.tile.tensor.shape[y] for p in self._placed], np.int64)
        self._x1 = self._x0 + np.array([p.tile.tensor.shape[x] for p in self._placed], np.int64)
        digest = hashlib.blake2b(
            repr((shape, [(p.tile.name, p.origin) for p in self._placed])).encode(), digest_size=16
        )
        for p in self._placed:
            digest.update(p.tile.tensor.content_version)
        super().__init__(
            TensorInfo(
                shape,
                first.dtype,
                dim_labels=first.dim_labels,
                physical_scale=first.physical_scale,
                physical_unit=first.physical_unit,
                content_version=digest.digest(),
                metadata=metadata,
            )
        )

    @property
    def read_block_shape(self) -> tuple[int, ...] | None:
        """None: a box is cut out of the images it overlaps, each read at its own blocks."""
        return None

    def _overlaps(self, bounds: Bounds) -> list[tuple[TensorAdapter, tuple[int, int], Bounds, tuple[slice, ...]]]:
        """(image, its origin, its bounds, where they land in the output) for every image under
        ``bounds``."""
        y, x = self._y, self._x
        (ya, xa), (yb, xb) = (bounds.start[y], bounds.start[x]), (bounds.stop[y], bounds.stop[x])
        hits = np.nonzero((self._y0 < yb) & (self._y1 > ya) & (self._x0 < xb) & (self._x1 > xa))[0]
        out = []
        for i in hits:
            tensor, (oy, ox) = self._placed[i].tile.tensor, self._placed[i].origin
            lo = (max(ya, int(self._y0[i])), max(xa, int(self._x0[i])))
            hi = (min(yb, int(self._y1[i])), min(xb, int(self._x1[i])))
            start, stop = list(bounds.start), list(bounds.stop)
            start[y], stop[y], start[x], stop[x] = lo[0] - oy, hi[0] - oy, lo[1] - ox, hi[1] - ox
            view = [slice(None)] * bounds.ndim
            view[y] = slice(lo[0] - ya, hi[0] - ya)
            view[x] = slice(lo[1] - xa, hi[1] - xa)
            out.append((tensor, (oy, ox), Bounds(tuple(start), tuple(stop)), tuple(view)))
        return out

    def read_region(self, bounds: Bounds) -> np.ndarray:
        out = np.empty(bounds.shape, self.dtype)
        self.read_region_into(bounds, out)
        return out

    def read_region_into(self, bounds: Bounds, out: np.ndarray) -> None:
        out[...] = 0
        for tensor, _origin, sub, view in self._overlaps(bounds):
            tensor.read_region_into(sub, out[view])

    def uniform_blocks(self, bounds: Bounds) -> list[UniformBlock]:
        """A box under no image: itself, the fill (an empty well, a gap, a missing field: the
        engine answers it in closed form); else the uniform blocks the images under it report,
        moved to where they lie in the montage."""
        overlaps = self._overlaps(bounds)
        if not overlaps:
            return [(bounds, self.dtype.type(0))]
        out = []
        for tensor, origin, sub, _view in overlaps:
            dy, dx = origin
            for box, value in tensor.uniform_blocks(sub):
                start, stop = list(box.start), list(box.stop)
                start[self._y], stop[self._y] = start[self._y] + dy, stop[self._y] + dy
                start[self._x], stop[self._x] = start[self._x] + dx, stop[self._x] + dx
                out.append((Bounds(tuple(start), tuple(stop)), value))
        return out

    def stale_reason(self, bounds: Bounds, exact: bool = False) -> str | None:
        for tensor, _origin, sub, _view in self._overlaps(bounds):
            why = tensor.stale_reason(sub, exact)
            if why is not None:
                return why
        return None
