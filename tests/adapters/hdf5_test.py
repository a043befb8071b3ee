"""HDF5 adapter: generated files through the conformance suite, decimated reads, handle
lifecycle, real sample files (../shared/testdata/hdf5) and bad input."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import tensor_server
from tensor_server.adapters import hdf5 as hdf5_module
from tensor_server.adapters.hdf5 import Hdf5Adapter, Hdf5ContiguousAdapter, labels_from_axis_names
from tensor_server.adapters.registry import detect_format
from tensor_server.core.bounds import Bounds
from tensor_server.core.handles import reap_idle_handles
from tensor_server.errors import InvalidArgument, UnreadableSource
from tensor_server.testing import AdapterTests, finishes_within

FAR_FUTURE = time.monotonic() + 1e9

#: Served axis order per generated dataset (the file's order → canonical): only the dataset
#: whose dimension labels say X, Y is transposed.
SERVED_ORDER = {"labelled": (1, 0)}


def inner(tensor):
    """The HDF5 adapter under a NormalizingAdapter (or the tensor itself)."""
    return getattr(tensor, "inner", tensor)


def served_order(tensor) -> tuple[int, ...]:
    return tuple(getattr(tensor, "order", range(tensor.ndim)))


def write_sample(path: Path) -> dict[str, np.ndarray]:
    """A file with chunked/contiguous, nested, 2-4-D, big-endian and labelled datasets, plus
    datasets that must be skipped. Returns the served arrays by field."""
    rng = np.random.default_rng(11)
    arrays = {
        "plane": rng.integers(0, 4000, (70, 90), dtype=np.uint16),
        "nested/group/volume": rng.standard_normal((9, 40, 33)).astype(np.float32),
        "stack4d": rng.integers(-3000, 3000, (3, 4, 20, 24), dtype=np.int16),
        "big_endian": rng.standard_normal((30, 41)).astype(">f4"),
        "labelled": rng.integers(0, 255, (25, 31), dtype=np.uint8),
    }
    with h5py.File(path, "w") as f:
        f.create_dataset("plane", data=arrays["plane"], chunks=(32, 32), compression="gzip")
        f.create_dataset("nested/group/volume", data=arrays["nested/group/volume"])  # contiguous
        f.create_dataset("stack4d", data=arrays["stack4d"], chunks=(1, 2, 8, 8))
        f.create_dataset("big_endian", data=arrays["big_endian"], dtype=">f4")
        lab = f.create_dataset("labelled", data=arrays["labelled"])
        xs = f.create_dataset("x_coords", data=np.arange(25) * 0.5 + 3.0)
        xs.attrs["units"] = "um"
        xs.make_scale("x")
        lab.dims[0].attach_scale(xs)
        lab.dims[0].label = "x"
        lab.dims[1].label = "y"
        f["scalar"] = 3.5
        f["text"] = np.array([b"hello", b"world"])  # 1-D strings
        f.create_dataset("table", data=np.zeros(4, dtype=[("a", "i4"), ("b", "f8")]))
        f.create_dataset("empty", shape=(0, 5), dtype="f4")
        f.create_dataset("refs", data=[f["plane"].ref], dtype=h5py.ref_dtype)
    arrays["x_coords"] = np.arange(25) * 0.5 + 3.0
    arrays["labelled"] = arrays["labelled"].T
    return arrays


class TestHdf5Generated(AdapterTests):
    max_tensors = 8

    @pytest.fixture
    def source(self, tmp_path):
        write_sample(tmp_path / "sample.h5")
        src = tensor_server.open(tmp_path / "sample.h5")
        yield src
        src.close()

    def reference_array(self, source, field):
        with h5py.File(source.path, "r") as f:
            raw = f[field][()]
        return np.transpose(raw, SERVED_ORDER.get(field, tuple(range(raw.ndim)))).astype(raw.dtype.newbyteorder("="))


class TestHdf5Source:
    @pytest.fixture
    def sample(self, tmp_path):
        arrays = write_sample(tmp_path / "sample.h5")
        src = tensor_server.open(tmp_path / "sample.h5")
        yield src, arrays
        src.close()

    def test_fields_layouts_and_skips(self, sample):
        src, arrays = sample
        assert src.type == "hdf5"
        assert set(src.tensors) == set(arrays)
        assert src.default_field == "nested/group/volume"  # the largest dataset
        kinds = {f: type(inner(t)) for f, t in src.tensors.items()}
        assert kinds["plane"] is Hdf5Adapter and kinds["stack4d"] is Hdf5Adapter
        assert kinds["nested/group/volume"] is Hdf5ContiguousAdapter and kinds["big_endian"] is Hdf5ContiguousAdapter
        assert src.tensors["plane"].read_block_shape == (32, 32)
        assert src.tensors["stack4d"].read_block_shape == (1, 2, 8, 8)
        assert src.tensors["nested/group/volume"].read_block_shape is None
        skipped = src.metadata["skipped_datasets"]
        assert set(skipped) == {"/scalar", "/text", "/table", "/empty", "/refs"}
        assert skipped["/scalar"] == "scalar" and skipped["/text"] == "string"
        assert skipped["/table"].startswith("compound") and skipped["/empty"].startswith("0-size")
        assert skipped["/refs"] == "object reference"
        for field, want in arrays.items():
            t = src.tensors[field]
            assert t.dtype == want.dtype.newbyteorder("=") and t.shape == want.shape, field
            np.testing.assert_array_equal(t.get_data(), want)

    def test_big_endian_is_served_native(self, sample):
        src, arrays = sample
        t = src.tensors["big_endian"]
        assert inner(t).metadata["stored_dtype"] == ">f4"
        got = t.get_data(Bounds((3, 5), (20, 40)))
        assert got.dtype == np.dtype("=f4")
        np.testing.assert_array_equal(got, arrays["big_endian"][3:20, 5:40])

    def test_dimension_labels_and_scales(self, sample):
        src, _ = sample
        t = src.tensors["labelled"]
        assert inner(t).dim_labels == ("x", "y")  # as stored
        assert t.dim_labels == ("y", "x") and t.shape == (31, 25)  # served canonical
        assert t.physical_scale == (None, 0.5) and t.physical_unit == (None, "µm")
        assert src.tensors["stack4d"].dim_labels == ("c", "z", "y", "x")  # default

    def test_decimated_reads_stride_rows_in_the_hyperslab(self, tmp_path, monkeypatch):
        rng = np.random.default_rng(2)
        vol = rng.integers(0, 60000, (5, 300, 257), dtype=np.uint16)
        line = rng.standard_normal(1001).astype(">f8")
        with h5py.File(tmp_path / "c.h5", "w") as f:
            f["vol"] = vol
            f["line"] = line
        selections = []
        real_read_open = hdf5_module.Hdf5File.read_open

        def spy(self, h5file, path, selection, dtype):
            selections.append(selection)
            return real_read_open(self, h5file, path, selection, dtype)

        monkeypatch.setattr(hdf5_module.Hdf5File, "read_open", spy)
        monkeypatch.setattr(hdf5_module, "DECIMATE_SLAB_BYTES", 4096)  # force many slabs
        with tensor_server.open(tmp_path / "c.h5") as src:
            t = src.tensors["vol"]
            assert t.decimates
            for b, step in [
                (Bounds((0, 0, 0), (5, 300, 257)), (1, 8, 8)),
                (Bounds((1, 7, 13), (5, 299, 250)), (2, 3, 5)),
                (Bounds((0, 100, 3), (1, 101, 4)), (4, 4, 4)),
                (Bounds((2, 0, 0), (5, 300, 257)), (3, 32, 2)),
            ]:
                selections.clear()
                got = t.get_decimated_data(b, step)
                np.testing.assert_array_equal(got, vol[b.to_slices()][tuple(slice(None, None, s) for s in step)])
                assert got.flags.owndata and got.flags.c_contiguous
                assert selections, "decimated read went through the hyperslab reader"
                for sel in selections:  # strided on all but the innermost axis, which is read whole
                    assert [s.step for s in sel[:-1]] == list(step[:-1]) and sel[-1].step is None
            # the streamed default path agrees
            b = Bounds((1, 7, 13), (5, 299, 250))
            np.testing.assert_array_equal(t.get_scaled_data(b, (2, 4, 4), "nearest"), vol[1:5:2, 7:299:4, 13:250:4])
            t1 = src.tensors["line"]
            got = t1.get_decimated_data(Bounds((5,), (1000,)), (7,))
            assert got.dtype == np.dtype("=f8")
            np.testing.assert_array_equal(got, line[5:1000:7].astype("=f8"))

    def test_complex_datasets_are_served_nearest_only(self, tmp_path):
        z = (np.arange(120).reshape(10, 12) + 1j * np.arange(120).reshape(10, 12)[::-1]).astype(np.complex64)
        with h5py.File(tmp_path / "cplx.h5", "w") as f:
            f["wave"] = z
        with tensor_server.open(tmp_path / "cplx.h5") as src:
            t = src.tensors["wave"]
            assert t.dtype == np.complex64
            np.testing.assert_array_equal(t.get_data(), z)
            np.testing.assert_array_equal(t.get_scaled_data(None, (2, 2), "nearest"), z[::2, ::2])
            with pytest.raises(InvalidArgument, match="complex"):
                t.get_scaled_data(None, (2, 2), "area")

    def test_virtual_dataset_has_no_block_and_does_not_decimate(self, tmp_path):
        parts = [np.full((4, 10), i, dtype=np.int16) + np.arange(10, dtype=np.int16) for i in range(3)]
        with h5py.File(tmp_path / "vds.h5", "w") as f:
            layout = h5py.VirtualLayout(shape=(12, 10), dtype=np.int16)
            for i, part in enumerate(parts):
                src_ds = f.create_dataset(f"part{i}", data=part, chunks=(2, 5))
                layout[4 * i : 4 * i + 4] = h5py.VirtualSource(src_ds)
            f.create_virtual_dataset("joined", layout)
        with tensor_server.open(tmp_path / "vds.h5") as src:
            t = src.tensors["joined"]
            assert src.default_field == "joined" and type(inner(t)) is Hdf5Adapter
            assert inner(t).metadata["layout"] == "virtual"
            assert t.read_block_shape is None and not t.decimates
            np.testing.assert_array_equal(t.get_data(Bounds((3, 2), (9, 7))), np.concatenate(parts)[3:9, 2:7])

    def test_userblock_and_misnamed_files_are_detected_by_content(self, tmp_path):
        data = np.arange(48, dtype=np.int32).reshape(6, 8)
        with h5py.File(tmp_path / "ub.dat", "w", userblock_size=1024) as f:
            f["d"] = data
        with h5py.File(tmp_path / "plain.bin", "w") as f:
            f["d"] = data
        for name in ("ub.dat", "plain.bin"):
            assert detect_format(tmp_path / name).name == "hdf5"
            with tensor_server.open(tmp_path / name) as src:
                np.testing.assert_array_equal(src.tensor().get_data(), data)


class TestHandleLifecycle:
    @pytest.fixture
    def src(self, tmp_path):
        write_sample(tmp_path / "sample.h5")
        src = tensor_server.open(tmp_path / "sample.h5")
        yield src
        src.close()

    def test_reaper_closes_idle_handle_and_next_read_reopens(self, src):
        t = src.tensors["plane"]
        handle = src.file.handle
        assert all(inner(x).file is src.file for x in src.tensors.values()), "one handle per file"
        first = t.get_data(Bounds((0, 0), (10, 10)))
        assert handle.is_open
        opens = handle.opens
        assert reap_idle_handles(now=FAR_FUTURE) >= 1
        assert not handle.is_open
        again = src.tensors["stack4d"].get_data()  # another tensor of the same file
        assert handle.is_open and handle.opens == opens + 1
        np.testing.assert_array_equal(t.get_data(Bounds((0, 0), (10, 10))), first)
        assert again.shape == (3, 4, 20, 24)

    def test_read_in_flight_blocks_close(self, src, monkeypatch):
        t = src.tensors["plane"]
        want = t.get_data()
        started, release = threading.Event(), threading.Event()
        real_read_open = hdf5_module.Hdf5File.read_open

        def slow_read(self, h5file, path, selection, dtype):
            started.set()
            assert release.wait(10)
            return real_read_open(self, h5file, path, selection, dtype)

        monkeypatch.setattr(hdf5_module.Hdf5File, "read_open", slow_read)
        result = {}
        reader = threading.Thread(target=lambda: result.setdefault("data", t.get_data()))
        reader.start()
        assert started.wait(10)
        reap_idle_handles(now=FAR_FUTURE)
        assert src.file.handle.is_open, "the reaper must not close a handle with a read in flight"
        closer = threading.Thread(target=src.close)
        closer.start()
        closer.join(0.3)
        assert closer.is_alive(), "close() must wait for the read in flight"
        release.set()
        reader.join(10)
        closer.join(10)
        assert not reader.is_alive() and not closer.is_alive()
        np.testing.assert_array_equal(result["data"], want)
        assert not src.file.handle.is_open


# ---- real files ------------------------------------------------------------------------------
def check_against_expected(src, datasets: dict) -> None:
    """Every dataset of an expected.json entry is a field (path without '/') with the listed
    dtype, shape (in served order), min, max and sum; and equals h5py's own read."""
    with h5py.File(src.path, "r") as f:
        for key, exp in datasets.items():
            field = key.lstrip("/")
            assert field in src.tensors, f"{src.path.name}: no field {field!r}"
            t = src.tensors[field]
            order = served_order(t)
            assert t.dtype == np.dtype(exp["dtype"]), field
            assert t.shape == tuple(exp["shape"][i] for i in order), field
            data = t.get_data()
            np.testing.assert_array_equal(data, np.transpose(f[key][()], order))
            assert data.min() == pytest.approx(exp["min"]) and data.max() == pytest.approx(exp["max"])
            assert float(data.astype(np.float64).sum()) == pytest.approx(exp["sum"], rel=1e-9)


