"""Chunk ids: the opaque bytes a plan hands out and DoGet (or the cache) takes back.

The biopb client caches chunks by chunk id, in memory and optionally on disk across
processes (wire-protocol §3.6), so an id is a *content identity*. It carries:

* ``array_id``, the level-0 extent ``start..stop``, ``scale`` and the canonical ``method``:
  different arrays, extents, scales or reductions never share an id;
* ``content_version``: bytes naming the data version (file stats: size, mtime, ctime, inode; or a token
  minted for in-memory data), so changed bytes can never be served under an old id;
* ``epoch``: the serving epoch, bumped in this module whenever the pixels served for the
  same (content, extent, scale, method) change meaning (for example a kernel rounding rule),
  so clients' persistent caches drop pixels computed under an old rule.

Only this module mints and parses ids. The encoding is a 4-byte magic, a CRC-32 of the body
and a compact JSON body: self-describing for debugging, and any corruption or foreign bytes
raise InvalidChunkId instead of reading a wrong region.
"""

from __future__ import annotations

import functools
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from tensor_server_kernels.reference import output_shape

from tensor_server.core.bounds import Bounds
from tensor_server.core.methods import CANONICAL_METHODS, PRECOMPUTE
from tensor_server.errors import InvalidChunkId

__all__ = ["ChunkId", "SERVING_EPOCH", "UNSCALED"]

#: Bump when served pixels change meaning for the same inputs (see module docstring).
SERVING_EPOCH = 1

#: Method recorded for an unscaled (all scale 1) chunk.
UNSCALED = "none"

_MAGIC = b"tsc\x01"
#: Minted ids are a few hundred bytes; anything this large is not one (and parsing or echoing
#: it would cost more than refusing it).
MAX_ENCODED_BYTES = 16 << 10
_VALID_METHODS = frozenset(CANONICAL_METHODS) | {UNSCALED, PRECOMPUTE}


@dataclass(frozen=True)
class ChunkId:
    array_id: str
    start: tuple[int, ...]
    stop: tuple[int, ...]
    scale: tuple[int, ...]
    method: str
    content_version: bytes
    epoch: int = SERVING_EPOCH

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", tuple(int(v) for v in self.start))
        object.__setattr__(self, "stop", tuple(int(v) for v in self.stop))
        object.__setattr__(self, "scale", tuple(int(v) for v in self.scale))
        n = len(self.start)
        if len(self.stop) != n or len(self.scale) != n:
            raise InvalidChunkId("chunk id axes disagree between start, stop and scale")
        if any(s < 1 for s in self.scale):
            raise InvalidChunkId(f"chunk id has a non-positive scale {self.scale}")
        if any(b <= a or a < 0 for a, b in zip(self.start, self.stop)):
            raise InvalidChunkId(f"chunk id has an empty or negative extent {self.bounds}")
        if self.method not in _VALID_METHODS:
            raise InvalidChunkId(f"chunk id has an unknown method {self.method!r}")
        if all(s == 1 for s in self.scale) and self.method not in (UNSCALED, PRECOMPUTE):
            object.__setattr__(self, "method", UNSCALED)

    @classmethod
    def for_extent(
        cls,
        array_id: str,
        bounds: Bounds,
        scale: Sequence[int],
        method: str,
        content_version: bytes,
    ) -> ChunkId:
        return cls(array_id, bounds.start, bounds.stop, tuple(scale), method, content_version)

    @cached_property
    def bounds(self) -> Bounds:
        """The level-0 source extent this chunk reduces."""
        return Bounds(self.start, self.stop)

    @property
    def is_scaled(self) -> bool:
        return any(s != 1 for s in self.scale)

    @property
    def output_shape(self) -> tuple[int, ...]:
        """ceil(extent / scale) per axis: the delivered chunk's shape."""
        return output_shape(self.bounds.shape, self.scale)

    # ---- wire encoding --------------------------------------------------------------------
    def encode(self) -> bytes:
        """The id's bytes, encoded once: a warm chunk read asks for them three to five times
        (the cache key, the precacher's, the location's), 10 us each."""
        return self._encoded

    @cached_property
    def _encoded(self) -> bytes:
        body = json.dumps(
            {
                "a": self.array_id,
                "s": list(self.start),
                "e": list(self.stop),
                "k": list(self.scale),
                "m": self.method,
                "v": self.content_version.hex(),
                "p": self.epoch,
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode()
        return _MAGIC + zlib.crc32(body).to_bytes(4, "little") + body

    @classmethod
    def decode(cls, raw: bytes) -> ChunkId:
        """Parse bytes minted by :meth:`encode`; anything else raises InvalidChunkId. The
        ids clients send are the few a viewer shows, sent again and again (a warm SDK tile
        sends its id twice: locate, then read), so the last ``DECODED_IDS`` are kept parsed:
        a parse is 15-40 us of Python under the GIL, a hit a dict look-up. An id is
        immutable, so sharing one object between requests is safe."""
        raw = bytes(raw)
        return _decoded(raw) if len(raw) <= REMEMBERED_ID_BYTES else cls._parse(raw)

    @classmethod
    def _parse(cls, raw: bytes) -> ChunkId:
        if len(raw) > MAX_ENCODED_BYTES:
            raise InvalidChunkId(f"chunk id is {len(raw)} bytes, more than any this server mints")
        if len(raw) < 9 or raw[:4] != _MAGIC:
            raise InvalidChunkId("not a chunk id of this server (bad magic)")
        body = raw[8:]
        if zlib.crc32(body).to_bytes(4, "little") != raw[4:8]:
            raise InvalidChunkId("chunk id is corrupt (checksum mismatch)")
        try:
            d = json.loads(body)
            return cls(
                array_id=str(d["a"]),
                start=tuple(d["s"]),
                stop=tuple(d["e"]),
                scale=tuple(d["k"]),
                method=str(d["m"]),
                content_version=bytes.fromhex(d["v"]),
                epoch=int(d["p"]),
            )
        except InvalidChunkId:
            raise
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
            detail = str(exc)[:120]
            raise InvalidChunkId(f"chunk id body is malformed: {type(exc).__name__}: {detail}") from None


#: parsed ids kept (``ChunkId.decode``): a 63-tile viewport is 63; a few viewers' worth
DECODED_IDS = 4096
#: only ids of a minted id's size are kept (a few hundred bytes), so the memory is bounded by
#: 4 MiB whatever ids clients make up
REMEMBERED_ID_BYTES = 1024


@functools.lru_cache(maxsize=DECODED_IDS)
def _decoded(raw: bytes) -> ChunkId:
    """``ChunkId._parse`` remembered; refusals are not (``lru_cache`` keeps only answers)."""
    return ChunkId._parse(raw)
