"""NdTiffAdapter: the real NDTiff v2/v3 datasets through the conformance suite (tifffile's own
NDTiff series is the reference), the stitched Magellan mosaic, its levels, and damage."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import tensor_server
from tensor_server.adapters.ndtiff import NdTiffAdapter, read_ndtiff_index
from tensor_server.adapters.registry import detect_format
from tensor_server.core.bounds import Bounds
from tensor_server.core.normalizing import canonical_axis_order
from tensor_server.errors import UnreadableSource
from tensor_server.testing import AdapterTests

tifffile = pytest.importorskip("tifffile")

V3_11BIT = "ndtiff/v3/ndtiff3.2_11bit_1"
V3_MDA = "ndtiff/v3/12_bit_pycromanager_mda"
V2 = "ndtiff/v2/ndtiffv2.0_test"
MAGELLAN = "ndtiff/v3/ndtiff3.2_magellan_explore_rgb"
TIFFFILE_AXES = {"T": "t", "C": "c", "Z": "z", "R": "p", "Y": "y", "X": "x", "S": "s"}


def inner(tensor):
    return getattr(tensor, "inner", tensor)


def level_folder(path: Path) -> Path:
    return path / "Full resolution" if (path / "Full resolution").is_dir() else path


def tifffile_reference(folder: Path) -> np.ndarray:
    """tifffile reads NDTiff through the same index; transposed to the served order."""
    stack = sorted(level_folder(folder).glob("*.tif"))[0]
    with tifffile.TiffFile(stack) as tif:
        series = tif.series[0]
        labels = [TIFFFILE_AXES[a] for a in series.axes]
        return np.transpose(series.asarray(), canonical_axis_order(labels))


def stitched_reference(folder: Path, overlap: int) -> np.ndarray:
    """Magellan tiles (tifffile: row J, column K, Y, X, S) placed with half the overlap
    cropped from each side (floor at the start, ceil at the end)."""
    stack = sorted(folder.glob("*.tif"))[0]
    with tifffile.TiffFile(stack) as tif:
        tiles = tif.series[0].asarray()  # (rows, cols, h, w, 3), missing tiles zero
    rows, cols, h, w, s = tiles.shape
    lo, hi = overlap // 2, overlap - overlap // 2
    th, tw = h - overlap, w - overlap
    out = np.zeros((rows * th, cols * tw, s), tiles.dtype)
    for r, c in np.ndindex(rows, cols):
        out[r * th : (r + 1) * th, c * tw : (c + 1) * tw] = tiles[r, c, lo : h - hi, lo : w - hi]
    return out


class TestNdTiffDatasets(AdapterTests):
    @pytest.fixture(params=[V3_11BIT, V3_MDA, V2, MAGELLAN])
    def source(self, request, testdata):
        src = tensor_server.open(testdata / request.param)
        yield src
        src.close()

    def reference_array(self, source, field):
        if source.path.name == Path(MAGELLAN).name:
            return stitched_reference(source.path / "Full resolution", overlap=1)
        return tifffile_reference(source.path)


@pytest.mark.parametrize(
    "rel, key, labels",
    [
        (V3_11BIT, f"{V3_11BIT}/", ("t", "y", "x")),
        (V3_MDA, f"{V3_MDA}/", ("t", "c", "y", "x")),
        (V2, f"{V2}/", ("t", "c", "y", "x")),
        (f"{V2}/Full resolution", f"{V2}/", ("t", "c", "y", "x")),
    ],
)
def test_values_match_expected(testdata, expected, rel, key, labels):
    e = expected[key]
    assert detect_format(testdata / rel).name == "ndtiff"
    with tensor_server.open(testdata / rel) as src:
        t = src.tensor()
        assert isinstance(inner(t), NdTiffAdapter) and src.type == "ndtiff"
        assert t.dim_labels == labels and t.shape == tuple(e["shape"])
        data = t.get_data()
        assert (str(data.dtype), int(data.min()), int(data.max()), float(data.sum())) == (
            e["dtype"],
            e["min"],
            e["max"],
            e["sum"],
        )
        assert t.read_block_shape is None and t.decimates
        assert t.physical_scale[-2:] == (1.0, 1.0) and t.physical_unit[-1] == "µm"


def test_channel_names_are_categories(testdata):
    with tensor_server.open(testdata / V3_MDA) as src:
        t = src.tensor()
        assert t.metadata["channel_names"] == ["DAPI", "FITC"] and t.metadata["bit_depth"] == 12
        # the index's first FITC image (time 0) is c=1 of t=0
        entries, _ = read_ndtiff_index(testdata / V3_MDA / "NDTiff.index")
        axes, name, offset, w, h, *_ = entries[1]
        assert axes == {"channel": "FITC", "time": 0}
        raw = np.fromfile(testdata / V3_MDA / name, "<u2", count=w * h, offset=offset).reshape(h, w)
        np.testing.assert_array_equal(t.get_data(Bounds((0, 1, 0, 0), (1, 2, 64, 64)))[0, 0], raw)


def test_magellan_mosaic(testdata, expected):
    folder = testdata / MAGELLAN
    with tensor_server.open(folder) as src:
        t = src.tensor()
        assert t.dim_labels == ("y", "x", "s") and t.shape == (93, 93, 3) and t.dtype == np.uint8
        tiles_meta = t.metadata["tiles"]
        assert tiles_meta["rows"] == [11, 12, 13] and tiles_meta["overlap"] == [1, 1]
        assert t.metadata["downsampled_levels_not_served"] == [f"Downsampled_x{n}" for n in (2, 4, 8, 16, 32)]
        assert t.native_levels == []
        data = t.get_data()
        # the raw tiles match expected.json; the mosaic holds each tile minus its last row/column
        e = expected[f"{MAGELLAN}/Full resolution/Magellan_expolore_multi_channel_NDTiffStack.tif"]
        with tifffile.TiffFile(folder / "Full resolution/Magellan_expolore_multi_channel_NDTiffStack.tif") as tif:
            tiles = np.stack([p.asarray() for p in tif.pages])
        assert tiles.shape == tuple(e["shape"]) and float(tiles.sum()) == e["sum"]
        for i in range(3):
            np.testing.assert_array_equal(data[31 * i : 31 * (i + 1), 31 * i : 31 * (i + 1)], tiles[i, :31, :31])
        assert float(data.sum()) == float(tiles[:, :31, :31].sum())
        assert not data[0:31, 31:93].any()  # off-diagonal tiles were never acquired
        # a decimated read across tile borders
        b = Bounds((5, 2, 0), (90, 93, 3))
        np.testing.assert_array_equal(t.get_decimated_data(b, (4, 3, 1)), data[5:90:4, 2:93:3])


@pytest.mark.parametrize("factor", [2, 4, 8, 16, 32])
def test_magellan_levels_open_on_their_own(testdata, expected, factor):
    folder = testdata / MAGELLAN / f"Downsampled_x{factor}"
    e = expected[f"{MAGELLAN}/Downsampled_x{factor}/Magellan_expolore_multi_channel_NDTiffStack.tif"]
    with tensor_server.open(folder) as src:
        t = src.tensor()
        data = t.get_data()
        # levels keep whole 31x31 tiles (no overlap to crop): every raw pixel is served
        assert float(data.sum()) == e["sum"] and int(data.max()) == e["max"]
        assert t.physical_scale[:2] == (float(factor), float(factor))


def test_opening_a_data_file_opens_its_dataset(testdata):
    stack = testdata / V3_11BIT / "ndtiff3.2_11bit_NDTiffStack.tif"
    assert detect_format(stack).name == "ndtiff-file"
    with tensor_server.open(stack) as src:
        np.testing.assert_array_equal(src.tensor().get_data(), tifffile_reference(testdata / V3_11BIT))


# ---- damage -------------------------------------------------------------------------------------
@pytest.fixture
def dataset_copy(testdata, tmp_path) -> Path:
    dst = tmp_path / "ds"
    shutil.copytree(testdata / V3_11BIT, dst)
    return dst


def test_truncated_data_file_names_it(dataset_copy):
    stack = dataset_copy / "ndtiff3.2_11bit_NDTiffStack.tif"
    entries, _ = read_ndtiff_index(dataset_copy / "NDTiff.index")
    with open(stack, "r+b") as fh:
        fh.truncate(entries[-1][2] + 100)  # the last image is cut short
    with pytest.raises(UnreadableSource, match="ndtiff3.2_11bit_NDTiffStack.tif.*truncated"):
        tensor_server.open(dataset_copy)


def test_missing_data_file_names_it(dataset_copy):
    (dataset_copy / "ndtiff3.2_11bit_NDTiffStack.tif").unlink()
    with pytest.raises(UnreadableSource, match="ndtiff3.2_11bit_NDTiffStack.tif"):
        tensor_server.open(dataset_copy)


def test_corrupt_index_entry(dataset_copy):
    index = dataset_copy / "NDTiff.index"
    data = bytearray(index.read_bytes())
    data[4:9] = b"\x00garb"  # the first entry's axes JSON
    index.write_bytes(bytes(data))
    with pytest.raises(UnreadableSource, match="NDTiff.index"):
        tensor_server.open(dataset_copy)


def test_index_cut_mid_entry_drops_that_entry(dataset_copy):
    index = dataset_copy / "NDTiff.index"
    index.write_bytes(index.read_bytes()[:-10])  # an acquisition still writing its last entry
    with tensor_server.open(dataset_copy) as src:
        t = src.tensor()
        assert t.shape == (9, 64, 64) and "index_tail_ignored" in t.metadata
        np.testing.assert_array_equal(t.get_data(), tifffile_reference(dataset_copy.parent / "ds")[:9])
