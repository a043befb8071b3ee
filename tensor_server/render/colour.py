"""Raw microscopy pixels to 8-bit RGB: windows, channel colours, composites, label colours.

Per channel a window ``[start, end]`` and a colour; the active channels are composited by the
one compositing kernel a render spec uses (``tensor_server_kernels.composite``: each channel
as its window and colour say, overlaps adding as light), so a tensor drawn with its own
settings and drawn with a spec of the same colours and windows are the same picture (the
viewer page turns the first into the second when a slider moves). The settings come from:

1. the source's ``omero`` block (OME-Zarr ``omero.channels``: ``color``, ``window.start/end``,
   ``active``) when it has one;
2. else a robust window per channel: the 0.1 and 99.9 percentiles of the tensor's coarsest
   served level (computed once per tensor content version and cached), except 8-bit data,
   which is shown as stored (0..255), and booleans (0..1);
3. colours from ``DEFAULT_COLOURS``: one channel is grey (white), more channels take
   green, magenta, cyan, yellow, red, blue, white in turn.

A colour-sample axis (RGB/RGBA, 3 or 4 samples) is shown as the colour it is (8-bit as stored;
other types windowed per sample, in red, green and blue; alpha is not drawn). Labels are
drawn in label colours: 0 (background) is black, every other id a stable colour of its own
(``label_colours``, the label-overlay oracle's: ``tensor_server_kernels.overlay_reference``), so
the same object has the same colour at every level, in every tile and under an overlay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from tensor_server_kernels.composite import Channel
from tensor_server_kernels.overlay_reference import label_colours

from tensor_server.render.histogram import percentile_window

__all__ = [
    "ChannelSetting",
    "RenderSettings",
    "DEFAULT_COLOURS",
    "label_colours",
    "channel_labels",
    "shown_channels",
    "settings_for",
]

DEFAULT_COLOURS = ("00FF00", "FF00FF", "00FFFF", "FFFF00", "FF0000", "0000FF", "FFFFFF")
GREY = "FFFFFF"
#: samples of an RGB(A) tensor that is not 8-bit: windowed like channels, in their own colours
RGB_COLOURS = ("FF0000", "00FF00", "0000FF")
PERCENTILES = (0.1, 99.9)


@dataclass(frozen=True)
class ChannelSetting:
    colour: tuple[int, int, int]
    start: float
    end: float
    active: bool = True


@dataclass(frozen=True)
class RenderSettings:
    channels: tuple[ChannelSetting, ...]
    #: "channels" (windowed composite), "rgb" (samples shown as colour), "labels"
    mode: str


def _hex(colour: Any, fallback: str) -> tuple[int, int, int]:
    text = str(colour or fallback).lstrip("#")
    try:
        value = int(text[:6], 16) if len(text) >= 6 else int(fallback, 16)
    except ValueError:
        value = int(fallback, 16)
    return (value >> 16) & 255, (value >> 8) & 255, value & 255


def _default_colour(index: int, count: int) -> str:
    return GREY if count == 1 else DEFAULT_COLOURS[index % len(DEFAULT_COLOURS)]


def _robust_window(values: np.ndarray, dtype: np.dtype) -> tuple[float, float]:
    if dtype == np.uint8:
        return 0.0, 255.0
    if dtype.kind == "b":
        return 0.0, 1.0
    return percentile_window(values, *PERCENTILES)


def settings_for(
    metadata: dict[str, Any],
    dtype: np.dtype,
    is_labels: bool,
    is_rgb: bool,
    count: int,
    coarse: Callable[[], np.ndarray],
) -> RenderSettings:
    """The settings of a tensor of ``count`` channels. ``coarse()`` gives its coarsest level as
    (channels, ...), read only when a window must be measured."""
    if is_labels:
        return RenderSettings((), "labels")
    if is_rgb and dtype == np.uint8:
        return RenderSettings((), "rgb")
    omero = metadata.get("omero") if isinstance(metadata, dict) else None
    channels_meta = omero.get("channels") if isinstance(omero, dict) else None
    measured = None
    out = []
    for i in range(count):
        meta = (
            channels_meta[i]
            if isinstance(channels_meta, list) and i < len(channels_meta) and isinstance(channels_meta[i], dict)
            else {}
        )
        window = meta.get("window")
        window = window if isinstance(window, dict) else {}
        start, end = window.get("start"), window.get("end")
        if not isinstance(start, (int, float)) or not isinstance(end, (int, float)) or end <= start:
            if measured is None:
                data = coarse() if dtype != np.uint8 and dtype.kind != "b" else np.zeros((count, 1), dtype)
                measured = [_robust_window(data[c], dtype) for c in range(count)]
            start, end = measured[i]
        colour = _hex(meta.get("color"), RGB_COLOURS[i] if is_rgb and i < 3 else _default_colour(i, count))
        active = meta.get("active", True) is not False and not (is_rgb and i >= 3)  # alpha is not a colour
        out.append(ChannelSetting(colour, float(start), float(end), active))
    if not any(c.active for c in out):  # nothing to show would be a black image: show them all
        out = [ChannelSetting(c.colour, c.start, c.end, True) for c in out]
    return RenderSettings(tuple(out), "channels")


def channel_labels(metadata: dict[str, Any]) -> dict[int, str]:
    """The channels' names the ``omero`` block gives (``omero.channels[i].label``), by index."""
    omero = metadata.get("omero") if isinstance(metadata, dict) else None
    channels = omero.get("channels") if isinstance(omero, dict) else None
    if not isinstance(channels, list):
        return {}
    return {
        i: str(c["label"])[:80]
        for i, c in enumerate(channels)
        if isinstance(c, dict) and isinstance(c.get("label"), (str, int))
    }


def shown_channels(settings: RenderSettings, channel_indices: list[int]) -> tuple[list[int], list[Channel]]:
    """(positions in the planes, compositing channels) of what a rendering with the tensor's own
    ``settings`` shows: the active channels, or the one channel asked for (``;c=``).
    ``channel_indices`` says which of the tensor's channels the planes hold."""
    chosen = [
        (k, settings.channels[c])
        for k, c in enumerate(channel_indices)
        if settings.channels[c].active or len(channel_indices) == 1
    ]
    return [k for k, _ in chosen], [
        Channel(s.start, s.end, (s.colour[0] / 255, s.colour[1] / 255, s.colour[2] / 255)) for _, s in chosen
    ]
