"""EMD adapter: a generated Berkeley EMD file and real Velox files through the conformance
suite, every sample in ../shared/testdata/emd (and inside its zips) against expected.json,
axes and calibration, detection, bad input."""

from __future__ import annotations

import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest

import tensor_server
from tensor_server.adapters.hdf5 import Hdf5Adapter, Hdf5ContiguousAdapter
from tensor_server.adapters.registry import detect_format
from tensor_server.errors import UnreadableSource
from tensor_server.testing import AdapterTests
from tests.adapters.hdf5_test import check_against_expected, inner, open_with_deadline

VELOX_ZIPS = ("emd/velox_emd_version11.zip", "emd/velox_emd_v11_elementSelection.zip")


def write_berkeley(path: Path) -> None:
    """Berkeley EMD v0.2: a chunked 4D-STEM signal and a contiguous Prismatic-style slice stack."""
    rng = np.random.default_rng(4)
    with h5py.File(path, "w") as f:
        f.attrs["version_major"] = 0
        f.attrs["version_minor"] = 2
        g = f.create_group("data/stem4d")
        g.attrs["emd_group_type"] = 1
        g.create_dataset("data", data=rng.random((6, 5, 16, 12), dtype=np.float32), chunks=(1, 1, 16, 12))
        for i, (name, unit, n, step) in enumerate(
            [
                ("R_x", "[n_m]", 6, 0.5),
                ("R_y", "[n_m]", 5, 0.5),
                ("Q_x", "[n_m^-1]", 16, 0.02),
                ("Q_y", "[n_m^-1]", 12, 0.02),
            ],
            1,
        ):
            d = g.create_dataset(f"dim{i}", data=(np.arange(n) * step - 1.0).astype(np.float32))
            d.attrs["name"] = np.bytes_(name)
            d.attrs["units"] = np.bytes_(unit)
        s = f.create_group("data/slices")
        s.attrs["emd_group_type"] = np.int32(1)
        s.create_dataset("realslice", data=rng.integers(0, 5000, (10, 12, 7), dtype=np.uint16))
        for i, (name, unit, n, step) in enumerate(
            [("R_x", "[n_m]", 10, 0.25), ("R_y", "[n_m]", 12, 0.25), ("bin_outer_angle", "[mrad]", 7, 2.0)], 1
        ):
            d = s.create_dataset(f"dim{i}", data=np.arange(n) * step)
            d.attrs["name"] = name
            d.attrs["units"] = unit
        f.create_dataset("extra/counts", data=np.arange(20, dtype=np.int64).reshape(4, 5))


#: Served order of each generated signal (file order → canonical).
BERKELEY_ORDER = {"data/slices/realslice": (2, 0, 1)}


class TestBerkeleyGenerated(AdapterTests):
    @pytest.fixture
    def source(self, tmp_path):
        write_berkeley(tmp_path / "berkeley.h5")  # not .emd: detected by structure
        src = tensor_server.open(tmp_path / "berkeley.h5")
        yield src
        src.close()

    def reference_array(self, source, field):
        with h5py.File(source.path, "r") as f:
            raw = f[field][()]
        return np.transpose(raw, BERKELEY_ORDER.get(field, tuple(range(raw.ndim))))


class TestBerkeleyAxes:
    def test_signals_axes_and_calibration(self, tmp_path):
        write_berkeley(tmp_path / "b.h5")
        with tensor_server.open(tmp_path / "b.h5") as src:
            assert src.type == "emd" and src.metadata["flavour"] == "berkeley"
            assert list(src.tensors) == [
                "data/slices/realslice",
                "data/stem4d/data",
                "extra/counts",
            ]  # signals in visit order
            cube = src.tensors["data/stem4d/data"]
            assert type(inner(cube)) is Hdf5Adapter and cube.read_block_shape == (1, 1, 16, 12)
            assert cube.dim_labels == ("c", "z", "y", "x") and cube.shape == (6, 5, 16, 12)
            assert cube.physical_scale == pytest.approx((0.5, 0.5, 0.02, 0.02))
            assert cube.physical_unit == ("nm", "nm", "1/nm", "1/nm")
            sl = src.tensors["data/slices/realslice"]
            assert type(inner(sl)) is Hdf5ContiguousAdapter and sl.decimates
            assert inner(sl).dim_labels == ("y", "x", "z")
            assert sl.dim_labels == ("z", "y", "x") and sl.shape == (7, 10, 12)
            assert sl.physical_scale == pytest.approx((2.0, 0.25, 0.25))
            assert sl.physical_unit == ("mrad", "nm", "nm")
            assert not any("dim" in f.rsplit("/", 1)[-1] for f in src.tensors), "dim vectors are calibration"


