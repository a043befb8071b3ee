"""MRC (mrcfile) and DeltaVision (mrc.DVFile) adapters: conformance on generated and real files,
axis maps, calibration, decimated reads, handle lifetime and bad input."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import tensor_server
from tensor_server.adapters.deltavision import DeltaVisionAdapter
from tensor_server.adapters.mrc import MrcAdapter
from tensor_server.core.bounds import Bounds
from tensor_server.errors import UnreadableSource
from tensor_server.testing import AdapterTests

mrcfile = pytest.importorskip("mrcfile")
mrc = pytest.importorskip("mrc")


def served_order(source) -> tuple[int, ...]:
    """Permutation from the file's stored axes to the served (canonical) axes."""
    stored = source.metadata["stored_axes"]
    served = source.tensor().dim_labels
    return tuple(stored.index(d) for d in served)


def inner(tensor):
    return getattr(tensor, "inner", tensor)


# ---- generated MRC files ---------------------------------------------------------------------
def _write_mrc(path: Path, data: np.ndarray, *, voxel=None, stack=False, axis_map=None, fei=False) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mrcfile.new(str(path), overwrite=True) as m:
            m.set_data(data)
            if stack:
                m.set_image_stack()
            if voxel is not None:
                m.voxel_size = voxel
            if axis_map is not None:
                m.header.mapc, m.header.mapr, m.header.maps = axis_map
            if fei:
                from mrcfile.dtypes import get_ext_header_dtype

                ext = np.zeros(data.shape[0], dtype=get_ext_header_dtype(b"FEI1"))
                ext["Metadata size"] = ext.dtype.itemsize
                ext["HT"] = 300000.0
                m.set_extended_header(ext)
                m.header.exttyp = b"FEI1"
    return path


