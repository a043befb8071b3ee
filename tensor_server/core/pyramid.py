"""Pyramid advertisement: which levels a tensor offers (wire-protocol §6.3).

A tensor with stored levels advertises them (method ``precompute``, ``native`` true). Otherwise
levels are computed on demand and advertised with the tensor's default method (``area`` for
intensities, ``mode`` for labels): factor 2 in Y and X until a plane fits ``plane_budget_px``,
then, for a volume, one more level that also reduces Z until the volume fits
``volume_budget_voxels`` (the reference server's 4 Mpx plane and 448³ voxel budgets).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from tensor_server_kernels.reference import output_shape

from tensor_server.core.adapter_base import TensorAdapter
from tensor_server.core.methods import PRECOMPUTE, default_method

__all__ = ["PyramidLevelSpec", "PyramidPolicy", "advertised_levels"]


@dataclass(frozen=True)
class PyramidPolicy:
    plane_budget_px: int = 4 * 1024 * 1024
    volume_budget_voxels: int = 448**3
    max_levels: int = 16


@dataclass(frozen=True)
class PyramidLevelSpec:
    scale: tuple[int, ...]
    method: str
    shape: tuple[int, ...]
    native: bool


def advertised_levels(
    tensor: TensorAdapter, policy: PyramidPolicy | None = None, *, computed: bool = False
) -> list[PyramidLevelSpec]:
    """Level 0 first, coarsest last. ``computed``: the computed levels even when the tensor
    stores its own (the exporter writes levels it computes, whatever the file stores)."""
    policy = policy or PyramidPolicy()
    ndim = tensor.ndim
    base = PyramidLevelSpec(
        (1,) * ndim, default_method(tensor.is_labels), tensor.shape, bool(tensor.native_levels) and not computed
    )
    if tensor.native_levels and not computed:
        levels = [PyramidLevelSpec((1,) * ndim, PRECOMPUTE, tensor.shape, True)]
        for lv in sorted(tensor.native_levels, key=lambda lv: prod(lv.scale)):
            levels.append(PyramidLevelSpec(tuple(lv.scale), PRECOMPUTE, tuple(lv.tensor.shape), True))
        return levels
    labels = tensor.dim_labels
    y = labels.index("y") if "y" in labels else (ndim - 2 if ndim >= 2 else None)
    x = labels.index("x") if "x" in labels else ndim - 1
    z = labels.index("z") if "z" in labels else None
    method = default_method(tensor.is_labels)
    levels = [base]
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
