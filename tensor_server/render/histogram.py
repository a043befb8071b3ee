"""Per-channel histograms and percentile windows of a plane, both from its coarsest level.

A histogram is what a viewer draws under a window slider (``GET /histogram/<array_id>``): one
read of one channel of the coarsest published level (one ``coarsest_tile``² plane or less),
measured once per tensor content version, plane and channel (``render.memo``). Integer values
spanning at most ``BINS`` are counted exactly (one bin per value); wider integer ranges and
floats get ``BINS`` equal bins between the finite minimum and maximum. NaN and infinities are
not counted.

A percentile window (a channel's default, 0.1-99.9, and a spec's ``percentiles``) is taken on
the same coarse values, not on the binned counts: one far outlier of float data stretches
equal bins over its range, and a percentile read from such bins lands far from the data
(``tests/viewers/render_test.py`` has the case: 0..999 and one 1e9)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tensor_server.errors import InvalidArgument
from tensor_server.render.numbers import whole_number

__all__ = ["BINS", "MAX_CHANNELS_ASKED", "Histogram", "histogram_of", "percentile_window", "channel_list"]

BINS = 1024
#: channels one histogram request may name
MAX_CHANNELS_ASKED = 1024
#: values per channel a percentile window is taken from (a regular sample of more)
SAMPLE_VALUES = 1 << 20


@dataclass(frozen=True)
class Histogram:
    """``counts[k]`` values in ``[lo + k * width, lo + (k + 1) * width)`` (the last bin closed);
    ``exact``: one bin per integer value (``width`` 1, bin ``k`` holds the value ``lo + k``)."""

    lo: float
    width: float
    counts: np.ndarray
    exact: bool

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def as_json(self) -> dict[str, Any]:
        return {
            "min": self.lo,
            "bin_width": self.width,
            "counts": self.counts.tolist(),
            "exact": self.exact,
        }


def histogram_of(values: np.ndarray) -> Histogram:
    """The histogram of ``values`` (any shape, a real dtype)."""
    flat = values.reshape(-1)
    if flat.dtype.kind == "b":
        flat = flat.view(np.uint8)
    if flat.dtype.kind == "f":
        flat = flat[np.isfinite(flat)]
    if flat.size == 0:
        return Histogram(0.0, 1.0, np.zeros(1, np.int64), True)
    lo, hi = flat.min(), flat.max()
    if flat.dtype.kind in "iu" and int(hi) - int(lo) < BINS:
        counts = np.bincount((flat.astype(np.int64) - int(lo)), minlength=int(hi) - int(lo) + 1)
        return Histogram(float(lo), 1.0, counts.astype(np.int64), True)
    lo_f, hi_f = float(lo), float(hi)
    width = (hi_f - lo_f) / BINS if hi_f > lo_f else 1.0
    counts, _ = np.histogram(flat.astype(np.float64), bins=BINS, range=(lo_f, lo_f + width * BINS))
    return Histogram(lo_f, width, counts.astype(np.int64), False)


def percentile_window(values: np.ndarray, low: float, high: float) -> tuple[float, float]:
    """The ``low`` and ``high`` percentiles of the finite ``values`` (a regular sample of
    ``SAMPLE_VALUES`` where there are more; NumPy's linear interpolation), widened to one unit
    where they meet, so a window always has ``start < end``; ``(0, 1)`` where none is finite."""
    flat = values.reshape(-1)
    if flat.size > SAMPLE_VALUES:
        flat = flat[:: flat.size // SAMPLE_VALUES]
    flat = flat.astype(np.float64)
    flat = flat[np.isfinite(flat)]
    if flat.size == 0:
        return 0.0, 1.0
    start, end = (float(v) for v in np.percentile(flat, (low, high)))
    return (start, end) if end > start else (start, start + 1.0)


def channel_list(text: str | None, count: int) -> list[int]:
    """The channels ``c=0,3,17`` names of a tensor of ``count`` (every one when ``text`` is
    None); a 400 naming ``c`` for a channel it lacks, a malformed list or too many."""
    if text is None:
        chosen = list(range(min(count, MAX_CHANNELS_ASKED + 1)))
    else:
        parts = text.split(",", MAX_CHANNELS_ASKED + 1)
        chosen = [whole_number(p, "c: a channel index") for p in parts[: MAX_CHANNELS_ASKED + 1]]
    if len(chosen) > MAX_CHANNELS_ASKED:
        raise InvalidArgument(f"c: name at most {MAX_CHANNELS_ASKED} channels per request (c=0,3,17)")
    missing = [c for c in chosen if c >= count]
    if missing:
        raise InvalidArgument(f"c: there is no channel {missing[0]} ({count} channels, 0 to {count - 1})")
    return chosen
