"""Validation of a read request's scale and of a chunk id's extent: the one owner of both.

Every entry point (plan, engine read, engine chunk) validates here once; the engine's inner
paths then trust their arguments. The limits exist because a request is work the server
does on a client's behalf, and work must be bounded by what the tensor is:

* a scale may not exceed its axis's extent rounded up to a power of two: past the extent a
  block is mostly edge padding (the last element repeated), so a scale of 2**28 would make
  the kernels pad blocks of 2**28 for one output pixel. The power-of-two allowance keeps
  every halving ladder valid on short axes (a 5-plane Z at scale 8).
* a chunk id's extent may not exceed one transfer chunk of output (for computed levels
  also ``transfer × scale`` of source): plans never mint larger, and chunk ids are not
  secret (the checksum is public), so a forged whole-tensor id must not become one
  multi-gigabyte DoGet.
"""

from __future__ import annotations

from collections.abc import Sequence

from tensor_server.core.bounds import Bounds
from tensor_server.errors import InvalidArgument, InvalidBounds, InvalidChunkId

__all__ = ["check_scale", "check_extent_within_chunk", "check_read_request", "max_scale", "MAX_PLAN_CHUNKS"]

#: A plan with more chunks than this is refused: 65,536 chunks is ≥ 512 GiB of 8 MiB chunks,
#: more than any client can hold; such a request wants a region or a coarser scale.
MAX_PLAN_CHUNKS = 65_536


def max_scale(extent: int) -> int:
    """The largest scale allowed on an axis of ``extent`` elements (see module docstring)."""
    n = max(int(extent), 1)
    return 1 << (n - 1).bit_length()


def check_scale(scale_hint: Sequence[int] | None, shape: Sequence[int]) -> tuple[int, ...]:
    """``scale_hint`` as a tuple of positive ints of the tensor's rank, each within
    ``max_scale`` of its axis; ``(1,) * ndim`` when empty."""
    ndim = len(shape)
    if scale_hint is None or len(scale_hint) == 0:
        return (1,) * ndim
    if len(scale_hint) != ndim:
        raise InvalidArgument(f"scale_hint has {len(scale_hint)} axes but the tensor has {ndim}")
    out = []
    for axis, (s, n) in enumerate(zip(scale_hint, shape)):
        if isinstance(s, bool) or not hasattr(s, "__index__") or int(s) < 1:
            raise InvalidArgument(f"scale_hint must be positive integers, got {_short(scale_hint)}")
        s = int(s)
        if s > max_scale(n):
            raise InvalidArgument(f"scale {s} on axis {axis} exceeds the axis extent {n} (at most {max_scale(n)})")
        out.append(s)
    return tuple(out)


def check_extent_within_chunk(extent: Sequence[int], scale: Sequence[int], chunk: Sequence[int], what: str) -> None:
    """Refuse a chunk id whose extent is larger than any plan mints (module docstring)."""
    for axis, (e, s, c) in enumerate(zip(extent, scale, chunk)):
        if -(-int(e) // int(s)) > int(c) or int(e) > int(c) * int(s):
            raise InvalidChunkId(
                f"chunk id extent {tuple(extent)} at scale {tuple(scale)} is larger than one "
                f"chunk {tuple(chunk)} of {what} (axis {axis}); re-plan"
            )


def _short(values: Sequence[object]) -> str:
    text = repr(tuple(values))
    return text if len(text) <= 80 else text[:77] + "..."


def check_read_request(region: Bounds | None, scale: Sequence[int] | None, shape: Sequence[int]) -> None:
    """Refuse a malformed slice or scale with the reference's slug. A stop past the end is
    *not* refused: it is clamped (NumPy semantics; a deliberate difference from the
    reference, which refuses it as ``slice_out_of_range``); only a start at or past the end
    of an axis, which leaves nothing to read, is ``slice_out_of_range``."""
    ndim = len(shape)
    if region is not None:
        if region.ndim != ndim:
            raise InvalidBounds(f"slice_hint has {region.ndim} axes but the tensor has {ndim}", slug="slice_rank")
        for axis, (a, b, n) in enumerate(zip(region.start, region.stop, shape)):
            if a < 0 or b < 0:
                raise InvalidBounds(f"slice_hint axis {axis}: bounds [{a}, {b}) are negative", slug="slice_negative")
            if a >= b:
                raise InvalidBounds(
                    f"slice_hint axis {axis}: empty or reversed interval [{a}, {b})", slug="slice_inverted"
                )
            if a >= n:
                raise InvalidBounds(
                    f"slice_hint axis {axis}: start {a} is past the axis length {n}", slug="slice_out_of_range"
                )
    if scale:
        if len(scale) != ndim:
            raise InvalidArgument(f"scale_hint has {len(scale)} axes but the tensor has {ndim}", slug="scale_rank")
        bad = [axis for axis, s in enumerate(scale) if s <= 0]
        if bad:
            raise InvalidArgument(
                f"scale_hint must be positive integers, got {list(scale)} (axis {bad[0]})", slug="scale_not_positive"
            )
