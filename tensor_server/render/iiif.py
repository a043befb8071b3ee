"""IIIF Image API 3.0, compliance level 2: the parameter grammar and ``info.json``.

``{region}/{size}/{rotation}/{quality}.{format}`` is parsed into an ``ImageRequest`` of
integers (the full-resolution region, the output size, rotation, mirroring, quality and
format) by pure functions; syntax errors raise ``InvalidArgument`` (400), well-formed requests
for what is not offered ``Unimplemented`` (501), as the spec asks. Tiles are advertised with
the ``scaleFactors`` and ``sizes`` of the published levels (``core.level_grid``: a file's
stored levels, else powers of two until the image fits one tile, the levels the OME-Zarr view
and an export publish), and a tile is read at the level that serves it (``render.plane``).

Every request's cost is bounded by its output before anything is read: each number is at
most 9 ASCII digits (``render.numbers``), the output at most ``MAX_SIDE`` on a side (the
advertised ``maxWidth``/``maxHeight``: WebP's limit) and ``MAX_AREA`` in all (``maxArea``), a
requested zero dimension (``0,``, ``!0,0``) is a 400; and ``render.plane`` reads the region at
a level of at most about 4 pixels per output pixel, however distorted the size. The grammar is
parsed with ``split``/``partition`` and digit tests, linear in the text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tensor_server.errors import InvalidArgument, Unimplemented
from tensor_server.render.numbers import decimal_number, whole_number
from tensor_server.render.plane import Shown

__all__ = ["ImageRequest", "parse_request", "info_json", "TILE", "MAX_AREA", "MAX_SIDE", "QUALITIES", "PROFILE_URI"]

TILE = 512
#: the largest output a request may ask for (``maxArea``): ``max`` of a big image is capped to it
MAX_AREA = 4096 * 4096
#: the widest and tallest output (``maxWidth``, ``maxHeight``): WebP's limit (JPEG's is 65535),
#: so every offered format can encode every size offered
MAX_SIDE = 16383
QUALITIES = ("default", "color", "gray", "bitonal")
PROFILE_URI = "http://iiif.io/api/image/3/level2.json"
CONTEXT = "http://iiif.io/api/image/3/context.json"
_MAX_TEXT = 200


@dataclass(frozen=True)
class ImageRequest(Shown):
    mirror: bool
    rotation: int
    quality: str
    format: str


def _region(text: str, width: int, height: int) -> tuple[int, int, int, int]:
    if text == "full":
        return 0, 0, width, height
    if text == "square":
        side = min(width, height)
        return (width - side) // 2, (height - side) // 2, side, side
    pct = text.startswith("pct:")
    fields = (text[4:] if pct else text).split(",", 4)
    if len(fields) != 4:
        raise InvalidArgument(f"region {text[:_MAX_TEXT]!r} is not full, square, x,y,w,h or pct:x,y,w,h")
    if pct:
        x, y, w, h = (
            decimal_number(v, f"region {name}") * side / 100
            for v, name, side in zip(fields, "xywh", (width, height, width, height))
        )
        x, y, w, h = round(x), round(y), round(w), round(h)
    else:
        x, y, w, h = (whole_number(v, f"region {name}") for v, name in zip(fields, "xywh"))
    if w <= 0 or h <= 0 or x >= width or y >= height:
        raise InvalidArgument(f"region {text[:_MAX_TEXT]!r} is empty or outside the {width}x{height} image")
    return x, y, min(w, width - x), min(h, height - y)


def _max_size(w: int, h: int) -> tuple[int, int]:
    """``max``: the region, scaled down (never up) to fit ``MAX_AREA`` and ``MAX_SIDE``."""
    factor = min(1.0, math.sqrt(MAX_AREA / (w * h)), MAX_SIDE / w, MAX_SIDE / h)
    return max(1, int(w * factor)), max(1, int(h * factor))


def _requested_size(text: str, body: str, w: int, h: int) -> tuple[int, int]:
    """``w,``, ``,h``, ``w,h`` or ``!w,h`` (``body``: ``text`` without its ``^``)."""
    confined = body.startswith("!")
    width_text, comma, height_text = (body[1:] if confined else body).partition(",")
    if not comma or not (width_text or height_text) or (confined and not (width_text and height_text)):
        raise InvalidArgument(f"size {text[:_MAX_TEXT]!r} is not max, w,, ,h, pct:n, w,h or !w,h (^ to upscale)")
    sw = whole_number(width_text, "size width") if width_text else None
    sh = whole_number(height_text, "size height") if height_text else None
    if sw == 0 or sh == 0:
        raise InvalidArgument(f"size {text[:_MAX_TEXT]!r} has a zero dimension: the image would be empty")
    if sw is not None and sh is not None:
        if not confined:
            return sw, sh
        factor = min(sw / w, sh / h)
        return max(1, int(w * factor + 1e-9)), max(1, int(h * factor + 1e-9))
    if sw is not None:
        return sw, max(1, round(h * sw / w))
    assert sh is not None  # one of the two, refused above otherwise
    return max(1, round(w * sh / h)), sh


def _size(text: str, w: int, h: int) -> tuple[int, int]:
    up = text.startswith("^")
    body = text[1:] if up else text
    if body == "max":
        return _max_size(w, h)
    if body.startswith("pct:"):
        n = decimal_number(body[4:], "size percentage")
        if n == 0 or (n > 100 and not up):
            raise InvalidArgument(f"size {text[:_MAX_TEXT]!r}: a percentage must be in (0, 100], or larger with ^")
        ow, oh = max(1, round(w * n / 100)), max(1, round(h * n / 100))
    else:
        ow, oh = _requested_size(text, body, w, h)
    if not up and (ow > w or oh > h):
        raise InvalidArgument(f"size {text[:_MAX_TEXT]!r} is larger than the {w}x{h} region; prefix ^ to upscale")
    if ow > MAX_SIDE or oh > MAX_SIDE:
        raise InvalidArgument(f"size {text[:_MAX_TEXT]!r} is {ow}x{oh}, over the maxWidth and maxHeight {MAX_SIDE}")
    if ow * oh > MAX_AREA:
        raise InvalidArgument(f"size {text[:_MAX_TEXT]!r} is {ow}x{oh}, over the maxArea {MAX_AREA}")
    return ow, oh


def parse_request(
    region: str, size: str, rotation: str, quality_format: str, width: int, height: int, formats: list[str]
) -> ImageRequest:
    """The request for a ``width × height`` image (raises InvalidArgument / Unimplemented)."""
    x, y, w, h = _region(region, width, height)
    ow, oh = _size(size, w, h)
    mirror = rotation.startswith("!")
    degrees = decimal_number(rotation[1:] if mirror else rotation, "rotation (degrees, optionally after ! to mirror)")
    if degrees > 360:
        raise InvalidArgument(
            f"rotation {rotation[:_MAX_TEXT]!r} is not a number of degrees in [0, 360], optionally after ! (mirror)"
        )
    if degrees % 90:
        raise Unimplemented(f"rotation {rotation[:_MAX_TEXT]!r}: only multiples of 90 degrees are offered")
    quality, dot, fmt = quality_format.rpartition(".")
    if not dot or quality not in QUALITIES:
        raise InvalidArgument(f"{quality_format[:_MAX_TEXT]!r} is not quality.format with quality one of {QUALITIES}")
    if fmt not in formats:
        raise InvalidArgument(f"format {fmt[:_MAX_TEXT]!r} is not offered; use one of {formats}")
    return ImageRequest(x, y, w, h, ow, oh, mirror, int(degrees) % 360, quality, fmt)


def info_json(
    service_id: str, width: int, height: int, formats: list[str], levels: Sequence[tuple[int, int, int]]
) -> dict[str, Any]:
    """The ``info.json`` of an image whose published levels (``core.level_grid``, finest
    first) are ``levels``: ``(factor, width, height)`` each, the ``scaleFactors`` and ``sizes``
    (those within ``maxArea`` and ``maxWidth``) a viewer chooses among."""
    factors = [f for f, _, _ in levels]
    sizes = [{"width": w, "height": h} for _, w, h in reversed(levels) if w * h <= MAX_AREA and max(w, h) <= MAX_SIDE]
    return {
        "@context": CONTEXT,
        "id": service_id,
        "type": "ImageService3",
        "protocol": "http://iiif.io/api/image",
        "profile": "level2",
        "width": width,
        "height": height,
        "maxArea": MAX_AREA,
        "maxWidth": MAX_SIDE,
        "maxHeight": MAX_SIDE,
        "sizes": sizes,
        "tiles": [{"width": TILE, "height": TILE, "scaleFactors": factors}],
        "extraFormats": [f for f in formats if f not in ("jpg", "png")],
        "extraQualities": ["color", "gray", "bitonal"],
        "extraFeatures": [
            "baseUriRedirect",
            "cors",
            "jsonldMediaType",
            "mirroring",
            "profileLinkHeader",
            "sizeUpscaling",
        ],
    }


def finish(image: Any, req: ImageRequest) -> Any:
    """Mirror, rotate (clockwise, as IIIF measures) and apply the quality to a rendered region."""
    from PIL import Image, ImageOps

    if req.mirror:
        image = ImageOps.mirror(image)
    turn = {90: Image.Transpose.ROTATE_270, 180: Image.Transpose.ROTATE_180, 270: Image.Transpose.ROTATE_90}
    if req.rotation in turn:
        image = image.transpose(turn[req.rotation])
    if req.quality == "gray":
        image = image.convert("L")
    elif req.quality == "bitonal":
        image = image.convert("L").point(lambda v: 255 if v >= 128 else 0).convert("1")
    elif req.quality == "color" and image.mode != "RGB":
        image = image.convert("RGB")
    return image
