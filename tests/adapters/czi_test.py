"""CZI adapter (tensor_server/adapters/czi.py): the conformance suite over CZIs generated with
pylibCZIrw's writer, values against the arrays written, the real samples in
../shared/testdata/czi, the CZI == OME-TIFF identity, and bad input.

The zoom= path (get_decimated_data) has its own file: tests/adapters/czi_zoom_test.py.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pylibCZIrw import czi as pyczi

import tensor_server
from tensor_server.adapters.czi import CziAdapter, sniff_czi
from tensor_server.adapters.registry import detect_format
from tensor_server.bench.writers import write_benchmark_czi
from tensor_server.core.bounds import Bounds
from tensor_server.core.handles import reap_idle_handles
from tensor_server.errors import UnreadableSource
from tensor_server.testing import AdapterTests, finishes_within


# ---- fixture writers (also used by tests/adapters/czi_zoom_test.py) --------------------------------
def write_stack(path: Path) -> np.ndarray:
    """2 channels × 3 Z × 256×384 uint16, one subblock per plane at stage position (100, 50),
    0.2 µm pixels and 0.5 µm Z steps. Returns the written data as (t, c, z, y, x)."""
    rng = np.random.default_rng(11)
    data = rng.integers(0, 65535, (1, 2, 3, 256, 384), dtype=np.uint16)
    with pyczi.create_czi(str(path), exist_ok=True) as w:
        for c in range(2):
            for z in range(3):
                w.write(data[0, c, z], plane={"T": 0, "C": c, "Z": z}, location=(100, 50))
        w.write_metadata(channel_names={0: "DAPI", 1: "GFP"}, scale_x=0.2e-6, scale_y=0.2e-6, scale_z=0.5e-6)
    return data


#: Mosaic tiles (y, x, h, w) relative to the mosaic corner, written in this order (M 0..4),
#: so a later tile wins where tiles overlap. Nothing covers rows 96..196 × columns 100..150
#: nor rows 96..120 × columns 150..200 (background 0); tile 4 overlaps tiles 1 and 3 and
#: sticks out to the right. Edges fall both on and off the f-grids of factors 2..8.
MOSAIC_TILES = [(0, 0, 96, 128), (0, 128, 96, 120), (96, 0, 100, 100), (120, 150, 76, 98), (60, 200, 70, 90)]
MOSAIC_ORIGIN = (-37, -41)  # (y, x): stage coordinates may be negative


def write_mosaic(path: Path) -> np.ndarray:
    """One-channel uint16 mosaic of MOSAIC_TILES; returns the expected composite (1,1,1,H,W)."""
    rng = np.random.default_rng(12)
    height = max(y + h for y, _, h, _ in MOSAIC_TILES)
    width = max(x + w for _, x, _, w in MOSAIC_TILES)
    composite = np.zeros((height, width), np.uint16)
    with pyczi.create_czi(str(path), exist_ok=True) as wr:
        for y, x, h, w in MOSAIC_TILES:
            tile = rng.integers(1, 65535, (h, w), dtype=np.uint16)
            wr.write(tile, plane={"T": 0, "C": 0, "Z": 0}, location=(MOSAIC_ORIGIN[1] + x, MOSAIC_ORIGIN[0] + y))
            composite[y : y + h, x : x + w] = tile
    return composite[None, None, None]


def write_scenes(path: Path) -> dict[str, np.ndarray]:
    """Two scenes (different sizes and stage positions), 2 T × 2 C uint16. Returns the data
    per field as (t, c, z, y, x)."""
    rng = np.random.default_rng(13)
    scenes = {0: ((-30, 20), (70, 90)), 1: ((400, 300), (45, 64))}
    out = {}
    with pyczi.create_czi(str(path), exist_ok=True) as w:
        for s, ((x, y), (h, wd)) in scenes.items():
            data = rng.integers(0, 65535, (2, 2, 1, h, wd), dtype=np.uint16)
            for t in range(2):
                for c in range(2):
                    w.write(data[t, c, 0], plane={"T": t, "C": c}, scene=s, location=(x, y))
            out[f"scene_{s}"] = data
    return out


def write_rgb(path: Path) -> np.ndarray:
    """Bgr24, 2 channels of 60×80 at (5, 7). Returns the served (RGB-ordered) data
    (t, c, z, y, x, s): pylibCZIrw writes and reads samples in B, G, R memory order."""
    rng = np.random.default_rng(14)
    bgr = rng.integers(0, 255, (2, 60, 80, 3), dtype=np.uint8)
    with pyczi.create_czi(str(path), exist_ok=True) as w:
        for c in range(2):
            w.write(bgr[c], plane={"T": 0, "C": c, "Z": 0}, location=(5, 7))
    return bgr[None, :, None, ..., ::-1]


def library_read(path: Path, field: str) -> np.ndarray:
    """The whole tensor read with pylibCZIrw itself, in served order (t, c, z, y, x[, s]),
    RGB samples reversed to R, G, B. Extent: the library's own bounding rectangle."""
    with pyczi.open_czi(str(path)) as doc:
        scene = int(field.split("_")[1]) if field.startswith("scene_") else None
        if scene is None:
            rect = doc.total_bounding_rectangle_no_pyramid
        else:
            rect = doc.scenes_bounding_rectangle_no_pyramid[scene]
        box = doc.total_bounding_box_no_pyramid
        planes = []
        for t in range(box["T"][1]):
            for c in range(box["C"][1]):
                for z in range(box["Z"][1]):
                    plane = {"T": t, "C": c, "Z": z}
                    bitmap = doc.read(roi=(rect.x, rect.y, rect.w, rect.h), plane=plane, scene=scene)
                    planes.append(bitmap[..., ::-1] if bitmap.shape[-1] == 3 else bitmap[..., 0])
        shape = (box["T"][1], box["C"][1], box["Z"][1]) + planes[0].shape
        return np.stack(planes).reshape(shape)


