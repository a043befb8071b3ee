"""TIFF family (tensor_server/adapters/tiff.py and its page-series reader _tiff_series.py):
plain, stripped multi-page, big-endian, tiled RGB pyramid, multi-series, QPTIFF and LSM files
generated with tifffile, the real samples in ../shared/testdata/tiff and tiff-pyramid, read
granularity, handles and bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensor_server
from tensor_server.adapters._tiff_series import TiffPageSeriesAdapter, level_scale, tiff_dim_labels
from tensor_server.adapters.registry import detect_format
from tensor_server.adapters.tiff import LsmAdapter, TiffAdapter, first_description_tail
from tensor_server.core.bounds import Bounds
from tensor_server.core.normalizing import NormalizingAdapter, canonical_axis_order
from tensor_server.errors import UnreadableSource
from tensor_server.testing import AdapterTests, finishes_within

tifffile = pytest.importorskip("tifffile")


# ---- helpers shared with ome_tiff_test ---------------------------------------------------------
def served_order(axes: str) -> tuple[int, ...]:
    """Permutation from tifffile's axis order to the served (canonical) order."""
    return canonical_axis_order(tiff_dim_labels(axes))


def served(arr: np.ndarray, axes: str) -> np.ndarray:
    """A tifffile-order array in the served order."""
    return np.transpose(np.asarray(arr), served_order(axes))


def tifffile_series(path: Path, index: int, level: int = 0, **kwargs: Any) -> tuple[np.ndarray, str]:
    """tifffile's own read of one series level, and its axes."""
    with tifffile.TiffFile(path, **kwargs) as tf:
        s = tf.series[index].levels[level]
        return s.asarray(), s.axes


def inner(tensor):
    """The native adapter under a NormalizingAdapter."""
    return tensor.inner if isinstance(tensor, NormalizingAdapter) else tensor


class TiffFileTests(AdapterTests):
    """AdapterTests over a generated file: reference = tifffile's own read of each series in
    the served order (fields map to series through tensor metadata)."""

    def write(self, path: Path) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    filename = "data.tif"

    @pytest.fixture
    def source(self, tmp_path):
        path = tmp_path / self.filename
        self.write(path)
        src = tensor_server.open(path)
        yield src
        src.close()

    def reference_array(self, source, field):
        index = source.tensors[field].metadata["series"]
        arr, axes = tifffile_series(source.path, index)
        return served(arr, axes)


# ---- generated files -----------------------------------------------------------------------------
class TestStrippedMultipageTiff(TiffFileTests):
    """Uncompressed, 16 rows per strip, 5 pages: tifffile's shaped series QYX."""

    def write(self, path):
        data = np.random.default_rng(0).integers(0, 60000, (5, 70, 90), dtype=np.uint16)
        tifffile.imwrite(path, data, photometric="minisblack", rowsperstrip=16)

    def test_one_page_is_the_block(self, source):
        t = source.tensor()
        assert t.dim_labels == ("q", "y", "x")
        assert t.read_block_shape == (1, 70, 90)
        assert isinstance(inner(t), TiffAdapter) and inner(t).chunkmode == 2
        assert source.type == "tiff"


class TestBigEndianTiff(TiffFileTests):
    """Big-endian (MM) file, deflate, int16 with negative values: served native-endian."""

    def write(self, path):
        data = np.random.default_rng(1).integers(-30000, 30000, (3, 41, 57), dtype=np.int16)
        tifffile.imwrite(path, data, byteorder=">", photometric="minisblack", compression="zlib")

    def test_declares_native_dtype(self, source):
        with open(source.path, "rb") as fh:
            assert fh.read(4) == b"MM\x00*"
        t = source.tensor()
        assert t.dtype == np.dtype("int16") and t.dtype.byteorder in ("=", "|")
        with tifffile.TiffFile(source.path) as tf:
            ref = tf.series[0].asarray()
        got = t.get_data()
        assert got.dtype.isnative and got.min() < 0
        np.testing.assert_array_equal(got, ref)


