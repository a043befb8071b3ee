"""Rendered regions of a plane as Pillow images, and their encodings: the one rendering path
IIIF, DeepZoom and the catalog thumbnails share."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from tensor_server.errors import InvalidArgument
from tensor_server.render.colour import RenderSettings, SettingsCache, settings_for, to_rgb8
from tensor_server.render.plane import PlaneView

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

    from tensor_server.render.provider import ViewerProvider

__all__ = ["Renderer", "encode", "FORMATS", "available_formats"]

#: URL extension -> (Pillow format, media type)
FORMATS = {"jpg": ("JPEG", "image/jpeg"), "png": ("PNG", "image/png"), "webp": ("WEBP", "image/webp")}


def available_formats() -> list[str]:
    """The extensions this Pillow can write (webp only where it was built with libwebp)."""
    from PIL import features

    return [f for f in FORMATS if f != "webp" or features.check("webp")]


def encode(image: Image.Image, fmt: str) -> bytes:
    if fmt not in available_formats():
        raise InvalidArgument(f"format {fmt[:20]!r} is not offered; use one of {available_formats()}")
    pil_format, _ = FORMATS[fmt]
    if pil_format == "JPEG" and image.mode not in ("RGB", "L"):
        image = image.convert("L" if image.mode == "1" else "RGB")
    buf = io.BytesIO()
    options = {"quality": 90} if pil_format in ("JPEG", "WEBP") else {"compress_level": 1}
    image.save(buf, pil_format, **options)
    return buf.getvalue()


class Renderer:
    """Renders regions of tensors the provider serves, with settings measured once per tensor."""

    def __init__(self, provider: ViewerProvider) -> None:
        self.provider = provider
        self.settings = SettingsCache()

    def view(self, array_id: str, selection: dict[str, int]) -> PlaneView:
        return PlaneView.of(self.provider.tensor(array_id), selection, self.provider.policy)

    def settings_of(self, view: PlaneView) -> RenderSettings:
        t = view.tensor
        whole = PlaneView(
            t,
            view.y,
            view.x,
            view.channel_axis,
            view.sample_axis,
            {a: i for a, i in view.fixed.items() if a != view.channel_axis},
            view.levels,
        )

        def coarse() -> np.ndarray:
            level = view.levels[-1]
            w, h = whole.width, whole.height
            ow, oh = -(-w // level.scale[view.x]), -(-h // level.scale[view.y])
            return whole.read(self.provider, 0, 0, w, h, ow, oh)[0]

        key = (t.array_id + ";" + ";".join(f"{a}={i}" for a, i in sorted(whole.fixed.items())), t.content_version)
        axis = view.sample_axis if view.sample_axis is not None else view.channel_axis
        count = t.shape[axis] if axis is not None else 1
        return self.settings.get(
            key, lambda: settings_for(t.metadata, t.dtype, t.is_labels, view.sample_axis is not None, count, coarse)
        )

    def region(
        self,
        view: PlaneView,
        x: int,
        y: int,
        w: int,
        h: int,
        out_w: int,
        out_h: int,
        cancelled: Callable[[], bool] | None = None,
    ) -> Image.Image:
        """Full-resolution region ``(x, y, w, h)`` rendered at ``out_w × out_h``: resized from
        the level ``render.plane`` reads it at, smoothly (bicubic) where an axis is upscaled, as
        the less reduced axis of a distorted size may be, else by averaging (box)."""
        from PIL import Image

        settings = self.settings_of(view)
        planes, level = view.read(self.provider, x, y, w, h, out_w, out_h, cancelled)
        sel = view.selected_channel if view.sample_axis is None else None
        channels = [sel] if sel is not None else list(range(planes.shape[0]))
        rgb = to_rgb8(planes, settings, channels)
        image = Image.fromarray(rgb)
        sy, sx = level.scale[view.y], level.scale[view.x]
        # the level region starts at a whole level pixel: crop to the exact full-res region
        box = (
            (x - (x // sx) * sx) / sx,
            (y - (y // sy) * sy) / sy,
            (x - (x // sx) * sx + w) / sx,
            (y - (y // sy) * sy + h) / sy,
        )
        if image.size == (out_w, out_h) and box == (0, 0, out_w, out_h):
            return image
        resample = Image.Resampling.NEAREST if settings.mode == "labels" else Image.Resampling.BOX
        if (box[2] - box[0]) < out_w or (box[3] - box[1]) < out_h:
            resample = Image.Resampling.NEAREST if settings.mode == "labels" else Image.Resampling.BICUBIC
        return image.resize((out_w, out_h), resample, box=box)
