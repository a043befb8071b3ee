"""TiffSequenceAdapter: generated sequences (raw, compressed, sparse, RGB tiled, multi-page),
the real sample folders, grouping, detection and damaged planes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import tensor_server
from tensor_server.adapters.registry import detect_format
from tensor_server.adapters.tiff_sequence import TiffSequenceAdapter, group_plane_names, sniff_tiff_sequence
from tensor_server.core.bounds import Bounds
from tensor_server.errors import UnknownFormat, UnreadableSource
from tensor_server.testing import AdapterTests

tifffile = pytest.importorskip("tifffile")


def inner(tensor):
    return getattr(tensor, "inner", tensor)


def write_planes(
    folder: Path,
    name_fmt: str,
    grid: dict[str, int],
    plane: tuple[int, ...],
    *,
    dtype=np.uint16,
    skip=(),
    seed=0,
    **imwrite_kw,
) -> dict[tuple, np.ndarray]:
    """One TIFF per grid point (``name_fmt`` uses the grid keys); returns index -> plane."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    keys = list(grid)
    written = {}
    for idx in np.ndindex(*grid.values()):
        if idx in skip:
            continue
        data = rng.integers(0, 4000 if dtype != np.uint8 else 255, plane, dtype=dtype)
        tifffile.imwrite(folder / name_fmt.format(**dict(zip(keys, idx))), data, **imwrite_kw)
        written[idx] = data
    return written


def sequence_reference(folder: Path, regex: str, axes_out: tuple[str, ...]) -> np.ndarray:
    """tifffile's own sequence parser places the files; absent planes are zeros. Returned in
    ``axes_out`` order (file-name dims as tifffile names them, in the served canonical
    order), plane axes last."""
    files = sorted(str(p) for p in folder.glob("*.tif"))
    seq = tifffile.TiffSequence(files, pattern=regex)
    first = tifffile.imread(files[0])
    out = np.zeros(seq.shape + first.shape, first.dtype)
    for name, index in zip(list(seq), seq.indices):
        out[index] = tifffile.imread(name)
    dims = [d.lower() for d in seq.dims]
    lead = len(dims)
    order = [dims.index(a) for a in axes_out] + list(range(lead, out.ndim))
    return np.transpose(out, order)


class _SourceFixture(AdapterTests):
    regex = ""
    axes_out: tuple[str, ...] = ()

    def make(self, folder: Path) -> None:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @pytest.fixture
    def source(self, tmp_path):
        folder = tmp_path / "seq"
        self.make(folder)
        src = tensor_server.open(folder)
        yield src
        src.close()

    def reference_array(self, source, field):
        return sequence_reference(source.path, self.regex, self.axes_out)


class TestRawSequence(_SourceFixture):
    """Uncompressed planes named c{c}z{z}t{t}: raw reads, no block, decimation by stride."""

    regex = r"(c)(\d+)(z)(\d+)(t)(\d+)"
    axes_out = ("t", "c", "z")

    def make(self, folder):
        write_planes(folder, "c{c}z{z}t{t}.tif", {"c": 2, "z": 3, "t": 2}, (40, 52))

    def test_layout(self, source):
        t = source.tensor()
        assert list(source.tensors) == ["czt"]
        assert t.dim_labels == ("t", "c", "z", "y", "x") and t.shape == (2, 2, 3, 40, 52)
        assert t.read_block_shape is None and t.decimates
        assert isinstance(inner(t), TiffSequenceAdapter)
        assert t.metadata["pattern"] == "c{c}z{z}t{t}" and t.metadata["missing_planes"] == 0


