"""blosc2 .b2nd adapter: conformance on generated files (dense, sparse with ZERO/VALUE
chunks, float with NaN chunks), detection and bad input."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_server
from tensor_server.adapters.b2nd import B2ndAdapter
from tensor_server.errors import UnreadableSource
from tensor_server.testing import AdapterTests

blosc2 = pytest.importorskip("blosc2")


def _write(path, data, chunks, blocks=None):
    b = blosc2.asarray(np.ascontiguousarray(data), chunks=chunks, blocks=blocks, urlpath=str(path), mode="w")
    del b
    return path


class TestB2nd(AdapterTests):
    @pytest.fixture(params=["dense_u16", "sparse_f32", "value_i16"])
    def source(self, request, tmp_path):
        rng = np.random.default_rng(7)
        if request.param == "dense_u16":
            path = _write(tmp_path / "d.b2nd", rng.integers(0, 60000, (5, 70, 90), dtype=np.uint16), (2, 32, 32))
        elif request.param == "sparse_f32":
            path = tmp_path / "s.b2nd"
            b = blosc2.zeros((6, 64, 80), dtype=np.float32, chunks=(2, 32, 40), urlpath=str(path), mode="w")
            b[2:4, 32:64, 0:40] = rng.standard_normal((2, 32, 40)).astype(np.float32)
            b[4:6, 0:32, 40:80] = np.full((2, 32, 40), np.nan, np.float32)
            del b
        else:
            path = tmp_path / "v.b2nd"
            b = blosc2.full((4, 50, 60), fill_value=-3, dtype=np.int16, chunks=(2, 25, 30), urlpath=str(path), mode="w")
            b[0:2, 0:25, 0:30] = rng.integers(-100, 100, (2, 25, 30), dtype=np.int16)
            del b
        src = tensor_server.open(path)
        yield src
        src.close()

    def reference_array(self, source, field):
        return blosc2.open(str(source.path), mode="r")[...]


def test_detected_by_content_and_reports_specials(tmp_path):
    path = tmp_path / "noext"
    b = blosc2.zeros((8, 8), dtype=np.uint8, chunks=(4, 4), urlpath=str(path), mode="w")
    del b
    with tensor_server.open(path) as src:
        assert src.type == "blosc2" and isinstance(src.tensor(), B2ndAdapter)
        assert len(src.tensor().uniform_blocks(src.tensor().check_bounds(None))) == 4


def test_not_blosc2_is_a_clear_error(tmp_path):
    from tensor_server.adapters.b2nd import B2ndSource

    bad = tmp_path / "bad.b2nd"
    bad.write_bytes(b"\x9e\xa8b2frame\x00" + b"\x00" * 50)
    with pytest.raises(UnreadableSource, match="bad.b2nd"):
        B2ndSource(bad)