def _mrc_fixtures(tmp_path: Path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    return {
        "image2d_int16": _write_mrc(
            tmp_path / "img.mrc", rng.integers(-500, 500, (70, 90), dtype=np.int16), voxel=(2.0, 2.0, 1.0)
        ),
        "volume_float32": _write_mrc(
            tmp_path / "vol.map", rng.standard_normal((9, 40, 33)).astype(np.float32), voxel=(1.5, 1.25, 3.0)
        ),
        "stack_uint8": _write_mrc(
            tmp_path / "parts.mrcs", rng.integers(0, 255, (6, 31, 29), dtype=np.uint8), stack=True
        ),
        "int8_volume": _write_mrc(tmp_path / "b.rec", rng.integers(-100, 100, (5, 17, 23), dtype=np.int8)),
        "permuted_axes": _write_mrc(
            tmp_path / "perm.map",
            rng.standard_normal((7, 11, 13)).astype(np.float32),
            voxel=(1.0, 2.0, 3.0),
            axis_map=(3, 1, 2),
        ),
        "fei_extended": _write_mrc(
            tmp_path / "fei.mrc", rng.integers(0, 4000, (4, 24, 20), dtype=np.uint16), stack=True, fei=True
        ),
        "volume_stack": _write_mrc(tmp_path / "vs.mrc", rng.standard_normal((2, 3, 10, 12)).astype(np.float32)),
    }


class TestMrcGenerated(AdapterTests):
    @pytest.fixture(
        params=[
            "image2d_int16",
            "volume_float32",
            "stack_uint8",
            "int8_volume",
            "permuted_axes",
            "fei_extended",
            "volume_stack",
        ]
    )
    def source(self, request, tmp_path):
        path = _mrc_fixtures(tmp_path)[request.param]
        src = tensor_server.open(path)
        yield src
        src.close()

    def reference_array(self, source, field):
        with mrcfile.open(str(source.path), permissive=False) as m:
            return np.array(m.data).transpose(served_order(source))


def test_generated_mrc_labels_and_calibration(tmp_path):
    fx = _mrc_fixtures(tmp_path)
    with tensor_server.open(fx["volume_float32"]) as src:
        t = src.tensor()
        assert src.type == "mrc" and isinstance(t, MrcAdapter)
        assert t.dim_labels == ("z", "y", "x") and t.shape == (9, 40, 33)
        assert t.physical_scale == pytest.approx((3.0, 1.25, 1.5))
        assert t.physical_unit == ("Å",) * 3
        assert t.read_block_shape is None and t.decimates
    with tensor_server.open(fx["stack_uint8"]) as src:
        t = src.tensor()
        assert t.dim_labels == ("i", "y", "x")
        assert t.physical_scale[0] is None
    with tensor_server.open(fx["image2d_int16"]) as src:
        assert src.tensor().dim_labels == ("y", "x") and src.tensor().dtype == np.int16
    with tensor_server.open(fx["volume_stack"]) as src:
        assert src.tensor().dim_labels == ("i", "z", "y", "x") and src.tensor().shape == (2, 3, 10, 12)


def test_axis_map_is_honoured(tmp_path):
    """MAPC=3, MAPR=1, MAPS=2: stored (sections, rows, columns) are (Y, X, Z); served Z, Y, X."""
    path = _mrc_fixtures(tmp_path)["permuted_axes"]
    with mrcfile.open(str(path)) as m:
        stored = np.array(m.data)  # (7, 11, 13) = (Y, X, Z)
    with tensor_server.open(path) as src:
        t = src.tensor()
        assert src.metadata["stored_axes"] == "yxz"
        assert t.dim_labels == ("z", "y", "x") and t.shape == (13, 7, 11)
        np.testing.assert_array_equal(t.get_data(), stored.transpose(2, 0, 1))
        assert t.physical_scale == pytest.approx((3.0, 2.0, 1.0))  # voxel (x, y, z) = (1, 2, 3)


def test_fei_extended_header_is_skipped_and_described(tmp_path):
    path = _mrc_fixtures(tmp_path)["fei_extended"]
    with mrcfile.open(str(path)) as m:
        ref = np.array(m.data)
        assert int(m.header.nsymbt) > 0
    with tensor_server.open(path) as src:
        np.testing.assert_array_equal(src.tensor().get_data(), ref)
        ext = src.metadata["extended_header"]
        assert ext["type"] == "FEI1" and ext["entries"] == 4
        assert ext["first_entry"]["HT"] == pytest.approx(300000.0)


def test_handle_reopens_after_close(tmp_path):
    path = _mrc_fixtures(tmp_path)["volume_float32"]
    with tensor_server.open(path) as src:
        t = inner(src.tensor())
        before = t.get_data(Bounds((0, 0, 0), (2, 5, 5)))
        t.close()
        assert not t._handle.is_open
        np.testing.assert_array_equal(t.get_data(Bounds((0, 0, 0), (2, 5, 5))), before)
        assert t._handle.opens == 2


def test_misnamed_mrc_opens_by_content(tmp_path):
    path = _mrc_fixtures(tmp_path)["volume_float32"]
    other = tmp_path / "volume.bin"
    other.write_bytes(path.read_bytes())
    with tensor_server.open(other) as src:
        assert src.type == "mrc" and src.tensor().shape == (9, 40, 33)


# ---- real MRC samples ------------------------------------------------------------------------
MRC_SAMPLES = ["mrc/EMD-3197.map", "mrc/EMD-3001.map"]


class TestMrcRealSamples(AdapterTests):
    @pytest.fixture(params=MRC_SAMPLES)
    def source(self, request, testdata):
        src = tensor_server.open(testdata / request.param)
        yield src
        src.close()

    def reference_array(self, source, field):
        with mrcfile.open(str(source.path)) as m:
            return np.array(m.data).transpose(served_order(source))


@pytest.mark.parametrize("name", MRC_SAMPLES)
def test_real_mrc_matches_expected(name, testdata, expected):
    exp = expected[name]
    with tensor_server.open(testdata / name) as src:
        t = src.tensor()
        a = t.get_data()
        order = served_order(src)
        assert a.shape == tuple(exp["shape"][i] for i in order)
        assert t.dtype == np.dtype(exp["dtype"])
        assert a.min() == pytest.approx(exp["min"]) and a.max() == pytest.approx(exp["max"])
        assert a.sum(dtype=np.float64) == pytest.approx(exp["sum"], rel=1e-9)
        vx, vy, vz = exp["voxel_size_A"]
        assert t.physical_scale == pytest.approx((vz, vy, vx))


def test_emd3001_axis_map(testdata):
    """EMD-3001 stores MAPC=3, MAPR=1, MAPS=2: its (25, 43, 73) array is Y, X, Z."""
    with tensor_server.open(testdata / "mrc/EMD-3001.map") as src:
        assert src.metadata["axis_map"] == {"mapc": 3, "mapr": 1, "maps": 2}
        assert src.tensor().shape == (73, 25, 43)


def test_real_mrc_decimated_equals_strided(testdata):
    with tensor_server.open(testdata / "mrc/EMD-3001.map") as src:
        t = src.tensor()
        b = Bounds((3, 1, 2), (70, 24, 41))
        for step in [(2, 2, 2), (3, 5, 7), (8, 8, 8)]:
            want = t.get_data(b)[tuple(slice(None, None, s) for s in step)]
            got = t.get_decimated_data(b, step)
            np.testing.assert_array_equal(got, want)
            assert got.flags.owndata and got.flags.c_contiguous
            np.testing.assert_array_equal(t.get_scaled_data(b, step, "nearest"), want)


# ---- DeltaVision -----------------------------------------------------------------------------
def _write_dv(path: Path, data: np.ndarray, order: str | None = None, **meta) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mrc.save(data, str(path), zAxisOrder=order, metadata=meta or None)
    return path


def _dv_fixtures(tmp_path: Path) -> dict[str, tuple[Path, np.ndarray]]:
    rng = np.random.default_rng(1)
    zw = rng.integers(-3000, 3000, (4, 2, 26, 21), dtype=np.int16)  # z, w, y, x (WZT sequence)
    tz = rng.integers(0, 60000, (3, 4, 19, 23), dtype=np.uint16)  # t, z, y, x (ZTW sequence)
    z = rng.standard_normal((5, 30, 22)).astype(np.float32)
    return {
        "zw_int16": (
            _write_dv(tmp_path / "zw.dv", zw, "zw", dx=0.1, dy=0.1, dz=0.25, wave0=525, wave1=632),
            zw.transpose(1, 0, 2, 3),
        ),
        "tz_uint16": (_write_dv(tmp_path / "tz.r3d", tz, "tz", dx=0.2, dy=0.2, dz=0.5), tz),
        "z_float32": (_write_dv(tmp_path / "z.dv", z), z),
    }


class TestDeltaVisionGenerated(AdapterTests):
    @pytest.fixture(params=["zw_int16", "tz_uint16", "z_float32"])
    def source(self, request, tmp_path):
        path, _ = _dv_fixtures(tmp_path)[request.param]
        src = tensor_server.open(path)
        yield src
        src.close()

    def reference_array(self, source, field):
        dv = mrc.DVFile(str(source.path))
        try:
            data = np.array(dv.data)
            stored = "".join(dv.sizes).lower()
        finally:
            dv.close()
        keep = [i for i, (d, n) in enumerate(zip(stored, data.shape)) if not (d in "tc" and n == 1)]
        data = data.reshape(tuple(data.shape[i] for i in keep))
        kept = [stored[i] for i in keep]
        return data.transpose([kept.index(d) for d in source.tensor().dim_labels])


def test_dv_axes_against_written_arrays(tmp_path):
    """Independent of DVFile's axis logic: the served array is the written one, canonical."""
    for name, (path, want) in _dv_fixtures(tmp_path).items():
        with tensor_server.open(path) as src:
            t = src.tensor()
            assert src.type == "deltavision", name
            assert isinstance(inner(t), DeltaVisionAdapter)
            np.testing.assert_array_equal(t.get_data(), want, err_msg=name)
    path, _ = _dv_fixtures(tmp_path)["zw_int16"]
    with tensor_server.open(path) as src:
        t = src.tensor()
        assert t.dim_labels == ("c", "z", "y", "x")
        assert src.metadata["wavelengths_nm"] == [525, 632]
        assert t.physical_scale[0] is None and t.physical_scale[1:] == pytest.approx((0.25, 0.1, 0.1))
        assert t.physical_unit[1:] == ("µm",) * 3 and t.physical_scale[0] is None
    path, _ = _dv_fixtures(tmp_path)["tz_uint16"]
    with tensor_server.open(path) as src:
        assert src.tensor().dim_labels == ("t", "z", "y", "x")


def test_real_dv_matches_expected(testdata, expected):
    exp = expected["dv/toxo.dv"]
    with tensor_server.open(testdata / "dv/toxo.dv") as src:
        t = src.tensor()
        a = t.get_data()
        assert src.type == "deltavision"
        assert t.dim_labels == tuple(exp["axes"].lower())
        assert a.shape == tuple(exp["shape"]) and a.dtype == np.dtype(exp["dtype"])
        assert (int(a.min()), int(a.max())) == (exp["min"], exp["max"])
        assert a.sum(dtype=np.float64) == exp["sum"]
        vx, vy, vz = exp["voxel_size_um"]
        assert t.physical_scale[1:] == pytest.approx((vz, vy, vx))
        assert src.metadata["wavelengths_nm"] == [525, 632]
        assert t.read_block_shape is None and t.decimates
        b = Bounds((1, 2, 5, 7), (2, 17, 128, 121))
        np.testing.assert_array_equal(t.get_decimated_data(b, (1, 3, 8, 8)), a[1:2, 2:17:3, 5:128:8, 7:121:8])


class TestDeltaVisionRealSample(AdapterTests):
    @pytest.fixture
    def source(self, testdata):
        src = tensor_server.open(testdata / "dv/toxo.dv")
        yield src
        src.close()

    def reference_array(self, source, field):
        dv = mrc.DVFile(str(source.path))
        try:
            return dv.asarray()  # squeezed C, Z, Y, X
        finally:
            dv.close()


# ---- bad input -------------------------------------------------------------------------------
def _assert_unreadable(path: Path) -> None:
    with pytest.raises(UnreadableSource) as info:
        tensor_server.open(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("cut", [100, 1024, 1024 + 9 * 40 * 33 * 4 // 2])
def test_truncated_mrc_is_unreadable(tmp_path, cut):
    path = _mrc_fixtures(tmp_path)["volume_float32"]
    bad = tmp_path / "cut.mrc"
    bad.write_bytes(path.read_bytes()[:cut])
    _assert_unreadable(bad)


@pytest.mark.parametrize("name", ["garbage.mrc", "garbage.map", "garbage.dv", "garbage.r3d"])
def test_garbage_with_extension_is_unreadable(tmp_path, name):
    bad = tmp_path / name
    bad.write_bytes(np.random.default_rng(2).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    _assert_unreadable(bad)


@pytest.mark.parametrize("cut", [500, 1024 + 1000])
def test_truncated_dv_is_unreadable(tmp_path, testdata, cut):
    bad = tmp_path / "cut.dv"
    bad.write_bytes((testdata / "dv/toxo.dv").read_bytes()[:cut])
    _assert_unreadable(bad)


def test_empty_files_are_unreadable(tmp_path):
    for name in ("empty.mrc", "empty.dv"):
        (tmp_path / name).write_bytes(b"")
        _assert_unreadable(tmp_path / name)


def test_sniffers_keep_mrc_and_dv_apart(testdata):
    from tensor_server.adapters.deltavision import sniff_deltavision
    from tensor_server.adapters.mrc import sniff_mrc

    dv_head = (testdata / "dv/toxo.dv").read_bytes()[:4096]
    mrc_head = (testdata / "mrc/EMD-3197.map").read_bytes()[:4096]
    assert sniff_deltavision(Path("x"), dv_head) and not sniff_mrc(Path("x"), dv_head)
    assert sniff_mrc(Path("x"), mrc_head) and not sniff_deltavision(Path("x"), mrc_head)
    assert not sniff_mrc(Path("x"), b"\0" * 4096)
