"""Zarr (v2, v3, sharded) and OME-Zarr (0.4 / 0.5, plates, labels, bioformats2raw) adapters.

Fixtures are written with zarr-python itself; NGFF metadata is written by hand per the spec
(https://ngff.openmicroscopy.org), so the adapter is checked against the documents, not
against a helper library's reading of them. Real third-party stores come from
../shared/testdata/ome-zarr (see SOURCES.md).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import tensor_server
from tensor_server.adapters.registry import detect_format
from tensor_server.core.bounds import Bounds
from tensor_server.core.engine import ReadEngine
from tensor_server.core.plan import plan_read
from tensor_server.errors import UnreadableSource
from tensor_server.testing import AdapterTests

zarr = pytest.importorskip("zarr")

RNG = np.random.default_rng(2024)


def _zread(root: Path, path: str) -> np.ndarray:
    """The format library's own read of one array of a store."""
    return np.asarray(zarr.open_array(store=str(root), path=path, mode="r")[...])


def _multiscales(axes, levels, version=None, name="img"):
    """An NGFF multiscales entry: ``axes`` [(name, type, unit)], ``levels`` [(path, scale)]."""
    ms = {
        "name": name,
        "axes": [{"name": n, "type": t, **({"unit": u} if u else {})} for n, t, u in axes],
        "datasets": [
            {"path": p, "coordinateTransformations": [{"type": "scale", "scale": list(s)}]} for p, s in levels
        ],
    }
    if version is not None:
        ms["version"] = version
    return ms


def _write_label_image(group, zarr_format: int, ome_key: bool) -> np.ndarray:
    """labels/cells: a 2-level uint32 label image (YX) under ``group``."""
    labels = group.create_group("labels")
    cells = labels.create_group("cells")
    data = RNG.integers(0, 5, (48, 40), dtype=np.uint32)
    cells.create_array("0", data=data, chunks=(16, 16))
    cells.create_array("1", data=data[::2, ::2], chunks=(16, 16))
    ms = _multiscales(
        [("y", "space", "micrometer"), ("x", "space", "micrometer")],
        [("0", (0.5, 0.5)), ("1", (1.0, 1.0))],
        version=None if ome_key else "0.4",
    )
    label_attrs = {"multiscales": [ms], "image-label": {"colors": [{"label-value": 1, "rgba": [255, 0, 0, 255]}]}}
    if ome_key:
        labels.attrs.update({"ome": {"version": "0.5", "labels": ["cells"]}})
        cells.attrs.update({"ome": {"version": "0.5", **label_attrs}})
    else:
        labels.attrs.update({"labels": ["cells"]})
        cells.attrs.update(label_attrs)
    return data


class _ZarrSuite(AdapterTests):
    """Reference: zarr's own read of the array a field serves, in the served axis order.

    ZarrAdapter does not override the reduction path, so every method on every dtype is the
    kernels' business (tests/kernels); each (dtype, scale, method) JIT-compiles a kernel, so
    suites here run nearest + area only, except the plain v2 and sharded suites, which run all
    six on the shared uint16 3-D shape (the read-block floor is what differs between them).
    """

    methods = ("nearest", "area")

    #: field -> (zarr path, permutation from stored to served order)
    layout: dict = {}

    def reference_array(self, source, field):
        path, order = self.layout[field]
        arr = _zread(source.path, path)
        return arr if order is None else np.transpose(arr, order)


