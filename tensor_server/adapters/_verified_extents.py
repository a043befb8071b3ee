"""Which extents of a chunk-file store were verified recently: the stale-data check of a store
of many chunk files (the zarr adapter's ``stale_reason``), without a stat per file per read.

Why: before every chunk is served, cached or not, the engine asks whether the bytes under it
changed since the source was opened. For a store of one file per chunk that is a stat per
chunk file under the extent: 4096 stats (50-80 ms) for a coarse level of a 32768² image of
512² chunks, on every warm tile of that level, where the rest of the tile costs 2 ms.

How a verified extent stays trusted (``VerifiedExtents.fresh``), and the guarantee:

* the folders holding the extent's chunk files are stat'ed on every check (one folder for a
  flat zarr v2 array, one per grid row for zarr v3's ``c/i/j``): a chunk file created,
  removed or replaced by a rename changes its folder's mtime, so such a write is seen at the
  next read, as with a stat per file. That is how zarr-python (``LocalStore``'s atomic write)
  and tensorstore write chunks;
* a chunk file rewritten *in place* (same inode, no rename: its folder is untouched) is seen
  within ``WINDOW_S`` seconds: an extent is re-verified file by file when its last full
  verification is older than that. Within the window a read may serve the extent's old
  pixels, and one read may mix them with new pixels of extents verified later (NFS's
  attribute cache makes the same trade, ``acregmin``);
* a verification is not remembered while a folder's mtime is within ``RACY_S`` of the clock
  (a folder changed in the same clock tick as its stat could change again unseen: git's
  "racily clean" index entries), so a store being written is checked file by file until
  it settles.

docs/reads.md (Changed files) states this bound; ``tests/reliability/stale_data_test.py``
asserts both halves.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Sequence

__all__ = ["VerifiedExtents", "WINDOW_S", "RACY_S", "MAX_EXTENTS"]

#: an in-place rewrite of a chunk file is served from the old bytes for at most this long
WINDOW_S = 2.0
#: a folder modified less than this long before its stat is not trusted to stay unchanged
RACY_S = 0.05
#: extents remembered per store (least recently verified dropped first): a bound, not a cache
#: size to tune; a dropped extent is only verified file by file again
MAX_EXTENTS = 4096

_Stamp = tuple[int, int, int]


def _folder_stamp(path: str) -> _Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return (-1, -1, -1)
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


class Verification:
    """The folders of one extent, stamped before its files are (``VerifiedExtents.begin``)."""

    __slots__ = ("folders", "stamps", "at", "racy")

    def __init__(self, root: str, keys: Sequence[str]) -> None:
        # one join per distinct folder, not per key (4096 keys of a coarse extent: 4 ms of 14)
        self.folders = tuple(sorted(os.path.join(root, d) for d in {k.rpartition("/")[0] for k in keys}))
        self.at = time.monotonic()
        now_ns = time.time_ns()
        self.stamps = tuple(_folder_stamp(f) for f in self.folders)
        self.racy = any(now_ns - mtime < RACY_S * 1e9 for _, mtime, _ in self.stamps)


class VerifiedExtents:
    """The extents of one store whose chunk files all matched their stamps at ``at``, with
    their folders' stamps then. Thread-safe; bounded by ``MAX_EXTENTS``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)
        self._done: OrderedDict[Hashable, Verification] = OrderedDict()
        self._lock = threading.Lock()

    def fresh(self, extent: Hashable) -> bool:
        """True when ``extent`` was verified less than ``WINDOW_S`` ago and none of its
        folders changed since: its files need no stat."""
        with self._lock:
            done = self._done.get(extent)
        if done is None:
            return False
        if time.monotonic() - done.at <= WINDOW_S and all(
            _folder_stamp(f) == s for f, s in zip(done.folders, done.stamps)
        ):
            return True
        with self._lock:
            if self._done.get(extent) is done:
                del self._done[extent]
        return False

    def begin(self, keys: Sequence[str]) -> Verification:
        """Stamp the folders of the chunk files ``keys`` (store keys), before they are stat'ed:
        a write after this changes a folder the next ``fresh`` compares."""
        return Verification(self.root, keys)

    def verified(self, extent: Hashable, verification: Verification) -> None:
        """Every file of ``extent`` matched its stamp after ``verification`` began."""
        if verification.racy:
            return
        with self._lock:
            self._done[extent] = verification
            self._done.move_to_end(extent)
            while len(self._done) > MAX_EXTENTS:
                self._done.popitem(last=False)
