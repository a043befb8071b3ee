"""A multi-position file served as one image (``<source>/positions``, ``core/positions.py``):
CZI scenes written with pylibCZIrw's writer, and the real 4-position Micro-Manager 1.4 MMStack
dataset (the ``p`` axis, the path an ND2's positions take too); the montage gap as a server
setting.

What it pins, through the real door (a catalog served on loopback, read with the biopb SDK):
every position's published box holds that position's pixels (read through its own tensor) and
nothing else holds anything but the fill; the layout's numbers (near-square grid, acquisition
order, names from the file); the montage's coarser levels are the engine's reduction of its
full resolution, bit for bit; a single-scene file gets no montage; with gap 0 the cells touch.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tensor_server_kernels import reference

import tensor_server
from tensor_server.catalog import Catalog
from tensor_server.config import load_settings
from tensor_server.errors import InvalidArgument
from tensor_server.testing import AdapterTests, serving

pyczi = pytest.importorskip("pylibCZIrw.czi")
zarr = pytest.importorskip("zarr")

#: scene -> (stage x, y), (height, width): four scenes of three sizes, far apart on the stage
SCENES = {0: ((-30, 20), (40, 36)), 1: ((900, 300), (32, 44)), 2: ((5000, -80), (40, 44)), 3: ((70, 7000), (24, 20))}


def write_scenes(path: Path, scenes: dict[int, tuple[tuple[int, int], tuple[int, int]]] = SCENES) -> Path:
    """A CZI of ``scenes`` (2 channels of uint16, never 0, the fill) through pylibCZIrw's writer."""
    rng = np.random.default_rng(7)
    with pyczi.create_czi(str(path), exist_ok=True) as w:
        for s, ((x, y), (h, wd)) in scenes.items():
            data = rng.integers(1, 60000, (2, h, wd), dtype=np.uint16)
            for c in range(2):
                w.write(data[c], plane={"T": 0, "C": c, "Z": 0}, scene=s, location=(x, y))
    return path


def scene_pixels(path: Path, scene: int) -> np.ndarray:
    """One scene (t, c, z, y, x) read with pylibCZIrw itself over its own bounding box."""
    with pyczi.open_czi(str(path)) as doc:
        r = doc.scenes_bounding_rectangle_no_pyramid[scene]
        planes = [doc.read(roi=(r.x, r.y, r.w, r.h), plane={"T": 0, "C": c, "Z": 0}, scene=scene) for c in range(2)]
    return np.stack([p[..., 0] for p in planes])[None, :, None]


def boxes(layout: dict) -> list[tuple[int, str, list[list[int]]]]:
    return [(p["index"], p["name"], p["box"]) for p in layout["positions"]]


def assembled(layout: dict, shape: tuple[int, ...], dtype, pixels) -> np.ndarray:
    """The montage built with NumPy: ``pixels(index)`` at every published box, 0 elsewhere."""
    out = np.zeros(shape, dtype)
    for index, _name, ((y0, x0), (y1, x1)) in boxes(layout):
        out[..., y0:y1, x0:x1] = pixels(index)
    return out


@pytest.fixture(scope="module")
def mmstack_folder(tmp_path_factory, testdata) -> Path:
    """The four 1.4 MMStack files of the real sample gunzipped into one folder (the only
    entry of its parent, a root to serve)."""
    folder = tmp_path_factory.mktemp("mmroot") / "VersionCompatTest"
    folder.mkdir()
    for gz in sorted((testdata / "micromanager/VersionCompatTest").glob("*.gz")):
        with gzip.open(gz, "rb") as src, open(folder / gz.name[:-3], "wb") as dst:
            shutil.copyfileobj(src, dst)
    return folder


def served_catalog(root: Path, **options) -> Catalog:
    cat = Catalog([root], **options)
    cat.scan()
    return cat


