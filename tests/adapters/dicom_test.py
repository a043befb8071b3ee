"""DICOM adapters (pydicom): single and multi-frame files, a shuffled CT series folder, whole-slide
levels (TILED_FULL / TILED_SPARSE, native levels), rescale, frame skipping, real samples, bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import tensor_server
from tensor_server.adapters.dicom import DicomAdapter, DicomSeriesAdapter, sniff_dicom_folder
from tensor_server.core.bounds import Bounds
from tensor_server.errors import UnreadableSource
from tensor_server.testing import AdapterTests

pydicom = pytest.importorskip("pydicom")
from pydicom.dataset import Dataset, FileMetaDataset  # noqa: E402
from pydicom.pixels import apply_modality_lut, set_pixel_data  # noqa: E402
from pydicom.uid import ExplicitVRLittleEndian, generate_uid  # noqa: E402

CT_IMAGE = "1.2.840.10008.5.1.4.1.1.2"
SC_MULTIFRAME = "1.2.840.10008.5.1.4.1.1.7.3"  # Multi-frame Grayscale Word Secondary Capture
WSI = "1.2.840.10008.5.1.4.1.1.77.1.6"


def inner(tensor):
    return getattr(tensor, "inner", tensor)


# ---- writers ---------------------------------------------------------------------------------
def _dataset(
    sop_class: str, arr: np.ndarray, photometric: str = "MONOCHROME2", bits: int | None = None, **attrs
) -> Dataset:
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = sop_class
    ds.SOPClassUID = sop_class
    ds.Modality = attrs.pop("Modality", "OT")
    for key, value in attrs.items():
        setattr(ds, key, value)
    set_pixel_data(ds, arr, photometric, bits or arr.dtype.itemsize * 8)
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    return ds


def _save(ds: Dataset, path: Path) -> Path:
    ds.save_as(path, enforce_file_format=True)
    return path


def write_ct_series(folder: Path, n: int = 8, seed: int = 0, with_positions: bool = True) -> list[np.ndarray]:
    """``n`` int16 slices, RescaleIntercept -1024 and slope 1 (slice 3: slope 2), written under
    shuffled file names with shuffled InstanceNumbers; returns the raw slices in z order."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    series = generate_uid()
    slices = [rng.integers(0, 3000, (24, 20), dtype=np.int16) for _ in range(n)]
    names = rng.permutation(n)
    instances = rng.permutation(n) + 1
    for k, raw in enumerate(slices):
        attrs = dict(
            Modality="CT",
            SeriesInstanceUID=series,
            SeriesNumber=3,
            InstanceNumber=int(instances[k]),
            RescaleSlope=2 if k == 3 else 1,
            RescaleIntercept=-1024,
            PixelSpacing=[0.7, 0.6],
            SliceThickness=2.5,
        )
        if with_positions:
            attrs.update(ImageOrientationPatient=[1, 0, 0, 0, 1, 0], ImagePositionPatient=[-10, 5, 40 + 2.5 * k])
        _save(_dataset(CT_IMAGE, raw, **attrs), folder / f"IM{names[k]:04d}")
    if not with_positions:  # without positions the instance number is the order
        order = np.argsort(instances)
        return [slices[i] for i in order]
    return slices


def write_multiframe(path: Path, frames: np.ndarray, **attrs) -> Path:
    return _save(_dataset(SC_MULTIFRAME, frames, **attrs), path)


