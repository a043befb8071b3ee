"""Micro-Manager: the real 1.4 MMStack dataset (gunzipped), the real 2.0 separate-files
sample, generated separate-files datasets (2.0 and 1.4 naming), detection and damage."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import tensor_server
from tensor_server.adapters.micromanager import MicroManagerLegacyAdapter, MicroManagerSequenceAdapter
from tensor_server.adapters.registry import detect_format
from tensor_server.core.bounds import Bounds
from tensor_server.core.normalizing import canonical_axis_order
from tensor_server.errors import UnreadableSource
from tensor_server.testing import AdapterTests

tifffile = pytest.importorskip("tifffile")

COMPAT = "micromanager/VersionCompatTest"
ALPHA = "micromanager/alpha_2.0_singleplane_manual"
MM_AXES = {"R": "p", "T": "t", "Z": "z", "C": "c", "Y": "y", "X": "x", "S": "s"}


def inner(tensor):
    return getattr(tensor, "inner", tensor)


@pytest.fixture(scope="module")
def mmstack_folder(tmp_path_factory, testdata) -> Path:
    """The four 1.4 MMStack files (and their metadata) gunzipped into one folder."""
    folder = tmp_path_factory.mktemp("mmstack")
    for gz in sorted((testdata / COMPAT).glob("*.gz")):
        with gzip.open(gz, "rb") as src, open(folder / gz.name[:-3], "wb") as dst:
            shutil.copyfileobj(src, dst)
    return folder


def tifffile_series_reference(path: Path) -> np.ndarray:
    """tifffile's own multi-file MMStack series, transposed to the served order."""
    with tifffile.TiffFile(path) as tif:
        series = tif.series[0]
        data = series.asarray()
        labels = [MM_AXES[a] for a in series.axes]
    return np.transpose(data, canonical_axis_order(labels))


class _DatasetSuite(AdapterTests):
    def tensors(self, source):
        """The dataset's tensor (its positions' montage has its suite in positions_montage_test.py)."""
        return [(f, t) for f, t in source.tensors.items() if f != "positions"]


class TestMMStack(_DatasetSuite):
    @pytest.fixture
    def source(self, mmstack_folder):
        src = tensor_server.open(mmstack_folder)
        yield src
        src.close()

    def reference_array(self, source, field):
        return tifffile_series_reference(sorted(source.path.glob("*_MMStack_*.ome.tif"))[0])

    def test_values_match_expected(self, source, expected):
        e = expected[f"{COMPAT}/1.4compatTest_3_MMStack_1-Pos_000_000.ome.tif.gz"]["dataset"]
        assert source.type == "micromanager" and list(source.tensors) == ["1.4compatTest_3", "positions"]
        t = source.tensor()
        assert isinstance(inner(t), MicroManagerLegacyAdapter)
        # RTZCYX in the file; served p, t, c, z, y, x
        assert t.dim_labels == ("p", "t", "c", "z", "y", "x") and t.shape == (4, 2, 2, 2, 64, 64)
        data = t.get_data()
        assert (str(data.dtype), int(data.min()), int(data.max()), float(data.sum())) == (
            e["dtype"],
            e["min"],
            e["max"],
            e["sum"],
        )
        own = expected[f"{COMPAT}/1.4compatTest_3_MMStack_1-Pos_000_000.ome.tif.gz"]["own_pages"]["sum"]
        assert [float(data[p].sum()) for p in range(4)] == [own] * 4
        assert t.read_block_shape is None and t.decimates
        assert t.physical_scale == (None, None, None, 5.0, 1.0, 1.0) and t.physical_unit[-1] == "µm"
        assert t.metadata["channel_names"] == ["Cy5", "DAPI"]
        assert t.metadata["positions"] == ["1-Pos_000_000", "1-Pos_001_000", "1-Pos_001_001", "1-Pos_000_001"]

    def test_each_position_is_its_own_file(self, source, mmstack_folder):
        t = source.tensor()
        for p in range(4):
            with tifffile.TiffFile(mmstack_folder / t.metadata["files"][p]) as tif:
                own = np.stack([page.asarray() for page in tif.pages])  # this file's 8 pages
            assert float(own.sum()) == float(t.get_data(Bounds((p, 0, 0, 0, 0, 0), (p + 1, 2, 2, 2, 64, 64))).sum())

    def test_decimated_skips_planes(self, source):
        t = source.tensor()
        b = Bounds((1, 0, 0, 1, 3, 2), (4, 2, 2, 2, 60, 64))
        np.testing.assert_array_equal(
            t.get_decimated_data(b, (2, 1, 2, 1, 5, 3)), t.get_data(b)[::2, :, ::2, :, ::5, ::3]
        )