class TestRgbTiledPyramidTiff(TiffFileTests):
    """RGB (YXS) tiled 64x64, deflate, with two reduced IFDs: a plain (non-OME) pyramid."""

    def write(self, path):
        rng = np.random.default_rng(2)
        data = rng.integers(0, 255, (200, 150, 3), dtype=np.uint8)
        with tifffile.TiffWriter(path) as tw:
            tw.write(
                data,
                photometric="rgb",
                tile=(64, 64),
                compression="zlib",
                resolution=(2.0, 2.0),
                resolutionunit="CENTIMETER",
            )
            for f in (2, 4):
                tw.write(data[::f, ::f], photometric="rgb", tile=(64, 64), compression="zlib", subfiletype=1)

    def test_levels_match_tifffile(self, source):
        t = source.tensor()
        assert t.dim_labels == ("y", "x", "s")
        assert t.read_block_shape == (200, 150, 3)  # the transfer chunk (the page) in whole tiles
        assert [lv.scale for lv in t.native_levels] == [(2, 2, 1), (4, 4, 1)]
        for i, lv in enumerate(t.native_levels, start=1):
            ref, axes = tifffile_series(source.path, 0, i)
            np.testing.assert_array_equal(lv.tensor.get_data(), served(ref, axes))
            assert lv.tensor.physical_scale[0] == pytest.approx(t.physical_scale[0] * lv.scale[0])
        # precompute reads go through the stored level (bounds in the level's coordinates)
        b = Bounds((5, 10, 0), (45, 75, 3))
        got = t.native_level((2, 2, 1)).tensor.get_data(b)
        ref, axes = tifffile_series(source.path, 0, 1)
        np.testing.assert_array_equal(got, served(ref, axes)[5:45, 10:75])

    def test_physical_scale_from_metric_resolution(self, source):
        t = source.tensor()
        # 2 pixels per cm -> 5000 µm per pixel
        assert t.physical_scale[:2] == pytest.approx((5000.0, 5000.0))
        assert t.physical_unit[:2] == ("µm", "µm") and t.physical_unit[2] is None


class TestMultiSeriesTiff(TiffFileTests):
    """Two shaped series of different shape and dtype in one file -> two tensors."""

    def write(self, path):
        rng = np.random.default_rng(3)
        with tifffile.TiffWriter(path) as tw:
            tw.write(rng.integers(0, 4000, (4, 33, 47), dtype=np.uint16), photometric="minisblack")
            tw.write(rng.standard_normal((2, 3, 20, 30)).astype(np.float32), photometric="minisblack")

    def test_one_tensor_per_series(self, source):
        assert list(source.tensors) == ["series_0", "series_1"]
        a, b = source.tensors.values()
        assert a.shape == (4, 33, 47) and a.dtype == np.uint16
        assert b.shape == (2, 3, 20, 30) and b.dtype == np.float32
        assert a.array_id == f"{source.source_id}/series_0"


class TestQptiff(TiffFileTests):
    """PerkinElmer QPI layout: 3 tiled channel pages, a thumbnail, then two half-size levels.
    No real QPTIFF sample exists (SOURCES.md gaps); this is tifffile's reading of the layout."""

    filename = "slide.qptiff"

    def write(self, path):
        rng = np.random.default_rng(4)
        data = rng.integers(0, 4000, (3, 128, 192), dtype=np.uint16)
        desc = (
            "<?xml version='1.0'?><PerkinElmer-QPI-ImageDescription><Name>c{}</Name></PerkinElmer-QPI-ImageDescription>"
        )
        kw = dict(software="PerkinElmer-QPI", photometric="minisblack", metadata=None)
        with tifffile.TiffWriter(path) as tw:
            for c in range(3):
                tw.write(data[c], tile=(64, 64), compression="zlib", description=desc.format(c), **kw)
            tw.write(data[0, ::8, ::8].astype(np.uint16), subfiletype=1, **kw)  # thumbnail
            for f in (2, 4):
                for c in range(3):
                    tw.write(data[c, ::f, ::f], tile=(64, 64), subfiletype=1, compression="zlib", **kw)

    def test_qpi_levels(self, source):
        assert source.type == "qptiff"
        assert list(source.tensors) == ["Baseline", "Thumbnail"]
        t = source.tensor()
        assert t.dim_labels == ("c", "y", "x") and t.shape == (3, 128, 192)
        assert t.read_block_shape == (1, 128, 192)
        assert [lv.scale for lv in t.native_levels] == [(1, 2, 2), (1, 4, 4)]
        ref, axes = tifffile_series(source.path, 0, 2)
        np.testing.assert_array_equal(t.native_levels[1].tensor.get_data(), served(ref, axes))


