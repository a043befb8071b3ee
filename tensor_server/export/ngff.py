"""The OME-Zarr image metadata of an export: ``multiscales`` and ``omero`` (NGFF 0.4 and 0.5).

Axes carry their NGFF types and units (``core/ngff.py``); each level's ``scale`` transform is
the source's physical pixel size times the level's factor (1 where the source has none).
The ``omero`` rendering block gives every channel a display window from the range of its
pixels at the coarsest level (the range the export saw, cheap to keep per unit; a display
hint, not a statistic). A label image (``labels/<name>``) has ``image-label`` instead.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensor_server.core.adapter_base import TensorAdapter
from tensor_server.core.ngff import AXIS_TYPES, ngff_unit
from tensor_server.export.layout import Layout

__all__ = ["image_attributes", "labels_attributes"]

_COLORS = ("FFFFFF",)
_MULTI_COLORS = ("00FF00", "FF00FF", "00FFFF", "FF0000", "0000FF", "FFFF00")
_RGB = ("FF0000", "00FF00", "0000FF")


def _per_output_axis(layout: Layout, values: Sequence[Any] | None, default: Any) -> list[Any]:
    """A per-source-axis property (physical scale, unit) per output axis; a folded samples
    axis (the channel axis) has none."""
    labels = layout.axes.source_labels
    values = values or (default,) * len(labels)
    out = []
    for label in layout.axes.out_labels:
        out.append(values[labels.index(label)] if label in labels and label != "c" else default)
    return out


def _axes(tensor: TensorAdapter, layout: Layout) -> list[dict[str, Any]]:
    units = _per_output_axis(layout, tensor.physical_unit, None)
    axes = []
    for label, unit in zip(layout.axes.out_labels, units):
        axis: dict[str, Any] = {"name": label, "type": AXIS_TYPES[label]}
        name = ngff_unit(unit) if axis["type"] in ("space", "time") else None
        if name:
            axis["unit"] = name
        axes.append(axis)
    return axes


def _multiscale(tensor: TensorAdapter, layout: Layout, name: str, version: str) -> dict[str, Any]:
    physical = _per_output_axis(layout, tensor.physical_scale, None)
    datasets = []
    for lv in layout.levels:
        factors = _factors(layout, lv.scale)
        scale = [float(p) * f if p else float(f) for p, f in zip(physical, factors)]
        datasets.append({"path": lv.path, "coordinateTransformations": [{"type": "scale", "scale": scale}]})
    entry: dict[str, Any] = {"name": name, "axes": _axes(tensor, layout), "datasets": datasets}
    if version == "0.4":
        entry["version"] = "0.4"
    if len(layout.levels) > 1:
        entry["type"] = layout.method
    return entry


def _factors(layout: Layout, scale: Sequence[int]) -> list[int]:
    """Per-output-axis level factors (1 on a channel axis that is a folded samples axis)."""
    labels = layout.axes.source_labels
    return [scale[labels.index(label)] if label in labels else 1 for label in layout.axes.out_labels]


def _omero(layout: Layout, ranges: Sequence[Sequence[float]] | None) -> dict[str, Any]:
    labels = layout.axes.out_labels
    n = layout.axes.out_shape(layout.shape)[labels.index("c")] if "c" in labels else 1
    rgb = layout.axes.merge_samples and n == 3
    palette = _RGB if rgb else (_COLORS if n == 1 else _MULTI_COLORS)
    channels = []
    for i in range(n):
        lo, hi = (ranges[i] if ranges and i < len(ranges) else (0.0, 1.0))
        lo, hi = (float(lo), float(hi)) if hi > lo else (float(lo), float(lo) + 1.0)
        channels.append({
            "label": "RGB"[i] if rgb else f"channel {i}", "color": palette[i % len(palette)], "active": True,
            "coefficient": 1.0, "family": "linear", "inverted": False,
            "window": {"min": lo, "max": hi, "start": lo, "end": hi},
        })
    return {"channels": channels, "rdefs": {"model": "color" if n > 1 else "greyscale", "defaultT": 0, "defaultZ": 0}}


def image_attributes(tensor: TensorAdapter, layout: Layout, name: str, version: str,
                     ranges: Sequence[Sequence[float]] | None = None, *, label_of: bool = False) -> dict[str, Any]:
    """The image group's attributes (0.5: under ``ome``; 0.4: top level). ``label_of``: a
    label image under ``labels/<name>``, whose ``image-label`` block points back at the
    image two groups up."""
    attrs: dict[str, Any] = {"multiscales": [_multiscale(tensor, layout, name, version)]}
    if label_of:
        attrs["image-label"] = {"source": {"image": "../../"}}
        if version == "0.4":
            attrs["image-label"]["version"] = "0.4"
    elif not tensor.is_labels:
        attrs["omero"] = _omero(layout, ranges)
    if version == "0.4":
        return attrs
    return {"ome": {"version": "0.5", **attrs}}


def labels_attributes(names: Sequence[str], version: str) -> dict[str, Any]:
    """The ``labels/`` group's attributes: the names of its label images."""
    return {"labels": list(names)} if version == "0.4" else {"ome": {"version": "0.5", "labels": list(names)}}
