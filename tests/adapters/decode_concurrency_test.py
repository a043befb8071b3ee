"""Within one read, the pieces a reader can decode independently are decoded on several threads:
zarr chunks (zarr-python 3's codec pipeline) and the tiles of a TIFF page (tifffile maxworkers).

Each test makes the first two piece decodes wait for each other at a barrier: a reader that
decodes one piece at a time never gets past it (the barrier times out and the read fails),
so these are not timing tests.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import tensor_server
from tensor_server.core.bounds import Bounds

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores")


def _meeting(decode):
    """``decode`` whose first two calls must overlap in time (else BrokenBarrierError)."""
    barrier, lock, calls = threading.Barrier(2, timeout=20), threading.Lock(), [0]

    def wrapped(*args, **kwargs):
        with lock:
            calls[0] += 1
            first_two = calls[0] <= 2
        if first_two:
            barrier.wait()
        return decode(*args, **kwargs)

    return wrapped, calls


def _plane():
    return np.random.default_rng(3).integers(0, 60000, (256, 256), dtype=np.uint16)


def test_zarr_chunks_of_one_read_decode_concurrently(tmp_path, monkeypatch):
    numcodecs = pytest.importorskip("numcodecs")
    zarr = pytest.importorskip("zarr")
    arr = _plane()
    z = zarr.open_array(
        str(tmp_path / "a.zarr"),
        mode="w",
        shape=arr.shape,
        chunks=(128, 128),
        dtype=arr.dtype,
        zarr_format=2,
        compressor=numcodecs.Zlib(1),
    )
    z[...] = arr
    tensor = tensor_server.open(tmp_path / "a.zarr").tensor()
    wrapped, calls = _meeting(numcodecs.Zlib.decode)
    monkeypatch.setattr(numcodecs.Zlib, "decode", lambda self, *a, **k: wrapped(self, *a, **k))
    got = tensor.get_data(Bounds.full(arr.shape))
    np.testing.assert_array_equal(got, arr)
    assert calls[0] == 4


def test_tiff_tiles_of_one_page_decode_concurrently(tmp_path, monkeypatch):
    tifffile = pytest.importorskip("tifffile")
    arr = _plane()
    tifffile.imwrite(tmp_path / "t.tif", arr, tile=(64, 64), compression="zlib")
    original = tifffile.TiffPage.decode  # a cached_property: the page's decode function
    state = {}

    def decode_of(page):
        if "fn" not in state:
            state["fn"], state["calls"] = _meeting(original.func(page))
        return state["fn"]

    monkeypatch.setattr(tifffile.TiffPage, "decode", property(decode_of))
    tensor = tensor_server.open(tmp_path / "t.tif").tensor()
    got = tensor.get_data(Bounds.full(arr.shape))
    np.testing.assert_array_equal(got, arr)
    assert state["calls"][0] == 16
