"""Every level of an export equals the engine's scaled read of the source, bit for bit, read
back with zarr-python, for real 2-D/3-D/5-D samples of several formats (ND2, CZI, OME-TIFF)
and generated zarr and TIFF volumes; NGFF 0.5 (sharded zarr v3) and 0.4 (zarr v2)."""

from __future__ import annotations

import numpy as np
import pytest
import tifffile
import zarr

from tensor_server.adapters.registry import open_source
from tensor_server.export import ExportOptions, export_tensor
from tests.export.helpers import engine_level

# (sample, field or None, levels, NGFF axis order as a permutation of the source axes)
REAL = [
    ("nd2/cluster.nd2", None, 2, (0, 1, 2, 3, 4)),  # 5-D t c z y x
    ("czi/CD_s_1_t_3_c_2_z_5.czi", None, 3, (0, 1, 2, 3, 4)),  # 5-D
    ("czi/mosaic_test.czi", "scene_0", 4, (0, 1, 2, 3, 4)),  # a mosaic plane
    ("ome-tiff/s_1_t_1_c_1_z_1.ome.tiff", None, 3, (0, 1)),  # 2-D
    ("ome-tiff/viv_fixture_multi-channel.ome.tif", None, 3, (0, 1, 2)),  # 3-D c y x, int8
]


def _check_levels(tensor, dest, method, out_order, levels):
    group = zarr.open_group(str(dest), mode="r")
    scales = _scales(tensor, levels)
    assert sorted(group.array_keys()) == [str(k) for k in range(len(scales))]
    for k, scale in enumerate(scales):
        expected = engine_level(tensor, scale, method, out_order)
        got = group[str(k)][...]
        assert got.dtype == tensor.dtype
        np.testing.assert_array_equal(got, expected, err_msg=f"level {k} scale {scale}")


def _scales(tensor, levels):
    y, x = tensor.dim_labels.index("y"), tensor.dim_labels.index("x")
    out = []
    for k in range(levels):
        s = [1] * tensor.ndim
        s[y] = s[x] = 2**k
        out.append(tuple(s))
    return out


@pytest.mark.parametrize("sample,field,levels,order", REAL, ids=[r[0] for r in REAL])
@pytest.mark.parametrize("ngff", ["0.5", "0.4"])
def test_real_samples_every_level_is_the_engines_scaled_read(testdata, tmp_path, sample, field, levels, order, ngff):
    with open_source(testdata / sample) as src:
        t = src.tensor(field)
        dest = tmp_path / "out.zarr"
        summary = export_tensor(t, dest, ExportOptions(levels=levels, ngff=ngff, chunks=None))
        assert summary["units_total"] >= 1 and not summary["already_complete"]
        _check_levels(t, dest, "area", order, levels)


@pytest.mark.parametrize("method", ["area", "nearest", "min", "max", "mode", "median"])
def test_every_method_on_a_generated_tiff_volume(tmp_path, method):
    rng = np.random.default_rng(7)
    vol = rng.integers(0, 2**16, (5, 300, 413), dtype=np.uint16)  # odd edges: ragged blocks at every level
    tifffile.imwrite(tmp_path / "v.ome.tif", vol, metadata={"axes": "ZYX"}, tile=(64, 64))
    with open_source(tmp_path / "v.ome.tif") as src:
        t = src.tensor()
        # small shards: several units, shards shrinking with the level, chunks cut at the edges
        export_tensor(
            t, tmp_path / "o.zarr", ExportOptions(levels=4, method=method, chunks=(2, 64, 64), shards=(2, 128, 128))
        )
        _check_levels(t, tmp_path / "o.zarr", method, (0, 1, 2), 4)


@pytest.mark.parametrize("dtype", ["float32", "int16", "uint8"])
def test_auto_levels_of_a_zarr_volume_are_the_published_pyramid(tmp_path, dtype):
    """``--levels auto`` writes the published levels (``core.level_grid``): Y and X halved
    down to one 512² plane (1100 -> 550 -> 275), each equal to the engine's reduction."""
    from tensor_server.core.level_grid import published_levels

    rng = np.random.default_rng(1)
    data = (rng.standard_normal((6, 1100, 260)) * 1000).astype(dtype)
    src_path = tmp_path / "src.zarr"
    zarr.create_array(str(src_path), data=data, chunks=(4, 128, 128))
    with open_source(src_path) as src:
        t = src.tensor()
        levels = published_levels(t)
        assert [spec.shape for spec in levels] == [(6, 1100, 260), (6, 550, 130), (6, 275, 65)]
        export_tensor(t, tmp_path / "o.zarr")
        group = zarr.open_group(str(tmp_path / "o.zarr"), mode="r")
        assert len(list(group.array_keys())) == len(levels)
        for k, spec in enumerate(levels):
            np.testing.assert_array_equal(group[str(k)][...], engine_level(t, spec.scale, spec.method, (0, 1, 2)))


