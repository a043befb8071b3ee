"""IIIF Image API 3.0, compliance level 2: the parameter grammar and ``info.json``.

``{region}/{size}/{rotation}/{quality}.{format}`` is parsed into an ``ImageRequest`` of
integers (the full-resolution region, the output size, rotation, mirroring, quality and
format) by pure functions; syntax errors raise ``InvalidArgument`` (400), well-formed requests
for what is not offered ``Unimplemented`` (501), as the spec asks. Tiles are advertised with
``scaleFactors`` of our computed levels (powers of two until the image fits one tile): no
stored pyramid is needed, and a tile is read at the level that serves it (``render.plane``).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from tensor_server.errors import InvalidArgument, Unimplemented

__all__ = ["ImageRequest", "parse_request", "info_json", "TILE", "MAX_AREA", "QUALITIES", "PROFILE_URI"]

TILE = 512
#: the largest output a request may ask for (``maxArea``): ``max`` of a big image is capped to it
MAX_AREA = 4096 * 4096
QUALITIES = ("default", "color", "gray", "bitonal")
PROFILE_URI = "http://iiif.io/api/image/3/level2.json"
CONTEXT = "http://iiif.io/api/image/3/context.json"
_NUMBER = r"\d+(?:\.\d+)?"
_MAX_TEXT = 200


@dataclass(frozen=True)
class ImageRequest:
    x: int
    y: int
    w: int
    h: int
    out_w: int
    out_h: int
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
    body = text[4:] if pct else text
    if not re.fullmatch(rf"{_NUMBER},{_NUMBER},{_NUMBER},{_NUMBER}" if pct else r"\d+,\d+,\d+,\d+", body):
        raise InvalidArgument(f"region {text[:_MAX_TEXT]!r} is not full, square, x,y,w,h or pct:x,y,w,h")
    values = [float(v) for v in body.split(",")]
    if pct:
        x, y = values[0] * width / 100, values[1] * height / 100
        w, h = values[2] * width / 100, values[3] * height / 100
        x, y, w, h = round(x), round(y), round(w), round(h)
    else:
        x, y, w, h = (int(v) for v in values)
    if w <= 0 or h <= 0 or x >= width or y >= height:
        raise InvalidArgument(f"region {text[:_MAX_TEXT]!r} is empty or outside the {width}x{height} image")
    return x, y, min(w, width - x), min(h, height - y)


def _size(text: str, w: int, h: int) -> tuple[int, int]:
    up = text.startswith("^")
    body = text[1:] if up else text
    if body == "max":
        factor = min(1.0, math.sqrt(MAX_AREA / (w * h)))
        ow, oh = max(1, int(w * factor)), max(1, int(h * factor))
        return ow, oh
    if body.startswith("pct:"):
        if not re.fullmatch(_NUMBER, body[4:]):
            raise InvalidArgument(f"size {text[:_MAX_TEXT]!r}: pct: takes a number")
        n = float(body[4:])
        if n <= 0 or (n > 100 and not up):
            raise InvalidArgument(f"size {text[:_MAX_TEXT]!r}: a percentage must be in (0, 100], or larger with ^")
        ow, oh = max(1, round(w * n / 100)), max(1, round(h * n / 100))
    else:
        confined = body.startswith("!")
        body = body[1:] if confined else body
        m = re.fullmatch(r"(\d*),(\d*)", body)
        if not m or (not m.group(1) and not m.group(2)) or (confined and not (m.group(1) and m.group(2))):
            raise InvalidArgument(f"size {text[:_MAX_TEXT]!r} is not max, w,, ,h, pct:n, w,h or !w,h (^ to upscale)")
        sw, sh = (int(g) if g else None for g in m.groups())
        if confined:
            factor = min(sw / w, sh / h)
            ow, oh = max(1, int(w * factor + 1e-9)), max(1, int(h * factor + 1e-9))
        elif sw is not None and sh is not None:
            ow, oh = sw, sh
        elif sw is not None:
            ow, oh = sw, max(1, round(h * sw / w))
        else:
            ow, oh = max(1, round(w * sh / h)), sh
    if ow <= 0 or oh <= 0:
        raise InvalidArgument(f"size {text[:_MAX_TEXT]!r} is empty")
    if not up and (ow > w or oh > h):
        raise InvalidArgument(f"size {text[:_MAX_TEXT]!r} is larger than the {w}x{h} region; prefix ^ to upscale")
    if ow * oh > MAX_AREA:
        raise InvalidArgument(f"size {text[:_MAX_TEXT]!r} is {ow}x{oh}, over the maxArea {MAX_AREA}")
    return ow, oh


def parse_request(region: str, size: str, rotation: str, quality_format: str, width: int, height: int,
                  formats: list[str]) -> ImageRequest:
    """The request for a ``width × height`` image (raises InvalidArgument / Unimplemented)."""
    x, y, w, h = _region(region, width, height)
    ow, oh = _size(size, w, h)
    mirror = rotation.startswith("!")
    angle_text = rotation[1:] if mirror else rotation
    if not re.fullmatch(_NUMBER, angle_text) or float(angle_text) > 360:
        raise InvalidArgument(f"rotation {rotation[:_MAX_TEXT]!r} is not a number of degrees in [0, 360], "
                              "optionally after ! (mirror)")
    angle = float(angle_text) % 360
    if angle % 90:
        raise Unimplemented(f"rotation {rotation[:_MAX_TEXT]!r}: only multiples of 90 degrees are offered")
    quality, dot, fmt = quality_format.rpartition(".")
    if not dot or quality not in QUALITIES:
        raise InvalidArgument(f"{quality_format[:_MAX_TEXT]!r} is not quality.format with quality one of {QUALITIES}")
    if fmt not in formats:
        raise InvalidArgument(f"format {fmt[:_MAX_TEXT]!r} is not offered; use one of {formats}")
    return ImageRequest(x, y, w, h, ow, oh, mirror, int(angle), quality, fmt)


def scale_factors(width: int, height: int) -> list[int]:
    """1, 2, 4, … until the whole image fits one tile."""
    factors = [1]
    while max(width, height) / factors[-1] > TILE:
        factors.append(factors[-1] * 2)
    return factors


def info_json(service_id: str, width: int, height: int, formats: list[str]) -> dict[str, Any]:
    factors = scale_factors(width, height)
    sizes = [{"width": -(-width // f), "height": -(-height // f)} for f in reversed(factors)
             if -(-width // f) * -(-height // f) <= MAX_AREA]
    return {
        "@context": CONTEXT, "id": service_id, "type": "ImageService3", "protocol": "http://iiif.io/api/image",
        "profile": "level2", "width": width, "height": height, "maxArea": MAX_AREA,
        "sizes": sizes, "tiles": [{"width": TILE, "height": TILE, "scaleFactors": factors}],
        "extraFormats": [f for f in formats if f not in ("jpg", "png")],
        "extraQualities": ["color", "gray", "bitonal"],
        "extraFeatures": ["baseUriRedirect", "cors", "jsonldMediaType", "mirroring", "profileLinkHeader",
                          "sizeUpscaling"],
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
