"""ArrayAdapter and .npy sources through the shipped conformance suite."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_server
from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.testing import AdapterTests


class TestArrayAdapter(AdapterTests):
    @pytest.fixture
    def source(self):
        rng = np.random.default_rng(0)
        src = MemorySource(
            {
                "img": ArrayAdapter(
                    rng.integers(0, 4000, (3, 70, 90), dtype=np.uint16), "cyx", chunk_shape=(1, 32, 32)
                ),
                "vol": ArrayAdapter(
                    rng.standard_normal((9, 40, 33)).astype(np.float32),
                    "zyx",
                    read_block_shape=(3, 16, 16),
                    chunk_shape=(3, 8, 8),
                ),
                "mask": ArrayAdapter(rng.integers(0, 4, (50, 60), dtype=np.uint32), "yx", is_labels=True),
            },
            source_id="mem",
        )
        yield src
        src.close()

    def reference_array(self, source, field):
        return source.tensors[field].array


class TestNpyFile(AdapterTests):
    @pytest.fixture
    def source(self, tmp_path):
        p = tmp_path / "stack.npy"
        np.save(p, np.random.default_rng(3).integers(-100, 100, (5, 33, 47), dtype=np.int16).astype(">i2"))
        src = tensor_server.open(p)
        yield src
        src.close()

    def reference_array(self, source, field):
        return np.load(source.path).astype("=i2")


class TestSuiteCatchesBrokenAdapters:
    """The suite must be able to fail: a lying adapter is caught."""

    def test_wrong_pixels_fail(self):
        class Liar(ArrayAdapter):
            def read_region(self, bounds):
                return super().read_region(bounds) + 1

        arr = np.zeros((8, 8), np.uint8)
        src = MemorySource(Liar(arr), source_id="liar")
        suite = TestArrayAdapter()
        with pytest.raises(AssertionError):
            suite.reference_array = lambda s, f: arr
            suite.test_random_reads_match_library(src)

    def test_view_leak_is_made_owned(self):
        arr = np.arange(16, dtype=np.uint8).reshape(4, 4)
        t = ArrayAdapter(arr)
        out = t.get_data()
        assert not np.shares_memory(out, arr)
