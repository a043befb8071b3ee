"""The IFD chain of a TIFF file that is still being written, read a few bytes at a time.

tifffile parses a file as a whole and once; a server following an acquisition must look at
what was appended since its last look without parsing the file again, and must tell an IFD
that is complete from one a writer has linked but not yet written (tifffile links the
previous IFD to the new one's position first, then writes the pixels, then the IFD). So this
reads IFDs itself: the entry count, the tags it needs (ImageWidth, ImageLength, the strip
offsets and byte counts) and the next-IFD pointer, and checks every IFD it is given against
the image (``IfdReader.strips``: its plane size, strips on disk) before it is believed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import BinaryIO

__all__ = ["IfdFormat", "IfdReader", "Strips"]

#: IFDs walked at most in one chain (a loop in a damaged chain ends)
MAX_IFDS = 10_000_000
#: (struct code, bytes) of the TIFF integer types a strip tag or an image size may have
_INTS = {3: ("H", 2), 4: ("I", 4), 16: ("Q", 8)}
_WIDTH, _LENGTH, _STRIP_OFFSETS, _STRIP_COUNTS = 256, 257, 273, 279


@dataclass(frozen=True)
class IfdFormat:
    """Byte order and sizes of one TIFF flavour: classic (2-byte entry count, 12-byte entries,
    4-byte offsets) or BigTIFF (8, 20, 8)."""

    byteorder: str  # "<" or ">"
    big: bool

    @property
    def count_size(self) -> int:
        return 8 if self.big else 2

    @property
    def entry_size(self) -> int:
        return 20 if self.big else 12

    @property
    def offset_size(self) -> int:
        return 8 if self.big else 4


@dataclass(frozen=True)
class Strips:
    """One IFD's strips and where its next-IFD pointer is."""

    offsets: tuple[int, ...]
    counts: tuple[int, ...]
    next_at: int


class IfdReader:
    """IFDs of an open file (``fh``) of format ``fmt`` (module docstring)."""

    def __init__(self, fh: BinaryIO, fmt: IfdFormat) -> None:
        self.fh, self.fmt = fh, fmt

    def uint(self, at: int, size: int) -> int:
        """The unsigned integer of ``size`` bytes at ``at`` (0 past the end of the file)."""
        self.fh.seek(at)
        raw = self.fh.read(size)
        return int.from_bytes(raw, "little" if self.fmt.byteorder == "<" else "big") if len(raw) == size else 0

    def next_at(self, ifd: int) -> int:
        """Where the next-IFD pointer of the IFD at ``ifd`` is."""
        return ifd + self.fmt.count_size + self.uint(ifd, self.fmt.count_size) * self.fmt.entry_size

    def count(self, first: int) -> int:
        """IFDs in the chain from ``first`` (0: none)."""
        n, at, seen = 0, first, set()
        while at and at not in seen and n < MAX_IFDS:
            seen.add(at)
            n += 1
            at = self.uint(self.next_at(at), self.fmt.offset_size)
        return n

    def strips(self, ifd: int, plane: tuple[int, int], file_size: int) -> Strips | None:
        """The strips of the IFD at ``ifd`` when it is a complete IFD of a ``plane`` (height,
        width) image whose strips are all on disk, else None."""
        entries = self._entries(ifd)
        if entries is None:
            return None
        size = tuple(self._values(entries.get(c, (0, 0, b"")))[:1] for c in (_LENGTH, _WIDTH))
        offsets = self._values(entries.get(_STRIP_OFFSETS, (0, 0, b"")))
        counts = self._values(entries.get(_STRIP_COUNTS, (0, 0, b"")))
        if size != ((plane[0],), (plane[1],)) or not offsets or len(offsets) != len(counts):
            return None
        if min(counts) <= 0 or max(o + c for o, c in zip(offsets, counts)) > file_size:
            return None  # linked and written before its strips' counts, or strips not on disk yet
        return Strips(offsets, counts, self.next_at(ifd))

    def _entries(self, ifd: int) -> dict[int, tuple[int, int, bytes]] | None:
        """tag -> (type, count, value field) of a plausible IFD (2..64 entries in ascending tag
        order, as every writer sorts them), or None."""
        fmt = self.fmt
        n = self.uint(ifd, fmt.count_size)
        if not 2 <= n <= 64:
            return None
        self.fh.seek(ifd + fmt.count_size)
        raw = self.fh.read(n * fmt.entry_size)
        if len(raw) < n * fmt.entry_size:
            return None
        out = {}
        head = fmt.byteorder + ("HHQ" if fmt.big else "HHI")
        for i in range(n):
            at = i * fmt.entry_size
            code, kind, count = struct.unpack_from(head, raw, at)
            if out and code <= max(out):
                return None
            out[code] = (kind, count, raw[at + 4 + fmt.offset_size : at + fmt.entry_size])
        return out

    def _values(self, entry: tuple[int, int, bytes]) -> tuple[int, ...]:
        """The integers of one entry, read from its value field or from where it points."""
        kind, count, field = entry
        if kind not in _INTS or count <= 0 or count > 1 << 24:
            return ()
        code, size = _INTS[kind]
        fmt = self.fmt
        if count * size <= fmt.offset_size:
            data = field[: count * size]
        else:
            self.fh.seek(int.from_bytes(field, "little" if fmt.byteorder == "<" else "big"))
            data = self.fh.read(count * size)
            if len(data) < count * size:
                return ()
        return struct.unpack(f"{fmt.byteorder}{count}{code}", data)
