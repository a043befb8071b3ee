"""Whole-tensor (or region) statistics, in closed form over uniform blocks.

``tensor_stats`` walks the region in units of the storage block (the transfer chunk when the
reader has none). A unit the engine says is uniform (``ReadEngine.uniform_lookup``, asked once
for the region: the adapter's metadata names its one value ``v``) contributes ``v`` to min and max, ``v * n`` to the sum
and ``n`` or 0 to the non-zero count without being read; every other unit is read once
through the engine. A mostly-empty mask costs the reads of its non-empty blocks.

Semantics are NumPy's over the decoded pixels: NaN propagates into min, max, sum and mean
(``np.min`` / ``np.sum``), NaN counts as non-zero. Integer and bool sums are exact (Python
ints); float sums accumulate float64, unit by unit, so they may differ from a one-pass NumPy
sum in the last bits. Complex tensors get sum, mean and the non-zero count (no order).

Bounded like every request: a region of more than ``StatsLimits.max_units`` units is refused
before any work (ask for a slice), the decoded pixels of one call are capped at
``max_decoded_bytes``, every decoded unit takes a slot of the engine's admission bound (so
statistics share ``max_computes`` with chunk reads), and ``cancelled()`` is polled before
each unit: a client that has gone stops the work (``ReadCancelled``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tensor_server.core.bounds import Bounds
from tensor_server.core.stream_reduce import iter_units, streaming_unit
from tensor_server.errors import ReadCancelled, RequestTooLarge

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.core.adapter_base import TensorAdapter
    from tensor_server.core.engine import ReadEngine

__all__ = ["tensor_stats", "StatsLimits"]


@dataclass(frozen=True)
class StatsLimits:
    """What one tensor_stats call may cost."""

    #: units (storage blocks) the region may span, uniform ones included
    max_units: int = 100_000
    #: bytes of pixels one call may decode (uniform units cost none)
    max_decoded_bytes: int = 16 << 30


def _unit(tensor: TensorAdapter) -> tuple[int, ...]:
    block = tensor.read_block_shape
    ones = (1,) * tensor.ndim
    return streaming_unit(block if block is not None else tensor.chunk_shape, block, ones)


def _check_size(tensor: TensorAdapter, bounds: Bounds, unit: tuple[int, ...], limits: StatsLimits) -> None:
    units = math.prod(-(-n // u) for n, u in zip(bounds.shape, unit))
    if units > limits.max_units:
        raise RequestTooLarge(
            f"tensor_stats of {tensor.array_id}: the region {bounds} spans {units} blocks of "
            f"{list(unit)}, above the limit of {limits.max_units} per call; ask for a slice"
        )


def tensor_stats(
    tensor: TensorAdapter,
    bounds: Bounds | None = None,
    engine: ReadEngine | None = None,
    *,
    limits: StatsLimits = StatsLimits(),
    cancelled: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """``{count, count_nonzero, min, max, sum, mean, uniform_pixels, decoded_pixels}`` of
    ``bounds`` (default the whole tensor); see the module docstring for the bounds."""
    from tensor_server.core.engine import default_engine

    engine = engine or default_engine()
    bounds = tensor.check_bounds(bounds)
    unit = _unit(tensor)
    _check_size(tensor, bounds, unit, limits)
    dt = tensor.dtype
    ordered = dt.kind != "c"
    exact = dt.kind in "biu"
    total: Any = 0 if exact else 0.0
    lo: Any = None
    hi: Any = None
    nonzero = uniform_px = decoded_px = 0

    def merge(unit_lo: Any, unit_hi: Any) -> None:
        nonlocal lo, hi
        if not ordered:
            return
        lo = unit_lo if lo is None else np.minimum(lo, unit_lo)
        hi = unit_hi if hi is None else np.maximum(hi, unit_hi)

    # uniform units: pixels per distinct value, folded in once at the end (order-free: integer
    # sums are exact, min/max/non-zero do not depend on order); float sums stay unit by unit
    tally: dict[bytes, list[Any]] = {}
    value_of = engine.uniform_lookup(tensor, bounds)
    for ub in iter_units(bounds, unit):
        if cancelled is not None and cancelled():
            raise ReadCancelled(f"tensor_stats of {tensor.array_id}: the client went away")
        n = ub.size
        v = value_of(ub) if value_of is not None else None
        if v is not None:
            seen = tally.get(key := np.asarray(v).tobytes())
            if seen is None:
                tally[key] = [v, n]
            else:
                seen[1] += n
            if not exact:
                total += (complex(v) if dt.kind == "c" else float(v)) * n
            continue
        if (decoded_px + n) * dt.itemsize > limits.max_decoded_bytes:
            raise RequestTooLarge(
                f"tensor_stats of {tensor.array_id}: the region {bounds} needs more than "
                f"{limits.max_decoded_bytes} bytes of pixels decoded, the limit of one call; "
                "ask for a slice"
            )
        with engine.admitted():
            data = engine.read(tensor, ub, cancelled=cancelled)
        decoded_px += n
        if exact:
            total += (
                int(data.sum(dtype=np.int64)) if dt.itemsize < 8 or dt.kind == "b" else int(data.astype(object).sum())
            )
        else:
            total += data.sum(dtype=np.complex128 if dt.kind == "c" else np.float64)
        nonzero += int(np.count_nonzero(data))
        if ordered:
            merge(data.min(), data.max())
    for v, n in tally.values():
        uniform_px += n
        if exact:
            total += int(v) * n
        nonzero += n if v != 0 or (dt.kind in "fc" and np.isnan(v)) else 0
        merge(v, v)
    count = bounds.size
    return {
        "array_id": tensor.array_id,
        "region": {"start": list(bounds.start), "stop": list(bounds.stop)},
        "dtype": dt.str,
        "count": count,
        "count_nonzero": nonzero,
        "min": _plain(lo),
        "max": _plain(hi),
        "sum": _plain(total),
        "mean": _plain(total / count),
        "uniform_pixels": uniform_px,
        "decoded_pixels": decoded_px,
    }


def _plain(value: Any) -> Any:
    """JSON-friendly: ints stay ints, floats are floats (NaN and inf as strings), complex as
    [real, imag]."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (complex, np.complexfloating)):
        return [_plain(float(value.real)), _plain(float(value.imag))]
    f = float(value)
    return f if math.isfinite(f) else str(f)
