"""A render spec's label image (``labels`` in ``render.spec``) drawn over its composite.

The label plane shown is the one the image shows: the same indices of the axes both have
(``z``, ``t``; a label image's own channel axis at 0), its ``y``/``x`` the image's. It is read
at the level its own ``PlaneView.window`` picks for the tile, the rule the image's level
follows, so a label pyramid made like the image's (the same scales, as OME-Zarr writers make
them) is read at the level matching the image level served; its levels are the label image's
own (stored, or computed by ``mode``, which picks an id and never mixes two). That level is
taken to the tile's output size by nearest neighbour (``ids_shown``), then drawn over the
composite by the overlay kernel (``tensor_server_kernels.overlay``) at the spec's opacity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from tensor_server_kernels import overlay

from tensor_server.errors import InvalidArgument
from tensor_server.render.luts import colour_value
from tensor_server.render.plane import PlaneView, Shown

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

    from tensor_server.core.adapter_base import TensorAdapter
    from tensor_server.core.level_grid import GridLevel
    from tensor_server.core.pyramid import PyramidPolicy
    from tensor_server.render.spec import LabelSpec

__all__ = ["label_plane", "ids_shown", "drawn_over"]


def label_plane(image: PlaneView, label: TensorAdapter, name: str, policy: PyramidPolicy | None) -> PlaneView:
    """The plane of ``label`` (the label image ``name``) under ``image``'s plane (module docstring)."""
    names = image.tensor.dim_labels
    selection = {
        names[axis]: index
        for axis, index in image.every_channel().fixed.items()
        if names[axis] in label.dim_labels and names[axis] != "c"
    }
    view = PlaneView.of(label, selection, policy)
    if (view.height, view.width) != (image.height, image.width):
        raise InvalidArgument(
            f"labels.name: label image {name!r} is {view.height}x{view.width}, "
            f"not the image's {image.height}x{image.width}"
        )
    return view.one_channel(0)


def ids_shown(view: PlaneView, ids: np.ndarray, level: GridLevel, shown: Shown) -> np.ndarray:
    """``(out_h, out_w)`` ids: ``ids`` (the level pixels of ``view.window(shown)``) at the
    output size, each output pixel taking the level pixel under its centre."""
    sy, sx = level.scale[view.y], level.scale[view.x]

    def take(start: int, length: int, out: int, scale: int, size: int) -> np.ndarray:
        centre = start + (np.arange(out, dtype=np.float64) + 0.5) * (length / out)
        return np.clip(np.floor(centre / scale).astype(np.intp) - start // scale, 0, size - 1)

    rows = take(shown.y, shown.h, shown.out_h, sy, ids.shape[0])
    cols = take(shown.x, shown.w, shown.out_w, sx, ids.shape[1])
    return ids[np.ix_(rows, cols)]


def drawn_over(image: Image.Image, ids: np.ndarray, spec: LabelSpec) -> Image.Image:
    """``image`` (the composite, RGB) with ``ids`` (its size) drawn over it as ``spec`` says."""
    from PIL import Image

    keys = np.array([k & (2**64 - 1) for k, _ in spec.colors], np.uint64)  # negative ids by their bits
    colours = np.array([[round(float(v) * 255) for v in colour_value(c)] for _, c in spec.colors], np.uint8)
    rgb = overlay.overlay(np.asarray(image.convert("RGB")), ids, spec.opacity, keys, colours.reshape(-1, 3))
    return Image.fromarray(rgb)