def write_lsm(path: Path, data: np.ndarray, voxel_m: tuple[float, float, float]) -> None:
    """A Zeiss LSM layout written with tifffile: CZ_LSMINFO (LSM 2.0 record) in the first IFD,
    data pages (planar channels) interleaved with reduced RGB thumbnail pages. tifffile cannot
    write LSM itself; this is the structure its LSM reader expects. Three channels, because
    tifffile applies an LSM quirk fix to a two-value BitsPerSample written inline."""
    z, c, y, x = data.shape
    fields = tifffile.TIFF.CZ_LSMINFO
    cut = [n for n, _ in fields].index("OffsetNextRecording") + 1
    rec = np.zeros((), np.dtype([(n, "<" + t) for n, t in fields[:cut]]))
    rec["MagicNumber"], rec["StructureSize"] = 67127628, rec.dtype.itemsize
    rec["DimensionX"], rec["DimensionY"], rec["DimensionZ"] = x, y, z
    rec["DimensionChannels"], rec["DimensionTime"], rec["DataType"] = c, 1, 2
    rec["ThumbnailX"], rec["ThumbnailY"] = x // 2, y // 2
    rec["VoxelSizeX"], rec["VoxelSizeY"], rec["VoxelSizeZ"] = voxel_m
    rec["ScanType"] = 0  # ZCYX stack
    blob = rec.tobytes()
    with tifffile.TiffWriter(path) as tw:
        for k in range(z):
            tags = [(34412, 1, len(blob), blob, True)] if k == 0 else []
            tw.write(data[k], photometric="minisblack", planarconfig="separate", extratags=tags, metadata=None)
            thumb = np.stack([data[k, 0, ::2, ::2] >> 4] * 3, -1).astype(np.uint8)
            tw.write(thumb, photometric="rgb", subfiletype=1, metadata=None)


class TestLsm(TiffFileTests):
    filename = "stack.lsm"

    def write(self, path):
        data = np.random.default_rng(5).integers(0, 4000, (4, 3, 40, 50), dtype=np.uint16)
        write_lsm(path, data, (0.2e-6, 0.25e-6, 1e-6))

    def test_lsm_axes_scale_and_block(self, source):
        assert source.type == "lsm"
        t = source.tensor()
        assert isinstance(inner(t), LsmAdapter)
        assert inner(t).axes == "ZCYX"
        assert t.dim_labels == ("c", "z", "y", "x") and t.shape == (3, 4, 40, 50)
        assert t.read_block_shape == (3, 1, 40, 50)  # one page = one plane with all channels
        assert t.physical_scale[0] is None
        assert t.physical_scale[1:] == pytest.approx((1.0, 0.25, 0.2))
        assert t.physical_unit[1:] == ("µm", "µm", "µm")
        thumbs = source.tensors["series_1"]
        assert thumbs.dim_labels == ("z", "y", "x", "s") and thumbs.physical_scale is None


