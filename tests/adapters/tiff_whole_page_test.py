"""A whole-tensor read of a one-page TIFF tensor decodes the page directly (no copy through the
zarr store); it must equal tifffile's own read, and every other read goes through the store
(or, for compressed pages, strile by strile: tiff_striles_test.py)."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_server
from tensor_server.core.bounds import Bounds

tifffile = pytest.importorskip("tifffile")


@pytest.mark.parametrize(
    "shape, kwargs, whole",
    [
        ((300, 260), {"tile": (64, 64), "compression": "zlib"}, True),
        ((300, 260), {"compression": "zlib", "rowsperstrip": 16}, True),
        ((100, 90, 3), {"photometric": "rgb", "tile": (32, 32), "compression": "zlib"}, True),
        ((3, 100, 90), {"photometric": "minisblack", "planarconfig": "separate"}, True),
        ((4, 50, 60), {"photometric": "minisblack", "compression": "zlib"}, False),  # 4 pages
    ],
)
def test_whole_page_read_equals_tifffile(tmp_path, shape, kwargs, whole):
    arr = np.random.default_rng(4).integers(0, 255, shape, dtype=np.uint8)
    tifffile.imwrite(tmp_path / "t.tif", arr, **kwargs)
    want = tifffile.imread(tmp_path / "t.tif")
    served = tensor_server.open(tmp_path / "t.tif").tensor()
    tensor = getattr(served, "inner", served)  # planar RGB is served with the channel axis moved
    with tensor.handle.use() as opened:
        assert (tensor._whole_page(opened, Bounds.full(tensor.shape)) is not None) == whole
        part = Bounds((0,) * tensor.ndim, tuple(max(1, n - 1) for n in tensor.shape))
        assert tensor._whole_page(opened, part) is None
    got = tensor.get_data()
    assert got.shape == tensor.shape
    np.testing.assert_array_equal(got.reshape(want.shape), want)


def test_whole_page_read_is_handed_over_without_a_copy(tmp_path, monkeypatch):
    """get_data returns the decoded page itself (a reshape view would be copied once more).
    A raw page: compressed pages are read strile by strile (tiff_striles_test.py)."""
    arr = np.random.default_rng(5).integers(0, 60000, (256, 256), dtype=np.uint16)
    tifffile.imwrite(tmp_path / "t.tif", arr)
    tensor = tensor_server.open(tmp_path / "t.tif").tensor()
    decoded = []
    real = tifffile.TiffPage.asarray
    monkeypatch.setattr(
        tifffile.TiffPage, "asarray", lambda self, *a, **k: decoded.append(real(self, *a, **k)) or decoded[-1]
    )
    got = tensor.get_data()
    np.testing.assert_array_equal(got, arr)
    assert len(decoded) == 1 and got is decoded[0]
