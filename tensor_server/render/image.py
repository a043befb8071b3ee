"""Rendered regions of a plane as Pillow images, and their encodings: the one rendering path
IIIF, DeepZoom and the catalog thumbnails share.

Pixels in, images out: the reads are the service's (``service/viewer_verbs.py`` reads a
``PlaneView.window`` through the runtime, with the caller's read rules, and hands the pixels
here), so rendering never calls back up into a door or the runtime."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from tensor_server_kernels import composite

from tensor_server.errors import InvalidArgument
from tensor_server.render.colour import RGB_COLOURS, RenderSettings, label_colours, settings_for, shown_channels
from tensor_server.render.histogram import Histogram, histogram_of
from tensor_server.render.memo import LruMemo
from tensor_server.render.plane import PlaneView, Shown
from tensor_server.render.spec import resolve

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

    from tensor_server.core.level_grid import GridLevel

__all__ = ["Renderer", "encode", "FORMATS", "available_formats"]

#: URL extension -> (Pillow format, media type)
FORMATS = {"jpg": ("JPEG", "image/jpeg"), "png": ("PNG", "image/png"), "webp": ("WEBP", "image/webp")}


def available_formats() -> list[str]:
    """The extensions offered (webp only where Pillow was built with libwebp)."""
    from PIL import features

    return [f for f in FORMATS if f != "webp" or features.check("webp")]


def encode(image: Image.Image, fmt: str) -> bytes:
    """``image`` as ``fmt``: JPEG at quality 90, PNG at zlib level 1 (a tile is sent once,
    so speed beats size), WebP at quality 90.

    JPEG and PNG are imagecodecs' (libjpeg-turbo, zlib): the same JPEG bytes Pillow writes
    with these settings, 30 % faster, and written with the GIL released — Pillow's encoders
    hold it, which kept a server's concurrent tiles on one core (two threads encoding 512²
    JPEGs: 1.19x one thread's rate with Pillow, 1.71x with imagecodecs, on 2 cores).
    WebP stays Pillow's (its libwebp)."""
    import imagecodecs

    if fmt not in available_formats():
        raise InvalidArgument(f"format {fmt[:20]!r} is not offered; use one of {available_formats()}")
    if fmt == "webp":
        buf = io.BytesIO()
        image.save(buf, "WEBP", quality=90)
        return buf.getvalue()
    keeps = ("L", "RGB") if fmt == "jpg" else ("L", "RGB", "RGBA")
    if image.mode not in keeps:
        image = image.convert("L" if image.mode == "1" else "RGBA" if "A" in image.mode and fmt == "png" else "RGB")
    pixels = np.asarray(image)
    if fmt == "jpg":
        return bytes(imagecodecs.jpeg8_encode(pixels, level=90))
    return bytes(imagecodecs.png_encode(pixels, level=1))