def test_one_mmstack_file_opens_the_dataset(mmstack_folder, expected):
    path = mmstack_folder / "1.4compatTest_3_MMStack_1-Pos_001_001.ome.tif"
    assert detect_format(path).name == "micromanager-mmstack"
    with tensor_server.open(path) as src:
        t = src.tensor()
        assert t.shape == (4, 2, 2, 2, 64, 64)
        np.testing.assert_array_equal(t.get_data(), tifffile_series_reference(path))
    assert detect_format(mmstack_folder).name == "micromanager"


def test_truncated_mmstack_file_serves_what_was_written(mmstack_folder, tmp_path):
    """A crashed acquisition: the index map (near the file start) lists planes past the end
    of the file. As tifffile does, those planes read as zeros; the metadata counts them."""
    folder = tmp_path / "cut"
    folder.mkdir()
    for f in mmstack_folder.glob("*.ome.tif"):
        shutil.copy(f, folder / f.name)
    victim = folder / "1.4compatTest_3_MMStack_1-Pos_001_000.ome.tif"
    with tifffile.TiffFile(victim) as tif:
        offsets = sorted(p.dataoffsets[0] for p in tif.pages)
    with open(victim, "r+b") as fh:
        fh.truncate(offsets[-2] + 100)  # the last two planes of position 1 are cut
    with tensor_server.open(folder) as src:
        t = src.tensor()
        assert t.metadata["truncated_planes"] == 2
        data = t.get_data()
        per_position = [int((data[p].reshape(8, -1).max(axis=1) == 0).sum()) for p in range(4)]
        assert per_position == [0, 2, 0, 0]
        np.testing.assert_array_equal(data[0], tifffile_series_reference(mmstack_folder / victim.name)[0])


# ---- separate image files -----------------------------------------------------------------------
def test_real_2_0_sample(testdata, expected):
    folder = testdata / ALPHA
    assert detect_format(folder).name == "micromanager"
    e = expected[f"{ALPHA}/Pos0/img_channel000_position000_time000000000_z000.tif"]["series"][0]
    for path in (folder, folder / "Pos0"):
        with tensor_server.open(path) as src:
            t = src.tensor()
            assert isinstance(inner(t), MicroManagerSequenceAdapter)
            assert t.shape == tuple(e["shape"]) and t.dim_labels == ("y", "x")
            data = t.get_data()
            assert (str(data.dtype), int(data.min()), int(data.max()), float(data.sum())) == (
                e["dtype"],
                e["min"],
                e["max"],
                e["sum"],
            )
            np.testing.assert_array_equal(
                data, tifffile.imread(folder / "Pos0/img_channel000_position000_time000000000_z000.tif")
            )
            assert t.metadata["channel_names"] == ["Alpha", "Beta", "Romeo"]  # metadata.txt lacks its final brace


def write_mm2_dataset(
    root: Path, positions=2, t=2, c=2, z=3, shape=(24, 20), skip=(), close_json=(True, False)
) -> dict:
    """A Micro-Manager-2.0-like separate-files dataset: Pos<k>/ with one TIFF per plane and a
    metadata.txt (Summary + Coords-<file>). Returns (p, t, c, z) -> plane."""
    rng = np.random.default_rng(11)
    planes = {}
    for p in range(positions):
        folder = root / f"Pos{p}"
        folder.mkdir(parents=True)
        meta = {
            "Summary": {
                "ChNames": ["DAPI", "GFP"][:c],
                "PixelSize_um": 0.5,
                "z-step_um": 2.0,
                "MicroManagerVersion": "2.0.0",
                "Prefix": "generated",
            }
        }
        for idx in np.ndindex(t, c, z):
            if (p,) + idx in skip:
                continue
            ti, ci, zi = idx
            name = f"img_channel{ci:03d}_position{p:03d}_time{ti:09d}_z{zi:03d}.tif"
            data = rng.integers(0, 60000, shape, dtype=np.uint16)
            tifffile.imwrite(folder / name, data)
            planes[(p,) + idx] = data
            meta[f"Coords-Pos{p}/{name}"] = {"position": p, "time": ti, "z": zi, "channel": ci}
        text = json.dumps(meta, indent=1)
        if not close_json[p % len(close_json)]:
            text = text.rstrip()[:-1]  # an acquisition still writing: no final brace
        (folder / "metadata.txt").write_text(text)
    return planes