@pytest.mark.parametrize("name", ["hdf5/example2_v3.1.hspy", "hdf5/py4DSTEM_size2x3x4x5.h5"])
def test_real_files_match_expected(testdata, expected, name):
    with tensor_server.open(testdata / name) as src:
        check_against_expected(src, expected[name]["datasets"])


def test_every_hdf5_sample_is_covered(testdata, expected):
    on_disk = {f"hdf5/{p.name}" for p in (testdata / "hdf5").iterdir()}
    assert on_disk <= set(expected), on_disk - set(expected)


def test_hyperspy_axes_calibrate(testdata):
    with tensor_server.open(testdata / "hdf5/example2_v3.1.hspy") as src:
        assert src.type == "hdf5"
        t = src.tensors["Experiments/test_diffraction_pattern/data"]
        assert t.dim_labels == ("y", "x")
        assert t.physical_scale == pytest.approx((0.17443285882472992, 0.17443285882472992))
        assert t.physical_unit == ("1/nm", "1/nm")
        assert t.read_block_shape == (16, 16)


def test_py4dstem_file_is_emd_with_calibration(testdata):
    """emdfile 1.0 (root emd_group_type 'file'): claimed by the EMD adapter, dim0..dim3 are
    [origin, origin + step] vectors."""
    with tensor_server.open(testdata / "hdf5/py4DSTEM_size2x3x4x5.h5") as src:
        assert src.type == "emd"
        t = src.tensors["datacube_root/datacube/data"]
        assert list(src.tensors) == ["datacube_root/datacube/data"]  # dim vectors are calibration
        assert t.dim_labels == ("c", "z", "y", "x") and t.read_block_shape is None and t.decimates
        assert t.physical_unit == ("nm", "nm", "1/Å", "1/Å")
        with h5py.File(src.path, "r") as f:
            steps = [float(np.diff(f[f"datacube_root/datacube/dim{i}"][()])[0]) for i in range(4)]
        assert t.physical_scale == pytest.approx(tuple(steps))


