"""Per-format detection of uniform blocks from metadata: the closed-form path is taken (the
decoder sees only the dense blocks) and the answers are the oracle's bytes."""

from __future__ import annotations

import numpy as np
import pytest

from tensor_server.core.bounds import Bounds
from tensor_server.core.engine import ReadEngine
from tensor_server.core.uniform import uniform_value

from .conftest import ReadCounter, assert_bit_identical, oracle

SHAPE = (12, 256, 256)
CHUNK = (4, 64, 128)
DENSE = (slice(4, 8), slice(64, 128), slice(0, 128))  # exactly one chunk


def volume(dtype="u2") -> np.ndarray:
    a = np.zeros(SHAPE, dtype=dtype)
    a[DENSE] = (np.arange(4 * 64 * 128) % 251 + 1).reshape(4, 64, 128).astype(dtype)
    return a


def check_tensor(t, a: np.ndarray, fill, stored=(Bounds((4, 64, 0), (8, 128, 128)),)) -> None:
    """Full-res and scaled reads equal the oracle and decode only the ``stored`` chunks."""
    counted = ReadCounter(t)
    engine = ReadEngine(workers=1)
    empty = Bounds((8, 0, 0), (12, 256, 256))
    assert uniform_value(t, empty) == np.asarray(fill, a.dtype)
    got = engine.read(t, empty)
    assert counted.regions == []
    assert_bit_identical(got, np.full(empty.shape, fill, a.dtype))
    for scale, method in (((1, 4, 4), "area"), ((2, 8, 8), "max"), ((4, 16, 16), "mode"), ((3, 5, 7), "median")):
        want = oracle(t, Bounds.full(t.shape), scale, method)
        counted.reset()
        got = engine.read(t, None, scale, method)
        assert_bit_identical(got, want)
        assert counted.pixels < a.size // 2, counted.regions
        assert counted.regions, "the dense chunk is decoded"
        assert all(any(r.intersect(b) is not None for b in stored) for r in counted.regions), counted.regions
    np.testing.assert_array_equal(ReadEngine(special_chunks=False).read(t), a)


# ---- zarr ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind,fill",
    [("v3", 0), ("v3", 7), ("v2", 0), ("v2", None), ("sharded", 0), ("sharded", 3)],
)
def test_zarr_absent_chunks_are_fill(tmp_path, kind, fill) -> None:
    import zarr

    from tensor_server.adapters.zarr import ZarrSource

    path = tmp_path / "a.zarr"
    kw = {"zarr_format": 2} if kind == "v2" else {}
    if kind == "sharded":
        kw["shards"] = (4, 128, 256)
    z = zarr.create_array(str(path), shape=SHAPE, chunks=CHUNK, dtype="u2", fill_value=fill, **kw)
    a = volume()
    if fill:
        a[a == 0] = fill
    z[DENSE] = a[DENSE]
    if kind == "sharded":  # a stored shard with empty slots: the index, not the key, tells
        assert len(list(path.glob("c/*/*/*"))) == 1
    else:
        assert len([p for p in path.rglob("*") if p.is_file() and not p.name.startswith((".z", "zarr"))]) == 1
    t = ZarrSource(path).tensor()
    check_tensor(t, a, fill or 0)


def test_zarr_fully_written_array_is_decoded(tmp_path) -> None:
    import zarr

    from tensor_server.adapters.zarr import ZarrSource

    path = tmp_path / "d.zarr"
    z = zarr.create_array(str(path), shape=(8, 32), chunks=(4, 16), dtype="u1", fill_value=0)
    z[:] = np.arange(256, dtype=np.uint8).reshape(8, 32)
    t = ZarrSource(path).tensor()
    want = oracle(t, Bounds.full(t.shape), (2, 2), "area")
    counted = ReadCounter(t)
    got = ReadEngine(workers=1).read(t, None, (2, 2), "area")
    assert_bit_identical(got, want)
    assert counted.pixels == 256 and t.uniform_blocks(Bounds.full(t.shape)) == []


def test_zarr_listing_follows_the_content_version(tmp_path) -> None:
    import zarr

    from tensor_server.adapters.zarr import ZarrSource

    path = tmp_path / "w.zarr"
    z = zarr.create_array(str(path), shape=(8, 32), chunks=(4, 16), dtype="u1", fill_value=0)
    t = ZarrSource(path).tensor()
    assert uniform_value(t, Bounds.full(t.shape)) == 0
    z[0:4, 0:16] = 5
    t.content_version = b"changed"  # what a catalog refresh does when it sees the write
    assert uniform_value(t, Bounds.full(t.shape)) is None
    assert ReadEngine().read(t)[0, 0] == 5


