"""The geometry of an export: NGFF axes, pyramid levels, chunk and shard shapes, read units.

Why units shape everything. The source is read once, in *units*: level-0 boxes that are a
whole number of every level's reduction blocks (so each level's pixels of a unit are
``downsample_block(unit, scale)``, exactly what the engine's streamed reduction computes for
them, for every method and dtype: core/stream_reduce.py) and a whole number of every level's
shards (so a unit's pixels complete its shards at every level at once). A unit is therefore
the unit of work, of memory and of resume: nothing of one unit waits for another.

Shards of level k are ``gcd(shard, unit / scale_k)`` (a coarse level's shards shrink so a unit
still holds whole ones); chunks are ``gcd(chunk, shard_k)``. The unit starts at
``lcm(shard, coarsest scale)`` and grows in Y and X (up to ``UNIT_BUDGET_BYTES``) while the
coarsest level's chunks would be smaller than asked.

Bounds (export/options.py says why): asked chunks and shards are at least ``MIN_CHUNK_EDGE``
in Y and X; ``lcm(shard, coarsest scale)`` with its levels holds at most ``MAX_UNIT_BYTES``
(default shards halve until it does; asked shards, or levels so deep that the coarsest block
is larger, are refused naming the option and the most that fits); ``check_file_count`` refuses
an export of more than ``MAX_FILES`` files before anything is written.

Axes: NGFF wants (t, c, z, y, x) in that order, at most one of each. The source's axes are
mapped there: known labels keep their meaning, an RGB samples axis ``s`` is folded into the
channel axis (channel = c·S + s), size-1 axes NGFF has no name for are dropped, and any
other axis is refused. Levels are computed in the source's axis order and moved to NGFF
order afterwards (moving axes does not change a value).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from math import gcd, prod

import numpy as np
from tensor_server_kernels.reference import output_shape

from tensor_server.core.adapter_base import TensorAdapter
from tensor_server.core.bounds import Bounds
from tensor_server.core.level_grid import published_levels, scales_on
from tensor_server.core.methods import PRECOMPUTE, default_method, effective_method
from tensor_server.core.pyramid import PyramidPolicy
from tensor_server.errors import InvalidArgument
from tensor_server.export.options import MAX_FILES, MAX_UNIT_BYTES, MIN_CHUNK_EDGE

__all__ = ["AxisMap", "Level", "Layout", "plan_layout", "label_scales", "label_shape_option", "check_file_count"]

NGFF_ORDER = ("t", "c", "z", "y", "x")
#: how large a read unit may grow to keep the coarsest level's chunks whole (bytes of level 0)
UNIT_BUDGET_BYTES = 32 << 20
#: default chunk edge (Y, X) and shard edge for planes, and for volumes (Z, Y, X)
PLANE_CHUNK, PLANE_SHARD = 256, 2048
VOLUME_CHUNK, VOLUME_SHARD = (16, 256, 256), (16, 512, 512)


def _lcm(a: int, b: int) -> int:
    return a * b // gcd(a, b)


def _levels_bytes(unit: Sequence[int], scales: Sequence[Sequence[int]], itemsize: int) -> int:
    """Bytes of a unit's pixels at every level (level 0 included)."""
    return int(sum(prod(-(-u // s) for u, s in zip(unit, scale)) for scale in scales) * itemsize)


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"


@dataclass(frozen=True)
class AxisMap:
    """Source axes -> NGFF axes. ``order``: source axes in output order (dropped axes
    first, then t, c, s, z, y, x as present); ``out_labels``/``out_shape``: the output's."""

    source_labels: tuple[str, ...]
    order: tuple[int, ...]
    dropped: int
    merge_samples: bool
    out_labels: tuple[str, ...]

    @classmethod
    def of(cls, tensor: TensorAdapter) -> AxisMap:
        labels, shape = tensor.dim_labels, tensor.shape
        if len(set(labels)) != len(labels):
            raise InvalidArgument(f"{tensor.array_id}: axis labels {list(labels)} repeat; OME-Zarr needs distinct axes")
        known = [a for a in NGFF_ORDER if a in labels]
        extra = [i for i, a in enumerate(labels) if a not in NGFF_ORDER and a != "s"]
        wide = [f"{labels[i]} ({shape[i]})" for i in extra if shape[i] > 1]
        if wide:
            raise InvalidArgument(
                f"{tensor.array_id}: axes {wide} have no OME-Zarr meaning (it knows t, c, z, y, x); "
                "export one position of them at a time"
            )
        if not {"y", "x"} <= set(labels):
            raise InvalidArgument(
                f"{tensor.array_id}: axes {list(labels)} lack y and x; OME-Zarr images are planes or volumes"
            )
        order = list(extra)
        for a in NGFF_ORDER:
            if a in labels:
                order.append(labels.index(a))
            if a == "c" and "s" in labels:
                order.append(labels.index("s"))
        out = list(known)
        if "s" in labels and "c" not in labels:
            out.insert(1 if "t" in out else 0, "c")
        return cls(tuple(labels), tuple(order), len(extra), "s" in labels, tuple(out))

    def out_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """The output shape of a source-ordered ``shape``."""
        moved = [shape[i] for i in self.order[self.dropped :]]
        if self.merge_samples and "c" in self.source_labels:  # c then s, side by side: one axis of c·S
            s_pos = self.order[self.dropped :].index(self.source_labels.index("s"))
            moved[s_pos - 1 : s_pos + 1] = [moved[s_pos - 1] * moved[s_pos]]
        return tuple(moved)  # without c, the samples axis is the channel axis, already in its place

    def to_output(self, block: np.ndarray) -> np.ndarray:
        """A source-ordered block in output order (a view when no samples axis merges)."""
        moved = block.transpose(self.order)
        return moved.reshape(self.out_shape(block.shape)) if self.merge_samples or self.dropped else moved

    def source_value(self, out_value: Sequence[int]) -> list[int]:
        """A per-output-axis shape (chunks, shards) per source axis: dropped axes get 1; a
        channel value goes to ``c`` (or to ``s`` when it is the channel axis; the samples
        axis is made whole by the caller anyway)."""
        values = [1] * len(self.source_labels)
        for label, v in zip(self.out_labels, out_value):
            source = label if label in self.source_labels else "s"
            values[self.source_labels.index(source)] = int(v)
        return values


@dataclass(frozen=True)
class Level:
    """One pyramid level, in source axis order except ``out_*``."""

    index: int
    scale: tuple[int, ...]
    shape: tuple[int, ...]
    shard: tuple[int, ...]
    chunk: tuple[int, ...]

    @property
    def path(self) -> str:
        return str(self.index)


@dataclass(frozen=True)
class Layout:
    axes: AxisMap
    method: str
    levels: tuple[Level, ...]
    unit: tuple[int, ...]
    shape: tuple[int, ...]
    itemsize: int

    def units(self) -> Iterator[Bounds]:
        """The read units covering the source, row-major (index = position in this order)."""
        ranges = [range(0, n, u) for n, u in zip(self.shape, self.unit)]
        for starts in itertools.product(*ranges):
            yield Bounds(starts, tuple(min(a + u, n) for a, u, n in zip(starts, self.unit, self.shape)))

    def unit_count(self) -> int:
        return prod(-(-n // u) for n, u in zip(self.shape, self.unit))

    def unit_bytes(self) -> int:
        """Bytes of one unit's pixels at every level (what one unit in flight holds)."""
        return _levels_bytes(self.unit, [lv.scale for lv in self.levels], self.itemsize)

    def file_count(self, sharded: bool) -> int:
        """The chunk files (zarr v2) or shard files (v3) every level of this image writes."""
        return sum(prod(-(-n // f) for n, f in zip(lv.shape, lv.shard if sharded else lv.chunk)) for lv in self.levels)

    def describe(self) -> dict:
        """JSON-ready: the record's and summary's account of the geometry, in output order."""
        out = self.axes.out_shape
        return {
            "axes": list(self.axes.out_labels),
            "method": self.method,
            "unit": list(out(self.unit)),
            "levels": [
                {
                    "path": lv.path,
                    "scale": list(out(lv.scale)),
                    "shape": list(out(lv.shape)),
                    "shards": list(out(lv.shard)),
                    "chunks": list(out(lv.chunk)),
                }
                for lv in self.levels
            ],
        }


def level_scales(
    tensor: TensorAdapter, levels: str | int, policy: PyramidPolicy | None = None
) -> list[tuple[int, ...]]:
    """Per-level scales (source order): the published pyramid's (``core.level_grid``: the
    stored levels' factors, else halvings down to one 512² plane; ``policy``: a server's), or
    N halvings of Y and X."""
    if levels == "auto":
        return [tuple(spec.scale) for spec in published_levels(tensor, policy)]
    y, x = tensor.dim_labels.index("y"), tensor.dim_labels.index("x")
    scales: list[tuple[int, ...]] = []
    for k in range(int(levels)):
        scale = [1] * tensor.ndim
        for axis in (y, x):  # never past the power of two that already covers the axis
            scale[axis] = min(2**k, 1 << max(tensor.shape[axis] - 1, 0).bit_length())
        if scales and tuple(scale) == scales[-1]:
            raise InvalidArgument(
                f"{tensor.array_id}: {levels} levels halve a {tensor.shape[y]}x{tensor.shape[x]} plane past one pixel; "
                f"ask for at most {k}"
            )
        scales.append(tuple(scale))
    return scales


def label_scales(image: TensorAdapter, image_layout: Layout, label: TensorAdapter) -> list[tuple[int, ...]]:
    """The image's level factors on a label image's axes (``core.level_grid.scales_on``)."""
    return scales_on(image, [lv.scale for lv in image_layout.levels], label)


def label_shape_option(
    image_axes: AxisMap, label: TensorAdapter, value: Sequence[int] | None
) -> tuple[int, ...] | None:
    """A chunk or shard shape given on the image's output axes, on a label image's (by name)."""
    if value is None:
        return None
    by_name = dict(zip(image_axes.out_labels, value))
    return tuple(by_name.get(a, 1) for a in AxisMap.of(label).out_labels)


def export_method(tensor: TensorAdapter, method: str | None) -> str:
    m = default_method(tensor.is_labels) if not method else effective_method(method, is_labels=tensor.is_labels)
    if m == PRECOMPUTE:
        raise InvalidArgument(
            "method 'precompute' names stored levels; an export computes its levels (area, mode, ...)"
        )
    return m


def plan_layout(
    tensor: TensorAdapter,
    *,
    levels: str | int = "auto",
    method: str | None = None,
    chunks: Sequence[int] | None = None,
    shards: Sequence[int] | None = None,
    scales: Sequence[Sequence[int]] | None = None,
    policy: PyramidPolicy | None = None,
) -> Layout:
    """The geometry of exporting ``tensor`` (see the module docstring); ``scales`` (per level,
    source order) instead of ``levels``: a label image takes its image's levels; ``policy``:
    the pyramid policy ``levels="auto"`` follows (a server's; default the defaults)."""
    axes = AxisMap.of(tensor)
    for name, value in (("chunks", chunks), ("shards", shards)):
        if value is not None:
            _check_asked_shape(tensor, axes, name, value)
    scales = [tuple(s) for s in scales] if scales is not None else level_scales(tensor, levels, policy)
    chunk = tuple(min(c, n) for c, n in zip(_source_shape(tensor, axes, chunks, default_chunk(tensor)), tensor.shape))
    shard = _source_shape(tensor, axes, shards, default_shard(tensor))
    if shards is None:  # the default: the nearest whole number of chunks
        shard = tuple(-(-s // c) * c for s, c in zip(shard, chunk))
    # a shard never reaches past the chunks that cover the tensor
    shard = tuple(min(s, -(-n // c) * c) for s, c, n in zip(shard, chunk, tensor.shape))
    if any(s % c for s, c in zip(shard, chunk)):
        raise InvalidArgument(
            f"shards {list(axes.out_shape(shard))} must be a whole number of chunks {list(axes.out_shape(chunk))}"
        )
    if shards is None:
        shard = _fitted_default_shard(tensor, shard, chunk, scales)
    _check_unit_bytes(
        tensor,
        axes,
        shard,
        scales,
        asked="shards" if shards is not None else "chunks" if shard == chunk and chunks is not None else None,
    )
    unit = _unit(tensor, shard, chunk, scales[-1])
    built = []
    for k, scale in enumerate(scales):
        shape = output_shape(tensor.shape, scale)
        lv_shard = tuple(gcd(s, u // sc) for s, u, sc in zip(shard, unit, scale))
        lv_chunk = tuple(gcd(c, s) for c, s in zip(chunk, lv_shard))
        lv_chunk = tuple(min(c, n) for c, n in zip(lv_chunk, shape))
        lv_shard = tuple(min(s, -(-n // c) * c) for s, n, c in zip(lv_shard, shape, lv_chunk))
        built.append(Level(k, scale, shape, lv_shard, lv_chunk))
    return Layout(axes, export_method(tensor, method), tuple(built), unit, tensor.shape, tensor.dtype.itemsize)


def _check_asked_shape(tensor: TensorAdapter, axes: AxisMap, name: str, value: Sequence[int]) -> None:
    """An asked chunk or shard shape: one value per output axis, Y and X edges at least
    ``MIN_CHUNK_EDGE`` (or the whole axis where it is shorter)."""
    if len(value) != len(axes.out_labels):
        raise InvalidArgument(
            f"{name} has {len(value)} values; the output has {len(axes.out_labels)} axes {list(axes.out_labels)}"
        )
    extents = axes.out_shape(tensor.shape)
    for label in ("y", "x"):
        i = axes.out_labels.index(label)
        if value[i] < min(MIN_CHUNK_EDGE, extents[i]):
            raise InvalidArgument(
                f"{name} {list(value)}: the {label} edge {value[i]} is below the minimum of {MIN_CHUNK_EDGE} pixels "
                f"(or the whole axis, {extents[i]}, where it is shorter); every chunk is a codec call and an index "
                f"entry (a file on --ngff 0.4), so tiny chunks cost more than their pixels"
            )


def _fitted_default_shard(
    tensor: TensorAdapter, shard: tuple[int, ...], chunk: tuple[int, ...], scales: Sequence[Sequence[int]]
) -> tuple[int, ...]:
    """The default shard, its Y and X halved (staying whole chunks) while a unit would hold
    more than ``MAX_UNIT_BYTES`` (a wide dtype or many samples: 2048² float64 RGB is 96 MiB)."""
    fitted = list(shard)
    itemsize = tensor.dtype.itemsize
    while _levels_bytes([_lcm(s, c) for s, c in zip(fitted, scales[-1])], scales, itemsize) > MAX_UNIT_BYTES:
        halved = False
        for axis in (tensor.dim_labels.index("y"), tensor.dim_labels.index("x")):
            half = fitted[axis] // 2
            if half >= chunk[axis] and half % chunk[axis] == 0:
                fitted[axis], halved = half, True
        if not halved:
            break  # left to _check_unit_bytes, which names what to change
    return tuple(fitted)


def _check_unit_bytes(
    tensor: TensorAdapter, axes: AxisMap, shard: Sequence[int], scales: Sequence[Sequence[int]], asked: str | None
) -> None:
    """Refuse a geometry whose unit (``lcm(shard, coarsest scale)``, every level) would hold
    more than ``MAX_UNIT_BYTES``, naming the option that makes it so (``asked``: "shards",
    or "chunks" when the default shard is one asked chunk) and what fits."""
    itemsize = tensor.dtype.itemsize
    unit = [_lcm(s, c) for s, c in zip(shard, scales[-1])]
    held = _levels_bytes(unit, scales, itemsize)
    if held <= MAX_UNIT_BYTES:
        return
    limit = f"an export holds at most {_mib(MAX_UNIT_BYTES)} per unit of work"
    if list(unit) == list(shard):
        what = asked or "shards"
        pixels = int(MAX_UNIT_BYTES * prod(unit) / held)  # a shard's pixels that fit, its levels' share included
        raise InvalidArgument(
            f"{what} {list(axes.out_shape(shard))}: a unit of work (one shard, with its pyramid levels) would hold "
            f"{_mib(held)} of {tensor.dtype} pixels, and {limit}: ask for smaller {what} "
            f"(at most {pixels:,} pixels each)"
        )
    fits = max(
        (
            k
            for k in range(1, len(scales) + 1)
            if _levels_bytes([_lcm(s, c) for s, c in zip(shard, scales[k - 1])], scales[:k], itemsize) <= MAX_UNIT_BYTES
        ),
        default=1,
    )
    raise InvalidArgument(
        f"levels: the coarsest level's scale {list(axes.out_shape(scales[-1]))} makes each unit of work "
        f"{list(axes.out_shape(unit))} pixels ({_mib(held)} with its levels), and {limit}: "
        f"ask for at most {fits} levels"
    )


def check_file_count(layouts: Sequence[Layout], sharded: bool) -> int:
    """The files an export of these images (the image, then its label images) writes;
    more than ``MAX_FILES`` is refused before anything is written, naming the count."""
    files = sum(layout.file_count(sharded) for layout in layouts)
    if files > MAX_FILES:
        kind = "shard" if sharded else "chunk"
        how = "larger --shards" if sharded else "larger --chunks, or --ngff 0.5 (sharded: a file per shard)"
        raise InvalidArgument(
            f"this export would write {files:,} {kind} files (every level"
            f"{' and label image' if len(layouts) > 1 else ''}), more than the {MAX_FILES:,} an export writes: "
            f"use {how}{' or leave the label images out' if len(layouts) > 1 else ''}"
        )
    return files


def _volume(tensor: TensorAdapter) -> bool:
    """Whether the default chunks are volume chunks (16 planes deep): a z axis, and a reader
    that can read 16 planes' worth of a unit without decoding 16 whole planes. A reader whose
    block is a whole plane (a TIFF page, decoded whole) would make every unit 16 planes
    (16 x 32 MiB for a 4096² uint16 page, held while it is written): such volumes get plane
    chunks, and a unit is one page."""
    labels = tensor.dim_labels
    if "z" not in labels or tensor.shape[labels.index("z")] <= 1:
        return False
    block = tensor.read_block_shape
    return block is None or VOLUME_CHUNK[0] * prod(block) * tensor.dtype.itemsize <= UNIT_BUDGET_BYTES


def default_chunk(tensor: TensorAdapter) -> dict[str, int]:
    """Chunk edges by label: planes 256² (one plane deep), volumes 16×256²."""
    if _volume(tensor):
        return dict(zip("zyx", VOLUME_CHUNK))
    return {"y": PLANE_CHUNK, "x": PLANE_CHUNK}


def default_shard(tensor: TensorAdapter) -> dict[str, int]:
    return dict(zip("zyx", VOLUME_SHARD)) if _volume(tensor) else {"y": PLANE_SHARD, "x": PLANE_SHARD}


def _source_shape(
    tensor: TensorAdapter, axes: AxisMap, given: Sequence[int] | None, default: dict[str, int]
) -> tuple[int, ...]:
    """A chunk or shard shape per source axis. The samples axis is always whole (a chunk
    holds every sample of its pixels)."""
    if given is not None:
        values = axes.source_value(given)
    else:
        values = [default.get(label, 1) for label in tensor.dim_labels]
    if "s" in tensor.dim_labels:
        values[tensor.dim_labels.index("s")] = tensor.shape[tensor.dim_labels.index("s")]
    return tuple(max(1, v) for v in values)


def _unit(
    tensor: TensorAdapter, shard: Sequence[int], chunk: Sequence[int], coarsest: Sequence[int]
) -> tuple[int, ...]:
    """lcm(shard, coarsest scale) per axis, then a whole number of the reader's blocks where
    it cannot read less (``read_block_shape``, e.g. a TIFF page: a smaller unit would decode
    the block once per unit, reading the source many times), then grown in Y and X (doubling,
    within ``UNIT_BUDGET_BYTES``) while the coarsest level's chunks would be cut short."""
    unit = [_lcm(s, c) for s, c in zip(shard, coarsest)]
    block = tensor.read_block_shape
    if block is not None:
        for axis, (b, n) in enumerate(zip(block, tensor.shape)):
            step = unit[axis]
            unit[axis] = _lcm(step, max(1, int(b)))
            if unit[axis] >= n:  # the whole axis: the least multiple of the step that covers it
                unit[axis] = -(-n // step) * step
    labels = tensor.dim_labels
    itemsize = tensor.dtype.itemsize
    for axis in (labels.index("y"), labels.index("x")):
        while (
            unit[axis] // coarsest[axis] < chunk[axis]
            and unit[axis] < tensor.shape[axis]
            and prod(unit) * 2 * itemsize <= UNIT_BUDGET_BYTES
        ):
            unit[axis] *= 2
    return tuple(unit)
