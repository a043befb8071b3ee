"""OME-NGFF as this server writes it: the documents, which tensors are an image's labels, and
the zarr v3 shard layout.

One owner for both publishers of an image: the virtual OME-Zarr view (``http/zarr_view.py``)
and the exporter (``export/``). Each maps its own geometry onto an ``NgffImage`` (the view:
the tensor's axes as they are and its published levels; the export: its NGFF axis order, a
samples axis folded into the channel axis), and the documents are written here once, so the
view of an image and its export say the same thing. It sits in ``core`` because both doors
import it and it needs nothing above the adapter interface. Reading NGFF metadata is
``adapters/_ngff.py``.

* ``multiscales``: NGFF axes (type from the label, UDUNITS unit for space and time axes), one
  dataset per level with a ``scale`` transform = physical pixel size × the level's factor (the
  factor alone where the source has no size), and ``type``: the downscaling method of the
  reduced levels when they are computed (none for a single level or stored levels, whose
  method the file does not say).
* ``montage`` beside them on a plate image (``core/montage.py``): where each well's fields lie.
* ``image-label`` on a label image (``labels/<name>``), pointing at the image two groups up;
  ``labels`` on the ``labels/`` group (names sorted); ``omero`` (a display window per channel).
* Which tensors are an image's labels (``image_labels``): a label tensor (``is_labels``)
  belongs to the image at field ``F`` when its field is ``F/labels/<name>`` (an OME-Zarr
  image's ``labels/`` group) or ``F/@labels/<name>`` (a label set uploaded onto the image); a
  top-level ``labels/<name>`` or ``@labels/<name>`` belongs to the source's default image. A
  label image whose extent differs from the image's on a shared axis cannot sit beside it in
  one NGFF image (the levels must coincide) and is left out, with the reason.
* The v3 shard layout (``sharding_indexed``, index at the end): the inner chunks, then per
  inner chunk in C order ``(offset, nbytes)`` as little-endian uint64 (``SHARD_ABSENT`` twice
  for a chunk not stored), then, when the index has a ``crc32c`` codec, its CRC-32C.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tensor_server.core.methods import PRECOMPUTE
from tensor_server.core.units import canonical_unit

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.core.adapter_base import TensorAdapter

__all__ = [
    "AXIS_TYPES",
    "ngff_unit",
    "NgffLevel",
    "NgffImage",
    "image_attributes",
    "labels_attributes",
    "omero",
    "ImageLabels",
    "image_labels",
    "labels_among",
    "SHARD_ABSENT",
    "shard_index",
    "encode_shard",
]

#: canonical axis label -> NGFF axis type
AXIS_TYPES = {"t": "time", "c": "channel", "z": "space", "y": "space", "x": "space"}
# NGFF takes UDUNITS names; the server spells units by their symbol (``core.units``), so a
# document it writes names each symbol back
_NGFF_UNITS = {
    "µm": "micrometer",
    "nm": "nanometer",
    "mm": "millimeter",
    "cm": "centimeter",
    "m": "meter",
    "pm": "picometer",
    "Å": "angstrom",
    "s": "second",
    "ms": "millisecond",
    "µs": "microsecond",
    "min": "minute",
    "h": "hour",
}
_NGFF_UNIT_NAMES = {
    "angstrom",
    "attometer",
    "centimeter",
    "decimeter",
    "exameter",
    "femtometer",
    "foot",
    "gigameter",
    "hectometer",
    "inch",
    "kilometer",
    "megameter",
    "meter",
    "micrometer",
    "mile",
    "millimeter",
    "nanometer",
    "parsec",
    "petameter",
    "picometer",
    "terameter",
    "yard",
    "yoctometer",
    "yottameter",
    "zeptometer",
    "zettameter",
    "attosecond",
    "centisecond",
    "day",
    "decisecond",
    "exasecond",
    "femtosecond",
    "gigasecond",
    "hectosecond",
    "hour",
    "kilosecond",
    "megasecond",
    "microsecond",
    "millisecond",
    "minute",
    "nanosecond",
    "petasecond",
    "picosecond",
    "second",
    "terasecond",
    "yoctosecond",
    "yottasecond",
    "zeptosecond",
    "zettasecond",
}
_LABEL_MARKERS = ("labels", "@labels")
#: the index entry of an inner chunk a shard does not store
SHARD_ABSENT = 2**64 - 1


def ngff_unit(unit: str | None) -> str | None:
    """The NGFF (UDUNITS) name of a unit in any spelling (``micrometer``, ``µm``, ``um``),
    or None when NGFF has no name for it."""
    symbol = canonical_unit(unit)
    if symbol is None:
        return None
    name = _NGFF_UNITS.get(symbol, symbol)
    return name if name in _NGFF_UNIT_NAMES else None


# ---- documents ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class NgffLevel:
    """One dataset: its path, its factor per axis and the method that made it (``precompute``
    for a stored level)."""

    path: str
    factors: tuple[int, ...]
    method: str


@dataclass(frozen=True)
class NgffImage:
    """What an image group's ``multiscales`` says: the image's name, its axes (label and unit
    each, as the publisher lays them out), the physical pixel size per axis (None: unknown)
    and its levels, finest first."""

    name: str
    axes: tuple[str, ...]
    units: tuple[str | None, ...]
    physical: tuple[float | None, ...]
    levels: tuple[NgffLevel, ...]

    def downscaling_type(self) -> str | None:
        """The method of the reduced levels when they are computed; None for one level or
        stored levels."""
        reduced = {lv.method for lv in self.levels if any(f != 1 for f in lv.factors)}
        return None if len(reduced) != 1 or PRECOMPUTE in reduced else reduced.pop()


def _axes(image: NgffImage) -> list[dict[str, Any]]:
    axes = []
    for label, unit in zip(image.axes, image.units):
        axis: dict[str, Any] = {"name": label}
        kind = AXIS_TYPES.get(label)
        if kind:
            axis["type"] = kind
            name = ngff_unit(unit) if kind in ("space", "time") else None
            if name:
                axis["unit"] = name
        axes.append(axis)
    return axes


def _multiscale(image: NgffImage, version: str) -> dict[str, Any]:
    datasets = []
    for lv in image.levels:
        scale = [float(p) * f if p else float(f) for p, f in zip(image.physical, lv.factors)]
        datasets.append({"path": lv.path, "coordinateTransformations": [{"type": "scale", "scale": scale}]})
    entry: dict[str, Any] = {"name": image.name, "axes": _axes(image), "datasets": datasets}
    if version == "0.4":
        entry["version"] = "0.4"
    kind = image.downscaling_type()
    if kind:
        entry["type"] = kind
    return entry


def image_attributes(
    image: NgffImage,
    version: str,
    *,
    label_of: bool = False,
    omero_block: dict[str, Any] | None = None,
    montage: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An image group's attributes (NGFF 0.5: under ``ome``; 0.4: top level). ``label_of``: a
    label image under ``labels/<name>``, whose ``image-label`` points back at the image two
    groups up; ``omero_block`` (``omero()``) is kept for an image that is not one. ``montage``:
    a plate image's layout (``core/montage.py``), beside the NGFF keys (never under ``ome``,
    which is NGFF's own), so a client maps a pixel to its well and field."""
    attrs: dict[str, Any] = {"multiscales": [_multiscale(image, version)]}
    if label_of:
        attrs["image-label"] = {"source": {"image": "../../"}}
        if version == "0.4":
            attrs["image-label"]["version"] = "0.4"
    elif omero_block is not None:
        attrs["omero"] = omero_block
    out = attrs if version == "0.4" else {"ome": {"version": "0.5", **attrs}}
    if montage is not None:
        out["montage"] = dict(montage)
    return out