# ---- read granularity ----------------------------------------------------------------------------
class _StoreGetCounter:
    """Counts ZarrTiffStore.get calls per chunk key (each one decodes a page in page mode)."""

    def __init__(self, monkeypatch):
        from tifffile.zarr import ZarrTiffStore

        self.keys: list[str] = []
        original = ZarrTiffStore.get

        async def counting_get(store, key, *args, **kwargs):
            if not key.endswith((".zarray", ".zattrs", ".zgroup", "zarr.json")):
                self.keys.append(key)
            return await original(store, key, *args, **kwargs)

        monkeypatch.setattr(ZarrTiffStore, "get", counting_get)


def test_scaled_read_decodes_each_page_once(tmp_path, monkeypatch):
    """A page bigger than the transfer chunk: the grid divides it, but the streaming unit is
    floored at the page, so a scaled read of the page decodes it once (unfloored: several)."""
    y = np.arange(3000, dtype=np.uint16)[:, None]
    data = np.stack([(y * 7 + np.arange(3000, dtype=np.uint16)[None, :] + k) for k in range(2)])
    path = tmp_path / "big.tif"
    tifffile.imwrite(path, data, photometric="minisblack")
    with tensor_server.open(path) as src:
        t = src.tensor()
        assert t.read_block_shape == (1, 3000, 3000)
        assert t.chunk_shape[1] * t.chunk_shape[2] < 3000 * 3000, "the grid should divide a 18 MB page"
        counter = _StoreGetCounter(monkeypatch)
        b = Bounds((0, 0, 0), (2, 3000, 3000))
        got = t.get_scaled_data(b, (1, 2, 2), "area")
        assert sorted(counter.keys) == ["0.0.0", "1.0.0"]  # one decode per page
        from tensor_server.core.downsample import downsample_block

        np.testing.assert_array_equal(got, downsample_block(data, (1, 2, 2), "area"))
        # the same read without the floor decodes each page once per unit: the count can fail
        counter.keys.clear()
        monkeypatch.setattr(TiffAdapter, "read_block_shape", property(lambda self: None))
        t.get_scaled_data(b, (1, 2, 2), "area")
        assert len(counter.keys) > 2


def test_huge_tiled_page_reads_by_tile(tmp_path, monkeypatch):
    """Above page_mode_max_bytes a tiled page is read tile by tile (strile mode)."""
    data = np.random.default_rng(6).integers(0, 255, (150, 200), dtype=np.uint8)
    path = tmp_path / "tiled.tif"
    tifffile.imwrite(path, data, tile=(64, 64), photometric="minisblack", compression="zlib")
    monkeypatch.setattr(TiffPageSeriesAdapter, "page_mode_max_bytes", 1000)
    with tensor_server.open(path) as src:
        t = src.tensor()
        assert inner(t).chunkmode == 0
        assert t.read_block_shape == t.chunk_shape  # the transfer chunk in whole tiles: reads cost their tiles
        np.testing.assert_array_equal(t.get_data(Bounds((30, 70), (140, 199))), data[30:140, 70:199])


def test_handle_reopens_after_idle_close(tmp_path):
    data = np.random.default_rng(7).integers(0, 255, (3, 20, 30), dtype=np.uint8)
    path = tmp_path / "stack.tif"
    tifffile.imwrite(path, data, photometric="minisblack")
    with tensor_server.open(path) as src:
        t = src.tensor()
        handle = inner(t).handle
        np.testing.assert_array_equal(t.get_data(), data)
        assert handle.opens == 1
        assert handle._lazy.close_if_idle(now=1e18)  # the reaper's view: idle for ages
        assert not handle.is_open
        np.testing.assert_array_equal(t.get_data(), data)
        assert handle.opens == 2


# ---- helpers -----------------------------------------------------------------------------------
def test_dim_labels_are_distinct_lower_case():
    assert tiff_dim_labels("TCZYX") == ("t", "c", "z", "y", "x")
    assert tiff_dim_labels("QYX") == ("q", "y", "x")
    assert tiff_dim_labels("IYXS") == ("i", "y", "x", "s")
    assert tiff_dim_labels("RTZCYX") == ("p", "t", "z", "c", "y", "x")
    assert tiff_dim_labels("RPYX") == ("p", "phase", "y", "x")  # P (phase) collides with R's p