def test_rgb_samples_fold_into_channels(testdata, tmp_path):
    """A CZI RGB plane (t c z y x s) is written as (t, c·s, z, y, x): channel = c·S + s."""
    with open_source(testdata / "czi/RGB-8bit.czi") as src:
        t = src.tensor()
        export_tensor(t, tmp_path / "o.zarr", ExportOptions(levels=2))
        group = zarr.open_group(str(tmp_path / "o.zarr"), mode="r")
        for k, scale in enumerate([(1, 1, 1, 1, 1, 1), (1, 1, 1, 2, 2, 1)]):
            ref = engine_level(t, scale, "area", (0, 1, 5, 2, 3, 4))
            tt, c, s, z, y, x = ref.shape
            np.testing.assert_array_equal(group[str(k)][...], ref.reshape(tt, c * s, z, y, x))
        assert group["0"].shape[1] == 3


@pytest.mark.parametrize("ngff", ["0.5", "0.4"])
def test_an_rgb_plane_without_a_channel_axis_exports_its_samples_as_channels(tmp_path, ngff):
    """An RGB TIFF reads as (y, x, s): the samples axis is the channel axis, in front (it
    used to be placed twice, and the export failed inside zarr-python)."""
    rgb = np.random.default_rng(4).integers(0, 256, (300, 410, 3), dtype=np.uint8)
    tifffile.imwrite(tmp_path / "rgb.tif", rgb, photometric="rgb")
    with open_source(tmp_path / "rgb.tif") as src:
        t = src.tensor()
        assert t.dim_labels == ("y", "x", "s")
        summary = export_tensor(t, tmp_path / "o.zarr", ExportOptions(levels=2, ngff=ngff))
        assert summary["levels"] == [[3, 300, 410], [3, 150, 205]]
        _check_levels(t, tmp_path / "o.zarr", "area", (2, 0, 1), 2)
    attrs = zarr.open_group(str(tmp_path / "o.zarr"), mode="r").attrs
    ms = attrs["ome"] if ngff == "0.5" else attrs
    assert [a["name"] for a in ms["multiscales"][0]["axes"]] == ["c", "y", "x"]
    assert [c["label"] for c in ms["omero"]["channels"]] == ["R", "G", "B"]


def test_the_source_is_read_once_in_whole_reader_blocks(tmp_path, monkeypatch):
    """Every pixel is read exactly once, and each read covers whole blocks of the reader (a
    TIFF page here: a read of part of a page decodes all of it)."""
    rng = np.random.default_rng(3)
    stack = rng.integers(0, 2**16, (3, 900, 1100), dtype=np.uint16)
    tifffile.imwrite(tmp_path / "s.ome.tif", stack, metadata={"axes": "ZYX"}, tile=(256, 256))
    with open_source(tmp_path / "s.ome.tif") as src:
        t = src.tensor()
        block = t.read_block_shape
        assert block is not None and block[1:] == (900, 1100)  # page mode: a read decodes the page
        reads = []
        original = type(t).read_region
        monkeypatch.setattr(type(t), "read_region", lambda self, b: reads.append(b) or original(self, b))
        export_tensor(t, tmp_path / "o.zarr", ExportOptions(levels=3, chunks=(1, 128, 128), shards=(1, 256, 256)))
    assert sum(int(np.prod(b.shape)) for b in reads) == stack.size
    for b in reads:
        for a, z, n, blk in zip(b.start, b.stop, stack.shape, block):
            assert a % blk == 0 and (z % blk == 0 or z == n), (b, block)


@pytest.mark.parametrize("codec, stored", [("zstd", 4), ("none", 2)])
def test_fill_valued_chunks_are_written_only_when_compressed(tmp_path, codec, stored):
    """A compressed chunk of zeros costs a few dozen bytes, so every chunk is written (skipping
    zarr's per-chunk equality check); uncompressed, the zero chunks are left out. The pixels
    read back the same either way."""
    plane = np.zeros((128, 128), np.uint16)
    plane[:, 64:] = np.arange(64 * 128, dtype=np.uint16).reshape(128, 64)  # right half non-zero
    zarr.create_array(str(tmp_path / "src.zarr"), data=plane, chunks=(64, 64))
    with open_source(tmp_path / "src.zarr") as src:
        export_tensor(
            src.tensor(), tmp_path / "o.zarr", ExportOptions(levels=1, chunks=(64, 64), codec=codec, ngff="0.4")
        )
    level0 = tmp_path / "o.zarr" / "0"
    assert sum(1 for p in level0.rglob("*") if p.is_file() and not p.name.startswith(".")) == stored
    np.testing.assert_array_equal(zarr.open_array(str(level0), mode="r")[...], plane)
