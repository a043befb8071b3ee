"""Chunks of a local zarr array read and decoded by the server itself, on every core (issue 25).

Why: zarr-python's sync API runs every read on its one event loop thread, so the decodes of
reads issued from several server threads (a streamed reduction's read-ahead) did not overlap,
and it decodes each chunk into a buffer of its own and copies that into the output. Here a
region's chunks are read with ``pread`` and decoded by numcodecs (blosc, zstd, zlib and gzip
release the GIL) on one process-wide pool, the calling thread taking part: a chunk that is a
contiguous part of the output (a unit of one chunk, the usual streamed unit) is decoded
straight into it; any other is decoded into a chunk-sized buffer and cropped, or strided for a
nearest read, into the output, so a strided read never holds a full-resolution buffer. A
sharded array's inner chunks are read alone, located by the shard's index, which is read once
per shard file and kept while the file's stamp (size, mtime, ctime, inode) stays the same.

What is read here (``LocalChunks.of``): a local folder's v2 arrays with a compressor and no
filters, and v3 arrays whose codecs are ``bytes`` then ``blosc`` / ``zstd`` / ``gzip`` /
``crc32c``, optionally inside one ``sharding_indexed`` codec with a default index (``bytes``,
optional ``crc32c``). Anything else (object stores, transposes, v2 filters, numcodecs.* v3
codecs, nested shards) answers None and stays with zarr-python. An absent chunk, or an empty
shard-index slot, is left to zarr-python region by region (its fill-value rules, v2 ``null``
included).

Blosc frames decode through libblosc2 where it loads (``_blosc_lib``: 25-40 % faster than
numcodecs here), numcodecs otherwise and for any frame libblosc2 refuses. ``decoder_name()``
names this path for ``server_stats`` (the service runtime reports it).

Cold reads: the decoding threads each read a chunk file, then decode it, so with two cores at
most two reads were in flight; a read's chunk files are now opened first and advised
``WILLNEED`` (``_open_ahead``), and the kernel fetches them all at once. A cold 8192² scale-4
read of 64 chunk files of 1024²: 83 -> 70-72 ms (TensorStore, which keeps many reads in
flight, 70); four files of 4096² are unchanged (84). Warm, the advice costs a system call per
file (the file is opened once either way).

Bytes are read with ``pread``, not mapped: mapping the sharded plane's four files instead of
reading them in runs saves their copy out of the page cache (9.6 -> 2.4 ms a plane), but a
file truncated while mapped (a writer rewriting a chunk) kills the process with SIGBUS.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.adapters._blosc_lib import decompressor as blosc_decompressor
from tensor_server.core.bounds import Bounds
from tensor_server.core.identity import file_stat_stamp
from tensor_server.core.stream_reduce import SCRATCH_MIN, run_parallel, scratch

__all__ = ["decoder_name", "LocalChunks", "ShardIndexFormat", "ShardIndexes"]


def decoder_name() -> str:
    """The decoders a local zarr read uses (one line of ``server_stats``)."""
    blosc = "libblosc2 (the blosc2 wheel's, per-thread contexts) for blosc, " if blosc_decompressor() else ""
    return f"{blosc}numcodecs on the server's read pool (zarr-python for object stores and other codecs)"


_EMPTY = 2**64 - 1


# ---- codecs ------------------------------------------------------------------------------------
def _crc32c_strip(data: Any) -> np.ndarray:
    import google_crc32c

    buf = np.frombuffer(data, np.uint8)
    if buf.size < 4 or np.uint32(google_crc32c.value(buf[:-4])).tobytes() != buf[-4:].tobytes():
        raise ValueError("crc32c checksum does not match")
    return buf[:-4]


def _v3_bytes_codecs(codecs: Iterable[Any]) -> list[Any] | None:
    """numcodecs decoders (or the crc32c marker) for zarr v3 bytes->bytes codecs, encode order."""
    import numcodecs
    from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec

    out: list[Any] = []
    for c in codecs:
        if isinstance(c, BloscCodec):
            out.append(numcodecs.Blosc())
        elif isinstance(c, ZstdCodec):
            out.append(numcodecs.Zstd())
        elif isinstance(c, GzipCodec):
            out.append(numcodecs.GZip())
        elif isinstance(c, Crc32cCodec):
            out.append(_crc32c_strip)
        else:
            return None
    return out


def _split_v3(codecs: Sequence[Any]) -> tuple[str | None, list[Any]] | None:
    """(endian of the bytes codec, its bytes->bytes decoders) or None when unsupported."""
    from zarr.codecs import BytesCodec

    if not codecs or not isinstance(codecs[0], BytesCodec):
        return None
    rest = _v3_bytes_codecs(codecs[1:])
    endian = None if codecs[0].endian is None else str(codecs[0].endian.value)
    return None if rest is None else (endian, rest)


def _blosc_nbytes(data: Any) -> int | None:
    """The decoded size a blosc frame declares (its header: bytes 4-8, little-endian)."""
    head = bytes(memoryview(data)[:16])
    return int.from_bytes(head[4:8], "little") if len(head) == 16 else None


class _Pipeline:
    """Bytes of one stored chunk -> its pixels, written into a C-contiguous target array."""

    def __init__(self, decoders: list[Any], stored: np.dtype, order: str) -> None:
        import numcodecs

        self.decoders = decoders  # encode order; applied in reverse
        self.stored = stored
        self.order = order
        self._last_blosc = bool(decoders) and isinstance(decoders[0], numcodecs.Blosc)
        self._libblosc2 = blosc_decompressor() if self._last_blosc else None

    def direct(self, target: np.ndarray) -> bool:
        """The chunk can be decoded straight into ``target`` (no conversion on the way)."""
        return self.order == "C" and target.dtype == self.stored and target.flags.c_contiguous

    def decode_into(self, data: Any, target: np.ndarray) -> None:
        """Decode ``data`` into ``target`` (the chunk's shape; stored dtype when ``direct``)."""
        for dec in reversed(self.decoders[1:]):
            data = dec(data) if dec is _crc32c_strip else dec.decode(data)
        expect = target.size * self.stored.itemsize
        if self.decoders and self._last_blosc and self.direct(target):
            if _blosc_nbytes(data) != expect:
                raise ValueError(f"the blosc frame holds {_blosc_nbytes(data)} bytes, expected {expect}")
            if self._libblosc2 is None or not self._libblosc2(data, target):  # refused: numcodecs says why
                self.decoders[0].decode(data, out=target)
            return
        if self.decoders:
            first = self.decoders[0]
            data = first(data) if first is _crc32c_strip else first.decode(data)
        raw = np.frombuffer(memoryview(data).cast("B"), np.uint8)
        if raw.size != expect:
            raise ValueError(f"decoded to {raw.size} bytes, expected {expect}")
        target[...] = raw.view(self.stored).reshape(target.shape, order=self.order)


# ---- shard indexes -----------------------------------------------------------------------------
class ShardIndexFormat:
    """Where a sharded array's index sits in a shard and how to parse it: the one reader of
    the default encoding (little-endian offsets and lengths, optional crc32c), for local shard
    files (``ShardIndexes``) and remote ones (``_url_shards.py``)."""

    def __init__(self, array: Any) -> None:
        from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

        codec = array.metadata.codecs[0] if array.metadata.zarr_format == 3 else None
        self.per_shard = tuple(int(s) // int(c) for s, c in zip(array.shards, array.chunks))
        self.supported = False
        self.crc = False
        self.size = 0
        self.at_end = True
        if isinstance(codec, ShardingCodec):
            kinds = [type(c) for c in codec.index_codecs]
            endian = getattr(codec.index_codecs[0], "endian", None) if kinds else None
            self.supported = (
                kinds in ([BytesCodec], [BytesCodec, Crc32cCodec]) and getattr(endian, "value", "little") == "little"
            )
            self.crc = kinds == [BytesCodec, Crc32cCodec]
            self.size = 16 * math.prod(self.per_shard) + (4 if self.crc else 0)
            self.at_end = str(getattr(codec.index_location, "value", codec.index_location)) == "end"

    def parse(self, raw: bytes, name: str) -> np.ndarray:
        """The (n, 2) uint64 offsets and lengths in ``raw``, the index bytes of shard ``name``;
        ValueError naming it when short or its checksum does not match."""
        if len(raw) != self.size:
            raise ValueError(f"shard {name!r} is shorter than its index ({len(raw)} < {self.size} bytes)")
        body = _crc32c_strip(raw) if self.crc else np.frombuffer(raw, np.uint8)
        return body.view("<u8").reshape(-1, 2)


class ShardIndexes(ShardIndexFormat):
    """(n, 2) uint64 offsets and lengths of each shard file's inner chunks, read once per
    file: a chunk read (``of_fd``) re-reads it when the file's ``file_stat_stamp`` changed,
    ``clear`` drops all when the source's content version changes. The adapter's uniform
    blocks ask ``get`` (one reader of indexes); None for a non-default index encoding."""

    def __init__(self, array: Any, folder: Path) -> None:
        super().__init__(array)
        self.folder = folder
        self.encode = array.metadata.encode_chunk_key
        self._cache: dict[tuple[int, ...], tuple[tuple[int, int], np.ndarray]] = {}
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Forget every index (the source's content version changed)."""
        with self._lock:
            self._cache.clear()

    def path(self, shard: tuple[int, ...]) -> str:
        return os.path.join(self.folder, self.encode(shard))

    def of_fd(self, shard: tuple[int, ...], fd: int) -> np.ndarray:
        """The index of the shard open at ``fd`` (read when new or when the file changed)."""
        st = os.fstat(fd)
        stamp = file_stat_stamp(st)
        hit = self._cache.get(shard)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        with self._lock:  # one read per shard even when several threads touch it first at once
            hit = self._cache.get(shard)
            if hit is not None and hit[0] == stamp:
                return hit[1]
            raw = os.pread(fd, self.size, st.st_size - self.size if self.at_end else 0)
            index = self.parse(raw, self.encode(shard))
            self._cache[shard] = (stamp, index)
        return index

    def get(self, shard: tuple[int, ...]) -> np.ndarray | None:
        """The index of a stored shard, None when unreadable or not default-encoded."""
        if not self.supported:
            return None
        hit = self._cache.get(shard)
        if hit is not None:  # a changed file is re-read by the next chunk read over it
            return hit[1]
        try:
            fd = os.open(self.path(shard), os.O_RDONLY)
        except OSError:
            return None
        try:
            return self.of_fd(shard, fd)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)


# ---- the reader --------------------------------------------------------------------------------
class LocalChunks:
    """Reads regions (optionally strided) of one local zarr array (module docstring)."""

    def __init__(self, array: Any, folder: Path, pipeline: _Pipeline, indexes: ShardIndexes | None) -> None:
        self.folder = folder
        self.chunks = tuple(int(c) for c in array.chunks)
        self.shape = tuple(int(n) for n in array.shape)
        self.encode = array.metadata.encode_chunk_key
        self.pipeline = pipeline
        self.indexes = indexes
        self.dtype = pipeline.stored.newbyteorder("=") if pipeline.stored.byteorder not in "=|" else pipeline.stored

    @classmethod
    def of(cls, array: Any, folder: Path, indexes: ShardIndexes | None) -> LocalChunks | None:
        """The reader for ``array`` stored under ``folder``, or None when zarr-python must read it."""
        from zarr.codecs import ShardingCodec

        md = array.metadata
        if md.zarr_format == 2:
            if md.filters or md.order not in ("C", "F"):
                return None
            stored = np.dtype(md.dtype.to_native_dtype())
            decoders = [] if md.compressor is None else [md.compressor]
            return cls(array, folder, _Pipeline(decoders, stored, md.order), None)
        codecs = list(md.codecs)
        if len(codecs) == 1 and isinstance(codecs[0], ShardingCodec):
            if indexes is None or not indexes.supported:
                return None
            codecs = list(codecs[0].codecs)
        split = _split_v3(codecs)
        if split is None:
            return None
        endian, decoders = split
        stored = np.dtype(array.dtype)
        if endian is not None:
            stored = stored.newbyteorder("<" if endian == "little" else ">")
        sharded = isinstance(md.codecs[0], ShardingCodec)
        return cls(array, folder, _Pipeline(decoders, stored, "C"), indexes if sharded else None)

    def read(
        self,
        bounds: Bounds,
        step: Sequence[int],
        absent: Callable[[tuple[slice, ...]], np.ndarray],
        out: np.ndarray | None = None,
        parallel: bool = True,
    ) -> np.ndarray:
        """``array[bounds][::step]`` into ``out`` (allocated when None; returned); ``absent(slices)``
        reads a part whose chunk is not stored. The chunks decode on every core (``run_parallel``),
        or on this thread alone when not ``parallel`` (a caller that already keeps every core
        busy with other reads: each hand-off costs a wake-up, which on a loaded machine is
        a wait for a core)."""
        spread = run_parallel if parallel else _serially
        shape = tuple(len(range(a, b, s)) for a, b, s in zip(bounds.start, bounds.stop, step))
        if out is None:
            out = np.empty(shape, self.dtype)
        pieces = list(self._pieces(bounds, step))
        whole = tuple(slice(0, c, 1) for c in self.chunks)
        small = math.prod(self.chunks) * self.pipeline.stored.itemsize < SCRATCH_MIN

        def place(piece: _Piece, data: Any) -> None:
            idx, src, dst = piece
            target = out[dst]
            if data is not None:
                try:
                    if src == whole and self.pipeline.direct(target):
                        self.pipeline.decode_into(data, target)
                        return
                    if small:  # the heap reuses small buffers: no scratch bookkeeping
                        chunk = np.empty(self.chunks, self.pipeline.stored)
                        self.pipeline.decode_into(data, chunk)
                        target[...] = chunk[src]
                        return
                    with scratch(self.chunks, self.pipeline.stored, "chunk") as chunk:
                        self.pipeline.decode_into(data, chunk)
                        target[...] = chunk[src]
                        return
                except Exception as exc:  # a corrupt chunk: name it (zlib.error and others)
                    raise ValueError(f"chunk {self._key(idx)!r}: {type(exc).__name__}: {exc}") from exc
            target[...] = absent(
                tuple(slice(i * c + s.start, i * c + s.stop, s.step) for i, c, s in zip(idx, self.chunks, src))
            )

        if self.indexes is None:
            ahead = self._open_ahead(pieces)
            try:
                spread(pieces, lambda piece: place(piece, self._chunk_bytes(piece[0], ahead)))
            finally:
                _close_all(ahead)
        else:
            spread(self._shard_jobs(pieces), lambda job: self._read_shard_job(job, place))
        return out

    def _pieces(self, bounds: Bounds, step: Sequence[int]) -> Iterator[_Piece]:
        """(chunk index, its picked pixels in chunk coordinates, their place in the output) of
        every chunk holding a picked pixel, row-major."""
        axes = []
        for a, b, s, c in zip(bounds.start, bounds.stop, step, self.chunks):
            parts = []
            for i in range(a // c, (b - 1) // c + 1):
                lo, hi = max(i * c, a), min((i + 1) * c, b)
                k0, k1 = -(-(lo - a) // s), -(-(hi - a) // s)
                if k0 < k1:
                    first = a + k0 * s - i * c
                    parts.append((i, slice(first, first + (k1 - k0 - 1) * s + 1, s), slice(k0, k1)))
            axes.append(parts)
        for combo in itertools.product(*axes):
            yield tuple(p[0] for p in combo), tuple(p[1] for p in combo), tuple(p[2] for p in combo)

    def _key(self, idx: tuple[int, ...]) -> str:
        if self.indexes is None:
            return self.encode(idx)
        per = self.indexes.per_shard
        inner = ", ".join(str(i % p) for i, p in zip(idx, per))
        return f"{self.encode(tuple(i // p for i, p in zip(idx, per)))}[{inner}]"

    def _open_ahead(self, pieces: list[_Piece]) -> dict[tuple[int, ...], int]:
        """The first ``_AHEAD_FILES`` chunk files of a read, opened and advised ``WILLNEED``
        before any is decoded (``_ABSENT`` for a chunk with no file): the kernel then reads
        them all at once, not two at a time as the decoding threads reach them (module
        docstring, "Cold reads")."""
        ahead: dict[tuple[int, ...], int] = {}
        if not hasattr(os, "posix_fadvise"):
            return ahead
        try:
            for idx, _, _ in pieces[:_AHEAD_FILES]:
                try:
                    fd = os.open(os.path.join(self.folder, self.encode(idx)), os.O_RDONLY)
                except FileNotFoundError:
                    ahead[idx] = _ABSENT
                    continue
                ahead[idx] = fd
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except BaseException:
            _close_all(ahead)
            raise
        return ahead

    def _chunk_bytes(self, idx: tuple[int, ...], ahead: dict[tuple[int, ...], int]) -> bytes | None:
        """The stored bytes of an unsharded chunk, None when it is not stored; its file is
        taken from ``ahead`` when it was opened there."""
        fd = ahead.pop(idx, None)
        if fd == _ABSENT:
            return None
        if fd is None:
            try:
                fd = os.open(os.path.join(self.folder, self.encode(idx)), os.O_RDONLY)
            except FileNotFoundError:
                return None
        try:
            return os.pread(fd, os.fstat(fd).st_size, 0)
        finally:
            os.close(fd)

    def _shard_jobs(self, pieces: list[_Piece]) -> list[tuple[tuple[int, ...], list[_Piece]]]:
        """The pieces grouped by shard, in runs of at most a few chunks each, adjacent in the
        file where the shard's index is known: one open, one index look-up and (for adjacent
        chunks) one ``pread`` per run, and enough runs for every core to have several. A
        whole 8192² read of 256² chunks in Morton-ordered shards made 1024 preads, 21 µs each."""
        per = self.indexes.per_shard
        by_shard: dict[tuple[int, ...], list[_Piece]] = {}
        for piece in pieces:
            by_shard.setdefault(tuple(i // p for i, p in zip(piece[0], per)), []).append(piece)
        for shard, group in by_shard.items():  # in file order: zarr-python writes inner chunks in
            index = self.indexes.get(shard)  # Morton order, so a row of them was a pread each
            if index is not None:
                group.sort(key=lambda piece: int(index[_slot(piece[0], per), 0]))
        run = max(1, min(_RUN_CHUNKS, len(pieces) // (4 * (os.cpu_count() or 1))))
        return [(shard, group[k : k + run]) for shard, group in by_shard.items() for k in range(0, len(group), run)]

    def _read_shard_job(self, job: tuple[tuple[int, ...], list[_Piece]], place: Callable[[_Piece, Any], None]) -> None:
        """Read a run of one shard's inner chunks (adjacent ones with one ``pread``) and place each."""
        shard, pieces = job
        per = self.indexes.per_shard
        try:
            fd = os.open(self.indexes.path(shard), os.O_RDONLY)
        except FileNotFoundError:
            for piece in pieces:
                place(piece, None)
            return
        try:
            index = self.indexes.of_fd(shard, fd)
            slots = [_slot(piece[0], per) for piece in pieces]
            spans = [(int(index[k, 0]), int(index[k, 1])) for k in slots]
            stored = [(o, n) for (o, n) in spans if not (o == _EMPTY and n == _EMPTY)]
            lo = min((o for o, _ in stored), default=0)
            hi = max((o + n for o, n in stored), default=0)
            if hi - lo <= 2 * sum(n for _, n in stored) + (1 << 16):  # close together: one read
                blob = memoryview(os.pread(fd, hi - lo, lo))
                if len(blob) != hi - lo:
                    raise ValueError(f"shard {self.encode(shard)!r} ends before its chunks' bytes")
                fetch = lambda o, n: blob[o - lo : o - lo + n]  # noqa: E731
            else:
                fetch = lambda o, n: os.pread(fd, n, o)  # noqa: E731
            for piece, (o, n) in zip(pieces, spans):
                place(piece, None if (o == _EMPTY and n == _EMPTY) else self._exact(fetch(o, n), n, piece[0]))
        finally:
            os.close(fd)

    def _exact(self, data: Any, n: int, idx: tuple[int, ...]) -> Any:
        if len(data) != n:
            raise ValueError(f"chunk {self._key(idx)!r}: shard file ends after {len(data)} of {n} bytes")
        return data


#: (chunk index, picked pixels in chunk coordinates, their place in the output)
_Piece = tuple[tuple[int, ...], tuple[slice, ...], tuple[slice, ...]]
#: at most this many inner chunks are read and decoded by one job of a sharded read
_RUN_CHUNKS = 16
#: chunk files of one unsharded read opened ahead and advised WILLNEED (one descriptor each
#: until the chunk is read; the per-process descriptor limit is usually 1024)
_AHEAD_FILES = 64
#: in ``_open_ahead``'s table: the chunk has no file
_ABSENT = -1


def _close_all(ahead: dict[tuple[int, ...], int]) -> None:
    for fd in ahead.values():
        if fd != _ABSENT:
            os.close(fd)


def _serially(jobs: Sequence[Any], run: Callable[[Any], None]) -> None:
    for job in jobs:
        run(job)


def _slot(idx: tuple[int, ...], per: tuple[int, ...]) -> int:
    """The C-order slot of inner chunk ``idx`` in its shard's index."""
    slot = 0
    for i, p in zip(idx, per):
        slot = slot * p + i % p
    return slot
