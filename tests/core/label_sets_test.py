"""``core.label_sets.carry_image_scale``: which label sets take their image's physical scale."""

from __future__ import annotations

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter
from tensor_server.core.label_sets import carry_image_scale


def _image():
    return ArrayAdapter(
        np.zeros((2, 8, 10), np.uint16), "cyx", physical_scale=(None, 0.5, 0.25), physical_unit=(None, "µm", "µm")
    )


def _label(shape=(8, 10), axes="yx", **kw):
    return ArrayAdapter(np.zeros(shape, np.uint32), axes, is_labels=True, **kw)


@pytest.mark.parametrize(
    "own", [{}, {"physical_scale": (1.0, 1.0)}, {"physical_scale": (1.0, 1.0), "physical_unit": (None, None)}]
)
def test_a_set_stating_no_size_takes_its_images_per_axis(own):
    label = _label(**own)
    assert carry_image_scale(label, _image()) is True
    assert label.physical_scale == (0.5, 0.25) and label.physical_unit == ("µm", "µm")


def test_a_set_with_the_channel_axis_takes_none_there():
    label = _label((2, 8, 10), "cyx")
    assert carry_image_scale(label, _image()) is True
    assert label.physical_scale == (None, 0.5, 0.25) and label.physical_unit == (None, "µm", "µm")


@pytest.mark.parametrize(
    "label",
    [
        _label(physical_scale=(2.0, 2.0)),  # a size of its own (a unitless 2 is not the identity)
        _label(physical_scale=(1.0, 1.0), physical_unit=("nm", "nm")),  # a unit of its own
        _label((4, 5)),  # not the image's extent
        _label((8, 10), "zx"),  # an axis the image does not have
    ],
)
def test_a_set_with_its_own_size_or_another_extent_keeps_its_own(label):
    before = (label.physical_scale, label.physical_unit)
    assert carry_image_scale(label, _image()) is False
    assert (label.physical_scale, label.physical_unit) == before


def test_an_image_without_a_size_gives_none():
    label = _label()
    assert carry_image_scale(label, ArrayAdapter(np.zeros((8, 10), np.uint16), "yx")) is False
    assert label.physical_scale is None
