"""Bounds: an axis-aligned box of an N-D tensor, start inclusive, stop exclusive.

Every read in the package is expressed as a Bounds in level-0 (full resolution) coordinates.
It is a value object (frozen, hashable) so it can key caches and travel inside chunk ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

from tensor_server.errors import InvalidBounds

__all__ = ["Bounds"]


def _as_int_tuple(values: Iterable[Any], what: str) -> tuple[int, ...]:
    out = []
    for v in values:
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise InvalidBounds(f"{what} must hold integers, got {v!r}")
        out.append(int(v.__index__()))
    return tuple(out)


@dataclass(frozen=True)
class Bounds:
    """Half-open box ``[start, stop)`` per axis."""

    start: tuple[int, ...]
    stop: tuple[int, ...]

    def __post_init__(self) -> None:
        start = _as_int_tuple(self.start, "start")
        stop = _as_int_tuple(self.stop, "stop")
        if len(start) != len(stop):
            raise InvalidBounds(f"start has {len(start)} axes but stop has {len(stop)}")
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "stop", stop)

    # ---- constructors -------------------------------------------------------------------
    @classmethod
    def of_ints(cls, start: tuple[int, ...], stop: tuple[int, ...]) -> Bounds:
        """A box from tuples of Python ints of equal length that the caller computed itself,
        without the constructor's checks (which cost most of a grid walk's time over a few
        hundred blocks); anything from outside goes through ``Bounds(start, stop)``."""
        box = object.__new__(cls)
        object.__setattr__(box, "start", start)
        object.__setattr__(box, "stop", stop)
        return box

    @classmethod
    def full(cls, shape: Sequence[int]) -> Bounds:
        """The whole tensor of ``shape``."""
        return cls((0,) * len(shape), tuple(shape))

    @classmethod
    def from_slices(cls, slices: Sequence[slice | int] | slice, shape: Sequence[int]) -> Bounds:
        """From Python slices (``None`` ends allowed, step must be 1 or None; ints select one
        element but keep the axis). Missing trailing axes mean the whole axis. Negative
        indices count from the end, as in NumPy; out-of-range stops are clamped."""
        if isinstance(slices, (slice, int)):
            slices = (slices,)
        slices = tuple(slices)
        if len(slices) > len(shape):
            raise InvalidBounds(f"{len(slices)} slices for a {len(shape)}-D tensor")
        start, stop = [], []
        for axis, n in enumerate(shape):
            s = slices[axis] if axis < len(slices) else slice(None)
            if isinstance(s, slice):
                if s.step not in (None, 1):
                    raise InvalidBounds(f"axis {axis}: step {s.step} is not supported here")
                a, b, _ = s.indices(n)
                b = max(a, b)
            elif hasattr(s, "__index__"):
                a = int(s.__index__())
                a = a + n if a < 0 else a
                if not 0 <= a < n:
                    raise InvalidBounds(f"axis {axis}: index {s} out of range for size {n}")
                b = a + 1
            else:
                raise InvalidBounds(f"axis {axis}: cannot use {s!r} as a slice")
            start.append(a)
            stop.append(b)
        return cls(tuple(start), tuple(stop))

    @classmethod
    def from_chunk_bounds(cls, chunk_bounds: Any) -> Bounds:
        """From anything with ``.start`` and ``.stop`` sequences (e.g. biopb ``ChunkBounds``
        or ``SliceHint`` protobuf messages)."""
        return cls(tuple(chunk_bounds.start), tuple(chunk_bounds.stop))

    # ---- properties -----------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.start)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.start, self.stop))

    @property
    def size(self) -> int:
        return prod(self.shape)

    def to_slices(self) -> tuple[slice, ...]:
        return tuple(slice(a, b) for a, b in zip(self.start, self.stop))

    # ---- checks and arithmetic --------------------------------------------------------------
    def validate(self, shape: Sequence[int], *, allow_empty: bool = False) -> Bounds:
        """Raise InvalidBounds unless this box lies inside a tensor of ``shape``; return self."""
        if self.ndim != len(shape):
            raise InvalidBounds(f"bounds have {self.ndim} axes but the tensor has {len(shape)}")
        for axis, (a, b, n) in enumerate(zip(self.start, self.stop, shape)):
            if a < 0:
                raise InvalidBounds(f"axis {axis}: start {a} is negative")
            if b > n:
                raise InvalidBounds(f"axis {axis}: stop {b} exceeds the axis length {n}")
            if b < a or (b == a and not allow_empty):
                raise InvalidBounds(f"axis {axis}: empty or reversed interval [{a}, {b})")
        return self

    def clamp(self, shape: Sequence[int]) -> Bounds:
        """Clip stops to ``shape`` (starts are left alone)."""
        return Bounds(self.start, tuple(min(b, n) for b, n in zip(self.stop, shape)))

    def intersect(self, other: Bounds) -> Bounds | None:
        start = tuple(max(a, c) for a, c in zip(self.start, other.start))
        stop = tuple(min(b, d) for b, d in zip(self.stop, other.stop))
        if any(b <= a for a, b in zip(start, stop)):
            return None
        return Bounds(start, stop)

    def shift(self, offset: Sequence[int]) -> Bounds:
        """Translate by ``+offset``."""
        return Bounds(
            tuple(a + o for a, o in zip(self.start, offset)),
            tuple(b + o for b, o in zip(self.stop, offset)),
        )

    def relative_to(self, origin: Sequence[int]) -> Bounds:
        """Translate by ``-origin`` (coordinates inside a box that starts at ``origin``)."""
        return self.shift(tuple(-o for o in origin))

    def with_axis(self, axis: int, start: int, stop: int) -> Bounds:
        """This box with ``[start, stop)`` on ``axis`` (one channel of a region)."""
        return Bounds(
            self.start[:axis] + (start,) + self.start[axis + 1 :], self.stop[:axis] + (stop,) + self.stop[axis + 1 :]
        )

    def permute(self, order: Sequence[int]) -> Bounds:
        """Axes reordered: new axis ``i`` is old axis ``order[i]``."""
        return Bounds(tuple(self.start[i] for i in order), tuple(self.stop[i] for i in order))

    def __repr__(self) -> str:
        spans = ", ".join(f"{a}:{b}" for a, b in zip(self.start, self.stop))
        return f"Bounds[{spans}]"