# ---- plain zarr -------------------------------------------------------------------------------
class TestZarrV2Array(_ZarrSuite):
    layout = {"data": ("", None)}
    methods = AdapterTests.methods

    @pytest.fixture
    def source(self, tmp_path):
        p = tmp_path / "plain_v2.zarr"
        a = zarr.create_array(str(p), shape=(3, 70, 90), chunks=(1, 32, 48), dtype="u2", zarr_format=2)
        a[...] = RNG.integers(0, 4000, (3, 70, 90), dtype=np.uint16)
        src = tensor_server.open(p)
        yield src
        src.close()

    def test_plain_array_facts(self, source):
        assert source.type == "zarr" and list(source.tensors) == ["data"]
        t = source.tensor()
        assert t.dim_labels == ("z", "y", "x")  # server defaults: last axes y, x
        assert t.physical_scale is None
        assert t.read_block_shape == t.native_chunk_shape == (1, 32, 48)
        assert t.decimates  # the server decodes local chunks itself: nearest strides each chunk


class TestZarrV3Group(_ZarrSuite):
    """A plain v3 group with several arrays: one tensor per array, field = array path;
    ``dimension_names`` label the axes and put them in canonical order."""

    layout = {"raw": ("raw", None), "nested/mask": ("nested/mask", None), "rgb": ("rgb", (2, 0, 1))}

    @pytest.fixture
    def source(self, tmp_path):
        p = tmp_path / "group_v3.zarr"
        g = zarr.open_group(str(p), mode="w", zarr_format=3)
        g.create_array("raw", data=RNG.integers(0, 9000, (9, 40, 33), dtype=np.uint16), chunks=(3, 16, 16))
        g.create_group("nested").create_array(
            "mask", data=RNG.integers(0, 4, (50, 60), dtype=np.uint8), chunks=(25, 30)
        )
        g.create_array(
            "rgb",
            data=RNG.integers(0, 255, (30, 41, 3), dtype=np.uint8),
            chunks=(16, 16, 3),
            dimension_names=["y", "x", "c"],
        )
        src = tensor_server.open(p)
        yield src
        src.close()

    def test_fields_and_labels(self, source):
        assert detect_format(source.path).name == "zarr"
        assert list(source.tensors) == ["nested/mask", "raw", "rgb"]
        rgb = source.tensors["rgb"]
        assert rgb.dim_labels == ("c", "y", "x") and rgb.shape == (3, 30, 41)
        assert rgb.read_block_shape == (3, 16, 16)  # the stored chunk, permuted with the axes


class TestShardedZarrV3(_ZarrSuite):
    layout = {"data": ("", None)}
    methods = AdapterTests.methods

    @pytest.fixture
    def source(self, tmp_path):
        p = tmp_path / "sharded.zarr"
        a = zarr.create_array(
            str(p), shape=(4, 64, 96), chunks=(2, 32, 32), shards=(4, 64, 64), dtype="u2", zarr_format=3
        )
        a[...] = RNG.integers(0, 60000, (4, 64, 96), dtype=np.uint16)
        src = tensor_server.open(p)
        yield src
        src.close()

    def test_read_block_is_the_inner_chunk(self, source):
        t = source.tensor()
        assert t.read_block_shape == t.native_chunk_shape == (2, 32, 32)  # not the shard
        assert t.metadata["shards"] == [4, 64, 64]


class TestBigEndian(_ZarrSuite):
    """Big-endian stores: v2 ``>i2`` / ``>f8`` and a v3 array with a big-endian bytes codec."""

    layout = {"u2": ("u2", None), "f8": ("f8", None), "v3": ("v3", None)}

    @pytest.fixture
    def source(self, tmp_path):
        from zarr.codecs import BytesCodec

        p = tmp_path / "be.zarr"
        g = zarr.open_group(str(p), mode="w", zarr_format=2)
        g.create_array("u2", data=RNG.integers(0, 60000, (3, 20, 30)).astype(">u2"), chunks=(1, 8, 8))
        g.create_array("f8", data=RNG.standard_normal((20, 30)).astype(">f8"), chunks=(8, 16))
        v3 = zarr.create_array(
            str(p / "v3"),
            shape=(2, 20, 30),
            chunks=(1, 8, 8),
            dtype="u2",
            zarr_format=3,
            serializer=BytesCodec(endian="big"),
        )
        v3[...] = RNG.integers(0, 60000, (2, 20, 30), dtype=np.uint16)
        src = tensor_server.open(p)
        yield src
        src.close()

    def test_stored_big_endian_served_native(self, source):
        assert json.loads((source.path / "u2" / ".zarray").read_text())["dtype"] == ">u2"
        assert '"big"' in (source.path / "v3" / "zarr.json").read_text()
        for t in source.tensors.values():
            assert t.get_data().dtype.isnative