def labels_attributes(names: Sequence[str], version: str) -> dict[str, Any]:
    """The ``labels/`` group's attributes: the names of its label images, sorted."""
    listed = sorted(names)
    return {"labels": listed} if version == "0.4" else {"ome": {"version": "0.5", "labels": listed}}


_GREY = ("FFFFFF",)
_MULTI_COLORS = ("00FF00", "FF00FF", "00FFFF", "FF0000", "0000FF", "FFFF00")
_RGB = ("FF0000", "00FF00", "0000FF")


def omero(channels: int, rgb: bool, ranges: Sequence[Sequence[float]] | None) -> dict[str, Any]:
    """The ``omero`` rendering block: every channel active with a display window from
    ``ranges`` (per channel ``(lo, hi)``; 0..1 when unknown); ``rgb``: three colour samples."""
    palette = _RGB if rgb else (_GREY if channels == 1 else _MULTI_COLORS)
    out = []
    for i in range(channels):
        lo, hi = ranges[i] if ranges and i < len(ranges) else (0.0, 1.0)
        lo, hi = (float(lo), float(hi)) if hi > lo else (float(lo), float(lo) + 1.0)
        out.append(
            {
                "label": "RGB"[i] if rgb else f"channel {i}",
                "color": palette[i % len(palette)],
                "active": True,
                "coefficient": 1.0,
                "family": "linear",
                "inverted": False,
                "window": {"min": lo, "max": hi, "start": lo, "end": hi},
            }
        )
    return {"channels": out, "rdefs": {"model": "color" if channels > 1 else "greyscale", "defaultT": 0, "defaultZ": 0}}


# ---- which tensors are an image's labels -------------------------------------------------------
@dataclass
class ImageLabels:
    """An image's label images (name -> tensor) and the ones left out (``{"name", "reason"}``)."""

    labels: dict[str, TensorAdapter] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)


