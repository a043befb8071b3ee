"""Decode floors for ``bench peers``: the time to only read and decode a plane's stored pieces
(zarr chunks, TIFF tiles) with all cores, nothing assembled and nothing reduced.

Why: a scaled read has to decode every piece of the plane, so this is the limit it can
approach. A row far above its floor spends its time elsewhere (serial decoding, copies, a
reduction that does not overlap decoding); a row near it can only get faster with a faster
codec. Each piece is read with its own ``pread`` and decoded on a pool of ``os.cpu_count()``
threads, using the codec the store names (numcodecs for zarr, tifffile's for TIFF).
"""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["zarr_decode_floor", "tiff_decode_floor", "zarr_extent_floor", "tiff_extent_floor"]


def _decode_all(path_of: Callable[[int], Path], spans: Sequence[tuple[int, int]],
                decode: Callable[[bytes, int], int]) -> int:
    """Read and decode every piece on all cores; return the decoded bytes (the plane's size)."""
    def one(i: int) -> int:
        fd = os.open(path_of(i), os.O_RDONLY)
        try:
            offset, count = spans[i]
            return decode(os.pread(fd, count, offset), i)
        finally:
            os.close(fd)

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return sum(pool.map(one, range(len(spans))))


def zarr_decode_floor(array_dir: Path) -> Callable[[], int]:
    """Decode every chunk file of a zarr v2 array (the bench fixture's format) with its compressor."""
    import numcodecs

    meta = json.loads((array_dir / ".zarray").read_text())
    if meta.get("filters"):
        raise ValueError(f"{array_dir}: the decode floor handles a compressor without filters")
    codec = numcodecs.get_codec(meta["compressor"])
    files = sorted(p for p in array_dir.iterdir() if p.is_file() and not p.name.startswith("."))
    spans = [(0, p.stat().st_size) for p in files]
    return lambda: _decode_all(files.__getitem__, spans, lambda data, i: memoryview(codec.decode(data)).nbytes)


def tiff_decode_floor(path: Path) -> Callable[[], int]:
    """Decode every tile/strip of the first page with tifffile's decoder for that page."""
    import tifffile

    with tifffile.TiffFile(path) as tf:
        page = tf.pages.first
        decode = page.decode  # tifffile's per-page decoder; it is what its own threads call
        spans = list(zip(page.dataoffsets, page.databytecounts))
    return lambda: _decode_all(lambda i: path, spans, lambda data, i: decode(data, i)[0].nbytes)


def _extent_pieces(x: int, y: int, w: int, h: int, tile: tuple[int, int], across: int) -> list[tuple[int, int, int]]:
    """(row, col, index in row-major order) of the stored 2-D pieces under a region."""
    th, tw = tile
    return [(r, c, r * across + c) for r in range(y // th, -(-(y + h) // th))
            for c in range(x // tw, -(-(x + w) // tw))]


def zarr_extent_floor(array_dir: Path) -> Callable[[int, int, int, int], int]:
    """``floor(x, y, w, h)``: decode the chunk files of a 2-D zarr v2 array under a region."""
    import numcodecs

    meta = json.loads((array_dir / ".zarray").read_text())
    codec = numcodecs.get_codec(meta["compressor"])
    sep = meta.get("dimension_separator", ".")
    tile = tuple(meta["chunks"])
    across = -(-meta["shape"][1] // tile[1])

    def floor(x: int, y: int, w: int, h: int) -> int:
        files = [array_dir / f"{r}{sep}{c}" for r, c, _ in _extent_pieces(x, y, w, h, tile, across)]
        spans = [(0, p.stat().st_size) for p in files]
        return _decode_all(files.__getitem__, spans, lambda data, i: memoryview(codec.decode(data)).nbytes)

    return floor


def tiff_extent_floor(path: Path) -> Callable[[int, int, int, int], int]:
    """``floor(x, y, w, h)``: decode the tiles of a tiled TIFF's first page under a region."""
    import tifffile

    with tifffile.TiffFile(path) as tf:
        page = tf.pages.first
        decode, tile = page.decode, (page.tilelength, page.tilewidth)
        spans = list(zip(page.dataoffsets, page.databytecounts))
        across = -(-page.imagewidth // page.tilewidth)

    def floor(x: int, y: int, w: int, h: int) -> int:
        index = [i for _, _, i in _extent_pieces(x, y, w, h, tile, across)]
        return _decode_all(lambda i: path, [spans[i] for i in index],
                           lambda data, i: decode(data, index[i])[0].nbytes)

    return floor
