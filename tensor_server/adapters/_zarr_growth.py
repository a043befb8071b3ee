"""Growth of a local zarr array while it is served: the metadata document says the array is
larger, the chunk files say how far frames are written (``ArrayGrowth``).

A live acquisition resizes the array along one axis (T) and writes the new frames: zarr-python
must resize first (it refuses a write past the shape), acquire-zarr writes the chunks first.
So the metadata alone may announce frames not yet on disk, and a client told of them would
read the fill value. The extent published is therefore the metadata's, cut back to the first
storage cell (chunk, or shard when sharded) of the new frames that is not written yet: a cell
is written when its file exists, and the cell holding the newest frame also when its file is
no older than the metadata document (a partial cell already held earlier frames before the
resize). zarr-python does not write a chunk equal to the fill value, so an all-fill frame
would never show up that way: a metadata document left alone for ``SETTLE_NS`` is taken at
its word.

Anything but one axis growing (a dtype, chunk grid or codec change, an axis shrunk, the rank,
two axes at once) is not growth: ``look`` answers the reason and the source is reopened under
a new content version, as for a chunk rewritten in place.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensor_server.core.identity import file_stat_stamp

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.adapters._zarr_array import StoredArray

__all__ = ["ArrayGrowth", "Grew", "SETTLE_NS"]

#: a metadata document older than this is believed without looking for its chunk files
SETTLE_NS = 1_000_000_000

#: at most this many cells are stat'ed per look (a huge jump is published in steps)
_MAX_CELLS = 4096


class Grew:
    """A look's answer when the array grew: the ``shape`` to publish along ``axis``, and
    zarr-python's view of the array as the look found it."""

    __slots__ = ("array", "axis", "shape")

    def __init__(self, axis: int, shape: tuple[int, ...], array: Any) -> None:
        self.axis, self.shape, self.array = axis, shape, array


class ArrayGrowth:
    """The metadata document of one array and what it said when last read (module
    docstring); made by the array's first look, which reads the document once."""

    def __init__(self, folder: Path, array: StoredArray, grid: tuple[int, ...]) -> None:
        self.folder = folder
        self.document = folder / (".zarray" if array.zarr_format == 2 else "zarr.json")
        self.grid = grid
        self._array = array
        #: the document's stamp when last read in full (None: not yet, read at the first look)
        self._stamp: tuple[int, ...] | None = None
        #: the growing axis, once the array has grown (None before: it may never grow)
        self.axis: int | None = None

    def unchanged(self) -> bool:
        """The document is as it was when everything it said was published: most looks'
        answer, found with one stat and no lock (``ZarrAdapter.refresh_extent`` asks before
        every plan; under the lock, six SDK clients queued on it). A look publishing growth
        meanwhile records its stamp before the tensor grows, so a plan racing it may still
        see the extent before (an earlier state, all of it verified), never a partial one."""
        if self._stamp is None:
            return False
        try:
            return file_stat_stamp(os.stat(self.document)) == self._stamp
        except OSError:  # gone or unreadable: the look under the lock says why
            return False

    def look(self, published: tuple[int, ...]) -> Grew | str | None:
        """None: nothing new to publish; ``Grew``: publish its shape; a str: not growth (the
        reason the source must be reopened)."""
        try:
            stamp = file_stat_stamp(os.stat(self.document))
            if stamp == self._stamp:
                return None
            array = self._read()
            old = self._array.metadata  # the same document less its shape and attributes?
            changed = dataclasses.replace(array.metadata, shape=old.shape, attributes=old.attributes) != old
        except FileNotFoundError:  # writers replace it by a rename: gone is removed
            return f"the metadata document {self.document.name} is gone"
        except Exception as exc:  # zarr-python refuses a document in many ways
            return f"the metadata document is unreadable: {type(exc).__name__}: {exc}"
        if changed:
            return "the array was rewritten (dtype, chunks or codecs changed)"
        shape = tuple(int(n) for n in array.shape)
        why = self._not_growth(published, shape)
        if why is not None:
            return why
        grown = [a for a, (n, p) in enumerate(zip(shape, published)) if n > p]
        if not grown:
            self._stamp = stamp
            return None
        axis = grown[0]
        written = self._written(axis, published, shape[axis], stamp)
        if written >= shape[axis]:
            self._stamp = stamp  # all of it published: nothing to look for until it changes
        if written <= published[axis]:
            return None
        self.axis = axis
        return Grew(axis, published[:axis] + (written,) + published[axis + 1 :], array)

    def _read(self) -> StoredArray:
        """The array as its document says now (read as the walker reads it at open)."""
        old = self._array
        return type(old)(old.store, old.path, old.zarr_format, self.document.read_bytes(), self.document)

    def _not_growth(self, published: tuple[int, ...], shape: tuple[int, ...]) -> str | None:
        if len(shape) != len(published):
            return f"the array's rank changed ({len(published)} -> {len(shape)} axes)"
        if any(n < p for n, p in zip(shape, published)):
            return f"the array shrank ({list(published)} -> {list(shape)})"
        grown = [a for a, (n, p) in enumerate(zip(shape, published)) if n > p]
        if len(grown) > 1 or (grown and self.axis is not None and grown[0] != self.axis):
            return f"the array grew along another axis than before ({list(published)} -> {list(shape)})"
        return None

    def _written(self, axis: int, shape: tuple[int, ...], declared: int, stamp: tuple[int, ...]) -> int:
        """How far along ``axis`` frames are on disk (module docstring), from ``shape``, the
        extent published so far."""
        mtime_ns, published = stamp[1], shape[axis]
        if time.time_ns() - mtime_ns >= SETTLE_NS:
            return declared
        g = self.grid[axis]
        last = (declared - 1) // g
        others = [range(-(-shape[a] // self.grid[a])) for a in range(len(self.grid)) if a != axis]
        per_cell = math.prod(len(r) for r in others)
        stop = min(last, published // g + max(1, _MAX_CELLS // max(per_cell, 1)) - 1)
        encode = self._array.metadata.encode_chunk_key
        for k in range(published // g, stop + 1):
            for rest in itertools.product(*others):
                cell = rest[:axis] + (k,) + rest[axis:]
                try:
                    st = os.stat(self.folder / encode(cell))
                except FileNotFoundError:
                    return max(published, k * g)
                if k == last and st.st_mtime_ns < mtime_ns:
                    return max(published, k * g)
        return min(declared, (stop + 1) * g)