def test_level_scale():
    assert level_scale((250, 300, 3), (62, 75, 3)) == (4, 4, 1)
    assert level_scale((250, 300, 3), (31, 37, 3)) == (8, 8, 1)
    assert level_scale((100, 100), (40, 40)) is None  # 2.5x is not an integer reduction
    assert level_scale((3, 100), (2, 50)) == (2, 2)  # ceil(3 / 2) == 2 is a valid reduction
    assert level_scale((3, 100), (3, 40)) is None


# ---- real files ----------------------------------------------------------------------------------
REAL = ["tiff/stuck.tif", "tiff/s_1_t_1_c_1_z_1.tiff", "tiff-pyramid/boxes.tiff", "tiff-pyramid/small.svs"]


def check_against_expected(src, want: dict, jpeg: bool = False) -> None:
    """Each expected series matches a tensor: shape in served order, dtype, min, max, sum."""
    tensors = list(src.tensors.values())
    assert len(tensors) == len(want["series"])
    for t, exp in zip(tensors, want["series"]):
        order = served_order(exp["axes"])
        assert t.shape == tuple(exp["shape"][i] for i in order)
        assert t.dtype == np.dtype(exp["dtype"])
        a = t.get_data()
        if jpeg:  # decoder-dependent: tolerance
            assert abs(float(a.sum(dtype=np.float64)) - exp["sum"]) <= 0.01 * exp["sum"]
            assert abs(int(a.min()) - exp["min"]) <= 8 and abs(int(a.max()) - exp["max"]) <= 8
        else:
            assert (a.min(), a.max(), float(a.sum(dtype=np.float64))) == (exp["min"], exp["max"], exp["sum"])


@pytest.mark.parametrize("name", REAL)
def test_real_files_match_expected(testdata, expected, name):
    with tensor_server.open(testdata / name) as src:
        assert detect_format(testdata / name).name == "tiff"
        check_against_expected(src, expected[name], jpeg=name.endswith(".svs"))


def test_real_boxes_pyramid_levels(testdata, expected):
    path = testdata / "tiff-pyramid/boxes.tiff"
    with tensor_server.open(path) as src:
        t = src.tensor()
        levels = expected["tiff-pyramid/boxes.tiff"]["series"][0]["levels"]
        assert [lv.tensor.shape for lv in t.native_levels] == [tuple(s) for s in levels[1:]]
        assert [lv.scale for lv in t.native_levels] == [(2, 2, 1), (4, 4, 1), (8, 8, 1)]
        for i, lv in enumerate(t.native_levels, start=1):
            ref, axes = tifffile_series(path, 0, i)
            np.testing.assert_array_equal(lv.tensor.get_data(), served(ref, axes))
        assert t.read_block_shape == (250, 300, 3)


def test_real_svs_fields_and_scale(testdata):
    with tensor_server.open(testdata / "tiff-pyramid/small.svs") as src:
        assert src.type == "svs" and list(src.tensors) == ["Baseline", "Thumbnail"]
        base = src.tensors["Baseline"]
        assert base.physical_scale[:2] == pytest.approx((0.499, 0.499))
        assert src.tensors["Thumbnail"].physical_scale is None  # MPP describes the baseline only


def test_real_imagej_scale(testdata):
    with tensor_server.open(testdata / "tiff/s_1_t_1_c_1_z_1.tiff") as src:
        assert src.type == "imagej"
        t = src.tensor()
        assert t.physical_scale == pytest.approx((1.0833, 1.0833), rel=1e-3)
        assert t.physical_unit == ("µm", "µm")


def test_real_stack_block_is_one_page(testdata):
    with tensor_server.open(testdata / "tiff/stuck.tif") as src:
        t = src.tensor()
        assert t.dim_labels == ("q", "y", "x") and t.read_block_shape == (1, 512, 512)


