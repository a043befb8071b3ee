"""OME-TIFF (tensor_server/adapters/ome_tiff.py): generated tiled SubIFD pyramids and
multi-image files, hand-built multi-file sets, the real samples in ../shared/testdata/ome-tiff
(including the multi-file set with a BinaryOnly companion) and cross-format identities."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import tensor_server
from tensor_server.adapters.ome_tiff import OmeTiffAdapter, resolve_ome_set
from tensor_server.adapters.registry import detect_format
from tensor_server.adapters.tiff import first_description_tail
from tensor_server.errors import UnreadableSource
from tensor_server.testing import AdapterTests, finishes_within
from tests.adapters.tiff_test import (
    check_against_expected,
    inner,
    served,
    tifffile_series,
)

tifffile = pytest.importorskip("tifffile")


class OmeFileTests(AdapterTests):
    filename = "data.ome.tif"

    def write(self, path: Path) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    @pytest.fixture
    def source(self, tmp_path):
        path = tmp_path / self.filename
        self.write(path)
        src = tensor_server.open(path)
        yield src
        src.close()

    def reference_array(self, source, field):
        arr, axes = tifffile_series(source.path, source.tensors[field].metadata["series"])
        return served(arr, axes)


class TestTiledPyramidOmeTiff(OmeFileTests):
    """CZYX uint16, tiled 64x64, deflate, two SubIFD levels (3 levels in all)."""

    def write(self, path):
        data = np.random.default_rng(0).integers(0, 4000, (2, 3, 200, 180), dtype=np.uint16)
        md = {
            "axes": "CZYX",
            "Name": "pyramid",
            "PhysicalSizeX": 0.5,
            "PhysicalSizeY": 0.5,
            "PhysicalSizeZ": 2.0,
            "Channel": {"Name": ["DAPI", "GFP"]},
        }
        with tifffile.TiffWriter(path) as tw:
            tw.write(data, subifds=2, tile=(64, 64), compression="zlib", photometric="minisblack", metadata=md)
            for f in (2, 4):
                tw.write(
                    data[..., ::f, ::f], subfiletype=1, tile=(64, 64), compression="zlib", photometric="minisblack"
                )

    def test_subifd_levels_match_tifffile(self, source):
        assert source.type == "ome-tiff" and list(source.tensors) == ["pyramid"]
        t = source.tensor()
        assert isinstance(inner(t), OmeTiffAdapter)
        assert t.dim_labels == ("c", "z", "y", "x") and t.shape == (2, 3, 200, 180)
        assert t.read_block_shape == (1, 1, 200, 180)  # the transfer chunk (a page) in whole tiles
        assert [lv.scale for lv in t.native_levels] == [(1, 1, 2, 2), (1, 1, 4, 4)]
        for i, lv in enumerate(t.native_levels, start=1):
            ref, axes = tifffile_series(source.path, 0, i)
            assert lv.tensor.shape == ref.shape
            np.testing.assert_array_equal(lv.tensor.get_data(), served(ref, axes))
            assert lv.tensor.read_block_shape == (1, 1) + ref.shape[2:]
        assert t.physical_scale == (None, 2.0, 0.5, 0.5)
        assert t.physical_unit == (None, "µm", "µm", "µm")
        assert t.native_levels[1].tensor.physical_scale == (None, 2.0, 2.0, 2.0)
        assert t.metadata["channel_names"] == ["DAPI", "GFP"]


class TestMultiImageOmeTiff(OmeFileTests):
    """Two OME images in one file (a TYX stack and an RGB image) -> two named tensors."""

    def write(self, path):
        rng = np.random.default_rng(1)
        with tifffile.TiffWriter(path, ome=True) as tw:
            tw.write(
                rng.integers(0, 255, (4, 30, 40), dtype=np.uint8),
                photometric="minisblack",
                metadata={"axes": "TYX", "Name": "timelapse", "TimeIncrement": 1.5},
            )
            tw.write(
                rng.integers(0, 255, (25, 35, 3), dtype=np.uint8),
                photometric="rgb",
                metadata={"axes": "YXS", "Name": "overview"},
            )

    def test_one_tensor_per_image(self, source):
        assert list(source.tensors) == ["timelapse", "overview"]
        a, b = source.tensors["timelapse"], source.tensors["overview"]
        assert a.dim_labels == ("t", "y", "x") and a.shape == (4, 30, 40)
        assert a.physical_scale[0] == 1.5 and a.physical_unit[0] == "s"
        assert a.read_block_shape == (1, 30, 40)
        assert b.dim_labels == ("y", "x", "s") and b.shape == (25, 35, 3)
        assert b.read_block_shape == (25, 35, 3)


class TestBigEndianBigTiffOme(OmeFileTests):
    """BigTIFF, big-endian, ZYX float32."""

    def write(self, path):
        data = np.random.default_rng(2).standard_normal((3, 33, 29)).astype(np.float32)
        tifffile.imwrite(path, data, bigtiff=True, byteorder=">", photometric="minisblack", metadata={"axes": "ZYX"})

    def test_detected_and_native(self, source):
        with open(source.path, "rb") as fh:
            assert fh.read(4) == b"MM\x00+"
        assert detect_format(source.path).name == "ome-tiff"
        t = source.tensor()
        assert t.dtype == np.dtype("float32") and t.get_data().dtype.isnative


# ---- hand-built multi-file set: BinaryOnly pointing at a master OME-TIFF ----------------------
def _write_master_set(folder: Path) -> np.ndarray:
    planes = np.random.default_rng(3).integers(0, 255, (2, 10, 20), dtype=np.uint8)
    pixels = (
        '<Pixels ID="Pixels:0" DimensionOrder="XYZCT" Type="uint8" SizeX="20" SizeY="10" SizeZ="2" '
        'SizeC="1" SizeT="1" PhysicalSizeX="0.3" PhysicalSizeY="0.3"><Channel ID="Channel:0:0" SamplesPerPixel="1"/>'
        '<TiffData FirstZ="0" IFD="0" PlaneCount="1"><UUID FileName="master.ome.tif">urn:uuid:aaaa</UUID></TiffData>'
        '<TiffData FirstZ="1" IFD="0" PlaneCount="1"><UUID FileName="part2.ome.tif">urn:uuid:bbbb</UUID></TiffData>'
        "</Pixels>"
    )
    ns = 'xmlns="http://www.openmicroscopy.org/Schemas/OME/2016-06"'
    master = (
        f'<?xml version="1.0"?><OME {ns} UUID="urn:uuid:aaaa"><Image ID="Image:0" Name="set">{pixels}</Image></OME>'
    )
    part = f'<?xml version="1.0"?><OME {ns} UUID="urn:uuid:bbbb"><BinaryOnly MetadataFile="master.ome.tif" UUID="urn:uuid:aaaa"/></OME>'
    tifffile.imwrite(folder / "master.ome.tif", planes[0], description=master, metadata=None, photometric="minisblack")
    tifffile.imwrite(folder / "part2.ome.tif", planes[1], description=part, metadata=None, photometric="minisblack")
    return planes


def test_binary_only_file_opens_its_master_set(tmp_path):
    planes = _write_master_set(tmp_path)
    root, omexml, meta = resolve_ome_set(tmp_path / "part2.ome.tif")
    assert root == tmp_path / "master.ome.tif" and omexml is None and meta == root
    for name in ("part2.ome.tif", "master.ome.tif"):
        with tensor_server.open(tmp_path / name) as src:
            t = src.tensor()
            assert t.shape == (2, 10, 20) and t.dim_labels == ("z", "y", "x")
            np.testing.assert_array_equal(t.get_data(), planes)
            assert t.physical_scale == (None, 0.3, 0.3)
            assert sorted(src.metadata["files"]) == ["master.ome.tif", "part2.ome.tif"]


# ---- real files ----------------------------------------------------------------------------------
REAL = [
    "ome-tiff/avivator_multi-channel.ome.tif",
    "ome-tiff/viv_fixture_multi-channel.ome.tif",
    "ome-tiff/s_1_t_1_c_1_z_1.ome.tiff",
]
MULTIFILE = [f"ome-tiff/multifile/multifile-Z{k}.ome.tiff" for k in range(1, 6)]


@pytest.mark.parametrize("name", REAL)
def test_real_files_match_expected(testdata, expected, name):
    assert detect_format(testdata / name).name == "ome-tiff"
    with tensor_server.open(testdata / name) as src:
        check_against_expected(src, expected[name])
        t = src.tensor()
        assert t.read_block_shape == (1,) * (t.ndim - 2) + t.shape[-2:]


@pytest.mark.parametrize("name", MULTIFILE + ["ome-tiff/multifile/multifile.companion.ome"])
def test_real_multifile_set_opens_whole(testdata, expected, name):
    """Any file of the set, or the companion, opens the whole (5,24,18) stack; each Z plane
    is the file expected.json describes."""
    assert detect_format(testdata / name).name == "ome-tiff"
    with tensor_server.open(testdata / name) as src:
        t = src.tensor()
        assert t.shape == (5, 24, 18) and t.dtype == np.uint8 and t.dim_labels == ("z", "y", "x")
        a = t.get_data()
        assert (int(a.min()), int(a.max()), float(a.sum(dtype=np.float64))) == (0, 255, 314466.0)
        for k, plane_file in enumerate(MULTIFILE):
            exp = expected[plane_file]["series"][0]
            assert float(a[k].sum(dtype=np.float64)) == exp["sum"]
            assert int(a[k].max()) == exp["max"]
        assert src.metadata["companion"] == "multifile.companion.ome"
        assert sorted(src.metadata["files"]) == sorted([Path(m).name for m in MULTIFILE] + ["multifile.companion.ome"])


def test_multifile_content_version_covers_every_file(testdata, tmp_path):
    folder = tmp_path / "set"
    shutil.copytree(testdata / "ome-tiff/multifile", folder)
    for f in folder.iterdir():
        f.chmod(0o644)
    with tensor_server.open(folder / "multifile-Z1.ome.tiff") as src:
        before = src.tensor().content_version
    st = (folder / "multifile-Z4.ome.tiff").stat()
    os.utime(folder / "multifile-Z4.ome.tiff", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with tensor_server.open(folder / "multifile-Z1.ome.tiff") as src:
        after = src.tensor().content_version
    assert before != after
    os.utime(folder / "multifile.companion.ome", ns=(st.st_atime_ns, st.st_mtime_ns + 5 * 10**9))
    with tensor_server.open(folder / "multifile-Z1.ome.tiff") as src:
        assert src.tensor().content_version not in (before, after)


def test_binary_only_without_its_metadata_file_opens_alone(testdata, tmp_path):
    lone = tmp_path / "multifile-Z3.ome.tiff"
    shutil.copy(testdata / "ome-tiff/multifile/multifile-Z3.ome.tiff", lone)
    with tensor_server.open(lone) as src:
        t = src.tensor()
        assert t.shape == (24, 18) and float(t.get_data().sum(dtype=np.float64)) == 93330.0


def test_real_physical_scale(testdata):
    with tensor_server.open(testdata / "ome-tiff/s_1_t_1_c_1_z_1.ome.tiff") as src:
        t = src.tensor()
        assert t.physical_scale == pytest.approx((1.0833333, 1.0833333))
        assert t.physical_unit == ("µm", "µm")


def test_cross_format_identities(testdata):
    pairs = [
        ("tiff/s_1_t_1_c_1_z_1.tiff", "ome-tiff/s_1_t_1_c_1_z_1.ome.tiff"),
        ("ome-tiff/viv_fixture_multi-channel.ome.tif", "ome-tiff/avivator_multi-channel.ome.tif"),
    ]
    for left, right in pairs:
        with tensor_server.open(testdata / left) as a, tensor_server.open(testdata / right) as b:
            ta, tb = a.tensor(), b.tensor()
            assert ta.dim_labels == tb.dim_labels
            np.testing.assert_array_equal(ta.get_data(), tb.get_data())


def test_sniff_finds_ome_xml_beyond_the_head(testdata):
    """Both real Bio-Formats files keep the OME-XML far beyond the first 4 KiB (one of them
    big-endian): the IFD walk finds it; a plain TIFF is not claimed."""
    for name in ("ome-tiff/avivator_multi-channel.ome.tif", "ome-tiff/s_1_t_1_c_1_z_1.ome.tiff"):
        path = testdata / name
        head = path.read_bytes()[:4096]
        assert b"<OME" not in head
        assert first_description_tail(path, head).endswith(b"OME>")
    assert detect_format(testdata / "tiff/s_1_t_1_c_1_z_1.tiff").name == "tiff"
    assert detect_format(testdata / "tiff-pyramid/boxes.tiff").name == "tiff"


# ---- bad input ----------------------------------------------------------------------------------
def test_truncated_ome_tiff_is_unreadable(testdata, tmp_path):
    """Cut inside the pixel strips (they end at byte 271736; ~1 MB of OME-XML follows them,
    so a cut after the strips leaves a readable TIFF without its OME metadata)."""
    raw = (testdata / "ome-tiff/s_1_t_1_c_1_z_1.ome.tiff").read_bytes()
    bad = tmp_path / "cut.ome.tiff"
    bad.write_bytes(raw[:200_000])
    with pytest.raises(UnreadableSource) as info:

        def attempt():
            with tensor_server.open(bad) as src:
                src.tensor().get_data()

        finishes_within(attempt)
    assert str(bad) in str(info.value)


def test_companion_naming_missing_files_is_unreadable(testdata, tmp_path):
    companion = tmp_path / "multifile.companion.ome"
    shutil.copy(testdata / "ome-tiff/multifile/multifile.companion.ome", companion)
    with pytest.raises(UnreadableSource) as info:
        finishes_within(lambda: tensor_server.open(companion))
    assert str(companion) in str(info.value)
    assert "multifile-Z1.ome.tiff" in info.value.reason


def test_companion_sniffed_by_content(testdata, tmp_path):
    """A companion under another name is recognised by its XML (TiffData naming files); an
    OME-XML naming no file (bioformats2raw's METADATA.ome.xml) is not claimed."""
    folder = tmp_path / "set"
    shutil.copytree(testdata / "ome-tiff/multifile", folder)
    renamed = folder / "dataset.xml"
    (folder / "multifile.companion.ome").rename(renamed)
    assert detect_format(renamed).name == "ome-tiff"
    with tensor_server.open(renamed) as src:
        assert src.tensor().shape == (5, 24, 18)
    b2r = testdata / "ome-zarr/bioformats2raw-v0.1-zarr2/METADATA.ome.xml"
    try:
        name = detect_format(b2r).name
    except UnreadableSource:
        name = None
    assert name != "ome-tiff"