def write_wsi(
    path: Path,
    image: np.ndarray,
    tile: int,
    *,
    flavour: str = "VOLUME",
    sparse_missing: tuple | None = None,
    series: str | None = None,
    spacing: float = 0.0005,
) -> Path:
    """A VL WSI instance of ``image`` ((planes,) H, W, 3 uint8), TILED_FULL (tiles row-major,
    then focal planes) or, with ``sparse_missing=(plane, ty, tx)``, TILED_SPARSE without that tile."""
    planes = image if image.ndim == 4 else image[None]
    nz, H, W, _ = planes.shape
    nty, ntx = -(-H // tile), -(-W // tile)
    frames, positions = [], []
    for z in range(nz):
        for ty in range(nty):
            for tx in range(ntx):
                if sparse_missing == (z, ty, tx):
                    continue
                t = np.zeros((tile, tile, 3), np.uint8)
                part = planes[z, ty * tile : (ty + 1) * tile, tx * tile : (tx + 1) * tile]
                t[: part.shape[0], : part.shape[1]] = part
                frames.append(t)
                positions.append((z, ty * tile + 1, tx * tile + 1))
    ds = _dataset(
        WSI,
        np.stack(frames),
        "RGB",
        Modality="SM",
        SeriesInstanceUID=series or generate_uid(),
        ImageType=["DERIVED", "PRIMARY", flavour, "NONE"],
        TotalPixelMatrixRows=H,
        TotalPixelMatrixColumns=W,
        TotalPixelMatrixFocalPlanes=nz,
        NumberOfOpticalPaths=1,
        DimensionOrganizationType="TILED_SPARSE" if sparse_missing else "TILED_FULL",
    )
    measures = Dataset()
    measures.PixelSpacing = [spacing, spacing]
    shared = Dataset()
    shared.PixelMeasuresSequence = [measures]
    ds.SharedFunctionalGroupsSequence = [shared]
    if sparse_missing:
        per = []
        for z, r, c in positions:
            pos = Dataset()
            pos.RowPositionInTotalImagePixelMatrix = r
            pos.ColumnPositionInTotalImagePixelMatrix = c
            pos.ZOffsetInSlideCoordinateSystem = float(z)
            item = Dataset()
            item.PlanePositionSlideSequence = [pos]
            per.append(item)
        ds.PerFrameFunctionalGroupsSequence = per
    return _save(ds, path)


# ---- references read with pydicom ------------------------------------------------------------
def _modality(ds) -> np.ndarray:
    arr = ds.pixel_array
    if "RescaleSlope" in ds or "RescaleIntercept" in ds:
        return apply_modality_lut(arr, ds)
    return arr


def pydicom_series(folder: Path, served_dtype) -> np.ndarray:
    datasets = [pydicom.dcmread(p) for p in sorted(folder.iterdir()) if p.is_file()]
    if all("ImagePositionPatient" in d for d in datasets):
        datasets.sort(key=lambda d: float(d.ImagePositionPatient[2]))
    else:
        datasets.sort(key=lambda d: int(d.InstanceNumber))
    return np.stack([_modality(d) for d in datasets]).astype(served_dtype)


def pydicom_wsi(path: Path) -> np.ndarray:
    """Compose the total pixel matrix from pydicom's decoded frames (independent of the adapter)."""
    ds = pydicom.dcmread(path)
    frames = ds.pixel_array.reshape((-1, ds.Rows, ds.Columns, 3))
    H, W, th, tw = ds.TotalPixelMatrixRows, ds.TotalPixelMatrixColumns, ds.Rows, ds.Columns
    nz = int(ds.get("TotalPixelMatrixFocalPlanes", 1))
    out = np.zeros((nz, -(-H // th) * th, -(-W // tw) * tw, 3), np.uint8)
    if ds.DimensionOrganizationType == "TILED_FULL":
        k = 0
        for z in range(nz):
            for r in range(0, H, th):
                for c in range(0, W, tw):
                    out[z, r : r + th, c : c + tw] = frames[k]
                    k += 1
    else:
        zs = sorted(
            {
                float(f.PlanePositionSlideSequence[0].ZOffsetInSlideCoordinateSystem)
                for f in ds.PerFrameFunctionalGroupsSequence
            }
        )
        for k, item in enumerate(ds.PerFrameFunctionalGroupsSequence):
            p = item.PlanePositionSlideSequence[0]
            r, c = p.RowPositionInTotalImagePixelMatrix - 1, p.ColumnPositionInTotalImagePixelMatrix - 1
            out[zs.index(float(p.ZOffsetInSlideCoordinateSystem)), r : r + th, c : c + tw] = frames[k]
    out = out[:, :H, :W]
    return out if nz > 1 else out[0]


# ---- generated fixtures through the conformance suite ------------------------------------------
def _fixture(kind: str, tmp_path: Path) -> Path:
    rng = np.random.default_rng(11)
    if kind == "ct_series":
        write_ct_series(tmp_path / "ct")
        return tmp_path / "ct"
    if kind == "series_by_instance":
        write_ct_series(tmp_path / "noipp", n=5, seed=4, with_positions=False)
        return tmp_path / "noipp"
    if kind == "multiframe_uint16":
        return write_multiframe(
            tmp_path / "mf.dcm", rng.integers(0, 65535, (7, 30, 26), dtype=np.uint16), FrameTime=40.0
        )
    if kind == "single_ct":
        raw = rng.integers(-100, 2000, (33, 41), dtype=np.int16)
        return _save(
            _dataset(CT_IMAGE, raw, Modality="CT", RescaleSlope=1, RescaleIntercept=-1024, PixelSpacing=[0.5, 0.5]),
            tmp_path / "ct.dcm",
        )
    if kind == "wsi_full":
        return write_wsi(tmp_path / "full.dcm", rng.integers(0, 255, (70, 90, 3), dtype=np.uint8), 32)
    if kind == "wsi_sparse_2planes":
        return write_wsi(
            tmp_path / "sparse.dcm", rng.integers(0, 255, (2, 50, 45, 3), dtype=np.uint8), 16, sparse_missing=(1, 1, 2)
        )
    raise KeyError(kind)


class TestDicomGenerated(AdapterTests):
    @pytest.fixture(
        params=["ct_series", "series_by_instance", "multiframe_uint16", "single_ct", "wsi_full", "wsi_sparse_2planes"]
    )
    def source(self, request, tmp_path):
        src = tensor_server.open(_fixture(request.param, tmp_path))
        yield src
        src.close()

    def reference_array(self, source, field):
        t = source.tensor(field)
        if source.path.is_dir():
            return pydicom_series(source.path, t.dtype)
        ds = pydicom.dcmread(source.path)
        if str(ds.SOPClassUID) == WSI:
            return pydicom_wsi(source.path)
        return _modality(ds).astype(t.dtype)


def test_series_is_sorted_by_position_and_rescaled(tmp_path):
    raw = write_ct_series(tmp_path / "ct")
    with tensor_server.open(tmp_path / "ct") as src:
        t = src.tensor()
        assert src.type == "dicom-series" and isinstance(inner(t), DicomSeriesAdapter)
        assert t.dim_labels == ("z", "y", "x") and t.shape == (8, 24, 20)
        assert t.dtype == np.float32  # intercept -1024: the modality transform is applied
        slopes = [2 if k == 3 else 1 for k in range(8)]
        want = np.stack([(r.astype(np.float64) * s - 1024).astype(np.float32) for r, s in zip(raw, slopes)])
        np.testing.assert_array_equal(t.get_data(), want)
        assert t.physical_scale == pytest.approx((2.5, 0.7, 0.6))
        assert t.physical_unit == ("mm",) * 3
        assert t.read_block_shape == (1, 24, 20)
        assert src.metadata["sorted_by"] == "ImagePositionPatient"


def test_series_without_positions_sorts_by_instance_number(tmp_path):
    write_ct_series(tmp_path / "s", n=5, seed=4, with_positions=False)
    with tensor_server.open(tmp_path / "s") as src:
        assert src.metadata["sorted_by"] == "InstanceNumber"
        got = src.tensor().get_data()
        assert got.shape == (5, 24, 20)
        np.testing.assert_array_equal(got, pydicom_series(tmp_path / "s", np.float32))


def test_identity_rescale_serves_raw_dtype(tmp_path):
    raw = np.random.default_rng(0).integers(-500, 500, (2, 12, 10), dtype=np.int16)
    path = write_multiframe(tmp_path / "id.dcm", raw, RescaleSlope=1, RescaleIntercept=0)
    with tensor_server.open(path) as src:
        t = src.tensor()
        assert t.dtype == np.int16 and "rescale" not in src.metadata
        np.testing.assert_array_equal(t.get_data(), raw)


def test_multiframe_axis_and_lazy_frames(tmp_path):
    frames = np.random.default_rng(1).integers(0, 65535, (9, 16, 12), dtype=np.uint16)
    path = write_multiframe(tmp_path / "mf.dcm", frames, FrameTime=33.0)
    with tensor_server.open(path) as src:
        t = src.tensor()
        adapter = inner(t)
        assert isinstance(adapter, DicomAdapter) and t.dim_labels == ("t", "y", "x")
        assert t.physical_scale[0] == 33.0 and t.physical_unit[0] == "ms"
        assert t.read_block_shape == (1, 16, 12) and t.decimates
        before = adapter.frames_decoded
        np.testing.assert_array_equal(t.get_data(Bounds((4, 0, 0), (5, 16, 12))), frames[4:5])
        assert adapter.frames_decoded - before == 1  # one frame asked, one decoded
        before = adapter.frames_decoded
        b = Bounds((1, 2, 1), (9, 16, 12))
        got = t.get_decimated_data(b, (3, 2, 2))
        np.testing.assert_array_equal(got, frames[1:9:3, 2:16:2, 1:12:2])
        assert adapter.frames_decoded - before == 3  # frames 1, 4, 7 only
        np.testing.assert_array_equal(t.get_scaled_data(b, (3, 2, 2), "nearest"), got)


def test_enhanced_multiframe_positions_and_per_frame_rescale(tmp_path):
    """Per-frame Plane Position (stored in descending z) makes the frame axis z, served in
    ascending position; per-frame Pixel Value Transformation is applied frame by frame."""
    frames = np.random.default_rng(2).integers(0, 4000, (5, 12, 10), dtype=np.uint16)
    ds = _dataset(SC_MULTIFRAME, frames)
    orient = Dataset()
    orient.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    shared = Dataset()
    shared.PlaneOrientationSequence = [orient]
    ds.SharedFunctionalGroupsSequence = [shared]
    per = []
    for k in range(5):
        pos, pvt, item = Dataset(), Dataset(), Dataset()
        pos.ImagePositionPatient = [0, 0, 100 - 3 * k]
        pvt.RescaleSlope, pvt.RescaleIntercept, pvt.RescaleType = 1 + k, -10 * k, "US"
        item.PlanePositionSequence = [pos]
        item.PixelValueTransformationSequence = [pvt]
        per.append(item)
    ds.PerFrameFunctionalGroupsSequence = per
    path = _save(ds, tmp_path / "enh.dcm")
    with tensor_server.open(path) as src:
        t = src.tensor()
        assert t.dim_labels == ("z", "y", "x") and t.dtype == np.float32
        assert t.physical_scale[0] == pytest.approx(3.0)
        want = np.stack([(frames[k].astype(np.float64) * (1 + k) - 10 * k).astype(np.float32) for k in range(5)])[::-1]
        np.testing.assert_array_equal(t.get_data(), want)
        np.testing.assert_array_equal(
            t.get_decimated_data(Bounds((1, 0, 0), (5, 12, 10)), (2, 1, 3)), want[1:5:2, :, ::3]
        )


def test_encapsulated_frames_without_offset_table(tmp_path):
    """RLE frames, no Basic Offset Table: the adapter scans the fragments once and decodes any
    frame by seeking straight to it (values equal pydicom's whole-file decode)."""
    from pydicom.encaps import encapsulate, generate_frames
    from pydicom.uid import RLELossless

    frames = np.random.default_rng(3).integers(0, 4000, (6, 14, 11), dtype=np.uint16)
    ds = _dataset(SC_MULTIFRAME, frames)
    ds.compress(RLELossless, encoding_plugin="pydicom")
    parts = list(generate_frames(ds.PixelData, number_of_frames=6))
    ds.PixelData = encapsulate(parts, has_bot=False)
    path = _save(ds, tmp_path / "rle.dcm")
    np.testing.assert_array_equal(pydicom.dcmread(path).pixel_array, frames)
    with tensor_server.open(path) as src:
        t = src.tensor()
        np.testing.assert_array_equal(t.get_data(Bounds((4, 0, 0), (6, 14, 11))), frames[4:6])
        assert "extended_offsets" in inner(t).layout.frames[0][0].opts
        np.testing.assert_array_equal(t.get_data(), frames)


def test_series_decimation_skips_slice_files(tmp_path):
    write_ct_series(tmp_path / "ct")
    with tensor_server.open(tmp_path / "ct") as src:
        t = src.tensor()
        adapter = inner(t)
        before = adapter.frames_decoded
        full = t.get_data()
        b = Bounds((0, 0, 0), (8, 24, 20))
        got = t.get_decimated_data(b, (4, 3, 3))
        np.testing.assert_array_equal(got, full[::4, ::3, ::3])
        assert adapter.frames_decoded - before == 8 + 2


def test_wsi_tiles_compose_and_sparse_gap_is_zero(tmp_path):
    rng = np.random.default_rng(5)
    image = rng.integers(1, 255, (2, 50, 45, 3), dtype=np.uint8)
    path = write_wsi(tmp_path / "sparse.dcm", image, 16, sparse_missing=(1, 1, 2))
    with tensor_server.open(path) as src:
        t = src.tensor()
        assert t.dim_labels == ("z", "y", "x", "s") and t.shape == (2, 50, 45, 3)
        assert t.read_block_shape == (1, 16, 16, 3)
        a = t.get_data()
        want = image.copy()
        want[1, 16:32, 32:45] = 0
        np.testing.assert_array_equal(a, want)
        assert src.metadata["wsi_missing_tiles"] == 1
        assert t.physical_scale[1:3] == pytest.approx((0.0005, 0.0005))
    # a tile never holding a picked pixel is not decoded
    path = write_wsi(tmp_path / "full.dcm", image[0], 16)
    with tensor_server.open(path) as src:
        t, adapter = src.tensor(), inner(src.tensor())
        before = adapter.frames_decoded
        got = t.get_decimated_data(Bounds((0, 0, 0), (50, 45, 3)), (20, 40, 1))  # rows 0,20,40; cols 0,40
        np.testing.assert_array_equal(got, image[0, ::20, ::40])
        assert adapter.frames_decoded - before == 6  # tile rows 0,1,2 x tile cols 0,2 (not 1)


def test_wsi_folder_levels_and_thumbnail(tmp_path):
    rng = np.random.default_rng(6)
    base = rng.integers(0, 255, (64, 96, 3), dtype=np.uint8)
    series = generate_uid()
    folder = tmp_path / "slide"
    folder.mkdir()
    write_wsi(folder / "l0.dcm", base, 32, series=series)
    write_wsi(folder / "l1.dcm", base[::2, ::2], 32, series=series, spacing=0.001)
    write_wsi(folder / "thumb.dcm", base[::8, ::8], 16, flavour="THUMBNAIL", series=series, spacing=0.004)
    with tensor_server.open(folder) as src:
        assert list(src.tensors) == ["volume", "thumbnail"]
        vol = src.tensor("volume")
        np.testing.assert_array_equal(vol.get_data(), base)
        assert [lv.scale for lv in vol.native_levels] == [(2, 2, 1)]
        np.testing.assert_array_equal(
            vol.native_level((2, 2, 1)).tensor.get_data(Bounds((0, 0, 0), (32, 48, 3))), base[::2, ::2]
        )
        np.testing.assert_array_equal(src.tensor("thumbnail").get_data(), base[::8, ::8])


# ---- real samples ----------------------------------------------------------------------------
def test_real_wsi_levels_match_expected(testdata, expected):
    """boxes_0 is a 16x16 total pixel matrix in one padded 64x64 JPEG tile: the served level is
    the matrix; expected.json's whole-frame sum is the matrix plus the 255 padding."""
    for name in ("dicom-wsi/boxes_0.dcm", "dicom-wsi/boxes_1.dcm"):
        exp = expected[name]
        with tensor_server.open(testdata / name) as src:
            t = src.tensor()
            a = t.get_data()
            assert src.type == "dicom" and t.dim_labels == ("y", "x", "s")
            assert a.shape == (16, 16, 3) and a.dtype == np.dtype(exp["dtype"])
            frame = pydicom.dcmread(testdata / name).pixel_array
            assert frame.shape == tuple(exp["shape"])
            np.testing.assert_array_equal(a, frame[:16, :16])
            padding = 255 * (frame.size - a.size)
            assert (frame[16:] == 255).all() and (frame[:, 16:] == 255).all()
            assert a.sum(dtype=np.float64) + padding == pytest.approx(exp["sum"], rel=0.01)  # JPEG: tolerance
            assert a.min() >= exp["min"] - 8 and a.max() <= exp["max"]
            assert t.physical_scale[:2] == pytest.approx((0.000499, 0.000499))


def test_real_wsi_folder(testdata, tmp_path):
    folder = tmp_path / "wsi"
    shutil.copytree(testdata / "dicom-wsi", folder)
    assert sniff_dicom_folder(folder, b"")
    with tensor_server.open(folder) as src:
        assert src.type == "dicom-series" and list(src.tensors) == ["volume", "thumbnail"]
        assert src.tensor("thumbnail").get_data().sum() == 181567
        assert src.tensor("volume").get_data().shape == (16, 16, 3)


def test_real_wsi_equals_svs_level(testdata):
    """SOURCES.md: boxes_0 was converted from small.svs; its matrix is the SVS level 0 (JPEG)."""
    tifffile = pytest.importorskip("tifffile")
    try:
        svs = tifffile.imread(testdata / "tiff-pyramid/small.svs")
    except Exception as exc:  # no JPEG codec for tifffile
        pytest.skip(f"tifffile cannot decode small.svs: {exc}")
    with tensor_server.open(testdata / "dicom-wsi/boxes_0.dcm") as src:
        got = src.tensor().get_data()
    assert np.abs(got.astype(int) - svs.astype(int)).max() <= 8


class TestDicomRealWsi(AdapterTests):
    @pytest.fixture(params=["boxes_0.dcm", "boxes_1.dcm"])
    def source(self, request, testdata):
        src = tensor_server.open(testdata / "dicom-wsi" / request.param)
        yield src
        src.close()

    def reference_array(self, source, field):
        return pydicom.dcmread(source.path).pixel_array[:16, :16]


PYDICOM_FILES = {
    # file: (shape served, dtype served, sum of pydicom's pixel_array) per SOURCES.md
    "CT_small.dcm": ((128, 128), np.float32, 14826310),
    "MR_small.dcm": ((64, 64), np.int16, 2125338),
    "rtdose.dcm": ((15, 10, 10), np.uint32, 1519910000),
    "SC_rgb_rle_2frame.dcm": ((2, 100, 100, 3), np.uint8, 7650000),
}


def _pydicom_file(name: str) -> Path:
    path = Path(pydicom.__file__).parent / "data" / "test_files" / name
    if not path.exists():
        pytest.skip(f"pydicom test file {name} not installed")
    return path


@pytest.mark.parametrize("name", sorted(PYDICOM_FILES))
def test_pydicom_bundled_files(name):
    shape, dtype, raw_sum = PYDICOM_FILES[name]
    path = _pydicom_file(name)
    ds = pydicom.dcmread(path)
    with tensor_server.open(path) as src:
        t = src.tensor()
        a = t.get_data()
        assert a.shape == shape and a.dtype == dtype
        assert int(ds.pixel_array.sum(dtype=np.float64)) == raw_sum
        np.testing.assert_array_equal(a, _modality(ds).astype(dtype))
    if name == "rtdose.dcm":
        assert t.dim_labels[0] == "z" and t.physical_scale[0] == pytest.approx(5.0)


def test_pydicom_bundled_series():
    folder = _pydicom_file("dicomdirtests/77654033/CT2")
    with tensor_server.open(folder) as src:
        t = src.tensor()
        a = t.get_data()
        assert t.shape == (4, 16, 16)
        # SOURCES.md raw sums for InstanceNumber 18, 180, 181, 182; intercept -1024 applied here
        raw_sums = [103749, 402336, 623134, 490592]
        assert [int(s) for s in a.reshape(4, -1).sum(axis=1, dtype=np.float64) + 1024 * 256] == raw_sums
        np.testing.assert_array_equal(a, pydicom_series(folder, np.float32))


# ---- bad input -------------------------------------------------------------------------------
def _assert_unreadable(path: Path) -> None:
    with pytest.raises(UnreadableSource) as info:
        src = tensor_server.open(path)
        try:  # a file may open and fail on its first read: that must be named too
            src.tensor().get_data()
        finally:
            src.close()
    assert str(path) in str(info.value)


@pytest.mark.parametrize("cut", [100, 140, 400, 0.7])
def test_truncated_dicom_is_unreadable(tmp_path, cut):
    for kind in ("multiframe_uint16", "wsi_full"):
        data = _fixture(kind, tmp_path).read_bytes()
        bad = tmp_path / f"cut_{kind}.dcm"
        bad.write_bytes(data[: cut if isinstance(cut, int) else int(len(data) * cut)])
        _assert_unreadable(bad)


def test_truncated_jpeg_wsi_is_unreadable(tmp_path, testdata):
    data = (testdata / "dicom-wsi/boxes_0.dcm").read_bytes()
    bad = tmp_path / "boxes_cut.dcm"
    bad.write_bytes(data[: len(data) - 400])
    _assert_unreadable(bad)


@pytest.mark.parametrize("name", ["garbage.dcm", "garbage.dicom"])
def test_garbage_with_extension_is_unreadable(tmp_path, name):
    bad = tmp_path / name
    bad.write_bytes(np.random.default_rng(7).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    _assert_unreadable(bad)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_folder_of_broken_dicoms_is_unreadable(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    for k in range(3):
        (folder / f"x{k}.dcm").write_bytes(b"\0" * 128 + b"DICM" + b"\xff" * 50)
    assert sniff_dicom_folder(folder, b"")
    _assert_unreadable(folder)


def test_folder_sniff_is_selective(tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    for k in range(4):
        (folder / f"note{k}.txt").write_text("not dicom")
    assert not sniff_dicom_folder(folder, b"")
    assert not sniff_dicom_folder(tmp_path / "missing", b"")