# ---- Velox -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def velox_dir(tmp_path_factory, testdata):
    out = tmp_path_factory.mktemp("velox")
    for name in VELOX_ZIPS:
        with zipfile.ZipFile(testdata / name) as z:
            z.extractall(out)
    return out


def velox_reference(source, field):
    with h5py.File(source.path, "r") as f:
        raw = f[field][()]
    kind = field.split("/")[1]
    if kind == "Image" and raw.ndim == 3:
        return np.transpose(raw, (2, 0, 1))  # (Y, X, frames) served as (T, Y, X)
    if kind == "Spectrum" and raw.ndim == 2:
        return raw.T  # (channels, frames) served as (T, X)
    return raw


class TestVeloxReal(AdapterTests):
    max_tensors = 6  # five images and a spectrum

    @pytest.fixture(params=["Test SI 16x16 215 kx.emd", "fei_example_tem_stack.emd"])
    def source(self, request, velox_dir, testdata):
        path = velox_dir / request.param if (velox_dir / request.param).exists() else testdata / "emd" / request.param
        src = tensor_server.open(path)
        yield src
        src.close()

    def reference_array(self, source, field):
        return velox_reference(source, field)


def test_velox_axes_and_calibration(velox_dir):
    with tensor_server.open(velox_dir / "Test SI 16x16 215 kx.emd") as src:
        assert src.type == "emd" and src.metadata["flavour"] == "velox"
        assert src.metadata["velox_version"] == {"version": "11", "format": "Velox"}
        fields = list(src.tensors)
        assert fields[0].startswith("Data/Image/") and all(f.startswith("Data/Image/") for f in fields[:5])
        assert not any(f.endswith("/Metadata") or f.endswith(".jpg") for f in fields)
        img = src.tensors["Data/Image/f03a0d4a7c05495f95856e6708f94863/Data"]
        assert img.dim_labels == ("t", "y", "x") and img.shape == (2, 16, 16)
        assert img.read_block_shape == (1, 16, 16)  # the (16, 16, 1) chunk, permuted
        assert img.physical_scale == pytest.approx((0.288, 3.5992492559614689e-09, 3.5992492559614689e-09))
        assert img.physical_unit == ("s", "m", "m")
        assert inner(img).metadata["velox"]["metadata"]["BinaryResult"]["Detector"] == "HAADF"
        spec = src.tensors["Data/Spectrum/182c3bd26ea143f883bd97b577d36d51/Data"]
        assert spec.dim_labels == ("t", "x") and spec.shape == (1, 4096)
        assert spec.physical_scale == (None, 10.0) and spec.physical_unit == (None, "eV")
        stream = src.tensors["Data/SpectrumStream/1a00ffb292da4f7a9f81f2a4d6f99aa5/Data"]
        assert stream.dim_labels == ("y", "x") and stream.physical_scale is None  # raw event stream
        assert src.metadata["skipped_datasets"]["/Data/Image/3997ddbe7d8c448e97ed660387f5ac44/Metadata"].startswith(
            "Velox JSON"
        )
    with tensor_server.open(velox_dir / "SI_empty selection.emd") as src:
        assert src.metadata["skipped_datasets"]["/Thumbnail.jpg"] == "encoded thumbnail image"
        assert "Thumbnail.jpg" not in src.tensors


def test_velox_tem_stack(testdata):
    with tensor_server.open(testdata / "emd/fei_example_tem_stack.emd") as src:
        t = src.tensor()
        assert src.default_field == "Data/Image/26f60320a61d4f66a73efd8cde34ffa9/Data"
        assert t.dim_labels == ("t", "y", "x") and t.shape == (2, 3, 3)
        assert t.physical_scale == pytest.approx((None, 8.1728831922978511e-12, 8.1728831922978511e-12))
        with h5py.File(src.path, "r") as f:
            raw = f[src.default_field][()]
        np.testing.assert_array_equal(t.get_data(), np.moveaxis(raw, 2, 0))
        np.testing.assert_array_equal(
            t.get_scaled_data(None, (2, 2, 2), "nearest"), np.moveaxis(raw, 2, 0)[::2, ::2, ::2]
        )


