"""OME-NGFF multiscales metadata read into the server's terms: axis labels, types and units,
per-level scales and integer level factors (versions 0.1 to 0.5).

Pure functions over parsed JSON, kept apart from the zarr adapter (which walks stores and
opens arrays) so the reading of NGFF's metadata is one testable piece.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["AXIS_ALIASES", "dataset_scale", "integer_factor", "jsonable", "ngff_axes"]

_log = logging.getLogger("tensor_server.adapters.zarr")
#: axis names some writers use for the canonical single-letter labels
AXIS_ALIASES = {"time": "t", "channel": "c", "channels": "c", "ch": "c"}


def version_tuple(version: str) -> tuple[int, int] | None:
    m = re.match(r"\s*(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def ngff_axes(
    ms: Mapping[str, Any], ndim: int, version: str
) -> tuple[list[str] | None, list[str | None], list[str | None]]:
    """(labels, types, units) from ``axes``: dicts with name/type/unit (0.4+) or plain names
    (0.3). 0.1/0.2 have no axes and are always 5-D TCZYX. None labels = server defaults."""
    axes = ms.get("axes")
    if axes is None:
        v = version_tuple(version)
        if ndim == 5 and (v is None or v < (0, 3)):
            return list("tczyx"), ["time", "channel", "space", "space", "space"], [None] * 5
        return None, [None] * ndim, [None] * ndim
    if not isinstance(axes, list) or len(axes) != ndim:
        _log.warning("multiscales axes %r do not match a %d-D array; using default labels", axes, ndim)
        return None, [None] * ndim, [None] * ndim
    names, types, units = [], [], []
    for ax in axes:
        if isinstance(ax, Mapping):
            names.append(str(ax.get("name", "")).lower())
            types.append(None if ax.get("type") is None else str(ax["type"]).lower())
            units.append(None if ax.get("unit") is None else str(ax["unit"]))
        else:
            names.append(str(ax).lower())
            types.append(None)
            units.append(None)
    aliased = [AXIS_ALIASES.get(n, n) for n in names]
    labels = aliased if len(set(aliased)) == ndim else names
    if len(set(labels)) != ndim or not all(labels):
        _log.warning("multiscales axis names %r are empty or repeated; using default labels", names)
        return None, types, units
    return labels, types, units


def scale_of(transforms: Any, ndim: int) -> list[float] | None:
    """The ``scale`` vector of a coordinateTransformations list (None when absent)."""
    if not isinstance(transforms, list):
        return None
    for tr in transforms:
        if isinstance(tr, Mapping) and tr.get("type") == "scale" and isinstance(tr.get("scale"), list):
            vec = tr["scale"]
            if len(vec) == ndim and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vec):
                return [float(v) for v in vec]
            _log.warning("ignoring scale transform %r for a %d-D array", vec, ndim)
    return None


def dataset_scale(ms: Mapping[str, Any], dataset: Mapping[str, Any], ndim: int) -> list[float] | None:
    """A dataset's physical pixel size: its own scale times the multiscale-wide scale (0.4)."""
    own = scale_of(dataset.get("coordinateTransformations"), ndim)
    if own is None:
        return None
    common = scale_of(ms.get("coordinateTransformations"), ndim)
    return own if common is None else [a * b for a, b in zip(own, common)]


def integer_factor(
    shape0: Sequence[int], shape: Sequence[int], scale0: Sequence[float] | None, scale: Sequence[float] | None
) -> tuple[tuple[int, ...] | None, str]:
    """The level's reduction factor per axis versus level 0, or (None, why not).

    From the coordinateTransformations scale ratio when both levels have one, else from the
    shape ratio (0.1-0.3 have no transforms; 167 -> 83 is factor 2 with a floored edge). Either
    way the level's size must be floor or ceil of level 0's size over the factor, so that
    level-0 bounds divided by the factor address the level correctly.
    """
    factors = []
    for axis, (n0, n) in enumerate(zip(shape0, shape)):
        if scale0 is not None and scale is not None and scale0[axis] > 0:
            ratio = scale[axis] / scale0[axis]
            f = round(ratio)
            if f < 1 or abs(ratio - f) > 1e-6 * max(1.0, ratio):
                return None, f"axis {axis}: scale ratio {ratio:g} is not a positive integer"
        else:
            ratio = n0 / n
            f = max(1, round(ratio))
        if n not in (n0 // f, -(-n0 // f)):
            return None, f"axis {axis}: size {n} is not level 0's {n0} reduced by an integer factor ({ratio:g})"
        factors.append(int(f))
    return tuple(factors), ""


def jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)
