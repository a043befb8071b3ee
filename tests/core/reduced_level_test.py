"""Levels below a stored pyramid's coarsest level (``core/reduced_level.py``): the scales
they take, that their pixels are the reduction of that stored level (never of level 0), and
that a region of one is the same crop of that reduction."""

from __future__ import annotations

import numpy as np
from tensor_server_kernels import reference

from tensor_server.adapters.memory import ArrayAdapter
from tensor_server.core.adapter_base import NativeLevel
from tensor_server.core.bounds import Bounds
from tensor_server.core.pyramid import PyramidPolicy
from tensor_server.core.reduced_level import levels_below


def _pyramid(is_labels: bool = False) -> ArrayAdapter:
    """1000 × 1500 with a stored level at 2 whose pixels are unrelated to level 0's (so a
    level reduced from level 0 would differ)."""
    rng = np.random.default_rng(3)
    level0 = ArrayAdapter(np.zeros((1000, 1500), np.uint16), dim_labels="yx", is_labels=is_labels)
    pixels = rng.integers(0, 9 if is_labels else 60000, (500, 750), dtype=np.uint16)
    stored = ArrayAdapter(pixels, dim_labels="yx", is_labels=is_labels)
    level0.native_levels.append(NativeLevel((2, 2), stored))
    return level0


def test_halved_below_the_coarsest_stored_level_until_one_tile():
    tensor = _pyramid()
    below = levels_below(tensor, PyramidPolicy(coarsest_tile=100))
    assert [lv.scale for lv in below] == [(4, 4), (8, 8), (16, 16)]
    assert [lv.tensor.shape for lv in below] == [(250, 375), (125, 188), (63, 94)]
    stored = tensor.native_levels[0].tensor.array
    for lv, f in zip(below, (2, 4, 8)):
        np.testing.assert_array_equal(lv.tensor.get_data(), reference.downsample(stored, (f, f), "area"))


def test_a_region_is_the_crop_of_the_whole_reduction():
    level = levels_below(_pyramid(), PyramidPolicy(coarsest_tile=100))[-1].tensor
    whole = level.get_data()
    for box in (Bounds((3, 5), (40, 61)), Bounds((50, 80), (63, 94))):  # inside, and at the edge
        np.testing.assert_array_equal(level.get_data(box), whole[box.to_slices()])


def test_labels_reduce_by_mode_and_the_level_count_is_capped():
    labels = _pyramid(is_labels=True)
    (only,) = levels_below(labels, PyramidPolicy(coarsest_tile=100, max_levels=3))
    assert only.scale == (4, 4) and only.tensor.is_labels
    want = reference.downsample(labels.native_levels[0].tensor.array, (2, 2), "mode")
    np.testing.assert_array_equal(only.tensor.get_data(), want)


def test_nothing_below_a_pyramid_that_ends_in_one_tile_or_no_pyramid():
    assert levels_below(_pyramid(), PyramidPolicy(coarsest_tile=750)) == []
    assert levels_below(ArrayAdapter(np.zeros((4000, 4000), np.uint8)), PyramidPolicy()) == []