class TestSparseCompressedSequence(_SourceFixture):
    """Zlib strips, a sparse grid (missing planes read as zeros), MM-2.0-like names without
    metadata.txt (so a TIFF sequence, not Micro-Manager): strile reads, block = one strip."""

    regex = r"img_(channel)(\d+)_(time)(\d+)_(z)(\d+)"
    axes_out = ("time", "channel", "z")

    def make(self, folder):
        write_planes(
            folder,
            "img_channel{c:03d}_time{t:09d}_z{z:03d}.tif",
            {"c": 2, "t": 3, "z": 4},
            (33, 47),
            skip={(0, 1, 2), (1, 0, 0), (1, 2, 3), (0, 2, 1)},
            compression="zlib",
            rowsperstrip=8,
        )

    def test_layout(self, source):
        t = source.tensor()
        assert t.shape == (3, 2, 4, 33, 47) and t.dim_labels == ("t", "c", "z", "y", "x")
        assert t.read_block_shape == (1, 1, 1, 8, 47)
        assert t.metadata["missing_planes"] == 4
        missing = t.get_data(Bounds((1, 0, 2, 0, 0), (2, 1, 3, 33, 47)))  # t1 c0 z2 was skipped
        assert not missing.any()


class TestRgbTiledSequence(_SourceFixture):
    """RGB planes in compressed 16x16 tiles, one axis named 'frame' (-> t), 1-based numbers."""

    regex = r"(frame)_(\d+)"
    axes_out = ("frame",)

    def make(self, folder):
        folder.mkdir(parents=True)
        rng = np.random.default_rng(4)
        for t in range(1, 4):
            tifffile.imwrite(
                folder / f"frame_{t}.tif",
                rng.integers(0, 255, (40, 36, 3), dtype=np.uint8),
                photometric="rgb",
                tile=(16, 16),
                compression="zlib",
            )

    def test_layout(self, source):
        t = source.tensor()
        assert t.dim_labels == ("t", "y", "x", "s") and t.shape == (3, 40, 36, 3)
        assert t.read_block_shape == (1, 16, 16, 3)
        assert t.metadata["axes"]["t"] == {"keyword": "frame", "first": 1}


class TestMultiPageFiles(_SourceFixture):
    """Each file an ImageJ z-stack: the file's own Z axis follows the name's t axis."""

    regex = r"(t)(\d+)"
    axes_out = ("t",)

    def make(self, folder):
        folder.mkdir(parents=True)
        rng = np.random.default_rng(5)
        for t in range(3):
            tifffile.imwrite(
                folder / f"stack_t{t}.tif",
                rng.integers(0, 60000, (4, 20, 24), dtype=np.uint16),
                imagej=True,
                metadata={"axes": "ZYX"},
            )

    def test_layout(self, source):
        t = source.tensor()
        assert t.dim_labels == ("t", "z", "y", "x") and t.shape == (3, 4, 20, 24)
        assert t.read_block_shape is None


class TestBigEndianWideRows(_SourceFixture):
    """Big-endian raw planes with 64 KiB rows: a decimated read with a row gap beyond the
    readahead window goes through the mmap stride."""

    regex = r"(z)(\d+)"
    axes_out = ("z",)

    def make(self, folder):
        write_planes(folder, "z{z}.tif", {"z": 2}, (40, 16384), dtype=np.uint32, byteorder=">", seed=9)

    def test_strided_decimation(self, source):
        t = source.tensor()
        assert t.dtype == np.dtype("uint32")
        b = Bounds((0, 1, 5), (2, 40, 16000))
        for step in ((1, 3, 7), (2, 5, 1), (1, 1, 2)):
            dec = t.get_decimated_data(b, step)
            np.testing.assert_array_equal(dec, t.get_data(b)[:, :: step[1], :: step[2]][:: step[0]])


# ---- real samples ---------------------------------------------------------------------------
def test_viv_channels(testdata, expected):
    folder = testdata / "tiff-sequence/viv_multi-tiff"
    with tensor_server.open(folder) as src:
        assert src.type == "tiff-sequence" and list(src.tensors) == ["Channel"]
        t = src.tensor()
        assert t.dim_labels == ("c", "y", "x") and t.shape == (3, 167, 439) and t.dtype == np.uint8
        data = t.get_data()
        for c in range(3):
            e = expected[f"tiff-sequence/viv_multi-tiff/Channel_{c}.tif"]["series"][0]
            plane = data[c]
            assert (plane.shape, int(plane.min()), int(plane.max()), float(plane.sum())) == (
                tuple(e["shape"]),
                e["min"],
                e["max"],
                e["sum"],
            )
            np.testing.assert_array_equal(plane, tifffile.imread(folder / f"Channel_{c}.tif"))