# ---- CZI scenes ------------------------------------------------------------------------------
def test_czi_scenes_are_laid_out_in_acquisition_order(tmp_path):
    """4 scenes on a 2 × 2 grid in S order; cell = the largest scene (40 × 44); gap =
    ceil(44 / 16) = 3; each scene at its own size at its cell's corner, named by its field."""
    with tensor_server.open(write_scenes(tmp_path / "scenes.czi")) as src:
        assert list(src.tensors) == ["scene_0", "scene_1", "scene_2", "scene_3", "positions"]
        montage = src.tensor("positions")
        layout = montage.metadata["montage"]
        assert json.loads(src.metadata_json("positions"))["metadata"]["montage"] == layout  # descriptor
        assert "montage" not in json.loads(src.metadata_json("scene_0"))["metadata"]  # a scene: none
    assert layout["rows"] == ["0", "1"] and layout["columns"] == ["0", "1"]
    assert layout["cell"] == [40, 44] and layout["gap"] == [3, 3]
    assert boxes(layout) == [
        (0, "scene_0", [[0, 0], [40, 36]]),
        (1, "scene_1", [[0, 47], [32, 91]]),
        (2, "scene_2", [[43, 0], [83, 44]]),
        (3, "scene_3", [[43, 47], [67, 67]]),
    ]
    assert montage.shape == (1, 2, 1, 83, 91) and montage.dim_labels == tuple("tczyx")


def test_czi_positions_through_the_door(tmp_path):
    """The SDK's read of the montage equals each scene's own SDK read at its box (and pylibCZIrw's
    read of the scene), 0 elsewhere; its level-1 reads equal the reduction of its level 0; the
    OME-Zarr view carries the layout and reads the same pixels."""
    write_scenes(tmp_path / "data" / "scenes.czi")
    cat = served_catalog(tmp_path / "data")
    try:
        rec = next(r for r in cat.records() if r.source is not None)
        sid = rec.source.source_id
        with serving(cat, http=True) as srv:
            client = srv.client()
            desc = client.get_descriptor(f"{sid}/positions", with_metadata=True)
            layout = json.loads(desc.metadata_json)["metadata"]["montage"]
            assert [i for i, _, _ in boxes(layout)] == [0, 1, 2, 3]
            group = zarr.open_group(f"{srv.http_url}/zarr/{sid}/positions/", mode="r")
            assert group.attrs.asdict()["montage"] == layout
            full = np.asarray(client.get_array(f"{sid}/positions"))
            scenes = {s: np.asarray(client.get_array(f"{sid}/scene_{s}")) for s in SCENES}
            for s, pixels in scenes.items():
                np.testing.assert_array_equal(pixels, scene_pixels(rec.source.path, s))
            np.testing.assert_array_equal(full, assembled(layout, full.shape, full.dtype, scenes.__getitem__))
            np.testing.assert_array_equal(group["0"][...], full)
            _coarse_levels_are_the_reduction(client, f"{sid}/positions", full)
    finally:
        cat.close()


def _coarse_levels_are_the_reduction(client, array_id: str, full: np.ndarray) -> None:
    """No stored level (vendor files have none): the engine's reduction of level 0, bit for bit."""
    assert full.any()
    for method in ("area", "nearest", "max"):
        scale = (1,) * (full.ndim - 2) + (2, 2)
        got = np.asarray(client.get_array(array_id, scale_hint=list(scale), reduction_method=method))
        np.testing.assert_array_equal(got, reference.downsample(full, scale, method), err_msg=method)


def test_a_single_scene_file_has_no_positions_image(tmp_path):
    write_scenes(tmp_path / "data" / "one.czi", {0: ((5, 5), (30, 20))})
    with tensor_server.open(tmp_path / "data" / "one.czi") as src:
        assert list(src.tensors) == ["scene_0"] and "montage" not in src.metadata
    cat = served_catalog(tmp_path / "data")
    try:
        (rec,) = cat.records()
        with serving(cat) as srv:
            client = srv.client()
            assert list(client.get_descriptor(rec.source_id).shape) == [1, 2, 1, 30, 20]
            with pytest.raises(Exception, match=r"has no tensor 'positions'; fields: \['scene_0'\]"):
                client.get_descriptor(f"{rec.source_id}/positions")
    finally:
        cat.close()


