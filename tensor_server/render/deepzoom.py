"""DeepZoom (the format OpenSeadragon's ``.dzi`` sources speak): levels and tiles as pure math.

Level ``L`` of ``0..max_level`` (``max_level = ceil(log2(max(w, h)))``) is the image reduced
by ``2^(max_level - L)`` (rounded up); its tiles are ``TILE_SIZE`` square with ``OVERLAP``
pixels repeated from each neighbour (none at the image edge), as OpenSeadragon expects.
``tile_region`` gives the full-resolution region and output size of a tile, which the renderer
reads at the level that serves it. ``parse_tile_path`` splits a tile's path with
``rpartition``/``partition`` and digit tests (``render.numbers``: ASCII digits, at most 9),
linear in the path; a level or tile past the image is a 400 naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tensor_server.errors import InvalidArgument
from tensor_server.render.numbers import whole_number
from tensor_server.render.plane import Shown

__all__ = ["TILE_SIZE", "OVERLAP", "max_level", "dzi_xml", "tile_region", "TilePath", "parse_tile_path"]

TILE_SIZE = 254
OVERLAP = 1


def max_level(width: int, height: int) -> int:
    return max(0, math.ceil(math.log2(max(width, height))))


def dzi_xml(width: int, height: int, fmt: str) -> str:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<Image xmlns="http://schemas.microsoft.com/deepzoom/2008" TileSize="{TILE_SIZE}" '
        f'Overlap="{OVERLAP}" Format="{fmt}"><Size Width="{width}" Height="{height}"/></Image>\n'
    )


@dataclass(frozen=True)
class TilePath:
    identifier: str
    level: int
    col: int
    row: int
    format: str


def parse_tile_path(path: str) -> TilePath:
    """``<identifier>_files/<level>/<col>_<row>.<format>`` (the identifier may hold ``_files/``
    itself: the last one ends it, as the tile part holds none)."""
    identifier, files, tail = path.rpartition("_files/")
    level, slash, name = tail.partition("/")
    tile, dot, fmt = name.partition(".")
    col, underscore, row = tile.partition("_")
    if not (identifier and files and slash and dot and underscore):
        raise InvalidArgument(f"{path[:200]!r} is neither <id>.dzi nor <id>_files/<level>/<col>_<row>.<format>")
    return TilePath(
        identifier,
        whole_number(level, "DeepZoom level"),
        whole_number(col, "DeepZoom tile column"),
        whole_number(row, "DeepZoom tile row"),
        fmt,
    )


def tile_region(width: int, height: int, level: int, col: int, row: int) -> Shown:
    """The full-resolution region of tile ``(col, row)`` of ``level`` and its size in pixels."""
    top = max_level(width, height)
    if not 0 <= level <= top:
        raise InvalidArgument(f"DeepZoom level {level} is outside 0..{top} of this {width}x{height} image")
    factor = 2 ** (top - level)
    lw, lh = -(-width // factor), -(-height // factor)
    cols, rows = -(-lw // TILE_SIZE), -(-lh // TILE_SIZE)
    if not (0 <= col < cols and 0 <= row < rows):
        raise InvalidArgument(f"DeepZoom tile {col}_{row} is outside the {cols}x{rows} tiles of level {level}")
    x0, y0 = max(col * TILE_SIZE - OVERLAP, 0), max(row * TILE_SIZE - OVERLAP, 0)
    x1, y1 = min((col + 1) * TILE_SIZE + OVERLAP, lw), min((row + 1) * TILE_SIZE + OVERLAP, lh)
    fx0, fy0 = x0 * factor, y0 * factor
    fx1, fy1 = min(x1 * factor, width), min(y1 * factor, height)
    return Shown(fx0, fy0, fx1 - fx0, fy1 - fy0, x1 - x0, y1 - y0)
