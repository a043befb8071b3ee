"""Pyramid advertisement: which levels a tensor offers (wire-protocol §6.3).

A tensor with stored levels advertises them (method ``precompute``, ``native`` true). Otherwise
levels are computed on demand and advertised with the tensor's default method (``area`` for
intensities, ``mode`` for labels): factor 2 in Y and X until a plane fits ``plane_budget_px``,
then, for a volume, one more level that also reduces Z until the volume fits
``volume_budget_voxels`` (the reference server's 4 Mpx plane and 448³ voxel budgets).

This is the pyramid Flight's descriptors advertise, for the biopb clients that pick levels
by the reference's budgets. The doors that publish an image (OME-Zarr, IIIF, DeepZoom, an
export's ``--levels auto``) publish ``core.level_grid.published_levels`` instead: the same
stored levels, else halvings down to one 512² tile, as viewers and converters expect.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from tensor_server_kernels.reference import output_shape

from tensor_server.core.adapter_base import TensorAdapter
from tensor_server.core.methods import PRECOMPUTE, default_method

__all__ = ["PyramidLevelSpec", "PyramidPolicy", "advertised_levels", "plane_axes"]


@dataclass(frozen=True)
class PyramidPolicy:
    plane_budget_px: int = 4 * 1024 * 1024
    volume_budget_voxels: int = 448**3
    max_levels: int = 16
    #: the plane side the coarsest published level fits in (``core.level_grid``): one tile
    coarsest_tile: int = 512


@dataclass(frozen=True)
class PyramidLevelSpec:
    scale: tuple[int, ...]
    method: str
    shape: tuple[int, ...]
    native: bool


def plane_axes(tensor: TensorAdapter) -> tuple[int | None, int]:
    """The (y, x) axes a pyramid halves: by label, else the last two (y None for 1-D)."""
    labels, ndim = tensor.dim_labels, tensor.ndim
    y = labels.index("y") if "y" in labels else (ndim - 2 if ndim >= 2 else None)
    x = labels.index("x") if "x" in labels else ndim - 1
    return y, x


def advertised_levels(tensor: TensorAdapter, policy: PyramidPolicy | None = None) -> list[PyramidLevelSpec]:
    """Level 0 first, coarsest last."""
    policy = policy or PyramidPolicy()
    ndim = tensor.ndim
    if tensor.native_levels:
        levels = [PyramidLevelSpec((1,) * ndim, PRECOMPUTE, tensor.shape, True)]
        for lv in sorted(tensor.native_levels, key=lambda lv: prod(lv.scale)):
            levels.append(PyramidLevelSpec(tuple(lv.scale), PRECOMPUTE, tuple(lv.tensor.shape), True))
        return levels
    y, x = plane_axes(tensor)
    z = tensor.dim_labels.index("z") if "z" in tensor.dim_labels else None
    method = default_method(tensor.is_labels)
    levels = [PyramidLevelSpec((1,) * ndim, method, tensor.shape, False)]
    scale = [1] * ndim

    def plane(shape: tuple[int, ...]) -> int:
        return shape[x] * (shape[y] if y is not None else 1)

    shape = tensor.shape
    while plane(shape) > policy.plane_budget_px and len(levels) < policy.max_levels:
        scale[x] *= 2
        if y is not None:
            scale[y] *= 2
        shape = output_shape(tensor.shape, scale)
        levels.append(PyramidLevelSpec(tuple(scale), method, shape, False))
    if z is not None and tensor.shape[z] > 1:
        volume = lambda s: s[z] * plane(s)  # noqa: E731
        if volume(shape) > policy.volume_budget_voxels:
            while volume(shape) > policy.volume_budget_voxels and shape[z] > 1:
                for axis in (z, y, x):
                    if axis is not None:
                        scale[axis] *= 2
                shape = output_shape(tensor.shape, scale)
            levels.append(PyramidLevelSpec(tuple(scale), method, shape, False))
    return levels