# ---- Micro-Manager positions (the p axis) ---------------------------------------------------------
def test_micromanager_positions_through_the_door(mmstack_folder):
    """The real 4-position dataset: a 2 × 2 grid of 64² cells, 4 px apart (ceil(64 / 16)),
    named by the summary's position labels; each box holds its position (the dataset's p
    index, read through its own tensor); level 1 is the reduction."""
    cat = served_catalog(mmstack_folder.parent, open_processes=0)
    try:
        rec = next(r for r in cat.records() if r.source is not None and r.path == mmstack_folder)
        dataset = rec.source.tensor()
        with serving(cat) as srv:
            client = srv.client()
            desc = client.get_descriptor(f"{rec.source_id}/positions", with_metadata=True)
            layout = json.loads(desc.metadata_json)["metadata"]["montage"]
            assert layout["cell"] == [64, 64] and layout["gap"] == [4, 4]
            assert boxes(layout) == [
                (0, "1-Pos_000_000", [[0, 0], [64, 64]]),
                (1, "1-Pos_001_000", [[0, 68], [64, 132]]),
                (2, "1-Pos_001_001", [[68, 0], [132, 64]]),
                (3, "1-Pos_000_001", [[68, 68], [132, 132]]),
            ]
            full = np.asarray(client.get_array(f"{rec.source_id}/positions"))
            assert full.shape == (2, 2, 2, 132, 132)
            whole = np.asarray(client.get_array(dataset.array_id))  # p, t, c, z, y, x
            np.testing.assert_array_equal(full, assembled(layout, full.shape, full.dtype, whole.__getitem__))
            _coarse_levels_are_the_reduction(client, f"{rec.source_id}/positions", full)
    finally:
        cat.close()


def test_generated_positions_each_hold_their_own_pixels(tmp_path):
    """The real sample's positions hold identical pixels, so a swap would pass there: a
    generated Micro-Manager 2.0 dataset of 3 positions of distinct pixels (Pos0..Pos2 folders)
    on a 2 × 2 grid, the fourth cell empty (the fill)."""
    from tests.adapters.micromanager_test import write_mm2_dataset

    planes = write_mm2_dataset(tmp_path / "data" / "acq", positions=3, c=1, z=2, shape=(12, 10))
    cat = served_catalog(tmp_path / "data")
    try:
        sid = next(iter(cat.records())).source_id
        with serving(cat) as srv:
            client = srv.client()
            layout = json.loads(client.get_descriptor(f"{sid}/positions", with_metadata=True).metadata_json)
            layout = layout["metadata"]["montage"]
            assert [(i, name) for i, name, _ in boxes(layout)] == [(0, "Pos0"), (1, "Pos1"), (2, "Pos2")]
            full = np.asarray(client.get_array(f"{sid}/positions"))  # t, z, y, x (c is 1: dropped)
            assert full.shape == (2, 2, 2 * 12 + 1, 2 * 10 + 1)  # gap ceil(12 / 16) = 1

            def position(p: int) -> np.ndarray:
                return np.array([[planes[p, t, 0, z] for z in range(2)] for t in range(2)])

            np.testing.assert_array_equal(full, assembled(layout, full.shape, full.dtype, position))
            assert not full[..., 13:, 11:].any(), "the fourth cell is the fill"
    finally:
        cat.close()


# ---- the gap setting ------------------------------------------------------------------------------
def test_gap_zero_puts_the_cells_edge_to_edge(tmp_path):
    """``montage_gap = 0`` on the catalog: four equal scenes read as one 2 × 2 block of them."""
    equal = {s: ((1000 * s, 0), (24, 30)) for s in range(4)}
    write_scenes(tmp_path / "data" / "equal.czi", equal)
    cat = served_catalog(tmp_path / "data", montage_gap=0)
    try:
        sid = next(iter(cat.records())).source_id
        with serving(cat) as srv:
            client = srv.client()
            layout = json.loads(client.get_descriptor(f"{sid}/positions", with_metadata=True).metadata_json)
            assert layout["metadata"]["montage"]["gap"] == [0, 0]
            s = [np.asarray(client.get_array(f"{sid}/scene_{k}")) for k in range(4)]
            full = np.asarray(client.get_array(f"{sid}/positions"))
            np.testing.assert_array_equal(full, np.block([[s[0], s[1]], [s[2], s[3]]]))
    finally:
        cat.close()


