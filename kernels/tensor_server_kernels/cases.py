"""The one table of kernel cases (downsampling; compositing at the end) that drives the tests
and the benchmarks.

Why one table (as bottleneck and numbagg do): a case that is benchmarked is a case that is
checked against the oracle, and the data generators (saturated integers, NaN/inf floats, label
images) exist once.

``TEST_CASES``: small arrays, every method x dtype, over geometries chosen to hit ragged edges,
scale-1 axes, non-dyadic scales, single-element axes, interleaved channels, 1-6 dimensions and
blocks up to 512 (``GATE_CASES`` and the crossover test cover both sides of the strided-add /
reshape-sum gate, which sits at a larger, measured block). The last-axis scales are kept to a few values
(2, 3, 4, 5, 7) so that the test run compiles a bounded set of kernels (see ``_CONST_S2`` in
``downsample.py``); ``WIDE_S2_CASES`` adds the constant kernels for the large last-axis scales on
the benchmark dtype only.

``BENCH_CASES``: the benchmark table (full size and ``--quick`` size).

``COMPOSITE_CASES``: the compositing kernel's table (dtypes, 1-64 channels, windows, gamma,
inversion, LUTs). ``OVERLAY_CASES``: label images over composites of that table (label dtypes,
opacities, overrides).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from tensor_server_kernels.reference import METHODS

__all__ = [
    "DTYPES",
    "FILLS",
    "Case",
    "BenchCase",
    "make_array",
    "make_labels",
    "fills_for",
    "TEST_GEOMETRIES",
    "TEST_CASES",
    "WIDE_S2_CASES",
    "GATE_CASES",
    "BENCH_CASES",
    "CompositeCase",
    "COMPOSITE_CASES",
    "OverlayCase",
    "OVERLAY_CASES",
]

DTYPES = (
    "bool",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "float32",
    "float64",
)

#: How the values are drawn. "random": uniform over the whole dtype range (floats: normal);
#: "max"/"min": saturated ``iinfo.max``/``iinfo.min`` (accumulator overflow); "extremes": a random
#: mix of min and max (overflow plus rounding at the extremes); "nonfinite": floats with NaN, +inf
#: and -inf sprinkled in; "equal": constant per block (all-equal blocks, uniform mode); "labels":
#: few distinct values in rectangles (mode ties and runs); "ties": values 0/1 only (exact
#: half-way means, mode ties, lower-median ties).
FILLS = ("random", "max", "min", "extremes", "nonfinite", "equal", "labels", "ties")


def fills_for(dtype: str) -> tuple[str, ...]:
    """The fills that mean something for ``dtype``."""
    kind = np.dtype(dtype).kind
    if kind == "b":
        return ("random", "equal", "ties")
    if kind == "f":
        return ("random", "nonfinite", "equal", "labels", "ties")
    return ("random", "max", "min", "extremes", "equal", "labels", "ties")


def make_labels(
    shape: tuple[int, ...],
    dtype: str | np.dtype,
    seed: int = 0,
    n_labels: int = 2**20,
    cell: tuple[int, int] = (15, 50),
) -> np.ndarray:
    """A label image: rectangles of random size (``cell`` range, so edges are not aligned to any
    power of two) with random ids; blocks straddling an edge hold 2-4 labels."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    axes = []
    for n in shape:
        counts = rng.integers(cell[0], cell[1], n // cell[0] + 2)
        axes.append(np.repeat(np.arange(counts.size), counts)[:n])
    grid_shape = tuple(int(a.max()) + 1 for a in axes)
    hi = min(n_labels, int(np.iinfo(dt).max) if dt.kind in "iu" else n_labels)
    grid = rng.integers(0, max(hi, 2), grid_shape).astype(dt)
    return np.ascontiguousarray(grid[np.ix_(*axes)])


def make_array(
    dtype: str, shape: tuple[int, ...], fill: str = "random", seed: int = 0, scale: tuple[int, ...] | None = None
) -> np.ndarray:
    """Deterministic test/benchmark data (``scale`` is used by "equal" to make blocks uniform)."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    kind = dt.kind
    if fill == "labels":
        return make_labels(shape, dt, seed, n_labels=5, cell=(1, 4))
    if fill == "ties":
        return rng.integers(0, 2, shape).astype(dt)
    if fill == "equal":
        sc = scale or (1,) * len(shape)
        coarse = make_array(dtype, tuple(-(-n // s) for n, s in zip(shape, sc)), "random", seed)
        for ax, s in enumerate(sc):
            coarse = np.repeat(coarse, s, axis=ax)
        return np.ascontiguousarray(coarse[tuple(slice(0, n) for n in shape)])
    if kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if kind == "f":
        x = rng.standard_normal(shape).astype(dt) * dt.type(100)
        if fill == "nonfinite":
            flat = x.reshape(-1)
            pick = rng.random(flat.size)
            flat[pick < 0.08] = np.nan
            flat[(pick >= 0.08) & (pick < 0.12)] = np.inf
            flat[(pick >= 0.12) & (pick < 0.16)] = -np.inf
            flat[(pick >= 0.16) & (pick < 0.20)] = -0.0
        return x
    info = np.iinfo(dt)
    if fill == "max":
        return np.full(shape, info.max, dtype=dt)
    if fill == "min":
        return np.full(shape, info.min, dtype=dt)
    if fill == "extremes":
        return np.where(rng.random(shape) < 0.5, info.min, info.max).astype(dt)
    return rng.integers(int(info.min), int(info.max), shape, dtype=dt, endpoint=True)


@dataclass(frozen=True)
class Case:
    """One oracle-vs-kernel comparison: ``downsample(make_array(...), scale, method)``."""

    method: str
    dtype: str
    shape: tuple[int, ...]
    scale: tuple[int, ...]
    fill: str = "random"

    @property
    def id(self) -> str:
        shp = "x".join(map(str, self.shape))
        sc = "x".join(map(str, self.scale))
        return f"{self.method}-{self.dtype}-{shp}-s{sc}-{self.fill}"

    def make(self, seed: int = 0) -> np.ndarray:
        return make_array(self.dtype, self.shape, self.fill, seed, self.scale)


#: (shape, scale, why). Last-axis scales after layout stay in {2, 3, 4, 5, 7} (see module doc).
TEST_GEOMETRIES: tuple[tuple[tuple[int, ...], tuple[int, ...], str], ...] = (
    ((8, 8), (2, 2), "aligned 2x2"),
    ((9, 7), (2, 2), "ragged both axes"),
    ((13, 11), (4, 4), "ragged 4x4"),
    ((10, 11), (3, 3), "non-dyadic 3"),
    ((11, 12), (5, 1), "scale-1 last axis (folded as channels)"),
    ((7, 15), (1, 7), "scale-1 first axis, non-dyadic 7"),
    ((1, 9), (2, 2), "single-element axis with scale > 1"),
    ((17,), (4,), "1-D ragged"),
    ((3, 18), (1, 4), "one block row per output row, even width (plain rows, ragged)"),
    ((5,), (7,), "scale larger than the axis"),
    ((5, 6, 7), (2, 2, 2), "3-D ragged"),
    ((4, 9, 10), (1, 2, 2), "3-D stack of planes"),
    ((10, 12, 3), (2, 2, 1), "interleaved RGB"),
    ((6, 5, 4), (2, 3, 1), "3-D trailing scale 1"),
    ((3, 4, 5, 6), (1, 2, 1, 3), "4-D mixed"),
    ((2, 3, 2, 3, 2, 5), (2, 1, 2, 3, 1, 2), "6-D"),
    ((67, 9), (64, 4), "block 256"),
    ((40, 10), (32, 4), "block 128 ragged rows"),
    ((130, 9), (128, 4), "block 512"),
)


def _test_cases() -> Iterator[Case]:
    for shape, scale, _ in TEST_GEOMETRIES:
        for dtype in DTYPES:
            for fill in fills_for(dtype):
                for method in METHODS:
                    yield Case(method, dtype, shape, scale, fill)


TEST_CASES: tuple[Case, ...] = tuple(_test_cases())

#: Large last-axis scales (constant-s2 kernels 8/16/32) in 2-D and
#: 3-D, on the benchmark dtypes only (each adds compiled kernels).
WIDE_S2_CASES: tuple[Case, ...] = tuple(
    Case(method, dtype, shape, scale, fill)
    for dtype, shape, scale, methods in (
        ("uint16", (37, 70), (8, 8), ("area", "max", "mode")),
        ("uint16", (40, 90), (16, 16), ("area", "max", "mode")),
        ("uint16", (70, 100), (32, 32), ("area", "max", "mode")),
        ("uint8", (9, 20, 17), (4, 4, 8), ("area",)),
        ("uint8", (17, 17, 17), (8, 8, 8), ("area",)),
    )
    for method in methods
    for fill in (("random", "max", "labels") if method == "area" else ("random", "labels"))
)

#: (dtype, scale, expected path) for the gate test: integer area, power-of-two scales ("plain":
#: the plain-rows kernel when the rows are plain and of even width, else the block-size gate).
GATE_CASES: tuple[tuple[str, tuple[int, ...], str], ...] = (
    ("uint16", (2, 2), "plain"),
    ("uint16", (16, 16), "plain"),
    ("uint16", (128, 4), "plain"),
    ("uint16", (4, 128), "strided-add"),
    ("uint16", (64, 64), "strided-add"),
    ("uint16", (64, 128), "reshape-sum"),
    ("uint8", (16, 16, 16), "plain"),
    ("uint8", (16, 16, 32), "plain"),
    ("uint8", (4, 16, 64), "strided-add"),
    ("uint8", (8, 16, 64), "reshape-sum"),
    ("int16", (1, 16, 16), "plain"),
    ("int16", (1, 16, 64), "strided-add"),
    ("int32", (1, 1, 8192), "reshape-sum"),
    ("int32", (2, 2), "strided-add"),
    ("bool", (2, 2), "plain"),
    ("bool", (2, 64), "strided-add"),
    ("uint16", (3, 3), "generic"),
    ("float32", (2, 2), "float"),
    ("int64", (2, 2), "wide"),
    ("uint64", (2, 2), "wide"),
    ("uint16", (1, 1), "identity"),
)


@dataclass(frozen=True)
class BenchCase:
    """One benchmark row group: our kernel against the peers on the same array, same call."""

    method: str
    dtype: str
    shape: tuple[int, ...]
    quick_shape: tuple[int, ...]
    scale: tuple[int, ...]
    fill: str = "random"

    def label(self, quick: bool = False) -> str:
        shape = self.quick_shape if quick else self.shape
        if len(set(shape)) == 1:
            shp = f"{shape[0]}^{len(shape)}"
        else:
            shp = "x".join(map(str, shape))
        sc = (
            f"s{self.scale[0]}"
            if len(set(self.scale)) == 1 and len(self.scale) == 2
            else "x".join(map(str, self.scale))
        )
        kind = "labels" if self.fill == "labels" else self.dtype
        return f"{self.method} {shp} {kind} {sc}"

    @property
    def name(self) -> str:
        return self.label(False)

    def make(self, quick: bool = False, seed: int = 0) -> np.ndarray:
        shape = self.quick_shape if quick else self.shape
        if self.fill == "labels":
            return make_labels(shape, self.dtype, seed)
        rng = np.random.default_rng(seed)
        info = np.iinfo(self.dtype)
        return rng.integers(0, int(info.max), shape, dtype=self.dtype, endpoint=True)


def _bench_cases() -> Iterator[BenchCase]:
    for method in ("area", "nearest", "max", "min"):
        for s in (2, 4, 8, 16, 32):
            yield BenchCase(method, "uint16", (8192, 8192), (2048, 2048), (s, s))
    yield BenchCase("area", "uint8", (512, 1024, 1024), (64, 512, 512), (2, 2, 2))
    for s in (2, 4, 8):
        yield BenchCase("mode", "uint32", (8192, 8192), (2048, 2048), (s, s), "labels")


BENCH_CASES: tuple[BenchCase, ...] = tuple(_bench_cases())


# ---------------------------------------------------------------------------------------------
# Compositing (composite.py against composite_reference.py)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompositeCase:
    """One oracle-vs-kernel comparison of ``composite``: ``channels`` planes of ``dtype`` filled
    by ``fill`` (``make_array``), windows of kind ``window`` ("data": over the values' range,
    "tight": a narrow band inside it, so most pixels clip at both ends, "wide": past it,
    "outside": by turns wholly above the values, wholly below them, and a few whole values
    wide from the lowest, so the ends of a table of every value's step are met), one
    ``gamma`` and ``invert`` for all channels, tints or, with ``lut``, a LUT on every third."""

    dtype: str
    channels: int
    fill: str = "random"
    window: str = "data"
    gamma: float = 1.0
    invert: bool = False
    lut: bool = False
    shape: tuple[int, int] = (13, 29)

    @property
    def id(self) -> str:
        extra = "-lut" if self.lut else ""
        return f"{self.dtype}-c{self.channels}-{self.fill}-{self.window}-g{self.gamma}-i{int(self.invert)}{extra}"

    def make(self, seed: int = 0) -> tuple[np.ndarray, list[dict]]:
        """(planes, per-channel settings as ``Channel`` keyword arguments)."""
        planes = make_array(self.dtype, (self.channels, *self.shape), self.fill, seed)
        rng = np.random.default_rng(seed + 1)
        finite = planes[np.isfinite(planes)] if planes.dtype.kind == "f" else planes
        lo = float(finite.min()) if finite.size else 0.0
        hi = float(finite.max()) if finite.size else 1.0
        hi = hi if hi > lo else lo + 1.0
        settings = []
        for c in range(self.channels):
            if self.window == "tight":
                a, b = sorted(rng.uniform(lo, hi, 2))
                start, end = a, (b if b > a else a + 1.0)
            elif self.window == "wide":
                start, end = lo - (hi - lo), hi + (hi - lo)
            elif self.window == "outside":
                start, end = ((hi + 10, hi + 20), (lo - 20, lo - 10), (np.floor(lo), np.floor(lo) + 3))[c % 3]
            else:
                start, end = lo, hi
            if self.lut and c % 3 == 0:
                colour: object = rng.integers(0, 256, (256, 3)).astype(np.uint8)
            else:
                colour = tuple(float(v) for v in rng.random(3))
            settings.append(dict(start=start, end=end, colour=colour, gamma=self.gamma, invert=self.invert))
        return planes, settings


def _composite_cases() -> Iterator[CompositeCase]:
    for dtype in ("uint8", "uint16", "int16", "float32"):
        for channels in (1, 2, 3, 4, 7, 16, 64):
            yield CompositeCase(dtype, channels)
        for fill in fills_for(dtype):
            yield CompositeCase(dtype, 4, fill)
        for window in ("tight", "wide", "outside"):
            yield CompositeCase(dtype, 5, window=window)
        for gamma in (0.45, 2.2):
            yield CompositeCase(dtype, 3, gamma=gamma)
        yield CompositeCase(dtype, 3, invert=True)
        yield CompositeCase(dtype, 6, "extremes" if dtype != "float32" else "nonfinite", "tight", 0.7, True, True)
        yield CompositeCase(dtype, 9, lut=True)
        yield CompositeCase(dtype, 6, "extremes" if dtype != "float32" else "nonfinite", "outside")
    yield CompositeCase("uint16", 64, window="tight", gamma=1.8, invert=True, lut=True, shape=(1, 300))
    yield CompositeCase("uint8", 2, shape=(1, 1))
    yield CompositeCase("uint16", 17, "extremes", "wide", shape=(3, 40))  # over MAX_VALUE_LIGHTS: steps computed


#: every dtype, 1-64 channels, each fill, windows inside and past the data, gammas below and
#: above 1, inversion and LUTs, and a 1x1 and a one-row image
COMPOSITE_CASES: tuple[CompositeCase, ...] = tuple(_composite_cases())


@dataclass(frozen=True)
class OverlayCase:
    """One oracle-vs-kernel comparison of ``overlay``: labels of ``dtype`` (``make_labels``, ids
    below ``n_labels``, so 0 is frequent where it is small) over the oracle's composite of
    ``base``, at ``opacity``, with ``overrides`` of its ids given colours."""

    base: CompositeCase
    dtype: str
    opacity: float
    overrides: int = 0
    n_labels: int = 2**20

    @property
    def id(self) -> str:
        return f"{self.base.id}-{self.dtype}-a{self.opacity}-o{self.overrides}-n{self.n_labels}"

    def make(self, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(rgb, ids, override ids, override colours): the composite comes from the oracle."""
        from tensor_server_kernels import composite_reference as R

        planes, settings = self.base.make(seed)
        rgb = R.composite(planes, [R.Channel(**s) for s in settings])
        ids = make_labels(self.base.shape, self.dtype, seed + 2, self.n_labels, cell=(2, 9))
        if np.dtype(self.dtype).kind == "i":
            ids[::3, ::4] = -ids[::3, ::4]  # negative ids: their two's complement patterns
        h, w = self.base.shape
        ids[h // 2 :, : max(1, w // 3)] = 0  # a background corner, whatever the ids drawn
        rng = np.random.default_rng(seed + 3)
        present = np.unique(ids)
        keys = rng.choice(present, min(self.overrides, present.size), replace=False)
        colours = rng.integers(0, 256, (keys.size, 3)).astype(np.uint8)
        return rgb, ids, keys, colours


def _overlay_cases() -> Iterator[OverlayCase]:
    bases = [c for c in COMPOSITE_CASES if c.channels in (1, 4, 64)]
    dtypes = ("bool", "uint8", "uint16", "uint32", "uint64", "int8", "int32", "int64")
    for i, base in enumerate(bases):
        yield OverlayCase(base, dtypes[i % len(dtypes)], (0.0, 0.3, 0.5, 1.0)[i % 4], (0, 1, 5)[i % 3], (3, 200)[i % 2])
    yield OverlayCase(bases[0], "uint32", 0.6, 40)


#: label dtypes bool to 64-bit, signed ids, opacities 0 to 1, none to many overrides, over
#: composites of 1, 4 and 64 channels
OVERLAY_CASES: tuple[OverlayCase, ...] = tuple(_overlay_cases())
