"""An export's image as ``core/ngff.py`` describes it: the layout's NGFF axes and levels.

The documents themselves are ``core/ngff.py``'s (the OME-Zarr view writes the same ones);
what is the export's own is the mapping of the source onto NGFF axes (``export/layout.py``:
NGFF order, a samples axis folded into the channel axis, which has no physical size or unit)
and the ``omero`` display window per channel from the range of its pixels at the coarsest
level (the range the export saw, cheap to keep per unit; a display hint, not a statistic).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensor_server.core.adapter_base import TensorAdapter
from tensor_server.core.chunk_id import UNSCALED
from tensor_server.core.ngff import NgffImage, NgffLevel, image_attributes, omero
from tensor_server.export.layout import Layout

__all__ = ["ngff_image", "export_attributes"]


def _per_output_axis(layout: Layout, values: Sequence[Any] | None, default: Any) -> tuple[Any, ...]:
    """A per-source-axis property (physical scale, unit, level factor) per output axis; a
    folded samples axis (the channel axis) has none."""
    labels = layout.axes.source_labels
    values = values or (default,) * len(labels)
    return tuple(
        values[labels.index(label)] if label in labels and label != "c" else default for label in layout.axes.out_labels
    )


def ngff_image(tensor: TensorAdapter, layout: Layout, name: str) -> NgffImage:
    """The export of ``tensor`` laid out as ``layout``, named ``name``."""
    levels = tuple(
        NgffLevel(lv.path, _per_output_axis(layout, lv.scale, 1), UNSCALED if lv.index == 0 else layout.method)
        for lv in layout.levels
    )
    return NgffImage(
        name,
        layout.axes.out_labels,
        _per_output_axis(layout, tensor.physical_unit, None),
        _per_output_axis(layout, tensor.physical_scale, None),
        levels,
    )


def export_attributes(
    tensor: TensorAdapter,
    layout: Layout,
    name: str,
    version: str,
    ranges: Sequence[Sequence[float]] | None = None,
    *,
    label_of: bool = False,
) -> dict[str, Any]:
    """The image group's attributes; an intensity image (not a label image, nor ``label_of``
    one) gets ``omero`` with a window per channel from ``ranges``."""
    block = None
    if not label_of and not tensor.is_labels:
        labels = layout.axes.out_labels
        n = layout.axes.out_shape(layout.shape)[labels.index("c")] if "c" in labels else 1
        block = omero(n, layout.axes.merge_samples and n == 3, ranges)
    montage = tensor.metadata.get("montage")  # a plate image's layout: the export is the whole tensor
    return image_attributes(
        ngff_image(tensor, layout, name), version, label_of=label_of, omero_block=block, montage=montage
    )