def test_zarr_folder_is_listed_once_for_stamps_and_uniform_keys(tmp_path, monkeypatch) -> None:
    import zarr

    from tensor_server.adapters import _zarr_array
    from tensor_server.adapters.zarr import ZarrSource

    path = tmp_path / "once.zarr"
    z = zarr.create_array(str(path), shape=(8, 32), chunks=(4, 16), dtype="u1", fill_value=0)
    z[0:4, 0:16] = 5
    listed: list[str] = []
    real = _zarr_array.stored_files

    def counting(folder):
        listed.append(str(folder))
        return real(folder)

    monkeypatch.setattr(_zarr_array, "stored_files", counting)
    t = ZarrSource(path).tensor()
    assert listed == [str(path)]  # the open: the chunk-file stamps
    blocks = t.uniform_blocks(Bounds.full(t.shape))
    assert sorted(b.start for b, _ in blocks) == [(0, 16), (4, 0), (4, 16)]
    assert listed == [str(path)]  # the uniform keys came from the same listing
    t.content_version = b"changed"
    assert len(t.uniform_blocks(Bounds.full(t.shape))) == 3
    assert len(listed) == 2  # a new content version lists again


# ---- HDF5 ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("fill", [0, 9])
def test_hdf5_unallocated_chunks_are_fill(tmp_path, fill) -> None:
    import h5py

    from tensor_server.adapters.hdf5 import Hdf5Source

    a = volume()
    if fill:
        a[a == 0] = fill
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("data", shape=SHAPE, chunks=CHUNK, dtype="u2", fillvalue=fill, compression="gzip")
        ds[DENSE] = a[DENSE]
        ds[0:4, 0:64, 0:128] = fill  # allocated, holds only the fill value: not special
    t = Hdf5Source(path).tensor()
    blocks = t.uniform_blocks(Bounds.full(SHAPE))
    assert len(blocks) == 3 * 4 * 2 - 2
    assert all(b.intersect(Bounds((0, 0, 0), (4, 64, 128))) is None for b, _ in blocks)
    check_tensor(t, a, fill, stored=(Bounds((4, 64, 0), (8, 128, 128)), Bounds((0, 0, 0), (4, 64, 128))))


# ---- blosc2 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["zeros", "full"])
def test_b2nd_special_chunks_from_headers(tmp_path, kind) -> None:
    import blosc2

    from tensor_server.adapters.b2nd import B2ndSource

    path = tmp_path / "a.b2nd"
    fill = 0 if kind == "zeros" else 11
    make = blosc2.zeros if kind == "zeros" else (lambda *a, **k: blosc2.full(*a, fill_value=fill, **k))
    b = make(SHAPE, dtype=np.uint16, chunks=CHUNK, blocks=(2, 32, 64), urlpath=str(path), mode="w")
    a = volume()
    if fill:
        a[a == 0] = fill
    b[DENSE] = np.ascontiguousarray(a[DENSE])
    del b
    t = B2ndSource(path).tensor()
    assert len(t.uniform_blocks(Bounds.full(SHAPE))) == 3 * 4 * 2 - 1
    check_tensor(t, a, fill)


def test_b2nd_nan_chunks(tmp_path) -> None:
    import blosc2

    from tensor_server.adapters.b2nd import B2ndSource

    path = tmp_path / "n.b2nd"
    b = blosc2.full((8, 64, 64), fill_value=np.nan, dtype=np.float32, chunks=(4, 32, 64), urlpath=str(path), mode="w")
    b[0:4, 0:32] = np.ones((4, 32, 64), np.float32)
    del b
    t = B2ndSource(path).tensor()
    assert len(t.uniform_blocks(Bounds.full(t.shape))) == 3
    for method in ("area", "median", "max"):
        want = oracle(t, Bounds.full(t.shape), (2, 4, 4), method)
        assert_bit_identical(ReadEngine().read(t, None, (2, 4, 4), method), want)