def test_readlif_groups_by_pattern(testdata, expected):
    folder = testdata / "tiff-sequence/readlif_tiff"
    with tensor_server.open(folder) as src:
        assert list(src.tensors) == ["czt", "xz_c_t", "xem_y32"]
        czt, xz, xem = (src.tensors[n] for n in ("czt", "xz_c_t", "xem_y32"))
        assert czt.dim_labels == ("t", "c", "z", "y", "x") and czt.shape == (3, 2, 3, 1024, 1024)
        assert xz.dim_labels == ("t", "c", "y", "x") and xz.shape == (9, 2, 128, 128)
        assert xem.dim_labels == ("y", "x") and xem.shape == (20, 66)
        present = {"c0z0t0": (0, 0, 0), "c0z2t0": (0, 0, 2), "c0z2t2": (2, 0, 2), "c1z0t0": (0, 1, 0)}
        data = czt.get_data()
        for name, (t, c, z) in present.items():
            e = expected[f"tiff-sequence/readlif_tiff/{name}.tif"]["series"][0]
            assert float(data[t, c, z].sum()) == e["sum"] and int(data[t, c, z].max()) == e["max"]
            np.testing.assert_array_equal(data[t, c, z], tifffile.imread(folder / f"{name}.tif"))
        assert float(data.sum()) == sum(
            expected[f"tiff-sequence/readlif_tiff/{n}.tif"]["series"][0]["sum"] for n in present
        )
        assert czt.metadata["missing_planes"] == 14
        xzd = xz.get_data()
        assert (
            float(xzd[0, 0].sum()) == 81719 and float(xzd[8, 1].sum()) == 180356 and float(xzd.sum()) == 81719 + 180356
        )
        assert float(xem.get_data().sum()) == 11079
        # a decimated read of the big planes: whole planes skipped, rows strided
        b = Bounds((0, 0, 0, 3, 5), (3, 2, 3, 1000, 1020))
        np.testing.assert_array_equal(
            czt.get_decimated_data(b, (2, 1, 2, 7, 5)), czt.get_data(b)[::2, :, ::2, ::7, ::5]
        )


# ---- grouping, detection, damage ---------------------------------------------------------------
def test_pattern_grouping_rules():
    groups = {
        g.field_name(): g
        for g in group_plane_names(
            ["c0z2t0.tif", "c1z0t0.tif", "xz_c0_t0.tif", "xz_c1_t8.tif", "xem_y32.tif", "overview.TIF"]
        )
    }
    assert set(groups) == {"czt0", "xz_c_t", "xem_y32", "overview"}  # t0 is constant here
    assert groups["czt0"].varying() == [0, 1] and groups["xz_c_t"].keyword(1) == "t"


def test_shapes_split_inside_one_pattern(tmp_path):
    folder = tmp_path / "scans"
    folder.mkdir()
    tifffile.imwrite(folder / "scan1.tif", np.ones((32, 32), np.uint8))
    tifffile.imwrite(folder / "scan2.tif", np.full((16, 16), 2, np.uint8))
    tifffile.imwrite(folder / "scan3.tif", np.full((32, 32), 3, np.uint8))
    with tensor_server.open(folder) as src:
        assert list(src.tensors) == ["scan_32x32", "scan2_16x16"]
        big = src.tensors["scan_32x32"]
        assert big.shape == (3, 32, 32)  # scan1 and scan3; scan2 is a plane of another shape
        data = big.get_data()
        assert data[:, 0, 0].tolist() == [1, 0, 3]
        assert src.tensors["scan2_16x16"].get_data().tolist() == [[2] * 16] * 16


