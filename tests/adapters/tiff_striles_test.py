"""Strile-by-strile TIFF reads (tensor_server/adapters/_tiff_striles.py, used by _tiff_series.py and
_tiff_planes.py): every layout tifffile writes compressed, read as windows and as strided
(nearest) windows, equals tifffile's own read of the file, ragged edges and off-origin
extents included; only the striles a window touches are decoded; the decodes run in parallel
and a failure in one of them is the read's error."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from tensor_server_kernels.reference import downsample

import tensor_server
from tensor_server.adapters import _tiff_striles
from tensor_server.core.bounds import Bounds
from tensor_server.core.engine import ReadEngine
from tensor_server.errors import UnreadableSource
from tests.adapters.tiff_test import inner, served, tifffile_series

tifffile = pytest.importorskip("tifffile")

LAYOUTS = {
    "tiles ragged": ((300, 260), np.uint16, dict(tile=(64, 64), compression="zlib")),
    "strips ragged": ((301, 77), np.uint16, dict(compression="zlib", rowsperstrip=16)),
    "rgb tiles": ((100, 90, 3), np.uint8, dict(photometric="rgb", tile=(32, 32), compression="zlib")),
    "planar rgb strips": (
        (3, 70, 50),
        np.uint8,
        dict(photometric="rgb", planarconfig="separate", compression="zlib", rowsperstrip=16),
    ),
    "pages of tiles": ((4, 130, 70), np.uint16, dict(photometric="minisblack", tile=(32, 32), compression="zlib")),
    "lzw predictor": ((90, 70), np.uint16, dict(compression="lzw", predictor=True, rowsperstrip=7)),
    "float predictor": ((65, 66), np.float32, dict(compression="zlib", predictor=3, tile=(32, 32))),
    "big endian": ((80, 96), np.int16, dict(compression="zlib", byteorder=">", tile=(32, 32))),
    "jpeg rgb tiles": ((64, 80, 3), np.uint8, dict(photometric="rgb", compression="jpeg", tile=(16, 16))),
}


def _write(tmp_path, name):
    shape, dtype, kwargs = LAYOUTS[name]
    rng = np.random.default_rng(7)
    data = rng.integers(0, 250, shape).astype(dtype) if dtype != np.float32 else rng.normal(size=shape).astype(dtype)
    path = tmp_path / "t.tif"
    tifffile.imwrite(path, data, **kwargs)
    arr, axes = tifffile_series(path, 0)
    return path, served(arr, axes)


@pytest.fixture(params=sorted(LAYOUTS))
def layout(request, tmp_path):
    path, want = _write(tmp_path, request.param)
    src = tensor_server.open(path)
    yield src.tensor(), want
    src.close()


def _windows(shape, rng, n=6):
    out = [Bounds.full(shape)]
    for _ in range(n):
        start = tuple(int(rng.integers(0, s)) for s in shape)
        stop = tuple(int(rng.integers(a + 1, s + 1)) for a, s in zip(start, shape))
        out.append(Bounds(start, stop))
    return out


def test_windows_and_strided_windows_equal_tifffile(layout):
    tensor, want = layout
    assert inner(tensor)._series_striles() is not None, "compressed pages are read strile by strile"
    assert tensor.decimates
    rng = np.random.default_rng(3)
    for b in _windows(tensor.shape, rng):
        np.testing.assert_array_equal(tensor.get_data(b), want[b.to_slices()])
        for _ in range(3):
            step = tuple(int(rng.integers(1, 9)) for _ in tensor.shape)
            got = tensor.get_decimated_data(b, step)
            np.testing.assert_array_equal(got, want[b.to_slices()][tuple(slice(None, None, s) for s in step)])


def test_scaled_reads_equal_the_oracle(layout):
    """The engine's nearest (decimated) and area (streamed over strile windows) reads, off
    origin and with ragged edges, equal the NumPy oracle on tifffile's pixels."""
    tensor, want = layout
    engine = ReadEngine(store=None)
    plane = tuple(i for i, d in enumerate(tensor.dim_labels) if d in ("y", "x"))
    for method in ("nearest", "area"):
        for s in (2, 3, 8):
            scale = tuple(s if i in plane else 1 for i in range(tensor.ndim))
            b = Bounds(tuple(1 if i in plane else 0 for i in range(tensor.ndim)), tensor.shape)
            got = engine.read(tensor, b, scale, method)
            np.testing.assert_array_equal(got, downsample(want[b.to_slices()], scale, method))