# ---- OME-Zarr ---------------------------------------------------------------------------------
def _write_ome(p: Path, zarr_format: int) -> dict:
    """A czyx uint16 image with levels at factors (1,1,2,2) and (1,2,4,4), one level at a
    non-integer factor (1.5) that must be skipped, and labels/cells. Returns the written data."""
    g = zarr.open_group(str(p), mode="w", zarr_format=zarr_format)
    l0 = RNG.integers(0, 60000, (2, 5, 64, 80), dtype=np.uint16)
    levels = {
        "0": (l0, (1.0, 0.5, 0.25, 0.25)),
        "1": (l0[:, :, ::2, ::2].copy(), (1.0, 0.5, 0.5, 0.5)),
        "odd": (l0[:, :, :43, :54].copy(), (1.0, 0.5, 0.375, 0.375)),
        "2": (l0[:, ::2, ::4, ::4].copy(), (1.0, 1.0, 1.0, 1.0)),
    }
    for path, (data, _) in levels.items():
        g.create_array(path, data=data, chunks=(1, 5, 32, 40))
    axes = [
        ("c", "channel", None),
        ("z", "space", "micrometer"),
        ("y", "space", "micrometer"),
        ("x", "space", "micrometer"),
    ]
    ms = _multiscales(axes, [(k, s) for k, (_, s) in levels.items()], version=None if zarr_format == 3 else "0.4")
    ms["coordinateTransformations"] = [{"type": "scale", "scale": [1.0, 2.0, 1.0, 1.0]}]  # multiscale-wide
    omero = {"channels": [{"label": "DAPI"}, {"label": "GFP"}]}
    if zarr_format == 3:
        g.attrs.update({"ome": {"version": "0.5", "multiscales": [ms], "omero": omero}})
    else:
        g.attrs.update({"multiscales": [ms], "omero": omero})
    labels = _write_label_image(g, zarr_format, ome_key=zarr_format == 3)
    return {"levels": {k: d for k, (d, _) in levels.items()}, "labels": labels}