# ---- real files against expected.json --------------------------------------------------------
EMD_FILES = ["emd/Si100_3D.emd", "emd/Si100_4D.emd", "emd/example_image.emd", "emd/fei_example_tem_stack.emd"]


@pytest.mark.parametrize("name", EMD_FILES)
def test_emd_samples_match_expected(testdata, expected, name):
    with tensor_server.open(testdata / name) as src:
        assert src.type == "emd"
        check_against_expected(src, expected[name]["datasets"])


@pytest.mark.parametrize("zip_name", VELOX_ZIPS)
def test_velox_zip_members_match_expected(testdata, expected, velox_dir, zip_name):
    members = expected[zip_name]["members"]
    assert members
    for member, entry in members.items():
        with tensor_server.open(velox_dir / member) as src:
            assert src.type == "emd" and src.metadata["flavour"] == "velox"
            check_against_expected(src, entry["datasets"])


def test_every_emd_sample_is_covered(testdata, expected):
    on_disk = {f"emd/{p.name}" for p in (testdata / "emd").iterdir()}
    assert on_disk == set(EMD_FILES) | set(VELOX_ZIPS)
    assert on_disk <= set(expected)


def test_prismatic_axes(testdata):
    with tensor_server.open(testdata / "emd/Si100_3D.emd") as src:
        t = src.tensor()
        assert t.dim_labels == ("z", "y", "x") and t.shape == (37, 22, 22)
        assert t.physical_unit == ("mrad", "nm", "nm") and t.physical_scale[1:] == pytest.approx((0.25, 0.25))
        assert t.read_block_shape is None and t.decimates  # contiguous
    with tensor_server.open(testdata / "emd/Si100_4D.emd") as src:
        assert len(src.tensors) == 2
        t = src.tensor()
        assert t.dim_labels == ("c", "z", "y", "x") and t.read_block_shape == (1, 1, 8, 8)
        assert t.physical_unit == ("nm", "nm", "1/nm", "1/nm")


def test_uncalibrated_berkeley_axes_carry_no_scale(testdata):
    with tensor_server.open(testdata / "emd/example_image.emd") as src:
        t = src.tensor()
        assert t.dim_labels == ("y", "x") and t.physical_scale is None


# ---- detection -------------------------------------------------------------------------------
def test_detection_by_structure_not_name(tmp_path, velox_dir, testdata):
    renamed = tmp_path / "velox_copy.h5"
    renamed.write_bytes((velox_dir / "SI_empty selection.emd").read_bytes())
    assert detect_format(renamed).name == "emd"
    prism = tmp_path / "prismatic.hdf5"
    prism.write_bytes((testdata / "emd/Si100_4D.emd").read_bytes())
    assert detect_format(prism).name == "emd"
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["Data/Image"] = np.zeros((4, 4))  # Velox-like names but no Velox root: generic
    assert detect_format(tmp_path / "plain.h5").name == "hdf5"
    assert detect_format(testdata / "hdf5/example2_v3.1.hspy").name == "hdf5"


def test_plain_hdf5_named_emd_is_served_generically(tmp_path):
    p = tmp_path / "plain.emd"
    with h5py.File(p, "w") as f:
        f["a/b"] = np.arange(12, dtype=np.uint8).reshape(3, 4)
    with tensor_server.open(p) as src:
        assert src.type == "emd" and src.metadata["flavour"] is None
        np.testing.assert_array_equal(src.tensors["a/b"].get_data(), np.arange(12, dtype=np.uint8).reshape(3, 4))


# ---- bad input -------------------------------------------------------------------------------
def test_not_hdf5_named_emd_is_unreadable(tmp_path):
    p = tmp_path / "fake.emd"
    p.write_bytes(b"\x00\x01 not hdf5 " * 500)
    box = open_with_deadline(p)
    assert isinstance(box.get("exc"), UnreadableSource) and str(p) in str(box["exc"])


@pytest.mark.parametrize("keep", [0.6, 0.01])
def test_truncated_velox_is_unreadable(tmp_path, velox_dir, keep):
    blob = (velox_dir / "Test SI 16x16 215 kx.emd").read_bytes()
    cut = tmp_path / "cut.emd"
    cut.write_bytes(blob[: int(len(blob) * keep)])
    box = open_with_deadline(cut)
    assert isinstance(box.get("exc"), UnreadableSource), box
    assert str(cut) in str(box["exc"])