def test_detection(tmp_path):
    lone = tmp_path / "lone"
    lone.mkdir()
    tifffile.imwrite(lone / "notes_001.tif", np.zeros((4, 4), np.uint8))
    with pytest.raises(UnknownFormat):
        tensor_server.open(lone)
    single = tmp_path / "single"
    single.mkdir()
    tifffile.imwrite(single / "c0z0t0.tif", np.full((4, 4), 5, np.uint8))
    with pytest.raises(UnknownFormat):
        tensor_server.open(single)
    with tensor_server.open(single, format="tiff-sequence") as src:  # asked for explicitly
        assert src.tensor().shape == (4, 4) and int(src.tensor().get_data().max()) == 5
    pair = tmp_path / "pair"
    pair.mkdir()
    for i in range(2):
        tifffile.imwrite(pair / f"scan{i}.tif", np.full((4, 4), i, np.uint8))
    with tensor_server.open(pair) as src:
        assert src.tensor().dim_labels == ("q", "y", "x")
        assert src.tensor().get_data()[:, 0, 0].tolist() == [0, 1]


def test_far_apart_numbers_make_an_ordinal_axis(tmp_path):
    folder = tmp_path / "stamps"
    write_planes(folder, "img_t{t}.tif", {"t": 1}, (4, 4))
    os.rename(folder / "img_t0.tif", folder / "img_t1000.tif")
    tifffile.imwrite(folder / "img_t5000.tif", np.full((4, 4), 7, np.uint16))
    with tensor_server.open(folder) as src:
        t = src.tensor()
        assert t.shape == (2, 4, 4) and t.metadata["axes"]["t"]["values"] == [1000, 5000]
        assert t.get_data()[1].tolist() == [[7] * 4] * 4


def test_truncated_plane_names_the_file(tmp_path):
    folder = tmp_path / "trunc"
    write_planes(folder, "z{z}.tif", {"z": 3}, (64, 64))
    victim = folder / "z1.tif"
    size = victim.stat().st_size
    with open(victim, "r+b") as fh:
        fh.truncate(size - 3000)
    with tensor_server.open(folder) as src:
        t = src.tensor()
        t.get_data(Bounds((0, 0, 0), (1, 64, 64)))  # the intact plane still reads
        with pytest.raises(UnreadableSource, match="z1.tif"):
            t.get_data()


def test_garbage_plane_names_the_file(tmp_path):
    folder = tmp_path / "garbage"
    write_planes(folder, "z{z}.tif", {"z": 3}, (16, 16), compression="zlib")
    (folder / "z1.tif").write_bytes(b"II*\x00" + os.urandom(200))  # header unreadable: at open
    with pytest.raises(UnreadableSource, match="z1.tif"):
        tensor_server.open(folder)


def test_corrupt_compressed_strip_names_the_file(tmp_path):
    folder = tmp_path / "corrupt"
    write_planes(folder, "z{z}.tif", {"z": 3}, (64, 64), compression="zlib", rowsperstrip=16)
    with tifffile.TiffFile(folder / "z2.tif") as tif:
        offset = tif.pages[0].dataoffsets[1]
    with open(folder / "z2.tif", "r+b") as fh:  # the header stays intact: found at read
        fh.seek(offset)
        fh.write(b"\xff" * 64)
    with tensor_server.open(folder) as src:
        t = src.tensor()
        t.get_data(Bounds((2, 0, 0), (3, 16, 64)))  # strip 0 of the plane is intact
        with pytest.raises(UnreadableSource, match="z2.tif"):
            t.get_data(Bounds((2, 16, 0), (3, 32, 64)))


def test_shape_mismatch_in_a_large_pattern_found_at_read(tmp_path, monkeypatch):
    from tensor_server.adapters import tiff_sequence

    monkeypatch.setattr(tiff_sequence, "_CHECK_ALL_HEADERS", 2)  # only first and last checked
    folder = tmp_path / "mismatch"
    write_planes(folder, "t{t}.tif", {"t": 3}, (16, 16))
    tifffile.imwrite(folder / "t1.tif", np.zeros((8, 8), np.uint16))  # neither first nor last
    with tensor_server.open(folder) as src:
        with pytest.raises(UnreadableSource, match="t1.tif"):
            src.tensor().get_data()


