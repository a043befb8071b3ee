"""Decode floors for ``bench peers``: the time to only read and decode a plane's stored pieces
(zarr chunks or a shard's inner chunks, TIFF tiles) with all cores, nothing assembled and
nothing reduced.

Why: a scaled read has to decode every piece of the plane, so this is the limit it can
approach. A row far above its floor spends its time elsewhere (serial decoding, copies, a
reduction that does not overlap decoding); a row near it can only get faster with a faster
codec. Each piece is read with its own ``pread`` and decoded on a pool of ``os.cpu_count()``
threads, using the codec the store names, decoded as the server decodes it (for zarr the
server's chunk pipeline: libblosc2 for blosc frames, numcodecs for the rest; tifffile's
codecs for TIFF). A zarr
piece is decoded into a buffer its thread reuses (first touches of fresh memory would add page
faults no reader has to pay); ``zarr_floor_candidates`` adds the other decoders a floor may be
the best of (TensorStore's and, when installed, the ``zarrs`` codec pipeline's whole read).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["zarr_decode_floor", "tiff_decode_floor", "zarr_floor_candidates", "zarr_extent_floor", "tiff_extent_floor"]


def _decode_all(
    path_of: Callable[[int], Path], spans: Sequence[tuple[int, int]], decode: Callable[[bytes, int], int]
) -> Callable[[], int]:
    """A call that reads and decodes every piece on all cores and returns the decoded bytes
    (the plane's size). Its pool (and so each thread's reused buffer) lives as long as it."""
    pool = ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="decode-floor")

    def one(i: int) -> int:
        fd = os.open(path_of(i), os.O_RDONLY)
        try:
            offset, count = spans[i]
            return decode(os.pread(fd, count, offset), i)
        finally:
            os.close(fd)

    return lambda: sum(pool.map(one, range(len(spans))))


def _zarr_pieces(array_dir: Path) -> tuple[list[Path], list[tuple[int, int]], Any]:
    """(file, (offset, length)) of every stored chunk, or inner chunk of a shard, and the
    decode of one piece's bytes into a buffer (the server's chunk pipeline, the store's codecs)."""
    import zarr

    from tensor_server.adapters._zarr_chunks import LocalChunks, ShardIndexes

    array = zarr.open_array(str(array_dir), mode="r")
    sharded = getattr(array, "shards", None) is not None
    indexes = ShardIndexes(array, array_dir) if sharded else None
    reader = LocalChunks.of(array, array_dir, indexes)
    if reader is None:
        raise ValueError(f"{array_dir}: the decode floor takes the codecs the server decodes itself")
    meta = array.metadata
    grid = array.shards if sharded else array.chunks
    counts = [-(-int(n) // int(g)) for n, g in zip(array.shape, grid)]
    files, spans = [], []
    for cell in np.ndindex(*counts):
        path = array_dir / meta.encode_chunk_key(cell)
        if not path.is_file():
            continue
        if not sharded:
            files.append(path)
            spans.append((0, path.stat().st_size))
            continue
        for offset, length in indexes.get(cell):
            if int(offset) != 2**64 - 1:
                files.append(path)
                spans.append((int(offset), int(length)))
    return files, spans, reader


def _server_decode(reader: Any) -> Callable[[bytes, int], int]:
    """One chunk's bytes decoded by the server's pipeline into a buffer its thread reuses."""
    local = threading.local()
    chunk_bytes = int(np.prod(reader.chunks)) * reader.pipeline.stored.itemsize

    def decode(data: bytes, i: int) -> int:
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = np.empty(reader.chunks, reader.pipeline.stored)
        reader.pipeline.decode_into(data, buf)
        return chunk_bytes

    return decode


def zarr_decode_floor(array_dir: Path) -> Callable[[], int]:
    """Decode every stored chunk (every inner chunk of every shard) of a zarr v2 or v3 array."""
    files, spans, reader = _zarr_pieces(Path(array_dir))
    return _decode_all(files.__getitem__, spans, _server_decode(reader))


def zarr_floor_candidates(array_dir: Path) -> dict[str, Callable[[], Any]]:
    """Decoders the zarr floor is the best of: the server's (libblosc2 / numcodecs) on all cores (above), TensorStore's
    whole read, and the ``zarrs`` codec pipeline's whole read when that package is installed."""
    import tensorstore as ts

    array_dir = Path(array_dir)
    driver = "zarr3" if (array_dir / "zarr.json").is_file() else "zarr"
    spec = {"driver": driver, "kvstore": {"driver": "file", "path": str(array_dir)}}
    out = {
        "libblosc2/numcodecs": zarr_decode_floor(array_dir),
        "tensorstore": lambda: ts.open(spec, read=True).result().read().result(),
    }
    try:
        import zarrs  # noqa: F401 - only whether it is installed
    except ImportError:
        return out
    import zarr

    def zarrs_read() -> Any:
        with zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"}):
            return zarr.open_array(str(array_dir), mode="r")[...]

    out["zarrs"] = zarrs_read
    return out


def tiff_decode_floor(path: Path) -> Callable[[], int]:
    """Decode every tile/strip of the first page with tifffile's decoder for that page."""
    import tifffile

    with tifffile.TiffFile(path) as tf:
        page = tf.pages.first
        decode = page.decode  # tifffile's per-page decoder; it is what its own threads call
        spans = list(zip(page.dataoffsets, page.databytecounts))
    return _decode_all(lambda i: path, spans, lambda data, i: decode(data, i)[0].nbytes)


def _extent_pieces(x: int, y: int, w: int, h: int, tile: tuple[int, int], across: int) -> list[tuple[int, int, int]]:
    """(row, col, index in row-major order) of the stored 2-D pieces under a region."""
    th, tw = tile
    return [
        (r, c, r * across + c) for r in range(y // th, -(-(y + h) // th)) for c in range(x // tw, -(-(x + w) // tw))
    ]


def zarr_extent_floor(array_dir: Path) -> Callable[[int, int, int, int], int]:
    """``floor(x, y, w, h)``: decode the chunk files of a 2-D zarr v2 array under a region."""
    import zarr

    from tensor_server.adapters._zarr_chunks import LocalChunks

    meta = json.loads((array_dir / ".zarray").read_text())
    reader = LocalChunks.of(zarr.open_array(str(array_dir), mode="r"), array_dir, None)
    if reader is None:
        raise ValueError(f"{array_dir}: the decode floor takes the codecs the server decodes itself")
    decode = _server_decode(reader)
    sep = meta.get("dimension_separator", ".")
    tile = tuple(meta["chunks"])
    across = -(-meta["shape"][1] // tile[1])

    def floor(x: int, y: int, w: int, h: int) -> int:
        files = [array_dir / f"{r}{sep}{c}" for r, c, _ in _extent_pieces(x, y, w, h, tile, across)]
        spans = [(0, p.stat().st_size) for p in files]
        return _decode_all(files.__getitem__, spans, decode)()

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
        return _decode_all(
            lambda i: path, [spans[i] for i in index], lambda data, i: decode(data, index[i])[0].nbytes
        )()

    return floor
