"""The compositing kernel against its NumPy oracle on the case table, and both against values
worked out by hand (identity of a grey 8-bit channel, addition in linear light, gamma,
inversion, clipping, NaN, LUTs). Comparison is exact: the oracle defines the float32 order of
additions and the kernel keeps it.

Runs under ``NUMBA_DISABLE_JIT=1`` too (``make test-nojit``): the cases stay small.
"""

from __future__ import annotations

import numpy as np
import pytest
from tensor_server_kernels import cases
from tensor_server_kernels import composite as K
from tensor_server_kernels import composite_reference as R


def _channels(settings: list[dict]) -> list[R.Channel]:
    return [R.Channel(**s) for s in settings]


@pytest.mark.parametrize("case", cases.COMPOSITE_CASES, ids=lambda c: c.id)
def test_kernel_equals_oracle(case):
    planes, settings = case.make()
    channels = _channels(settings)
    want = R.composite(planes, channels)
    got = K.composite(planes, channels)
    assert got.dtype == np.uint8 and got.shape == planes.shape[1:] + (3,)
    if not np.array_equal(got, want):
        bad = np.argwhere(got != want)
        i = tuple(bad[0])
        raise AssertionError(f"first mismatch at {i}: oracle {want[i]}, kernel {got[i]} ({len(bad)} mismatches)")


def test_the_case_table_spans_dtypes_channels_and_settings():
    table = cases.COMPOSITE_CASES
    assert {c.dtype for c in table} == set(R.DTYPES)
    assert {1, 64} <= {c.channels for c in table}
    assert {True} == {c.invert for c in table if c.gamma == 0.7}
    assert any(c.lut for c in table) and any(c.gamma < 1 for c in table) and any(c.gamma > 1 for c in table)


GREY = (1.0, 1.0, 1.0)
RAMP = np.arange(256, dtype=np.uint8).reshape(1, 1, 256)


@pytest.mark.parametrize("mod", [R, K], ids=["oracle", "kernel"])
class TestPinnedValues:
    def test_grey_uint8_over_its_range_is_shown_as_stored(self, mod):
        out = mod.composite(RAMP, [R.Channel(0, 255, GREY)])
        assert out[0, :, 0].tolist() == list(range(256))
        assert np.array_equal(out[..., 0], out[..., 1]) and np.array_equal(out[..., 0], out[..., 2])

    def test_a_lut_shows_its_entries(self, mod):
        lut = np.random.default_rng(3).integers(0, 256, (256, 3)).astype(np.uint8)
        out = mod.composite(RAMP, [R.Channel(0, 255, lut)])
        assert np.array_equal(out[0], lut)

    def test_channels_add_in_linear_light(self, mod):
        # two grey channels at 100/255: linear 0.1274 each, 0.2549 together, sRGB 138.2 (display-space
        # addition would give 200)
        two = np.full((2, 1, 1), 100, np.uint8)
        out = mod.composite(two, [R.Channel(0, 255, GREY), R.Channel(0, 255, GREY)])
        assert out[0, 0].tolist() == [138, 138, 138]
        # red and green at full: yellow; a colour is clipped per component, not scaled
        rg = np.full((2, 1, 1), 255, np.uint8)
        out = mod.composite(rg, [R.Channel(0, 255, (1.0, 0, 0)), R.Channel(0, 255, (1.0, 1.0, 0))])
        assert out[0, 0].tolist() == [255, 255, 0]

    def test_window_clips_and_nan_is_dark(self, mod):
        x = np.array([[[-5.0, 10.0, 15.0, 20.0, 99.0, np.nan, np.inf, -np.inf]]], np.float32)
        out = mod.composite(x, [R.Channel(10.0, 20.0, GREY)])[0, :, 0]
        assert out.tolist() == [0, 0, 128, 255, 255, 0, 255, 0]

    def test_gamma_and_inversion(self, mod):
        x = np.array([[[0, 128, 255]]], np.uint16)
        gamma2 = mod.composite(x, [R.Channel(0, 255, GREY, gamma=2.0)])[0, :, 0]
        assert gamma2.tolist() == [0, 64, 255]  # (128/255)² · 255 = 64.25
        inverted = mod.composite(x, [R.Channel(0, 255, GREY, invert=True)])[0, :, 0]
        assert inverted.tolist() == [255, 127, 0]
        both = mod.composite(x, [R.Channel(0, 255, GREY, gamma=2.0, invert=True)])[0, :, 0]
        assert both.tolist() == [255, 63, 0]  # inverted first: (127/255)² · 255 = 63.25

    def test_signed_values_below_zero(self, mod):
        x = np.array([[[-32768, -1000, 0, 1000, 32767]]], np.int16)
        out = mod.composite(x, [R.Channel(-1000, 1000, (0, 1.0, 0))])[0, :, 1]
        assert out.tolist() == [0, 0, 128, 255, 255]


@pytest.mark.parametrize("mod", [R, K], ids=["oracle", "kernel"])
@pytest.mark.parametrize(
    "channel,count,says",
    [
        (R.Channel(10, 10, GREY), 1, "start 10 must be below end 10"),
        (R.Channel(20, 10, GREY), 1, "start 20 must be below end 10"),
        (R.Channel(0, np.inf, GREY), 1, "both finite"),
        (R.Channel(0, 1, GREY, gamma=0), 1, "gamma 0 must be a positive"),
        (R.Channel(0, 1, (1.5, 0, 0)), 1, "colour must be"),
        (R.Channel(0, 1, np.zeros((255, 3), np.uint8)), 1, "colour must be"),
        (R.Channel(0, 1, GREY), 65, "1 to 64 visible channels; got 65"),
    ],
)
def test_bad_settings_are_refused_naming_them(mod, channel, count, says):
    with pytest.raises(ValueError, match=says):
        mod.composite(np.zeros((count, 2, 2), np.uint8), [channel] * count)


@pytest.mark.parametrize("mod", [R, K], ids=["oracle", "kernel"])
def test_planes_must_match_the_channels_and_a_dtype(mod):
    with pytest.raises(ValueError, match="planes must be"):
        mod.composite(np.zeros((2, 2, 2), np.uint8), [R.Channel(0, 1, GREY)])
    with pytest.raises(ValueError, match="dtype int64 is not one of"):
        mod.composite(np.zeros((1, 2, 2), np.int64), [R.Channel(0, 1, GREY)])


def test_integer_lights_are_tabulated_up_to_max_value_lights_then_computed():
    """The kernel reads an integer pixel's light from ``ValueLight`` while the table stays within
    ``MAX_VALUE_LIGHTS`` values, and computes its step past that: both equal the oracle."""
    planes = np.random.default_rng(4).integers(0, 65536, (17, 3, 40)).astype(np.uint16)
    for end, tabulated in ((4000.0, True), (65535.0, False)):  # 17 windows of 4001 or 65536 values
        tables = R.prepare([R.Channel(0.0, end, (0.2, 0.5, 1.0))] * 17)
        got = K.composite_with(planes, tables)
        assert (tables.value_light["uint16"] is not None) is tabulated
        assert np.array_equal(got, R.composite_with(planes, tables))
    assert 17 * 4002 <= R.MAX_VALUE_LIGHTS < 17 * 65536
