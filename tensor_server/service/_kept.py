"""Plans kept for the requests a warm viewer repeats.

A viewer asks for the same plan (``GetFlightInfo``) each time it shows a tile. Deriving it
again (decode the request, plan, render the wire answer) was 40 % of its handler's CPU:
0.23-0.27 ms a warm SDK tile, 0.13-0.15 ms with the kept answer (one SDK client in process,
three runs each, 2026-12-06; whole-process runs on this machine are too noisy to show it:
docs/performance.md, "Many viewers at once"). The tile's other call, ``chunk_locate``, is not
kept: its answer is its checks and the cache's verification of the batch, and keeping it
saved 1.7 of its 45 us.

A kept answer stands in for the derivation, never for a rule: every request runs the rules
again before its kept answer is sent (the caller may read the tensor; the tensor is the one
the answer was made from, with the same extent and content version; the plan's region passes
the exact stale check). The key is the request's bytes as the client sent them, so only the
same request shares an answer. Bounded: ``MAX_KEPT`` answers, keys of at most
``MAX_KEY_BYTES``.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.core.adapter_base import TensorAdapter
    from tensor_server.core.bounds import Bounds

__all__ = ["MAX_KEPT", "MAX_KEY_BYTES", "Kept", "KeptAnswers", "UNKEPT_FIELDS"]

#: answers kept at most (the least recently used goes first): a viewport of 512² tiles on a
#: 4K screen is ~60 tiles, so this is every tile of several viewers and zoom levels
MAX_KEPT = 4096
#: a longer request is answered and not kept (an SDK plan request is ~100 bytes):
#: a client cannot make the kept answers large
MAX_KEY_BYTES = 1024
#: describe fields whose answer can change while the tensor does not: never kept
UNKEPT_FIELDS = frozenset({"is_resident", "metadata_json", "upload_status"})


@dataclass(frozen=True, slots=True)
class Kept:
    """One kept answer, with what the rules are run on again before it is sent. The tensor
    is held weakly: a kept answer never keeps a replaced tensor (and what it holds) alive."""

    tensor: weakref.ref[TensorAdapter]
    shape: tuple[int, ...]
    version: Any
    #: what the request asked, for the rules: the array id and the region
    asked: tuple[str, Bounds | None]
    answer: Any

    def made_from(self, tensor: TensorAdapter) -> bool:
        """``tensor`` (just found and gated for this request) is the one the answer was made
        from, unchanged in extent and content version (a growing tensor grows in place)."""
        return tensor is self.tensor() and tensor.shape == self.shape and tensor.content_version == self.version


class KeptAnswers:
    """Kept answers by request bytes; thread-safe, bounded by ``limit``."""

    def __init__(self, limit: int = MAX_KEPT) -> None:
        self.limit = limit
        self._kept: OrderedDict[bytes, Kept] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, request: bytes) -> Kept | None:
        with self._lock:
            kept = self._kept.get(request)
            if kept is not None:
                self._kept.move_to_end(request)
        return kept

    def keep(self, request: bytes, tensor: TensorAdapter, asked: tuple[str, Bounds | None], answer: Any) -> None:
        """Keep ``answer`` to ``request``, made from ``tensor`` as it is now."""
        if len(request) > MAX_KEY_BYTES:
            return
        kept = Kept(weakref.ref(tensor), tuple(tensor.shape), tensor.content_version, asked, answer)
        with self._lock:
            self._kept[request] = kept
            self._kept.move_to_end(request)
            while len(self._kept) > self.limit:
                self._kept.popitem(last=False)
