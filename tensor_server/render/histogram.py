"""Per-channel histograms of a plane, from its coarsest level: what a viewer draws under a
window slider (``GET /histogram/<array_id>``) and what percentile windows are read from.

One read of one channel of the coarsest published level (one ``coarsest_tile``² plane or
less), measured once per tensor content version, plane and channel (``render.memo``).
Integer values spanning at most ``BINS`` are counted exactly (one bin per value, so a
percentile is a value of the data); wider integer ranges and floats get ``BINS`` equal bins
between the finite minimum and maximum, a percentile interpolated inside its bin. NaN and
infinities are not counted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["BINS", "Histogram", "histogram_of"]

BINS = 1024


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

    def percentile(self, p: float) -> float:
        """The value below which ``p`` percent of the counted values lie: the value of the bin
        reaching it (exact bins), else interpolated in that bin; ``lo`` when nothing was counted."""
        total = self.total
        if total == 0:
            return self.lo
        target = p / 100 * total
        cum = np.cumsum(self.counts)
        k = min(int(np.searchsorted(cum, target, side="left")), len(self.counts) - 1)
        if self.exact:
            return self.lo + k
        before = float(cum[k - 1]) if k else 0.0
        inside = (target - before) / float(self.counts[k]) if self.counts[k] else 0.0
        return self.lo + (k + min(max(inside, 0.0), 1.0)) * self.width

    def window(self, low: float, high: float) -> tuple[float, float]:
        """``(percentile(low), percentile(high))``, widened to one unit where they meet, so a
        window always has ``start < end``."""
        start, end = self.percentile(low), self.percentile(high)
        return (start, end) if end > start else (start, start + max(self.width, 1.0))

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