class Renderer:
    """Renders pixels of planes to images, with settings measured once per tensor and plane
    (for every door: IIIF, DeepZoom and the catalog's thumbnails share one ``Renderer``)."""

    def __init__(self) -> None:
        self.settings: LruMemo[RenderSettings] = LruMemo()
        self.histograms: LruMemo[Histogram] = LruMemo(2048)
        #: per (spec, plane, content version): the visible channels and the kernel's tables (spec
        #: "": the tensor's own settings, per channels shown)
        self.tables: LruMemo[tuple[tuple[int, ...], composite.Tables]] = LruMemo(256)
        #: per the same key and dtype: a grey image's value of every pixel value (None: itself)
        self.grey_luts: LruMemo[np.ndarray | None] = LruMemo(256)

    @staticmethod
    def _plane_key(view: PlaneView) -> tuple[str, bytes]:
        """The tensor, its plane (every channel) and its content version: what the measured
        settings, histograms and tables of a plane are kept under."""
        t = view.tensor
        whole = view.every_channel()
        return t.array_id + ";" + ";".join(f"{a}={i}" for a, i in sorted(whole.fixed.items())), t.content_version

    def settings_of(self, view: PlaneView, coarse: Callable[[], np.ndarray]) -> RenderSettings:
        """The settings of ``view``'s plane (every channel of it): the ``omero`` block, else a
        window measured on ``coarse()`` (``view.every_channel()`` at ``coarsest_window``, as
        ``planes``), which is read only when a window must be measured, once per content version."""
        t = view.tensor
        return self.settings.get(
            self._plane_key(view),
            lambda: settings_for(
                t.metadata, t.dtype, t.is_labels, view.sample_axis is not None, view.channel_count, coarse
            ),
        )

    def histogram(self, view: PlaneView, index: int, coarse: Callable[[], np.ndarray]) -> Histogram:
        """Channel ``index``'s histogram on ``view``'s plane, measured once per content version
        on ``coarse()`` (``view.one_channel(index)`` at ``coarsest_window``, as ``planes``)."""
        return self.histograms.get((*self._plane_key(view), index), lambda: histogram_of(coarse()))

    def spec_tables(
        self, view: PlaneView, settings: RenderSettings, percentiles: Callable[[int, float, float], tuple[float, float]]
    ) -> tuple[tuple[int, ...], composite.Tables]:
        """(visible channels, kernel tables) of ``view.spec`` on ``view``'s plane, built once per
        content version: the spec's settings over the plane's own (``settings``)."""
        spec = view.spec
        assert spec is not None  # the caller renders a spec
        if settings.mode == "labels":
            raise InvalidArgument(f"{view.tensor.array_id} is a label image: it is drawn in label colours, not a spec")

        def defaults(i: int) -> tuple[tuple[int, int, int], float, float]:
            if settings.channels:
                c = settings.channels[i]
                return c.colour, c.start, c.end
            colour = RGB_COLOURS[i] if i < 3 else "FFFFFF"  # 8-bit RGB(A): samples as stored
            return (int(colour[:2], 16), int(colour[2:4], 16), int(colour[4:], 16)), 0.0, 255.0

        def build() -> tuple[tuple[int, ...], composite.Tables]:
            indices, channels = resolve(spec, view.channel_count, defaults, percentiles, view.tensor.array_id)
            return indices, composite.prepare(channels)

        return self.tables.get((spec.id, *self._plane_key(view)), build)

    def composited(
        self, view: PlaneView, planes: np.ndarray, level: GridLevel, tables: composite.Tables, shown: Shown
    ) -> Image.Image:
        """``shown`` from the visible channels' ``planes`` (in the spec's order) at ``level``,
        composited by the kernel (``tensor_server_kernels.composite``)."""
        from PIL import Image

        rgb = composite.composite_with(_kernel_dtype(planes), tables)
        return self._fit(view, Image.fromarray(rgb), level, shown, labels=False)

    def image(
        self, view: PlaneView, planes: np.ndarray, level: GridLevel, settings: RenderSettings, shown: Shown
    ) -> Image.Image:
        """``shown`` rendered from its ``planes`` at ``level`` (``view.window``): resized from
        that level smoothly (bicubic) where an axis is upscaled, as the less reduced axis of a
        distorted size may be, else by averaging (box)."""
        from PIL import Image

        sel = view.selected_channel if view.sample_axis is None else None
        channels = [sel] if sel is not None else list(range(planes.shape[0]))
        if settings.mode == "labels":
            rgb = label_colours(planes[0])
        elif settings.mode == "rgb":
            rgb = np.ascontiguousarray(np.moveaxis(planes[:3], 0, -1))
        else:
            rgb = self._own_composite(view, planes, settings, channels)
        return self._fit(view, Image.fromarray(rgb), level, shown, labels=settings.mode == "labels")

    def _own_composite(
        self, view: PlaneView, planes: np.ndarray, settings: RenderSettings, channels: list[int]
    ) -> np.ndarray:
        """``planes`` drawn with the tensor's own ``settings`` by the spec's compositing kernel
        (its tables made once per plane, channels and content version); one white channel as
        a grey image (what a viewer expects of one channel, and a third of the JPEG's work),
        of 8 or 16 bits looked up in the kernel's own answer for every value (``_grey_lut``)."""
        positions, shown = shown_channels(settings, channels)
        key = ("", tuple(channels), *self._plane_key(view))
        indices, tables = self.tables.get(key, lambda: (tuple(positions), composite.prepare(shown)))
        visible = planes if list(indices) == list(range(planes.shape[0])) else planes[list(indices)]
        grey = len(shown) == 1 and shown[0].colour == (1.0, 1.0, 1.0)
        if grey and visible.dtype in _GREY_LUT_DTYPES:
            lut = self.grey_luts.get((*key, visible.dtype.str), lambda: _grey_lut(visible.dtype, tables))
            return visible[0] if lut is None else lut[visible[0]]
        rgb = composite.composite_with(_kernel_dtype(visible), tables)
        return np.ascontiguousarray(rgb[..., 0]) if grey else rgb

    @staticmethod
    def _fit(view: PlaneView, image: Image.Image, level: GridLevel, shown: Shown, labels: bool) -> Image.Image:
        """``image`` (the pixels of ``view.window(shown)`` at ``level``) cropped and resized to
        ``shown``; labels by nearest neighbour (an id is never blended into another)."""
        from PIL import Image

        x, y, w, h, out_w, out_h = shown.x, shown.y, shown.w, shown.h, shown.out_w, shown.out_h
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
        resample = Image.Resampling.NEAREST if labels else Image.Resampling.BOX
        if (box[2] - box[0]) < out_w or (box[3] - box[1]) < out_h:
            resample = Image.Resampling.NEAREST if labels else Image.Resampling.BICUBIC
        return image.resize((out_w, out_h), resample, box=box)


#: the dtypes whose grey image is a look-up (at most 65,536 values: 64 KiB a table)
_GREY_LUT_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16))


def _grey_lut(dtype: np.dtype, tables: composite.Tables) -> np.ndarray | None:
    """The grey value the compositing kernel gives every value of ``dtype`` (one white
    channel), so a look-up answers as the kernel does, bit for bit; None when that is the value
    itself (8 bits at their full window), which needs no look-up at all. A 512² tile costs the
    kernel 1.2 ms, the look-up 0.35 ms (in process, 2026-12-05): a grey tile is most of what a
    single-channel image's viewer asks for."""
    values = np.arange(np.iinfo(dtype).max + 1, dtype=dtype)
    lut = np.ascontiguousarray(composite.composite_with(values.reshape(1, 1, -1), tables)[0, :, 0])
    return None if dtype == np.uint8 and np.array_equal(lut, values) else lut


def _kernel_dtype(planes: np.ndarray) -> np.ndarray:
    """``planes`` in a dtype the compositing kernel takes: its own four as they are, booleans
    as uint8, any other number as float32 (a window over 24 bits of precision is finer than
    an 8-bit display shows)."""
    if planes.dtype.name in composite.DTYPES:
        return planes
    return planes.astype(np.uint8 if planes.dtype.kind == "b" else np.float32)
