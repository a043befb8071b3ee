"""Pure-NumPy oracle for channel compositing. This module DEFINES the semantics.

The numba kernel in :mod:`tensor_server_kernels.composite` exposes the same public names and
must return bit-identical results (tests/kernels/composite_test.py checks it, jitted and under
``NUMBA_DISABLE_JIT=1``). Both build their tables with :func:`prepare`, here.

What a composite is
-------------------
``planes`` is ``(C, H, W)`` (``C`` visible channels, 1 to ``MAX_CHANNELS``; uint8, uint16,
int16 or float32); per channel a window ``[start, end]`` (``start < end``), a gamma (> 0), an
inversion flag and a colour: a tint (three sRGB components in [0, 1]) or a LUT (``(256, 3)``
uint8 sRGB). The result is ``(H, W, 3)`` uint8 sRGB:

1. ``t = (v - start) * ((LEVELS - 1) / (end - start))`` in float64, rounded half up to a step
   ``q`` in ``0 .. LEVELS - 1`` and clipped (NaN and -inf give 0, +inf ``LEVELS - 1``);
2. the step's light, a table per channel made by :func:`prepare`: ``s = q / (LEVELS - 1)``,
   ``1 - s`` when inverted, then ``s ** gamma``; a tint shows ``s * tint``, a LUT its entry
   ``round(s * 255)``; that sRGB colour is taken to linear light (the sRGB transfer function)
   and stored as float32;
3. the channels' lights are added in float32, channel by channel in order (so the sum is
   defined to the bit), per colour component;
4. the sum, clipped to [0, 1], is taken back to sRGB through a table of ``ENCODE_STEPS``
   steps (index ``round half up(sum * (ENCODE_STEPS - 1))`` in float64).

Why linear light: each channel alone looks as its window and colour say (a grey channel over
``0..255`` of uint8 is shown as stored, pinned by a test), and where channels overlap their
colours add as light does, so red over green is a bright yellow, not a dark olive.

Why tables and steps: the per-pixel work is a subtraction, a multiplication, a rounding and
three table reads per channel, with no ``pow`` per pixel (whose last bit may differ between
libm and NumPy's SIMD code, which would break bit-identity). ``LEVELS - 1 = 16 * 255``, so
every 8-bit value over a ``0..255`` window lands on a step exactly; 4081 steps are finer than
the 256 an 8-bit display shows, and ``ENCODE_STEPS`` (16384) are fine enough that a single
channel round-trips to the value it had.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "LEVELS",
    "ENCODE_STEPS",
    "MAX_CHANNELS",
    "MAX_VALUE_LIGHTS",
    "DTYPES",
    "Channel",
    "Tables",
    "prepare",
    "check_planes",
    "value_light",
    "composite",
    "composite_with",
    "srgb_to_linear",
    "linear_to_srgb",
]

LEVELS = 16 * 255 + 1
ENCODE_STEPS = 16384
MAX_CHANNELS = 64
#: values of the largest ``ValueLight`` table (12 bytes each, 6 MB): 8 channels over every
#: uint16 value, 16 over half of them, 64 over an eighth
MAX_VALUE_LIGHTS = 1 << 19
DTYPES = ("uint8", "uint16", "int16", "float32")


@dataclass(frozen=True)
class Channel:
    """One visible channel: its window, gamma, inversion and colour (a tint of three sRGB
    components in [0, 1], or a ``(256, 3)`` uint8 LUT)."""

    start: float
    end: float
    colour: tuple[float, float, float] | np.ndarray
    gamma: float = 1.0
    invert: bool = False


@dataclass(frozen=True)
class Tables:
    """What the per-pixel loop reads: per channel the window's offset and scale (float64) and
    the light of every step (``(C, LEVELS, 3)`` float32), and the sRGB encoding table."""

    lo: np.ndarray
    scale: np.ndarray
    light: np.ndarray
    encode: np.ndarray
    #: per integer planes dtype, its ``value_light`` (None: over ``MAX_VALUE_LIGHTS``): made by
    #: the kernel on its first tile of that dtype and kept with the tables (a server keeps a
    #: spec's tables for every tile)
    value_light: dict[str, ValueLight | None] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class ValueLight:
    """The light of every value of an integer dtype that a window tells apart, per channel:
    value ``first[c] + k`` shows ``light[c, :, k]`` (the light of its step, components first)
    for ``k`` in ``0 .. last[c]``; a value below ``first[c]`` shows ``light[c, :, 0]`` and one
    above ``first[c] + last[c]`` shows ``light[c, :, last[c]]`` (steps only grow with the
    value, and below the window they are 0, above it ``LEVELS - 1``). What makes a pixel's
    light one clamp and three reads for 8- and 16-bit planes, each value's step computed by
    this module's own ``_steps``."""

    first: np.ndarray
    last: np.ndarray
    light: np.ndarray


def srgb_to_linear(c: np.ndarray) -> np.ndarray:
    """The sRGB transfer function (IEC 61966-2-1), components in [0, 1], float64."""
    c = np.asarray(c, np.float64)
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def linear_to_srgb(c: np.ndarray) -> np.ndarray:
    """Its inverse, components in [0, 1], float64."""
    c = np.asarray(c, np.float64)
    return np.where(c <= 0.0031308, c * 12.92, 1.055 * np.power(np.maximum(c, 0.0031308), 1 / 2.4) - 0.055)


