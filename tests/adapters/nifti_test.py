"""NIfTI adapter (nibabel): NIfTI-1/-2, .nii/.nii.gz, scaling, axes, calibration, decimated
reads, nibabel's own sample files and bad input."""

from __future__ import annotations

import gzip
import importlib.resources
from pathlib import Path

import numpy as np
import pytest

import tensor_server
from tensor_server.adapters.nifti import NiftiAdapter, served_dtype
from tensor_server.core.bounds import Bounds
from tensor_server.errors import UnreadableSource
from tensor_server.testing import AdapterTests

nib = pytest.importorskip("nibabel")


def _nibabel_reference(path: Path, dtype: np.dtype) -> np.ndarray:
    """nibabel's read (scaling applied by the proxy), cast to the served dtype, axes reversed
    from (x, y, z, t, ...) to canonical (..., t, z, y, x)."""
    data = np.asarray(nib.load(str(path)).dataobj)
    return data.astype(dtype).transpose(tuple(range(data.ndim))[::-1])


def _save(img, path: Path, slope=None, inter=None, units=None) -> Path:
    if slope is not None:
        img.header.set_slope_inter(slope, inter)
    if units is not None:
        img.header.set_xyzt_units(*units)
    nib.save(img, str(path))
    return path


def _patch_slope_zero(path: Path) -> Path:
    """scl_slope = 0 (NIfTI: "no scaling") and a non-zero scl_inter that must then be ignored;
    nibabel refuses to write a zero slope, so the header bytes are patched (offsets 112/116)."""
    raw = bytearray(path.read_bytes())
    raw[112:120] = np.array([0.0, 5.0], dtype="<f4").tobytes()
    path.write_bytes(bytes(raw))
    return path