# ---- conformance suite ------------------------------------------------------------------------
class _CziSuite(AdapterTests):
    writer: Callable[[Path], Any]

    @pytest.fixture
    def source(self, tmp_path):
        p = tmp_path / "fixture.czi"
        type(self).writer(p)
        src = tensor_server.open(p)
        yield src
        src.close()

    def tensors(self, source):
        """The scenes (the scenes' montage has its suite in positions_montage_test.py)."""
        return [(f, t) for f, t in source.tensors.items() if f != "positions"]

    def reference_array(self, source, field):
        return library_read(source.path, field)


class TestCziStack(_CziSuite):
    writer = staticmethod(write_stack)


class TestCziMosaic(_CziSuite):
    writer = staticmethod(write_mosaic)


class TestCziScenes(_CziSuite):
    writer = staticmethod(write_scenes)


class TestCziRgb(_CziSuite):
    writer = staticmethod(write_rgb)


# ---- values against what was written ----------------------------------------------------------
def test_stack_values_layout_and_scale(tmp_path):
    p = tmp_path / "stack.czi"
    data = write_stack(p)
    with tensor_server.open(p) as src:
        assert src.format_name == "czi" and list(src.tensors) == ["scene_0"]  # pylibCZIrw always writes S
        t = src.tensor()
        assert isinstance(t, CziAdapter)
        assert t.dim_labels == ("t", "c", "z", "y", "x") and t.shape == data.shape and t.dtype == np.uint16
        np.testing.assert_array_equal(t.get_data(), data)
        # the origin is the subblock position (100, 50), not 0
        pixel = t.get_data(Bounds((0, 1, 2, 10, 20), (1, 2, 3, 11, 21)))
        assert pixel[0, 0, 0, 0, 0] == data[0, 1, 2, 10, 20]
        assert t.physical_scale[2:] == pytest.approx((0.5, 0.2, 0.2)) and t.physical_scale[:2] == (None, None)
        assert t.physical_unit == (None, None, "µm", "µm", "µm")
        assert t.read_block_shape is None and t.decimates is True  # nearest via libCZI's zoom
        assert src.metadata["channel_names"] == ["DAPI", "GFP"]


def test_mosaic_is_composed_with_background(tmp_path):
    p = tmp_path / "mosaic.czi"
    composite = write_mosaic(p)
    with tensor_server.open(p) as src:
        t = src.tensor()
        assert t.shape == composite.shape
        got = t.get_data()
        np.testing.assert_array_equal(got, composite)
        assert got[0, 0, 0, 100, 130] == 0  # the gap is background
        assert src.metadata["mosaic"] is True


def test_scenes_are_fields(tmp_path):
    p = tmp_path / "scenes.czi"
    data = write_scenes(p)
    with tensor_server.open(p) as src:
        assert list(src.tensors) == ["scene_0", "scene_1", "positions"]  # the scenes as one image too
        for field, want in data.items():
            t = src.tensor(field)
            assert t.array_id == f"{src.source_id}/{field}"
            np.testing.assert_array_equal(t.get_data(), want)
        assert src.metadata["scenes"] == {"scene_0": [-30, 20, 90, 70], "scene_1": [400, 300, 64, 45]}