def test_only_the_touched_striles_are_decoded(tmp_path, monkeypatch):
    path, want = _write(tmp_path, "tiles ragged")  # 300x260 in 64x64 tiles: 5 x 5 tiles
    tensor = tensor_server.open(path).tensor()
    decoded = []
    real = _tiff_striles._decode_one
    monkeypatch.setattr(
        _tiff_striles, "_decode_one", lambda fd, job, task: decoded.append(task[0]) or real(fd, job, task)
    )
    b = Bounds((70, 10), (130, 60))  # tile rows 1-2, tile column 0
    np.testing.assert_array_equal(tensor.get_data(b), want[70:130, 10:60])
    assert sorted(decoded) == [5, 10]
    decoded.clear()
    # a stride that skips whole tiles decodes none of them: rows 0, 128, 256; columns 0, 128, 256
    np.testing.assert_array_equal(tensor.get_decimated_data(Bounds.full(tensor.shape), (128, 128)), want[::128, ::128])
    assert sorted(decoded) == [0, 2, 4, 10, 12, 14, 20, 22, 24]


def test_decodes_run_on_the_read_pool_and_a_failure_is_the_reads_error(tmp_path, monkeypatch):
    """Striles decode on the caller's thread and the engine's shared read pool (each thread
    takes the next one itself), and a strile that fails is the read's error."""
    path, want = _write(tmp_path, "tiles ragged")
    tensor = tensor_server.open(path).tensor()
    threads = set()
    real = _tiff_striles._decode_one

    def spy(fd, job, task):
        threads.add(threading.current_thread().name)
        if task[0] == 7:
            raise ValueError("damaged tile")
        return real(fd, job, task)

    monkeypatch.setattr(_tiff_striles, "_decode_one", spy)
    with pytest.raises(UnreadableSource, match="damaged tile"):
        tensor.get_data()
    caller = threading.current_thread().name
    assert threads and all(t == caller or t.startswith("tensor-read") for t in threads), threads


def test_a_truncated_file_is_unreadable_not_a_crash(tmp_path):
    path, _ = _write(tmp_path, "tiles ragged")
    tensor = tensor_server.open(path).tensor()
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size - 3000)
    with pytest.raises(UnreadableSource):
        inner(tensor).read_region(Bounds.full(tensor.shape))


def test_raw_pages_keep_their_reader(tmp_path):
    arr = np.arange(60 * 50, dtype=np.uint16).reshape(60, 50)
    tifffile.imwrite(tmp_path / "raw.tif", arr)
    tensor = tensor_server.open(tmp_path / "raw.tif").tensor()
    assert inner(tensor)._series_striles() is None and not tensor.decimates
    assert tensor.get_decimated_data(Bounds.full(tensor.shape), (2, 2)) is None
    np.testing.assert_array_equal(tensor.get_data(), arr)


@pytest.fixture(scope="module")
def big_page(tmp_path_factory):
    """One 3000² uint16 page (18 MB) of 512² zlib tiles: larger than a transfer chunk."""
    y, x = np.mgrid[0:3000, 0:3000]
    data = ((y * 7 + x * 3) % 65521).astype(np.uint16)
    path = tmp_path_factory.mktemp("big") / "big.tif"
    tifffile.imwrite(path, data, tile=(512, 512), compression="zlib", photometric="minisblack")
    return path, data


def test_a_scaled_read_of_a_big_page_decodes_each_tile_once(big_page, monkeypatch):
    """The read block is the transfer chunk rounded up to whole tiles, so an area read streams
    units smaller than the page that meet on tile edges: every tile is decoded exactly once."""
    path, data = big_page
    tensor = tensor_server.open(path).tensor()
    assert tensor.chunk_shape == (1500, 1500), "the grid divides the page"
    assert tensor.read_block_shape == (1536, 1536)
    decoded = []
    real = _tiff_striles._decode_one
    monkeypatch.setattr(
        _tiff_striles, "_decode_one", lambda fd, job, task: decoded.append(task[0]) or real(fd, job, task)
    )
    got = ReadEngine(store=None).read(tensor, Bounds.full(tensor.shape), (2, 2), "area")
    np.testing.assert_array_equal(got, downsample(data, (2, 2), "area"))
    assert sorted(decoded) == list(range(36))


def test_nearest_never_holds_the_page(big_page):
    """A decimated read holds its output and the tiles being decoded, never the 18 MB page."""
    import tracemalloc

    path, data = big_page
    tensor = tensor_server.open(path).tensor()
    tensor.get_decimated_data(Bounds((0, 0), (600, 600)), (4, 4))  # warm: open the file, plan the striles
    tracemalloc.start()
    try:
        got = tensor.get_decimated_data(Bounds.full(tensor.shape), (4, 4))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(got, data[::4, ::4])
    workers = os.cpu_count() or 1
    assert peak < got.nbytes + (workers + 2) * 2 * 512 * 512 * 2, peak  # output + a few decoded tiles