def _label_name(image_field: str, default_field: str, candidate: str) -> str | None:
    """``candidate``'s label name when it is a label field of ``image_field`` (module
    docstring), else None."""
    head, _, name = candidate.rpartition("/")
    parent, _, marker = head.rpartition("/")
    if not name or marker not in _LABEL_MARKERS and head not in _LABEL_MARKERS:
        return None
    if head in _LABEL_MARKERS:  # top level: the source's default image
        return name if image_field == default_field else None
    return name if parent == image_field else None


def image_labels(
    fields: Mapping[str, Any],
    image_field: str,
    image: TensorAdapter,
    default_field: str | None = None,
    describe: Callable[[Any], TensorAdapter] | None = None,
) -> ImageLabels:
    """The label images of ``image`` (at ``image_field``) among a source's ``fields`` (field ->
    tensor, or -> a key ``describe(key)`` turns into a tensor, so only label candidates are
    described); ``default_field``: the source's default image (default: the first field)."""
    default_field = next(iter(fields), "") if default_field is None else default_field
    out = ImageLabels()
    for candidate, value in fields.items():
        name = _label_name(image_field, default_field, candidate)
        if name is None or candidate == image_field:
            continue
        tensor = describe(value) if describe is not None else value
        if not tensor.is_labels:
            continue
        problem = _mismatch(image, tensor)
        if problem:
            out.skipped.append({"name": name, "reason": problem})
        elif name in out.labels:
            out.skipped.append({"name": name, "reason": f"a second label image named {name!r} ({candidate})"})
        else:
            out.labels[name] = tensor
    return out


def labels_among(fields: Mapping[str, TensorAdapter], image: TensorAdapter) -> ImageLabels:
    """``image_labels`` of ``image`` served among ``fields`` (every tensor of its source, by
    field): its field is the one holding it (else its array id's), the default the first."""
    from tensor_server.core.identity import ArrayId

    field = next((f for f, t in fields.items() if t is image), None)
    if field is None:
        field = ArrayId.parse(image.array_id).field
    return image_labels(fields, field, image, next(iter(fields), field))


def _mismatch(image: TensorAdapter, label: TensorAdapter) -> str | None:
    shared = [a for a in label.dim_labels if a in image.dim_labels]
    if not {"y", "x"} <= set(shared):
        return f"axes {list(label.dim_labels)} lack the image's y and x"
    for axis in shared:
        n, m = label.shape[label.dim_labels.index(axis)], image.shape[image.dim_labels.index(axis)]
        if n != m and not (axis == "c" and n == 1):
            return f"its {axis} extent {n} is not the image's {m}"
    extra = [
        f"{a} ({label.shape[i]})"
        for i, a in enumerate(label.dim_labels)
        if a not in image.dim_labels and label.shape[i] > 1
    ]
    if extra:
        return f"axes {extra} are not the image's"
    return None


# ---- zarr v3 shards ----------------------------------------------------------------------------
def shard_index(nbytes: np.ndarray, *, checksum: bool) -> bytes:
    """A shard's index for inner chunks stored one after the other in C order: ``nbytes`` per
    inner chunk (shape: the inner grid), negative for a chunk not stored; with its CRC-32C
    when ``checksum`` (an index codec ``crc32c``)."""
    sizes = np.asarray(nbytes, dtype=np.int64)
    stored = sizes >= 0
    index = np.full(sizes.shape + (2,), SHARD_ABSENT, dtype="<u8")
    ends = np.cumsum(np.where(stored, sizes, 0).ravel()).reshape(sizes.shape)
    index[stored, 0] = (ends - sizes)[stored]
    index[stored, 1] = sizes[stored]
    table = index.tobytes()
    if not checksum:
        return table
    import google_crc32c

    return table + np.uint32(google_crc32c.value(table)).astype("<u4").tobytes()


def encode_shard(data: np.ndarray, inner: Sequence[int]) -> memoryview:
    """A shard of raw inner chunks (every one stored, all the same size, so the body is one
    transpose) with its index (no checksum) at the end."""
    grid = [n // c for n, c in zip(data.shape, inner)]
    split = data.reshape([v for g, c in zip(grid, inner) for v in (g, c)])
    nd = data.ndim
    body = np.ascontiguousarray(split.transpose(list(range(0, 2 * nd, 2)) + list(range(1, 2 * nd, 2))))
    index = shard_index(np.full(grid, body.nbytes // int(np.prod(grid)), dtype=np.int64), checksum=False)
    out = bytearray(body.nbytes + len(index))
    out[: body.nbytes] = memoryview(body.data).cast("B")
    out[body.nbytes :] = index
    return memoryview(out)