class _OmeSuite(_ZarrSuite):
    layout = {"image": ("0", None), "image/@labels/cells": ("labels/cells/0", None)}
    zarr_format = 2

    @pytest.fixture
    def written(self, tmp_path):
        p = tmp_path / "img.ome.zarr"
        return p, _write_ome(p, self.zarr_format)

    @pytest.fixture
    def source(self, written):
        src = tensor_server.open(written[0])
        yield src
        src.close()

    def test_ome_metadata(self, source):
        assert source.type == "ome-zarr" and detect_format(source.path).name == "ome-zarr"
        assert list(source.tensors) == ["image", "image/@labels/cells"]  # a label set under its image
        assert source.former_fields == {"labels/cells": "image/@labels/cells"}
        t = source.tensor("image")
        assert t.dim_labels == ("c", "z", "y", "x") and t.dtype == np.uint16
        assert t.physical_scale == (None, 1.0, 0.25, 0.25)  # dataset scale x multiscale-wide scale
        assert t.physical_unit == (None, "µm", "µm", "µm")
        assert t.read_block_shape == (1, 5, 32, 40) and not t.is_labels
        assert t.metadata["omero"]["channels"][1]["label"] == "GFP"

    def test_native_levels_are_the_stored_levels(self, source, written):
        levels = written[1]["levels"]
        t = source.tensor("image")
        assert [lv.scale for lv in t.native_levels] == [(1, 1, 2, 2), (1, 2, 4, 4)]
        np.testing.assert_array_equal(t.native_levels[0].tensor.get_data(), levels["1"])
        np.testing.assert_array_equal(t.native_levels[1].tensor.get_data(), levels["2"])
        # the 1.5x level is not an integer factor: skipped, with the reason recorded
        (skipped,) = t.metadata["skipped_levels"]
        assert skipped["path"] == "odd" and "not a positive integer" in skipped["reason"]
        assert t.native_levels[1].tensor.physical_scale == (None, 2.0, 1.0, 1.0)

    def test_precompute_plan_serves_the_stored_level(self, source, written):
        t = source.tensor("image")
        plan = plan_read(t, Bounds((0, 1, 8, 16), (2, 5, 64, 80)), (1, 2, 4, 4), "precompute")
        out = np.empty(plan.shape, t.dtype)
        for pc in plan.chunks:
            out[pc.out_bounds.to_slices()] = ReadEngine().chunk(pc.chunk_id.encode(), t)[1]
        scale = (1, 2, 4, 4)
        assert plan.method == "precompute" and plan.scale == scale
        # the realized region is reported in level-0 pixels; the stored level is addressed by /scale
        level_window = tuple(slice(a // s, a // s + n) for a, s, n in zip(plan.realized.start, scale, plan.shape))
        want = written[1]["levels"]["2"][level_window]
        np.testing.assert_array_equal(out, want)
        assert want.shape[1:] >= (3, 14, 16)  # covers the requested region at least

    def test_labels_are_label_tensors(self, source, written):
        lab = source.tensor("image/@labels/cells")
        assert lab.is_labels and lab.dtype == np.uint32 and lab.dim_labels == ("y", "x")
        assert lab.physical_scale == (0.5, 0.5)
        assert [lv.scale for lv in lab.native_levels] == [(2, 2)]
        np.testing.assert_array_equal(lab.get_data(), written[1]["labels"])
        assert "image-label" in lab.metadata


class TestOmeZarr04(_OmeSuite):
    zarr_format = 2


class TestOmeZarr05(_OmeSuite):
    zarr_format = 3

    def test_v05_keeps_metadata_under_ome(self, source):
        doc = json.loads((source.path / "zarr.json").read_text())
        assert "multiscales" in doc["attributes"]["ome"] and "multiscales" not in doc["attributes"]
        assert source.metadata["ngff_version"] == "0.5"


class TestHcsPlate(_ZarrSuite):
    """A 2-well plate with two fields in A/1 and one in B/2, NGFF 0.4 on zarr v2."""

    layout = {"A/1/0": ("A/1/0/0", None), "A/1/1": ("A/1/1/0", None), "B/2/0": ("B/2/0/0", None)}

    def tensors(self, source):
        """The fields; the plate image beside them has its own suite (plate_montage_test.py)."""
        return [(f, t) for f, t in source.tensors.items() if f in self.layout]

    @pytest.fixture
    def source(self, tmp_path):
        p = tmp_path / "plate.ome.zarr"
        g = zarr.open_group(str(p), mode="w", zarr_format=2)
        wells = {"A/1": 2, "B/2": 1}
        g.attrs.update(
            {
                "plate": {
                    "version": "0.4",
                    "name": "tiny",
                    "field_count": 2,
                    "rows": [{"name": "A"}, {"name": "B"}],
                    "columns": [{"name": "1"}, {"name": "2"}],
                    "wells": [{"path": w, "rowIndex": i, "columnIndex": i} for i, w in enumerate(wells)],
                }
            }
        )
        axes = [("c", "channel", None), ("y", "space", "micrometer"), ("x", "space", "micrometer")]
        for w, nfields in wells.items():
            wg = g.require_group(w)
            wg.attrs.update({"well": {"version": "0.4", "images": [{"path": str(f)} for f in range(nfields)]}})
            for f in range(nfields):
                fg = wg.create_group(str(f))
                fg.create_array("0", data=RNG.integers(0, 255, (2, 24, 20), dtype=np.uint8), chunks=(1, 12, 20))
                fg.attrs.update({"multiscales": [_multiscales(axes, [("0", (1, 0.3, 0.3))], version="0.4")]})
        src = tensor_server.open(p)
        yield src
        src.close()

    def test_one_tensor_per_field(self, source):
        assert source.type == "ome-zarr" and source.metadata["layout"] == "plate"
        assert list(source.tensors) == ["A/1/0", "A/1/1", "B/2/0", "plate"]
        assert source.metadata["plate"]["name"] == "tiny"
        assert all(t.physical_scale == (None, 0.3, 0.3) for t in source.tensors.values())


# ---- real files -------------------------------------------------------------------------------
def _ome_zarr_samples():
    from tests.conftest import _testdata_dir

    d = _testdata_dir()
    if d is None:
        return ["(no testdata)"]
    keys = [k for k in json.loads((d / "expected.json").read_text()) if k.startswith("ome-zarr/")]
    return keys


@pytest.mark.parametrize("key", _ome_zarr_samples())
def test_real_ome_zarr_matches_expected(key, testdata, expected):
    want = expected[key]
    with tensor_server.open(testdata / key) as src:
        assert src.type == "ome-zarr"
        assert src.metadata["ngff_version"] == want["ngff_version"]
        t = src.tensor()
        if want["axes"]:
            assert list(t.dim_labels) == want["axes"]
        served = [t] + [lv.tensor for lv in t.native_levels]
        assert len(served) == len(want["levels"])
        for tensor, (level, lw) in zip(served, sorted(want["levels"].items())):
            data = tensor.get_data()
            assert list(data.shape) == lw["shape"], level
            assert data.dtype == np.dtype(lw["dtype"]), level
            assert list(tensor.read_block_shape) == lw["chunks"], level
            assert data.min() == lw["min"] and data.max() == lw["max"], level
            assert data.sum(dtype=np.float64) == pytest.approx(lw["sum"], rel=1e-9), level


def test_bioformats2raw_root_serves_series(testdata):
    with tensor_server.open(testdata / "ome-zarr/bioformats2raw-v0.1-zarr2/data.zarr") as src:
        assert src.metadata["layout"] == "bioformats2raw" and list(src.tensors) == ["0"]
        t = src.tensor("0")
        assert t.dim_labels == tuple("tczyx") and t.shape == (1, 3, 1, 167, 439)
        assert [lv.scale for lv in t.native_levels] == [(1, 1, 1, 2, 2)]  # from 167 -> 83, 439 -> 219


def test_bioformats2raw_equals_ome_tiff_pixels(testdata):
    """SOURCES.md identity: level 0 of the bioformats2raw series == the avivator OME-TIFF."""
    tifffile = pytest.importorskip("tifffile")
    tif = tifffile.imread(testdata / "ome-tiff/avivator_multi-channel.ome.tif")
    with tensor_server.open(testdata / "ome-zarr/bioformats2raw-v0.1-zarr2/data.zarr/0") as src:
        got = src.tensor().get_data()
    assert tif.shape == (3, 167, 439) and tif.dtype == np.int8
    np.testing.assert_array_equal(got[0, :, 0], tif)
    assert int(got.sum()) == 10445323


def test_real_v04_axes_units_and_empty_labels(testdata):
    with tensor_server.open(testdata / "ome-zarr/v0.4-zarr2/image-03.zarr") as src:
        assert list(src.tensors) == ["image"]  # its labels group is empty
        t = src.tensor()
        assert t.physical_unit == ("µm",) * 3 and t.physical_scale == (1.0, 1.0, 1.0)
    with tensor_server.open(testdata / "ome-zarr/v0.5-zarr3/blobs_image_v05.ome.zarr") as src:
        assert src.tensor().physical_scale == (None, 1.0, 1.0)  # the channel axis has no size


# ---- detection and bad input ------------------------------------------------------------------
def test_detection(tmp_path, testdata):
    assert detect_format(testdata / "ome-zarr/v0.5-zarr3/blobs_image_v05.ome.zarr").name == "ome-zarr"
    assert detect_format(testdata / "ome-zarr/bioformats2raw-v0.1-zarr2/data.zarr").name == "ome-zarr"
    assert detect_format(testdata / "ome-zarr/bioformats2raw-v0.1-zarr2/data.zarr/0/1").name == "zarr"
    zarr.create_array(str(tmp_path / "misnamed"), shape=(4, 4), dtype="u1", zarr_format=3)
    assert detect_format(tmp_path / "misnamed").name == "zarr"  # content, not extension
    (tmp_path / "empty.ome.zarr").mkdir()
    with pytest.raises(UnreadableSource, match="not a zarr store"):
        tensor_server.open(tmp_path / "empty.ome.zarr")
    with pytest.raises(UnreadableSource, match="no OME-Zarr metadata"):
        tensor_server.open(tmp_path / "misnamed", format="ome-zarr")


def test_corrupt_zarr_json_names_the_file(tmp_path):
    p = tmp_path / "bad3.zarr"
    zarr.create_array(str(p), shape=(4, 4), dtype="u1", zarr_format=3)
    (p / "zarr.json").write_text('{"shape": [4, ')
    assert detect_format(p).name == "zarr"  # the sniffers do not raise; the opener reports it
    with pytest.raises(UnreadableSource) as exc:
        tensor_server.open(p)
    assert str(p / "zarr.json") in str(exc.value) and "corrupt" in str(exc.value)


def test_corrupt_zarray_of_an_ome_level_names_the_file(tmp_path):
    p = tmp_path / "bad2.ome.zarr"
    _write_ome(p, 2)
    (p / "0" / ".zarray").write_bytes(b"\x00\xff garbage")
    with pytest.raises(UnreadableSource) as exc:
        tensor_server.open(p)
    assert str(p / "0" / ".zarray") in str(exc.value)


def test_a_fifo_named_like_metadata_is_no_node_and_never_blocks_the_open(tmp_path):
    """Metadata files are opened without a stat first: a FIFO called ``zarr.json`` beside an
    array's ``.zarray`` is no file (the v2 array is served), and opening it never waits for a
    writer (the open ends within a generous bound)."""
    import threading

    p = tmp_path / "fifo.zarr"
    z = zarr.create_array(str(p), shape=(4, 6), chunks=(2, 3), dtype="u1", zarr_format=2)
    z[...] = np.arange(24, dtype=np.uint8).reshape(4, 6)
    os.mkfifo(p / "zarr.json")
    opened: dict[str, np.ndarray] = {}

    def run() -> None:
        with tensor_server.open(p, format="zarr") as src:
            opened["data"] = src.tensor().get_data()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(30)
    assert "data" in opened, "the open waited on the FIFO"
    np.testing.assert_array_equal(opened["data"], np.arange(24, dtype=np.uint8).reshape(4, 6))


def test_missing_level0_is_unreadable(tmp_path):
    p = tmp_path / "nolevel.ome.zarr"
    _write_ome(p, 3)
    shutil.rmtree(p / "0")
    with pytest.raises(UnreadableSource, match="level 0"):
        tensor_server.open(p)


def test_missing_chunk_reads_as_fill_value(tmp_path):
    p = tmp_path / "sparse.zarr"
    data = RNG.integers(0, 100, (20, 30), dtype=np.uint16)
    a = zarr.create_array(str(p), shape=data.shape, chunks=(10, 10), dtype="u2", fill_value=7, zarr_format=2)
    a[...] = data
    os.remove(p / "1.2")  # rows 10:20, cols 20:30
    want = data.copy()
    want[10:20, 20:30] = 7
    with tensor_server.open(p) as src:
        np.testing.assert_array_equal(src.tensor().get_data(), want)


@pytest.mark.parametrize("zarr_format,compressed", [(2, True), (3, True), (3, False)])
def test_garbage_chunk_fails_at_read_time(tmp_path, zarr_format, compressed):
    p = tmp_path / "garbage.zarr"
    kw = {} if compressed else {"compressors": None}
    a = zarr.create_array(str(p), shape=(20, 30), chunks=(10, 10), dtype="u2", zarr_format=zarr_format, **kw)
    a[...] = 1
    chunk = p / ("0.1" if zarr_format == 2 else "c/0/1")
    chunk.write_bytes(chunk.read_bytes()[:7])  # truncated
    with tensor_server.open(p) as src:  # opening reads metadata only: fine
        t = src.tensor()
        np.testing.assert_array_equal(t.get_data(Bounds((0, 0), (10, 10))), 1)  # other chunks still read
        with pytest.raises(UnreadableSource) as exc:
            t.get_data(Bounds((0, 5), (10, 15)))
    assert str(p) in str(exc.value)


def test_content_version_follows_metadata(tmp_path):
    p = tmp_path / "cv.zarr"
    zarr.create_array(str(p), shape=(8, 8), chunks=(4, 4), dtype="u1", zarr_format=2)
    with tensor_server.open(p) as src:
        v1 = src.tensor().content_version
    with tensor_server.open(p) as src:
        assert src.tensor().content_version == v1  # stable across reopen
    st = os.stat(p / ".zarray")
    os.utime(p / ".zarray", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with tensor_server.open(p) as src:
        assert src.tensor().content_version != v1


# ---- metadata rules -----------------------------------------------------------------------------
def test_axes_forms():
    from tensor_server.adapters._ngff import ngff_axes as _axes

    # 0.4+: dicts with name/type/unit, names lower-cased
    labels, types, units = _axes({"axes": [{"name": "C", "type": "channel"}, {"name": "y", "unit": "nm"}]}, 2, "0.4")
    assert labels == ["c", "y"] and types == ["channel", None] and units == [None, "nm"]
    # 0.3: plain strings
    assert _axes({"axes": ["z", "y", "x"]}, 3, "0.3")[0] == ["z", "y", "x"]
    # 0.1/0.2: no axes, always 5-D TCZYX
    assert _axes({}, 5, "0.1")[0] == list("tczyx")
    # long names map to the letters the server orders by; a mismatch falls back to defaults
    assert _axes({"axes": [{"name": "time"}, {"name": "y"}, {"name": "x"}]}, 3, "0.4")[0] == ["t", "y", "x"]
    assert _axes({"axes": ["y", "x"]}, 3, "0.4")[0] is None
    assert _axes({"axes": ["y", "y"]}, 2, "0.4")[0] is None


def test_integer_factors():
    from tensor_server.adapters._ngff import integer_factor as _integer_factor

    # shape ratio with a floored or ceiled edge (no transforms, as in 0.1-0.3)
    assert _integer_factor((1, 3, 167, 439), (1, 3, 83, 219), None, None)[0] == (1, 1, 2, 2)
    assert _integer_factor((5, 64), (3, 16), None, None)[0] == (2, 4)
    # transforms decide where present; the sizes must agree with them
    assert _integer_factor((64, 80), (32, 40), [0.2, 0.2], [0.4, 0.4])[0] == (2, 2)
    assert _integer_factor((64, 80), (43, 54), [0.2, 0.2], [0.3, 0.3])[0] is None  # 1.5x
    assert _integer_factor((64, 80), (43, 54), None, None)[0] is None  # 1.5x by shape
    factor, why = _integer_factor((64, 80), (30, 40), [0.2, 0.2], [0.4, 0.4])
    assert factor is None and "axis 0" in why  # says 2x, stores 30 rows