def test_rgb_is_served_in_rgb_order(tmp_path):
    p = tmp_path / "rgb.czi"
    want = write_rgb(p)
    with tensor_server.open(p) as src:
        t = src.tensor()
        assert t.dim_labels == ("t", "c", "z", "y", "x", "s") and t.shape == want.shape
        np.testing.assert_array_equal(t.get_data(), want)
        # a sample sub-range: G and B only
        part = t.get_data(Bounds((0, 1, 0, 3, 4, 1), (1, 2, 1, 9, 20, 3)))
        np.testing.assert_array_equal(part, want[:, 1:2, :, 3:9, 4:20, 1:3])


def test_mixed_gray_pixel_types_widen_losslessly(tmp_path):
    p = tmp_path / "mixed.czi"
    rng = np.random.default_rng(3)
    c0 = rng.integers(0, 255, (20, 30), dtype=np.uint8)
    c1 = rng.integers(256, 65535, (20, 30), dtype=np.uint16)
    with pyczi.create_czi(str(p), exist_ok=True) as w:
        w.write(c0, plane={"C": 0})
        w.write(c1, plane={"C": 1})
    with tensor_server.open(p) as src:
        t = src.tensor()
        assert t.dtype == np.uint16 and src.metadata["pixel_type"] == "Gray16"
        np.testing.assert_array_equal(t.get_data()[0, :, 0], np.stack([c0.astype(np.uint16), c1]))


def test_lossy_pixel_type_mix_is_refused(tmp_path):
    p = tmp_path / "gray16_bgr24.czi"
    with pyczi.create_czi(str(p), exist_ok=True) as w:
        w.write(np.ones((8, 8), np.uint16), plane={"C": 0})
        w.write(np.ones((8, 8, 3), np.uint8), plane={"C": 1})
    with pytest.raises(UnreadableSource, match="mix pixel types") as exc:
        tensor_server.open(p)
    assert str(p) in str(exc.value)


def test_reader_is_reopened_after_the_idle_reaper(tmp_path):
    p = tmp_path / "stack.czi"
    data = write_stack(p)
    with tensor_server.open(p) as src:
        t = src.tensor()
        b = Bounds((0, 0, 1, 0, 0), (1, 2, 2, 64, 64))
        np.testing.assert_array_equal(t.get_data(b), data[b.to_slices()])
        handles = t._file.handles
        assert any(h.is_open for h in handles)
        reap_idle_handles(now=time.monotonic() + 1e6)
        assert not any(h.is_open for h in handles)
        np.testing.assert_array_equal(t.get_data(b), data[b.to_slices()])
        assert sum(h.opens for h in handles) >= 2


def test_benchmark_fixture_writer(tmp_path):
    """write_benchmark_czi (used by the benchmark at 8192² × 3C) writes what it says, tiled."""
    p = write_benchmark_czi(tmp_path / "bench.czi", size=300, channels=2, tile=128)
    with tensor_server.open(p) as src:
        t = src.tensor()
        assert t.shape == (1, 2, 1, 300, 300) and t.dtype == np.uint16
        assert len(t._file.rects) == 2 * 9 and not src.metadata["pyramid"]
        full = t.get_data()[0, :, 0].astype(np.int64)
        yy, xx = np.mgrid[0:300, 0:300]
        for c in range(2):  # a deterministic ramp plus noise in [0, 4096)
            noise = full[c] - (yy * 7 + xx * 3 + c * 1000) % 50000
            assert noise.min() >= 0 and noise.max() < 4096 and noise.std() > 500


# ---- real files -------------------------------------------------------------------------------
#: Served fields/shapes of the real samples. expected.json records aicspylibczi's read_image,
#: whose axes differ from the served ones: B (deprecated block index) and V (view, size 1) are
#: not axes here, A is the sample axis s, S is a field per scene, and M (mosaic tile) is
#: composed by libCZI instead of being an axis.
REAL_FILES: dict[str, dict[str, tuple[int, ...]]] = {
    "CD_s_1_t_3_c_2_z_5.czi": {"image": (3, 2, 5, 170, 240)},
    "RGB-8bit.czi": {"image": (1, 1, 1, 624, 924, 3)},
    "RGB-multichannel.czi": {"scene_0": (1, 7, 1, 81, 147, 3)},
    "mosaic_test.czi": {"scene_0": (1, 1, 1, 624, 1756)},
    "s_1_t_1_c_1_z_1.czi": {"image": (1, 1, 1, 325, 475)},
    "tiles.czi": {"image": (1, 2, 1, 512, 510)},
}
#: Composed mosaics cannot match expected.json's per-tile sum (the overlap is counted twice
#: there). The stitched value is from SOURCES.md ("stitched plane (pylibCZIrw) 624×1756 sum
#: 7101695274"); tiles.czi's 2-column overlap holds zeros, so its sum is unchanged.
STITCHED_SUM = {"mosaic_test.czi": 7101695274.0}