def test_gap_zero_puts_a_plates_wells_edge_to_edge(tmp_path):
    """A plate with ``montage_gap=0``: well A/2 starts where A/1's two fields end."""
    ome_writer = pytest.importorskip("ome_zarr.writer")
    fmt = pytest.importorskip("ome_zarr.format").FormatV04()
    root = zarr.open_group(str(tmp_path / "p.ome.zarr"), mode="w", zarr_format=2)
    ome_writer.write_plate_metadata(root, ["A"], ["1", "2"], ["A/1", "A/2"], fmt=fmt)
    rng = np.random.default_rng(3)
    fields = {}
    for well, n in (("A/1", 2), ("A/2", 1)):
        group = root.require_group(well)
        ome_writer.write_well_metadata(group, [str(i) for i in range(n)], fmt=fmt)
        for i in range(n):
            fields[well, i] = rng.integers(1, 255, (16, 20), dtype=np.uint8)
            ome_writer.write_image(fields[well, i], group.require_group(str(i)), scale_factors=(), axes="yx", fmt=fmt)
    for gap, want_x in ((0, [0, 20, 40]), (0.5, [0, 20, 50])):  # 0.5 × 20 = 10 px between wells
        with tensor_server.open(tmp_path / "p.ome.zarr", montage_gap=gap) as src:
            montage = src.tensor("plate")
            layout = montage.metadata["montage"]
            starts = [f["box"][0][1] for w in layout["wells"] for f in w["fields"]]
            assert starts == want_x and layout["gap"] == [want_x[2] - 40] * 2
            whole = montage.get_data()
            for (well, i), pixels in fields.items():
                x0 = want_x[{("A/1", 0): 0, ("A/1", 1): 1, ("A/2", 0): 2}[well, i]]
                np.testing.assert_array_equal(whole[:, x0 : x0 + 20], pixels)
    with pytest.raises(InvalidArgument, match="montage gap must be a fraction of a cell between 0 and 1"):
        tensor_server.open(tmp_path / "p.ome.zarr", montage_gap=-0.1)


def test_the_gap_setting_is_validated(tmp_path):
    from tensor_server.cli import _settings
    from tensor_server.cli_parser import build_parser

    assert load_settings().montage_gap == 1 / 16
    cfg = tmp_path / "server.toml"
    cfg.write_text("[montage]\ngap = 0.25\n")
    assert load_settings(cfg).montage_gap == 0.25
    args = build_parser().parse_args(["serve", "/data", "--config", str(cfg), "--montage-gap", "0"])
    assert _settings(args).montage_gap == 0.0  # the flag overrides the file
    for bad in (1.5, -0.01, float("nan"), True, "wide"):
        with pytest.raises(InvalidArgument, match=r"montage gap must be a fraction of a cell between 0 and 1"):
            load_settings(montage_gap=bad)
    cfg.write_text("[montage]\ngap = 2\n")
    with pytest.raises(InvalidArgument, match="got 2"):
        load_settings(cfg)
    out = subprocess.run(
        [sys.executable, "-m", "tensor_server", "serve", "/tmp", "--montage-gap", "3", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and out.stderr.startswith("serve: montage gap must be a fraction of a cell")


# ---- the adapter contract -------------------------------------------------------------------------
class TestCziPositions(AdapterTests):
    """The conformance suite on the scenes' montage (uniform blocks: the gaps, the cells'
    empty corners; reads across cells)."""

    methods = ("nearest", "area")

    @pytest.fixture
    def source(self, tmp_path):
        with tensor_server.open(write_scenes(tmp_path / "suite.czi")) as src:
            yield src

    def tensors(self, source):
        return [("positions", source.tensor("positions"))]

    def reference_array(self, source, field):
        """pylibCZIrw's read of every scene at its published box (numbers pinned above)."""
        montage = source.tensor(field)
        return assembled(
            montage.metadata["montage"], montage.shape, montage.dtype, lambda s: scene_pixels(source.path, s)
        )


class TestMicroManagerPositions(AdapterTests):
    """The conformance suite on the real dataset's positions: each position a view of the
    dataset tensor at one ``p`` index (``AxisIndexTensor``)."""

    methods = ("nearest", "area")

    @pytest.fixture
    def source(self, mmstack_folder):
        with tensor_server.open(mmstack_folder) as src:
            yield src

    def tensors(self, source):
        return [("positions", source.tensor("positions"))]

    def reference_array(self, source, field):
        """tifffile's own read of the dataset, each position at its published box."""
        tifffile = pytest.importorskip("tifffile")
        with tifffile.TiffFile(sorted(source.path.glob("*_MMStack_*.ome.tif"))[0]) as tif:
            data = tif.series[0].asarray()  # R T Z C Y X
        served = np.transpose(data, (0, 1, 3, 2, 4, 5))  # p t c z y x
        montage = source.tensor(field)
        return assembled(montage.metadata["montage"], montage.shape, montage.dtype, served.__getitem__)