# ---- labels ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "names, want",
    [
        (["y", "x"], ("y", "x")),
        (["X", "Y"], ("x", "y")),
        (["time", "channel", "z", "y", "x"], ("t", "c", "z", "y", "x")),
        (["R_x", "R_y", "Q_x", "Q_y"], ("c", "z", "y", "x")),
        (["R_x", "R_y", "bin_outer_angle"], ("y", "x", "z")),
        (["y", "x", "Energy"], ("y", "x", "z")),
        (["x", "t"], ("x", "t")),
        (["", ""], None),
        (["x", "x"], None),
        (["Energy", "y"], None),
    ],
)
def test_labels_from_axis_names(names, want):
    assert labels_from_axis_names(names) == want


# ---- bad input -------------------------------------------------------------------------------
def open_with_deadline(path: Path, seconds: float = 20.0):
    """tensor_server.open under a deadline: a hang fails the test; an open error is handed back
    in the box (``"exc"``) for the test to inspect, a success as ``"src"``."""
    box: dict = {}
    try:
        box["src"] = finishes_within(lambda: tensor_server.open(path), seconds)
    except AssertionError:
        raise
    except BaseException as exc:  # handed back to the test
        box["exc"] = exc
    return box


def test_not_hdf5_named_h5_is_unreadable(tmp_path):
    p = tmp_path / "fake.h5"
    p.write_bytes(b"this is not an HDF5 file\n" * 200)
    box = open_with_deadline(p)
    assert isinstance(box.get("exc"), UnreadableSource)
    assert str(p) in str(box["exc"]) and box["exc"].path == str(p)