def test_every_real_czi_is_listed(testdata):
    found = sorted(p.name for p in (testdata / "czi").glob("*.czi"))
    assert found == sorted(REAL_FILES)


@pytest.mark.parametrize("name", sorted(REAL_FILES))
def test_real_file_matches_expected(testdata, expected, name):
    want = expected[f"czi/{name}"]
    with tensor_server.open(testdata / "czi" / name) as src:
        assert src.format_name == "czi"
        assert {f: t.shape for f, t in src.tensors.items()} == REAL_FILES[name]
        (t,) = src.tensors.values()
        data = t.get_data()
        assert data.dtype == np.dtype(want["dtype"])
        assert int(data.min()) == want["min"] and int(data.max()) == want["max"]
        assert float(data.sum(dtype=np.float64)) == STITCHED_SUM.get(name, want["sum"])
        np.testing.assert_array_equal(data, library_read(src.path, src.default_field))


def test_real_file_origin_is_the_bounding_box(testdata):
    """s_1_t_1_c_1_z_1.czi's only subblock sits at X 39856, Y 39272 (SOURCES.md)."""
    with tensor_server.open(testdata / "czi" / "s_1_t_1_c_1_z_1.czi") as src:
        assert src.metadata["scenes"]["image"] == [39856, 39272, 475, 325]


def test_czi_equals_ome_tiff(testdata):
    """SOURCES.md: czi/s_1_t_1_c_1_z_1.czi == ome-tiff/s_1_t_1_c_1_z_1.ome.tiff (325×475 uint16)."""
    import tifffile

    tiff = tifffile.imread(testdata / "ome-tiff" / "s_1_t_1_c_1_z_1.ome.tiff")
    assert tiff.shape == (325, 475) and float(tiff.sum(dtype=np.float64)) == 563709458.0
    with tensor_server.open(testdata / "czi" / "s_1_t_1_c_1_z_1.czi") as src:
        np.testing.assert_array_equal(src.tensor().get_data()[0, 0, 0], tiff)


# ---- detection and bad input ------------------------------------------------------------------
def test_sniff_by_content(tmp_path):
    p = tmp_path / "stack.czi"
    write_stack(p)
    misnamed = tmp_path / "stack.dat"
    shutil.copy(p, misnamed)
    assert detect_format(misnamed).name == "czi"
    assert sniff_czi(misnamed, misnamed.read_bytes()[:4096])
    assert not sniff_czi(tmp_path / "x.tif", b"II*\x00" + b"\x00" * 100)
    with tensor_server.open(misnamed) as src:
        assert src.tensor().shape == (1, 2, 3, 256, 384)


def test_garbage_czi_is_unreadable(tmp_path):
    p = tmp_path / "garbage.czi"
    p.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    with pytest.raises(UnreadableSource) as exc:
        finishes_within(lambda: tensor_server.open(p))
    assert str(p) in str(exc.value)


def test_magic_then_garbage_is_unreadable(tmp_path):
    p = tmp_path / "fake.czi"
    p.write_bytes(b"ZISRAWFILE" + b"\x00" * 6 + b"\xff" * 3000)
    with pytest.raises(UnreadableSource) as exc:
        finishes_within(lambda: tensor_server.open(p))
    assert str(p) in str(exc.value)


@pytest.mark.parametrize("keep", [100, 0.5])
def test_truncated_czi_is_unreadable(tmp_path, keep):
    """A truncated file fails with UnreadableSource naming it: at open when the header or
    directory is gone, else at the read that reaches the missing subblock data."""
    p = tmp_path / "truncated.czi"
    write_stack(p)
    raw = p.read_bytes()
    p.write_bytes(raw[: keep if isinstance(keep, int) else int(len(raw) * keep)])

    def open_and_read_all() -> None:
        with tensor_server.open(p) as src:
            for t in src.tensors.values():
                t.get_data()

    with pytest.raises(UnreadableSource) as exc:
        finishes_within(open_and_read_all)
    assert str(p) in str(exc.value)


def test_real_files_are_not_written(testdata):
    """Opening and reading never writes to the input."""
    p = testdata / "czi" / "CD_s_1_t_3_c_2_z_5.czi"
    before = (p.stat().st_mtime_ns, p.stat().st_size)
    with tensor_server.open(p) as src:
        src.tensor().get_scaled_data(None, (1, 1, 1, 2, 2), "nearest")
    assert (p.stat().st_mtime_ns, p.stat().st_size) == before
    assert json.loads(src.metadata_json())["type"] == "czi"