# ---- TIFF ---------------------------------------------------------------------------------------
def test_tiff_sparse_pages_are_fill(tmp_path) -> None:
    import tifffile

    from tensor_server.adapters.tiff import TiffSource

    rng = np.random.default_rng(3)
    a = np.zeros((6, 128, 256), np.uint16)
    a[0] = rng.integers(1, 60000, (128, 256))
    a[3] = rng.integers(1, 60000, (128, 256))
    path = tmp_path / "sparse.tif"
    tifffile.imwrite(path, a, tile=(64, 128), photometric="minisblack", metadata={"axes": "ZYX"}, compression="zlib")
    with tifffile.TiffFile(path, mode="r+") as tf:  # make pages 1, 2, 4, 5 sparse (no tiles stored)
        tf.pages.useframes = False
        for i in (1, 2, 4, 5):
            tf.pages[i].tags["TileOffsets"].overwrite((0,) * 4)
            tf.pages[i].tags["TileByteCounts"].overwrite((0,) * 4)
    t = TiffSource(path).tensor()
    assert [b.start[0] for b, _ in t.uniform_blocks(Bounds.full(t.shape))] == [1, 2, 4, 5]
    counted = ReadCounter(t)
    assert np.array_equal(ReadEngine().read(t, Bounds((1, 0, 0), (3, 128, 256))), a[1:3])
    assert counted.regions == []
    for scale, method in (((2, 4, 4), "area"), ((1, 2, 2), "max"), ((3, 3, 3), "median")):
        want = oracle(t, Bounds.full(t.shape), scale, method)
        counted.reset()
        assert_bit_identical(ReadEngine(workers=1).read(t, None, scale, method), want)
        if scale[0] < 3:  # (3 pages per unit hold a dense page in both units)
            assert counted.pixels <= a.size * 2 // 3, counted.regions
    assert np.array_equal(ReadEngine().read(t), a)


# ---- CZI ----------------------------------------------------------------------------------------
def test_czi_regions_no_subblock_covers_are_background(tmp_path) -> None:
    from pylibCZIrw import czi as pyczi

    from tensor_server.adapters.czi import CziSource

    rng = np.random.default_rng(4)
    path = tmp_path / "gaps.czi"
    a = np.zeros((3, 128, 512), np.uint16)  # Z, Y, X; tiles at x 0 and x 384 of Z 0 and Z 2
    with pyczi.create_czi(str(path), exist_ok=True) as w:
        for z in (0, 2):
            for x in (0, 384):
                tile = rng.integers(1, 60000, (128, 128), dtype=np.uint16)
                a[z, :, x : x + 128] = tile
                w.write(tile, plane={"Z": z, "C": 0, "T": 0}, location=(x, 0))
    t = CziSource(path).tensor()
    assert t.shape[-3:] == (3, 128, 512)
    lead = (0,) * (t.ndim - 3)
    box = lambda z0, z1, x0, x1: Bounds(lead + (z0, 0, x0), tuple(n + 1 for n in lead) + (z1, 128, x1))  # noqa: E731
    assert uniform_value(t, box(1, 2, 0, 512)) == 0  # a plane with no subblocks
    assert uniform_value(t, box(0, 3, 128, 384)) == 0  # the gap between the tiles
    assert uniform_value(t, box(0, 1, 100, 200)) is None
    counted = ReadCounter(t)
    got = ReadEngine().read(t, box(0, 3, 128, 384))
    assert counted.regions == [] and not got.any()
    want = oracle(t, Bounds.full(t.shape), (1,) * (t.ndim - 3) + (1, 4, 4), "area")
    assert_bit_identical(ReadEngine(workers=1).read(t, None, (1,) * (t.ndim - 3) + (1, 4, 4), "area"), want)
    assert np.array_equal(ReadEngine().read(t).reshape(a.shape), a)


# ---- ND2 ----------------------------------------------------------------------------------------
def test_nd2_frames_missing_from_the_chunk_map_are_zeros(testdata) -> None:
    """nd2 has no writer: the real sample with two frames dropped from its chunk map (as an
    acquisition stopped early leaves it); nd2 itself then reads those frames as zeros."""
    import tensor_server

    with tensor_server.open(testdata / "nd2/cluster.nd2") as src:
        t = src.tensor()
        inner = t.inner if hasattr(t, "inner") else t
        with inner._handle.use() as f:
            offsets = f._rdr._frame_offsets
            dropped = sorted(offsets)[-2:]
            for k in dropped:
                del offsets[k]
        blocks = t.uniform_blocks(Bounds.full(t.shape))
        assert len(blocks) == 2 and all(v == 0 for _, v in blocks)
        counted = ReadCounter(t)
        for box, _ in blocks:
            assert not ReadEngine().read(t, box).any()
        assert counted.regions == []
        scale = tuple(2 if d in "yx" else 1 for d in t.dim_labels)
        want = oracle(t, Bounds.full(t.shape), scale, "area")
        assert_bit_identical(ReadEngine(workers=1).read(t, None, scale, "area"), want)
