"""The extents a tensor has published while it grows, numbered by ``sequence``.

A live acquisition appends frames to a tensor the server keeps open (a zarr array resized
along T, ``adapters/_zarr_growth.py``). Each extent the tensor takes is one record
``(sequence, shape)``; the sequence goes up by one per record, so a watcher that has seen
``n`` knows exactly what it missed. Records are coalesced where they are made: a tensor is
looked at (a plan, the watch poller's tick), not told per frame, so 10,000 frames a second
make one record per look, not 10,000.

The log keeps the last ``KEPT`` records for watchers that resume from a sequence
(``after``); a watcher further behind than that gets the oldest kept record next and so sees
the jump in ``sequence``: every watcher shares this one bounded history instead of holding
a queue of its own.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

__all__ = ["ExtentLog", "KEPT"]

#: records kept for resuming watchers (a record is a shape: well under 100 bytes)
KEPT = 1024


class ExtentLog:
    """Published ``(sequence, shape)`` records of one tensor (module docstring)."""

    def __init__(self, shape: Sequence[int], sequence: int = 0) -> None:
        self._records: deque[tuple[int, tuple[int, ...]]] = deque([(sequence, tuple(shape))], maxlen=KEPT)
        self._changed = threading.Condition()

    @property
    def sequence(self) -> int:
        return self._records[-1][0]

    @property
    def shape(self) -> tuple[int, ...]:
        return self._records[-1][1]

    def publish(self, shape: Sequence[int]) -> int:
        """Record ``shape`` as the next extent and wake the watchers; its sequence."""
        with self._changed:
            sequence = self.sequence + 1
            self._records.append((sequence, tuple(int(n) for n in shape)))
            self._changed.notify_all()
        return sequence

    def after(self, since: int | None, timeout: float) -> list[tuple[int, tuple[int, ...]]]:
        """The records after ``since`` in order (the newest alone when ``since`` is None),
        waiting up to ``timeout`` seconds for one when there is none yet ([] then)."""
        with self._changed:
            if since is not None and self.sequence <= since:
                self._changed.wait(timeout)
            if since is None:
                return [self._records[-1]]
            return [r for r in self._records if r[0] > since]

    def wake(self) -> None:
        """Wake every waiter now (the tensor was replaced: they look it up again)."""
        with self._changed:
            self._changed.notify_all()
