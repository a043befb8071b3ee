"""A label set's physical scale: its image's, when it states none of its own.

A label set annotates its image pixel for pixel (an uploaded set has the image's shape, with
or without the channel axis; a stored OME-Zarr label image the image's y/x), yet it often
carries no physical size: an upload cannot carry metadata (it belongs to the source), and
label writers such as ome-zarr-py's ``write_labels`` write the identity transform (scale 1,
no unit) unless told otherwise. A viewer that scales each layer by its own physical size then
draws the labels at a different size than the image (napari: twice it, beside a 0.5 µm image).
So a set with no physical size of its own, covering the image's spatial extent, reports its
image's scale and unit per shared axis. This is the one place the rule lives; the zarr reader
applies it to stored label images and the catalog to attached (uploaded) sets.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

__all__ = ["carry_image_scale"]

_SPATIAL = ("z", "y", "x")


def _states_no_scale(tensor: Any) -> bool:
    """No physical size of its own: none at all, or no unit and only the identity scale."""
    scale, unit = tensor.physical_scale, tensor.physical_unit
    if scale is None:
        return True
    return not any(unit or ()) and all(s is None or s == 1 for s in scale)


def carry_image_scale(label: Any, image: Any) -> bool:
    """Give label set ``label`` its ``image``'s physical scale and unit (per axis, by name)
    when it states none of its own and has the image's length on every spatial axis it has;
    return whether it did."""
    if image.physical_scale is None or not _states_no_scale(label):
        return False
    index = {name: i for i, name in enumerate(image.dim_labels)}
    if any(name not in index for name in label.dim_labels):
        return False
    if any(label.shape[a] != image.shape[index[name]] for a, name in enumerate(label.dim_labels) if name in _SPATIAL):
        return False
    units = image.physical_unit or (None,) * image.ndim
    label.info = replace(
        label.info,
        physical_scale=tuple(image.physical_scale[index[name]] for name in label.dim_labels),
        physical_unit=tuple(units[index[name]] for name in label.dim_labels),
    )
    return True