class TestGeneratedMM2(_DatasetSuite):
    @pytest.fixture
    def source(self, tmp_path):
        root = tmp_path / "acq_1"
        write_mm2_dataset(root, skip={(1, 1, 0, 2)})
        src = tensor_server.open(root)
        yield src
        src.close()

    def reference_array(self, source, field):
        out = np.zeros((2, 2, 2, 3, 24, 20), np.uint16)
        for f in source.path.glob("Pos*/img_*.tif"):
            c, p, t, z = (
                int(v)
                for v in f.stem.replace("img_channel", "")
                .replace("_position", " ")
                .replace("_time", " ")
                .replace("_z", " ")
                .split()
            )
            out[p, t, c, z] = tifffile.imread(f)
        return out

    def test_layout(self, source):
        t = source.tensor()
        assert source.type == "micromanager"
        assert t.dim_labels == ("p", "t", "c", "z", "y", "x") and t.shape == (2, 2, 2, 3, 24, 20)
        assert t.physical_scale == (None, None, None, 2.0, 0.5, 0.5)
        assert t.metadata["positions"] == ["Pos0", "Pos1"] and t.metadata["channel_names"] == ["DAPI", "GFP"]
        assert t.metadata["missing_planes"] == 1
        assert not t.get_data(Bounds((1, 1, 0, 2, 0, 0), (2, 2, 1, 3, 24, 20))).any()
        assert t.read_block_shape is None


def test_generated_1_4_separate_files(tmp_path):
    """1.4 naming (img_<time>_<channel>_<slice>.tif) placed by FrameKey entries, one position
    in the root folder."""
    root = tmp_path / "acq14"
    root.mkdir()
    meta = {"Summary": {"ChNames": ["DAPI", "FITC"], "PixelSize_um": 0.65}}
    rng = np.random.default_rng(2)
    want = np.zeros((3, 2, 2, 12, 10), np.uint8)
    for t, c, z in np.ndindex(3, 2, 2):
        name = f"img_{t:09d}_{['DAPI', 'FITC'][c]}_{z:03d}.tif"
        want[t, c, z] = rng.integers(0, 255, (12, 10), dtype=np.uint8)
        tifffile.imwrite(root / name, want[t, c, z])
        meta[f"FrameKey-{t}-{c}-{z}"] = {"FileName": name, "FrameIndex": t, "ChannelIndex": c, "SliceIndex": z}
    (root / "metadata.txt").write_text(json.dumps(meta))
    with tensor_server.open(root) as src:
        tensor = src.tensor()
        assert tensor.dim_labels == ("t", "c", "z", "y", "x") and tensor.physical_scale[-1] == 0.65
        np.testing.assert_array_equal(tensor.get_data(), want)
    (root / "metadata.txt").write_text('{"Summary": {"ChNames": ["DAPI", "FITC"]}, "FrameKey-0-0-0": {"Fi')
    with tensor_server.open(root) as src:  # unreadable metadata: the 1.4 names place the files
        np.testing.assert_array_equal(src.tensor().get_data(), want)
        assert "notes" in src.tensor().metadata


def test_truncated_mm2_plane_names_the_file(tmp_path):
    root = tmp_path / "acq_trunc"
    write_mm2_dataset(root, positions=1, t=2, c=1, z=2)
    victim = root / "Pos0/img_channel000_position000_time000000001_z000.tif"
    with open(victim, "r+b") as fh:
        fh.truncate(victim.stat().st_size - 500)
    with tensor_server.open(root) as src:
        with pytest.raises(UnreadableSource, match="img_channel000_position000_time000000001_z000.tif"):
            src.tensor().get_data()


def test_folder_without_mm_data_is_not_claimed(tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "metadata.txt").write_text('{"something": 1}')
    for z in range(2):
        tifffile.imwrite(folder / f"c0z{z}t0.tif", np.zeros((4, 4), np.uint8))
    assert detect_format(folder).name == "tiff-sequence"