# ---- detection and bad input -------------------------------------------------------------------
def test_sniff_and_description_probe(tmp_path):
    data = np.zeros((8, 8), np.uint8)
    plain = tmp_path / "plain.dat"
    tifffile.imwrite(plain, data, description="hello world")
    assert detect_format(plain).name == "tiff"  # by content, whatever the extension
    head = plain.read_bytes()[:4096]
    assert first_description_tail(plain, head) == b"hello world"
    big = tmp_path / "big.bin"
    tifffile.imwrite(big, data, bigtiff=True, description="x" * 5000 + "tail")
    assert detect_format(big).name == "tiff"
    assert first_description_tail(big, big.read_bytes()[:4096]).endswith(b"xxtail")


def _truncate(src: Path, dst: Path, keep: int) -> Path:
    dst.write_bytes(src.read_bytes()[:keep])
    return dst


def _assert_unreadable(path: Path, read: bool = True) -> UnreadableSource:
    def attempt():
        with tensor_server.open(path) as src:
            if read:
                for t in src.tensors.values():
                    t.get_data()

    with pytest.raises(UnreadableSource) as info:
        finishes_within(attempt)
    assert str(path) in str(info.value)
    return info.value


def test_truncated_stack_is_unreadable(tmp_path):
    good = tmp_path / "good.tif"
    tifffile.imwrite(good, np.ones((3, 100, 120), np.uint16), photometric="minisblack")
    bad = _truncate(good, tmp_path / "half.tif", good.stat().st_size // 2)
    err = _assert_unreadable(bad, read=False)  # caught at open: the data runs past the end
    assert "truncated" in err.reason


def test_truncated_tiled_compressed_is_unreadable(tmp_path):
    good = tmp_path / "good.tif"
    data = np.random.default_rng(8).integers(0, 60000, (100, 120), dtype=np.uint16)
    tifffile.imwrite(good, data, tile=(32, 32), compression="zlib", photometric="minisblack")
    _assert_unreadable(_truncate(good, tmp_path / "cut.tif", good.stat().st_size - 300))
    _assert_unreadable(_truncate(good, tmp_path / "head.tif", 100))


def test_broken_ifd_offset_is_unreadable(tmp_path):
    good = tmp_path / "good.tif"
    tifffile.imwrite(good, np.ones((20, 30), np.uint8), photometric="minisblack")
    raw = bytearray(good.read_bytes())
    for name, offset in (("far.tif", 10**9), ("odd.tif", 9)):
        raw[4:8] = offset.to_bytes(4, "little")
        bad = tmp_path / name
        bad.write_bytes(bytes(raw))
        _assert_unreadable(bad)


def test_random_bytes_with_tif_extension(tmp_path):
    bad = tmp_path / "noise.tif"
    bad.write_bytes(np.random.default_rng(9).integers(0, 255, 5000, dtype=np.uint8).tobytes())
    _assert_unreadable(bad)
    magic = tmp_path / "magic_noise.tif"
    magic.write_bytes(b"II*\x00" + bad.read_bytes())
    _assert_unreadable(magic)


def test_corrupt_tile_found_at_read_time(tmp_path):
    """A tile whose bytes are garbage (file length intact): the open succeeds, the read raises
    UnreadableSource naming the path."""
    good = tmp_path / "good.tif"
    data = np.random.default_rng(10).integers(0, 60000, (128, 128), dtype=np.uint16)
    tifffile.imwrite(good, data, tile=(64, 64), compression="zlib", photometric="minisblack")
    with tifffile.TiffFile(good) as tf:
        off, n = tf.pages.first.dataoffsets[3], tf.pages.first.databytecounts[3]
    raw = bytearray(good.read_bytes())
    raw[off : off + n] = b"\xff" * n
    bad = tmp_path / "corrupt.tif"
    bad.write_bytes(bytes(raw))
    with tensor_server.open(bad) as src:
        with pytest.raises(UnreadableSource) as info:
            finishes_within(lambda: src.tensor().get_data())
        assert str(bad) in str(info.value)