def _fixtures(tmp_path: Path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    aff = np.diag([0.8, 0.9, 2.5, 1.0])
    i16 = rng.integers(-2000, 2000, (23, 19, 7, 3), dtype=np.int16)
    f32 = rng.standard_normal((21, 17, 9)).astype(np.float32)
    img = nib.Nifti1Image(i16, aff)
    img.header.set_zooms((0.8, 0.9, 2.5, 1.5))
    out = {
        "n1_int16_4d": _save(img, tmp_path / "a.nii", units=("mm", "sec")),
        "n1_float32_gz": _save(nib.Nifti1Image(f32, aff), tmp_path / "b.nii.gz", units=("micron", "unknown")),
        "n2_int16": _save(nib.Nifti2Image(i16[..., 0], aff), tmp_path / "c.nii"),
        "n2_gz_scaled": _save(nib.Nifti2Image(i16[:, :, :4, 0], aff), tmp_path / "d.nii.gz", slope=0.25, inter=10.0),
        "n1_int16_scaled": _save(nib.Nifti1Image(i16[..., 1], aff), tmp_path / "e.nii", slope=1.5, inter=-3.0),
        "n1_uint8_slope0": _patch_slope_zero(
            _save(nib.Nifti1Image(rng.integers(0, 255, (15, 11, 5), dtype=np.uint8), aff), tmp_path / "f.nii")
        ),
        "n1_pair": _save(nib.Nifti1Pair(f32[:, :, :3], aff), tmp_path / "g.hdr"),
        "n2_pair": _save(nib.Nifti2Pair(i16[:, :, :2, 2], aff), tmp_path / "h.hdr"),
    }
    return out


def _assert_unreadable(path: Path) -> None:
    with pytest.raises(UnreadableSource) as info:
        tensor_server.open(path)
    assert str(path) in str(info.value)


class TestNiftiGenerated(AdapterTests):
    @pytest.fixture(
        params=[
            "n1_int16_4d",
            "n1_float32_gz",
            "n2_int16",
            "n2_gz_scaled",
            "n1_int16_scaled",
            "n1_uint8_slope0",
            "n1_pair",
            "n2_pair",
        ]
    )
    def source(self, request, tmp_path):
        src = tensor_server.open(_fixtures(tmp_path)[request.param])
        yield src
        src.close()

    def reference_array(self, source, field):
        return _nibabel_reference(source.path, source.tensor(field).dtype)


def test_axes_calibration_and_declarations(tmp_path):
    fx = _fixtures(tmp_path)
    with tensor_server.open(fx["n1_int16_4d"]) as src:
        t = src.tensor()
        assert src.type == "nifti" and isinstance(t.inner, NiftiAdapter)
        assert t.inner.dim_labels == ("x", "y", "z", "t")
        assert t.dim_labels == ("t", "z", "y", "x") and t.shape == (3, 7, 19, 23)
        assert t.physical_scale == pytest.approx((1.5, 2.5, 0.9, 0.8))
        assert t.physical_unit == ("s", "mm", "mm", "mm")
        assert t.dtype == np.int16 and src.metadata["scaled"] is False
        assert t.read_block_shape is None and t.decimates
    with tensor_server.open(fx["n1_float32_gz"]) as src:
        t = src.tensor()
        assert t.physical_unit == ("µm",) * 3
    with tensor_server.open(fx["n2_int16"]) as src:
        assert src.metadata["format"] == "Nifti2"


def test_scaling_rules(tmp_path):
    fx = _fixtures(tmp_path)
    with tensor_server.open(fx["n1_int16_scaled"]) as src:
        t = src.tensor()
        assert t.dtype == np.float32 and src.metadata["scaled"]
        raw = np.asarray(nib.load(str(fx["n1_int16_scaled"])).dataobj.get_unscaled())
        want = (raw.astype(np.float64) * 1.5 - 3.0).astype(np.float32).T
        np.testing.assert_array_equal(t.get_data(), want)
    with tensor_server.open(fx["n1_uint8_slope0"]) as src:  # slope 0 means "no scaling"
        assert src.tensor().dtype == np.uint8 and not src.metadata["scaled"]
    assert served_dtype(np.dtype(">i2"), 1.0, 0.0) == np.dtype(">i2")
    assert served_dtype(np.dtype("i2"), 2.0, 0.0) == np.float32
    assert served_dtype(np.dtype("f8"), 2.0, 1.0) == np.float64


def test_decimated_read_equals_strided_get_data(tmp_path):
    for name in ("n1_int16_4d", "n2_gz_scaled"):
        with tensor_server.open(_fixtures(tmp_path)[name]) as src:
            t = src.tensor()
            start = tuple(min(1, n - 1) for n in t.shape)
            b = Bounds(start, t.shape)
            for step in [(1,) * t.ndim, (2,) * t.ndim, (1,) * (t.ndim - 2) + (3, 5)]:
                want = t.get_data(b)[tuple(slice(None, None, s) for s in step)]
                got = t.get_decimated_data(b, step)
                np.testing.assert_array_equal(got, want)
                assert got.flags.owndata


# ---- nibabel's bundled sample files (real files written by other software) --------------------
NIBABEL_SAMPLES = {
    # name: (shape as nibabel reports it, raw dtype, sum of np.asanyarray(dataobj)) from SOURCES.md
    "anatomical.nii": ((33, 41, 25), ">i2", 284166082),
    "functional.nii": ((17, 21, 3, 20), None, 77913290.363),
    "example4d.nii.gz": ((128, 96, 24, 2), "int16", 101985356),
    "example_nifti2.nii.gz": ((32, 20, 12, 2), "int16", 6926802),
    "standard.nii.gz": ((4, 5, 7), "uint8", 7650),
    "reoriented_anat_moved.nii": ((21, 26, 22), ">f4", 32739769.449),
}


def _nibabel_sample(name: str) -> Path:
    path = Path(str(importlib.resources.files("nibabel") / "tests" / "data" / name))
    if not path.exists():
        pytest.skip(f"nibabel test data {name} not installed")
    return path


@pytest.mark.parametrize("name", sorted(NIBABEL_SAMPLES))
def test_nibabel_samples_match_sources(name):
    shape, raw, total = NIBABEL_SAMPLES[name]
    with tensor_server.open(_nibabel_sample(name)) as src:
        t = src.tensor()
        assert src.type == "nifti"
        assert t.shape == tuple(reversed(shape))
        a = t.get_data()
        if raw is not None:
            assert t.dtype == np.dtype(raw).newbyteorder("=")
            assert a.sum(dtype=np.float64) == pytest.approx(total, rel=1e-10, abs=1e-3)
        else:  # functional.nii is scaled: served float32 (nibabel's float64 cast down)
            assert t.dtype == np.float32
            assert a.sum(dtype=np.float64) == pytest.approx(total, rel=1e-6)
        np.testing.assert_array_equal(a, _nibabel_reference(src.path, t.dtype))


class TestNiftiNibabelSamples(AdapterTests):
    @pytest.fixture(params=["example_nifti2.nii.gz", "functional.nii", "anatomical.nii"])
    def source(self, request):
        src = tensor_server.open(_nibabel_sample(request.param))
        yield src
        src.close()

    def reference_array(self, source, field):
        return _nibabel_reference(source.path, source.tensor(field).dtype)


# ---- sniffing and bad input --------------------------------------------------------------------
def test_sniff_by_content(tmp_path):
    fx = _fixtures(tmp_path)
    for name, new in (("n1_int16_4d", "x.img1"), ("n2_int16", "y.bin"), ("n1_float32_gz", "z.gzdata")):
        other = tmp_path / new
        other.write_bytes(fx[name].read_bytes())
        with tensor_server.open(other) as src:
            assert src.type == "nifti"
            np.testing.assert_array_equal(src.tensor().get_data(), _nibabel_reference(fx[name], src.tensor().dtype))


@pytest.mark.parametrize("name", ["n1_int16_4d", "n2_int16", "n1_float32_gz"])
@pytest.mark.parametrize("keep", [100, 0.6])
def test_truncated_nifti_is_unreadable(tmp_path, name, keep):
    data = _fixtures(tmp_path)[name].read_bytes()
    if name.endswith("gz"):  # cut the decompressed stream and re-gzip, plus a cut gzip stream
        raw = gzip.decompress(data)
        cut = raw[: keep if isinstance(keep, int) else int(len(raw) * keep)]
        bad = tmp_path / "cut_stream.nii.gz"
        bad.write_bytes(gzip.compress(cut))
        _assert_unreadable_or_fails_on_read(bad)
        bad2 = tmp_path / "cut_file.nii.gz"
        bad2.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
        _assert_unreadable_or_fails_on_read(bad2)
    else:
        bad = tmp_path / "cut.nii"
        bad.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
        _assert_unreadable_or_fails_on_read(bad)


def _assert_unreadable_or_fails_on_read(path: Path) -> None:
    """Opening fails naming the path, or (gzip: the stream is only inflated on read) the first
    read does. Either way an UnreadableSource naming the path, never garbage or a hang."""
    try:
        src = tensor_server.open(path)
    except UnreadableSource as exc:
        assert str(path) in str(exc)
        return
    with src:
        with pytest.raises(UnreadableSource) as info:
            src.tensor().get_data()
        assert str(path) in str(info.value)


@pytest.mark.parametrize("name", ["garbage.nii", "garbage.nii.gz"])
def test_garbage_with_extension_is_unreadable(tmp_path, name):
    bad = tmp_path / name
    payload = np.random.default_rng(3).integers(0, 256, 2000, dtype=np.uint8).tobytes()
    bad.write_bytes(gzip.compress(payload) if name.endswith(".gz") else payload)
    _assert_unreadable(bad)