@pytest.mark.parametrize("keep", [0.5, 0.02])
def test_truncated_hdf5_is_unreadable(tmp_path, keep):
    full = tmp_path / "full.h5"
    write_sample(full)
    cut = tmp_path / "cut.h5"
    blob = full.read_bytes()
    cut.write_bytes(blob[: max(64, int(len(blob) * keep))])
    box = open_with_deadline(cut)
    assert isinstance(box.get("exc"), UnreadableSource), box
    assert str(cut) in str(box["exc"])


def test_corrupt_chunk_raises_unreadable_at_read_time(tmp_path):
    p = tmp_path / "corrupt.h5"
    data = np.random.default_rng(0).integers(0, 1000, (64, 64), dtype=np.int32)
    with h5py.File(p, "w") as f:
        ds = f.create_dataset("d", data=data, chunks=(32, 32), compression="gzip")
        info = ds.id.get_chunk_info(0)
    with open(p, "r+b") as fh:  # overwrite the first chunk's deflate stream with garbage
        fh.seek(info.byte_offset)
        fh.write(b"\xff" * min(info.size, 64))
    with tensor_server.open(p) as src:
        t = src.tensors["d"]
        np.testing.assert_array_equal(t.get_data(Bounds((32, 32), (64, 64))), data[32:, 32:])  # intact chunk
        with pytest.raises(UnreadableSource) as err:
            t.get_data(Bounds((0, 0), (8, 8)))
        assert str(p) in str(err.value) and "/d" in str(err.value)


def test_file_without_numeric_datasets_is_unreadable(tmp_path):
    p = tmp_path / "strings.h5"
    with h5py.File(p, "w") as f:
        f["name"] = "only text"
        f["n"] = 3
    with pytest.raises(UnreadableSource, match="no numeric N-D dataset"):
        tensor_server.open(p)