def _check_channel(i: int, ch: Channel) -> None:
    if not (np.isfinite(ch.start) and np.isfinite(ch.end) and ch.start < ch.end):
        raise ValueError(f"channel {i}: window start {ch.start} must be below end {ch.end}, both finite")
    if not (np.isfinite(ch.gamma) and ch.gamma > 0):
        raise ValueError(f"channel {i}: gamma {ch.gamma} must be a positive number")
    colour = np.asarray(ch.colour)
    if colour.shape == (256, 3) and colour.dtype == np.uint8:
        return
    if colour.shape != (3,) or not np.all((colour >= 0) & (colour <= 1)):
        raise ValueError(f"channel {i}: colour must be three sRGB components in [0, 1] or a (256, 3) uint8 LUT")


def _light(ch: Channel) -> np.ndarray:
    """``(LEVELS, 3)`` float32: the linear light of each step of ``ch`` (module docstring, 2)."""
    s = np.arange(LEVELS, dtype=np.float64) / (LEVELS - 1)
    if ch.invert:
        s = 1.0 - s
    s = s ** float(ch.gamma)
    colour = np.asarray(ch.colour)
    if colour.shape == (256, 3):
        srgb = colour[np.floor(s * 255 + 0.5).astype(np.intp)].astype(np.float64) / 255
    else:
        srgb = s[:, None] * colour.astype(np.float64)[None, :]
    return srgb_to_linear(srgb).astype(np.float32)


def prepare(channels: Sequence[Channel]) -> Tables:
    """The tables of ``channels`` (raises ValueError naming a channel whose settings are not
    a window, gamma and colour as :class:`Channel` says)."""
    if not 1 <= len(channels) <= MAX_CHANNELS:
        raise ValueError(f"a composite has 1 to {MAX_CHANNELS} visible channels; got {len(channels)}")
    for i, ch in enumerate(channels):
        _check_channel(i, ch)
    lo = np.array([float(c.start) for c in channels], np.float64)
    scale = np.array([(LEVELS - 1) / (float(c.end) - float(c.start)) for c in channels], np.float64)
    light = np.ascontiguousarray(np.stack([_light(c) for c in channels]))
    steps = np.arange(ENCODE_STEPS, dtype=np.float64) / (ENCODE_STEPS - 1)
    encode = np.floor(linear_to_srgb(steps) * 255 + 0.5).astype(np.uint8)
    return Tables(lo, scale, light, encode)


def check_planes(planes: np.ndarray, count: int) -> np.ndarray:
    """``planes`` as a C-contiguous ``(count, H, W)`` array of a supported dtype."""
    planes = np.asarray(planes)
    if planes.ndim != 3 or planes.shape[0] != count:
        raise ValueError(f"planes must be (channels={count}, rows, cols); got shape {planes.shape}")
    if planes.dtype.name not in DTYPES:
        raise ValueError(f"planes dtype {planes.dtype} is not one of {DTYPES}")
    return np.ascontiguousarray(planes)


def _steps(plane: np.ndarray, lo: float, scale: float) -> np.ndarray:
    """Step ``q`` of every pixel (module docstring, 1): NaN and below 0 give 0."""
    with np.errstate(invalid="ignore"):
        u = (plane.astype(np.float64) - lo) * scale + 0.5
        return np.where(u >= LEVELS - 1, LEVELS - 1, np.where(u > 0, np.floor(u), 0)).astype(np.intp)


def value_light(tables: Tables, dtype: np.dtype) -> ValueLight | None:
    """The ``ValueLight`` of ``tables`` for planes of integer ``dtype`` (uint8, uint16, int16):
    per channel the values from the window's start (rounded down: its step is 0) to one past
    its end (rounded up; the end is recovered from the scale, so one more value absorbs its
    last bit), clipped to the dtype's range; every value outside them has the light of the
    nearer one. None where the table would hold more than ``MAX_VALUE_LIGHTS`` values, so a
    server keeping many specs' tables keeps at most 6 MB more for each."""
    info = np.iinfo(dtype)
    ends = tables.lo + (LEVELS - 1) / tables.scale
    first = np.clip(np.floor(tables.lo), info.min, info.max).astype(np.int64)
    top = np.clip(np.ceil(ends) + 1, info.min, info.max).astype(np.int64)
    last = top - first
    if len(first) * (int(last.max()) + 1) > MAX_VALUE_LIGHTS:
        return None
    light = np.zeros((len(first), 3, int(last.max()) + 1), np.float32)
    for c in range(len(first)):
        steps = _steps(np.arange(first[c], top[c] + 1, dtype=np.int64), tables.lo[c], tables.scale[c])
        light[c, :, : last[c] + 1] = tables.light[c][steps].T
    return ValueLight(first, last, light)


def composite(planes: np.ndarray, channels: Sequence[Channel]) -> np.ndarray:
    """``(H, W, 3)`` uint8: ``planes`` (one plane per entry of ``channels``) composited."""
    return composite_with(planes, prepare(channels))


def composite_with(planes: np.ndarray, tables: Tables) -> np.ndarray:
    """``composite`` with the tables made (``prepare``)."""
    planes = check_planes(planes, len(tables.lo))
    acc = np.zeros(planes.shape[1:] + (3,), np.float32)
    for c in range(planes.shape[0]):
        acc += tables.light[c][_steps(planes[c], tables.lo[c], tables.scale[c])]
    a = acc.astype(np.float64)
    top = ENCODE_STEPS - 1
    index = np.where(a >= 1.0, top, np.where(a > 0, np.floor(a * top + 0.5), 0)).astype(np.intp)
    return np.ascontiguousarray(tables.encode[index])
