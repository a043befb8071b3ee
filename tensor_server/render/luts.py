"""Colours a render spec may name for a channel: ``#RRGGBB`` (or ``RRGGBB``), the grey and
primary ramps by name (grey, cyan, magenta, yellow, red, green, blue: black to that colour),
and the perceptual LUTs viridis and magma (``luts.json``, written by ``tools/luts.py`` from
matplotlib's tables) for a channel shown alone.

A colour is given to the compositing kernel (``tensor_server_kernels.composite``) as a tint
(three sRGB components in [0, 1]) or a LUT (``(256, 3)`` uint8)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from tensor_server.errors import InvalidArgument

__all__ = ["TINTS", "LUT_NAMES", "colour_value", "normalised_colour"]

#: named ramps: black to this sRGB colour
TINTS = {
    "grey": "FFFFFF",
    "gray": "FFFFFF",
    "cyan": "00FFFF",
    "magenta": "FF00FF",
    "yellow": "FFFF00",
    "red": "FF0000",
    "green": "00FF00",
    "blue": "0000FF",
}
LUT_NAMES = ("viridis", "magma")
_HEX = frozenset("0123456789abcdefABCDEF")


@functools.cache
def _lut(name: str) -> np.ndarray:
    doc = json.loads((Path(__file__).with_name("luts.json")).read_text(encoding="utf-8"))
    table = bytes.fromhex(doc["luts"][name])
    lut = np.frombuffer(table, np.uint8).reshape(256, 3)
    lut.flags.writeable = False
    return lut


def normalised_colour(text: object, field: str) -> str:
    """``text`` as the spec stores it: ``#RRGGBB`` upper-case, or a lower-case name (raises
    ``InvalidArgument`` naming ``field`` otherwise)."""
    if isinstance(text, str):
        body = text[1:] if text.startswith("#") else text
        if len(body) == 6 and all(ch in _HEX for ch in body):
            return "#" + body.upper()
        if text.lower() in TINTS or text.lower() in LUT_NAMES:
            return text.lower()
    names = ", ".join([*TINTS, *LUT_NAMES])
    raise InvalidArgument(f"{field}: {str(text)[:40]!r} is not a colour: #RRGGBB or one of {names}")


def colour_value(colour: str) -> tuple[float, float, float] | np.ndarray:
    """A normalised colour as the kernel takes it: a tint, or a LUT."""
    if colour in LUT_NAMES:
        return _lut(colour)
    value = int(TINTS.get(colour, colour.lstrip("#")), 16)
    return ((value >> 16) / 255, ((value >> 8) & 255) / 255, (value & 255) / 255)