def test_real_folders_are_not_claimed_by_other_formats(testdata):
    for rel in ("tiff-sequence/viv_multi-tiff", "tiff-sequence/readlif_tiff"):
        assert detect_format(testdata / rel).name == "tiff-sequence"
    for rel in ("ome-tiff", "tiff", "tiff-pyramid"):  # unrelated TIFFs side by side
        assert not sniff_tiff_sequence(testdata / rel, b"")


def test_content_version_follows_files(tmp_path):
    folder = tmp_path / "cv"
    write_planes(folder, "z{z}.tif", {"z": 2}, (8, 8))
    with tensor_server.open(folder) as a:
        v1 = a.tensor().content_version
    tifffile.imwrite(folder / "z1.tif", np.ones((8, 8), np.uint16))
    os.utime(folder / "z1.tif", ns=(1, 1))
    with tensor_server.open(folder) as b:
        assert b.tensor().content_version != v1
    shutil.rmtree(folder)


@pytest.mark.parametrize(
    "kind, write",
    [
        ("jpeg_rgb_tiles", dict(photometric="rgb", compression="jpeg", tile=(32, 32))),
        ("lzw_predictor", dict(compression="lzw", predictor=True, rowsperstrip=7)),
        ("planar_rgb", dict(photometric="rgb", planarconfig="separate", compression="zlib", rowsperstrip=16)),
        ("bilevel", dict()),
    ],
)
def test_codecs_and_layouts(tmp_path, kind, write):
    """Strile decoding across codecs and sample layouts equals tifffile's whole-file read,
    for full, off-origin and decimated windows."""
    rng = np.random.default_rng(3)
    folder = tmp_path / kind
    folder.mkdir()
    planes = []
    for z in range(3):
        if kind == "jpeg_rgb_tiles":
            data = rng.integers(0, 255, (70, 90, 3), dtype=np.uint8)
        elif kind == "planar_rgb":
            data = rng.integers(0, 4000, (3, 70, 90), dtype=np.uint16)
        elif kind == "bilevel":
            data = rng.integers(0, 2, (70, 90)).astype(bool)
        else:
            data = rng.integers(0, 4000, (70, 90), dtype=np.uint16)
        tifffile.imwrite(folder / f"z{z}.tif", data, **write)
        planes.append(tifffile.imread(folder / f"z{z}.tif"))
    ref = np.stack(planes)
    if kind == "planar_rgb":
        ref = ref.transpose(0, 2, 3, 1)  # SYX pages are served y, x, s
    with tensor_server.open(folder) as src:
        t = src.tensor()
        assert t.shape == ref.shape and t.dtype == ref.dtype
        np.testing.assert_array_equal(t.get_data(), ref)
        rgb = t.ndim == 4
        b = Bounds((1, 5, 9) + ((1,) * rgb), (3, 61, 80) + ((3,) * rgb))
        np.testing.assert_array_equal(t.get_data(b), ref[b.to_slices()])
        step = (2, 3, 4) + ((2,) * rgb)
        np.testing.assert_array_equal(
            t.get_decimated_data(b, step), ref[b.to_slices()][tuple(slice(None, None, s) for s in step)]
        )
        if kind != "bilevel":
            assert t.read_block_shape is not None and t.read_block_shape[0] == 1


def test_multifile_ome_folder_as_a_sequence(testdata):
    """SOURCES.md: the five multifile-Z<n>.ome.tiff planes stack to (5,24,18) sum 314466."""
    with tensor_server.open(testdata / "ome-tiff/multifile") as src:
        t = src.tensor()
        assert t.dim_labels == ("z", "y", "x") and t.shape == (5, 24, 18)
        data = t.get_data()
        assert float(data.sum()) == 314466 and [float(p.sum()) for p in data] == [94605, 16575, 93330, 17136, 92820]
