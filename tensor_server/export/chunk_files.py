"""The bytes of an export's zarr files, made here from the array's metadata: key -> bytes.

Why not ``array[...] = block``. zarr-python's write path assembles each shard through its
event loop: a fill buffer per shard, one coroutine and one executor hop per inner chunk, a
``Buffer.combine`` of the pieces. In a py-spy profile of a 32768² uint16 export (2026-12-03,
idle) that assembly was about 13 % of the busy samples, against 59 % for Blosc itself. A unit
always covers whole files (export/layout.py), so nothing is ever merged into an existing file
and the assembly is simple enough to do directly: each inner chunk is encoded by numcodecs on
the writer's own thread (Blosc and Zstd release the GIL), the pieces are written with one gathered
write (never joined), and the caller fsyncs and checksums the bytes it already holds.

What a file holds is what zarr-python would read back, by the array's own metadata:

* zarr v2: one file per chunk, the chunk (an edge chunk padded with the fill value to the
  chunk shape) through the array's compressor;
* zarr v3 ``sharding_indexed`` (index at the end; index codecs ``bytes`` little-endian +
  ``crc32c``, which is what zarr-python writes): the encoded inner chunks that meet the
  array, in C order, then the index (``core/ngff.py`` owns the layout).

Fill-valued chunks: a compressed chunk of fill values is a few dozen bytes, so every chunk is
written (zarr-python's per-chunk equality check, ``np.array_equal``, was 18 % of the busy
samples of a 30×4096² export); uncompressed, a fill-valued chunk is left out (its whole size
saved) and a file with nothing in it is no file (``None``). The rule follows the stored
codecs, so a resumed export writes exactly what an uninterrupted one does.
tests/export/chunk_files_test.py reads every layout back with zarr-python and compares the
encoded inner chunks with the ones zarr-python writes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from tensor_server.core.ngff import shard_index

__all__ = ["ChunkFiles"]


def _go_on() -> None:
    """The checkpoint of an encode nobody stops."""


def _numcodec(config: dict[str, Any] | None) -> Any:
    """The numcodecs codec of a stored compressor config (v2 ``compressor``, or a v3 codec
    entry with its ``name``/``configuration``); None for no compression."""
    import numcodecs

    if config is None:
        return None
    if "id" in config:  # zarr v2: numcodecs' own spelling
        return numcodecs.get_codec(dict(config))
    name, conf = config["name"], dict(config.get("configuration") or {})
    if name == "blosc":
        conf["shuffle"] = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}[conf["shuffle"]]
    if name not in ("blosc", "zstd"):
        raise ValueError(f"codec {name!r} is not one an export writes")
    return numcodecs.get_codec({"id": name, **conf})


class ChunkFiles:
    """How one level's array lies in files, and the bytes of the files a block fills."""

    def __init__(self, array: Any) -> None:
        meta = array.metadata.to_dict()
        self.key = array.metadata.encode_chunk_key
        self.shape = tuple(array.shape)
        self.fill = array.fill_value
        if meta["zarr_format"] == 2:
            if meta.get("filters") or meta.get("order", "C") != "C":
                raise ValueError(f"{array.path}: filters or F order are not what an export writes")
            self.file_shape = self.chunk_shape = tuple(meta["chunks"])
            self.dtype = np.dtype(array.dtype)
            self.codec = _numcodec(meta.get("compressor"))
            self.sharded = False
        else:
            (sharding,) = meta["codecs"]
            conf = sharding["configuration"]
            inner = conf["codecs"]
            if (
                sharding["name"] != "sharding_indexed"
                or conf.get("index_location", "end") != "end"
                or [c["name"] for c in conf["index_codecs"]] != ["bytes", "crc32c"]
                or inner[0]["name"] != "bytes"
                or len(inner) > 2
            ):
                raise ValueError(f"{array.path}: a v3 layout other than what an export writes: {sharding}")
            self.file_shape = tuple(meta["chunk_grid"]["configuration"]["chunk_shape"])
            self.chunk_shape = tuple(conf["chunk_shape"])
            endian = ">" if (inner[0].get("configuration") or {}).get("endian") == "big" else "<"
            dtype = np.dtype(array.dtype)
            self.dtype = dtype.newbyteorder(endian) if dtype.itemsize > 1 else dtype
            self.codec = _numcodec(inner[1] if len(inner) == 2 else None)
            self.sharded = True
        self.write_fill_chunks = self.codec is not None

    def files(self, origin: tuple[int, ...], data: np.ndarray) -> list[tuple[str, np.ndarray]]:
        """(key relative to the array, the file's part of ``data``) of each file ``data``
        (placed at ``origin``) fills; ``encode`` makes a part's bytes. ``data`` must cover
        each such file's part of the array whole: a unit holds whole files, and a file is
        never merged."""
        ranges = [range(a // g, -(-(a + n) // g)) for a, n, g in zip(origin, data.shape, self.file_shape)]
        out = []
        for index in itertools.product(*ranges):
            start = tuple(i * g for i, g in zip(index, self.file_shape))
            stop = tuple(min(a + g, n) for a, g, n in zip(start, self.file_shape, self.shape))
            if any(a < o or z > o + n for a, z, o, n in zip(start, stop, origin, data.shape)):
                raise ValueError(f"block at {origin} of shape {data.shape} covers file {index} only in part")
            out.append((self.key(index), data[tuple(slice(a - o, z - o) for a, z, o in zip(start, stop, origin))]))
        return out

    def encode(self, part: np.ndarray, checkpoint: Callable[[], None] | None = None) -> list[bytes] | None:
        """A file's bytes from its part of the array (``files``), as the pieces to write one
        after the other (never joined: a shard is written with one gathered write); None: no
        file. ``checkpoint()`` is called before each chunk is encoded: it raises to stop a
        shard part way (an export asked to stop), so a stop waits for one chunk, not a shard."""
        checkpoint = checkpoint or _go_on
        if self.sharded:
            return self._shard(part, checkpoint)
        checkpoint()
        chunk = self._chunk(part)
        return None if chunk is None else [chunk]

    def _chunk(self, piece: np.ndarray) -> bytes | None:
        """One chunk's stored bytes (``piece`` is its part inside the array)."""
        if not self.write_fill_chunks and not np.any(piece != self.fill):
            return None
        if piece.shape == self.chunk_shape:
            whole = np.ascontiguousarray(piece, dtype=self.dtype)
        else:
            whole = np.full(self.chunk_shape, self.fill, self.dtype)
            whole[tuple(slice(0, n) for n in piece.shape)] = piece
        return bytes(self.codec.encode(whole)) if self.codec is not None else whole.tobytes()

    def _shard(self, view: np.ndarray, checkpoint: Callable[[], None]) -> list[bytes] | None:
        """One shard's pieces: its inner chunks in C order, then the index and its CRC-32C
        (``core.ngff.shard_index``)."""
        per_shard = tuple(-(-f // c) for f, c in zip(self.file_shape, self.chunk_shape))
        nbytes = np.full(per_shard, -1, dtype=np.int64)
        pieces: list[bytes] = []
        for inner in itertools.product(*(range(-(-n // c)) for n, c in zip(view.shape, self.chunk_shape))):
            checkpoint()
            piece = self._chunk(view[tuple(slice(i * c, (i + 1) * c) for i, c in zip(inner, self.chunk_shape))])
            if piece is None:
                continue
            nbytes[inner] = len(piece)
            pieces.append(piece)
        if not pieces:
            return None
        return pieces + [shard_index(nbytes, checksum=True)]
