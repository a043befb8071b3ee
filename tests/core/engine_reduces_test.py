"""The engine's ``reduces`` path: a backend's own reduction is used when offered, the
engine's own when declined, after the chunk cache; a wrong shape is a loud error."""

from __future__ import annotations

import numpy as np
import pytest
from tensor_server_kernels import reference

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.cache import CacheManager
from tensor_server.core import plan_read
from tensor_server.core.engine import ReadEngine


class Reducing(ArrayAdapter):
    """Reduces by returning a marker (so a test sees which path answered), or declines."""

    reduces = True

    def __init__(self, arr, *, answer: str = "marker") -> None:
        super().__init__(arr, "yx", chunk_shape=(32, 32))
        self.answer, self.asked = answer, []

    def get_reduced_data(self, bounds, scale, method):
        self.asked.append((bounds, tuple(scale), method))
        if self.answer == "decline":
            return None
        shape = tuple(-(-n // s) for n, s in zip(bounds.shape, scale))
        if self.answer == "wrong":
            shape = (shape[0] + 1, shape[1])
        return np.full(shape, 7, self.dtype)


ARR = np.random.default_rng(0).integers(0, 60000, (100, 90), dtype=np.uint16)


def test_an_offered_reduction_is_served():
    t = Reducing(ARR)
    got = ReadEngine().read(t, None, (2, 3), "area")
    assert got.shape == (50, 30) and (got == 7).all() and len(t.asked) == 1


def test_a_declined_reduction_is_computed_here():
    t = Reducing(ARR, answer="decline")
    got = ReadEngine().read(t, None, (2, 3), "max")
    np.testing.assert_array_equal(got, reference.downsample(ARR, (2, 3), "max"))
    assert len(t.asked) == 1


def test_a_wrong_shape_is_an_error():
    with pytest.raises(RuntimeError, match="get_reduced_data returned"):
        ReadEngine().read(Reducing(ARR, answer="wrong"), None, (2, 2), "area")


def test_cached_full_resolution_chunks_are_used_before_the_backend(tmp_path):
    t = Reducing(ARR)
    MemorySource(t, source_id="red")
    with CacheManager(tmp_path) as cache:
        engine = ReadEngine(cache)
        for c in plan_read(t).chunks:
            engine.chunk(c.chunk_id, t)
        got = engine.read(t, None, (2, 2), "area")
    np.testing.assert_array_equal(got, reference.downsample(ARR, (2, 2), "area"))
    assert t.asked == []
