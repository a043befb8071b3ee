"""The label-overlay kernel against its NumPy oracle on the case table (label images over the
compositing table's composites), and both against values worked out by hand. Comparison is
exact: both blend in integers.

Runs under ``NUMBA_DISABLE_JIT=1`` too (``make test-nojit``): the cases stay small.
"""

from __future__ import annotations

import numpy as np
import pytest
from tensor_server_kernels import cases
from tensor_server_kernels import overlay as K
from tensor_server_kernels import overlay_reference as R


@pytest.mark.parametrize("case", cases.OVERLAY_CASES, ids=lambda c: c.id)
def test_kernel_equals_oracle(case):
    rgb, ids, keys, colours = case.make()
    want = R.overlay(rgb, ids, case.opacity, keys, colours)
    got = K.overlay(rgb, ids, case.opacity, keys, colours)
    assert got.dtype == np.uint8 and got.shape == rgb.shape
    assert np.array_equal(got, want), f"{np.count_nonzero(got != want)} components differ"
    drawn = R.check_ids(ids) != 0
    assert (~drawn).any() and (drawn.any() or ids.size == 1)
    assert np.array_equal(got[~drawn], rgb[~drawn])  # the background is never drawn


def test_the_case_table_spans_dtypes_opacities_and_overrides():
    table = cases.OVERLAY_CASES
    assert {"bool", "uint8", "int8", "int64", "uint64"} <= {c.dtype for c in table}
    assert {0.0, 1.0} <= {c.opacity for c in table}
    assert {0, 1} <= {c.overrides for c in table} and max(c.overrides for c in table) >= 40
    assert {1, 4, 64} <= {c.base.channels for c in table}


@pytest.mark.parametrize("mod", [R, K], ids=["oracle", "kernel"])
class TestPinnedValues:
    def test_opacity_blends_in_integers_and_zero_is_background(self, mod):
        rgb = np.full((1, 3, 3), 100, np.uint8)
        ids = np.array([[0, 7, 9]], np.uint16)
        out = mod.overlay(rgb, ids, 0.5, np.array([7]), np.array([[255, 0, 0]]))
        # alpha 128: (100 * 127 + 255 * 128 + 127) // 255 = 178; (100 * 127 + 127) // 255 = 50
        assert out[0, 0].tolist() == [100, 100, 100]
        assert out[0, 1].tolist() == [178, 50, 50]
        hashed = R.label_colours(np.array([9]))[0].astype(int)
        assert out[0, 2].tolist() == [(100 * 127 + int(c) * 128 + 127) // 255 for c in hashed]

    def test_full_opacity_shows_the_label_colour_and_none_the_image(self, mod):
        rgb = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
        ids = np.array([[1, 2], [3, 4]], np.int32)
        assert np.array_equal(mod.overlay(rgb, ids, 1.0, [], []), R.label_colours(ids))
        assert np.array_equal(mod.overlay(rgb, ids, 0.0, [], []), rgb)

    def test_negative_ids_are_their_bit_patterns(self, mod):
        rgb = np.zeros((1, 2, 3), np.uint8)
        a = mod.overlay(rgb, np.array([[-1, 5]], np.int64), 1.0, [], [])
        b = mod.overlay(rgb, np.array([[2**64 - 1, 5]], np.uint64), 1.0, [], [])
        assert np.array_equal(a, b) and a[0, 0].min() >= 64


def test_hashed_colours_are_pinned():
    # the colours a viewer has shown stay the same: a change here recolours every label image
    assert R.label_colours(np.array([1, 2, 3])).tolist() == [[235, 226, 89], [126, 76, 224], [245, 235, 232]]


@pytest.mark.parametrize("mod", [R, K], ids=["oracle", "kernel"])
@pytest.mark.parametrize(
    "args,says",
    [
        ((np.zeros((2, 2, 3), np.uint8), np.zeros((2, 2)), 0.5, [], []), "must be integers"),
        ((np.zeros((2, 2, 3), np.uint8), np.zeros((2, 3), np.uint8), 0.5, [], []), "ids must be"),
        ((np.zeros((2, 2), np.uint8), np.zeros((2, 2), np.uint8), 0.5, [], []), "rgb must be"),
        ((np.zeros((2, 2, 3), np.uint8), np.zeros((2, 2), np.uint8), 1.5, [], []), "opacity 1.5 must be"),
        ((np.zeros((2, 2, 3), np.uint8), np.zeros((2, 2), np.uint8), 0.5, [1, 1], [[0, 0, 0]] * 2), "two colours"),
        ((np.zeros((2, 2, 3), np.uint8), np.zeros((2, 2), np.uint8), 0.5, [1], [[0, 0, 0]] * 2), "1 ids but 2"),
    ],
)
def test_bad_input_is_refused_naming_it(mod, args, says):
    with pytest.raises(ValueError, match=says):
        mod.overlay(*args)
