"""A read of exactly one stored chunk of a zarr v2 array is decoded straight from the chunk file
(no copy through zarr); it must equal zarr's own read in every case, including the ones that
fall back to zarr."""
from __future__ import annotations

import numpy as np
import pytest

import tensor_server
from tensor_server.core.bounds import Bounds

zarr = pytest.importorskip("zarr")
numcodecs = pytest.importorskip("numcodecs")


def _write(path, arr, chunks, **kwargs):
    z = zarr.open_array(str(path), mode="w", shape=arr.shape, chunks=chunks, dtype=arr.dtype, zarr_format=2, **kwargs)
    z[...] = arr
    return z


def _reads(tensor, chunks):
    """Every chunk-aligned region of ``chunks`` size (interior and ragged edge)."""
    starts = [range(0, n, c) for n, c in zip(tensor.shape, chunks)]
    for a in starts[0]:
        for b in starts[1]:
            yield Bounds((a, b), (min(a + chunks[0], tensor.shape[0]), min(b + chunks[1], tensor.shape[1])))


@pytest.mark.parametrize("dtype", ["<u2", ">u2", "<f4", "int8"])
@pytest.mark.parametrize("compressor", [numcodecs.Blosc("zstd", 3, numcodecs.Blosc.SHUFFLE), numcodecs.Zlib(1), None])
def test_whole_chunk_reads_equal_zarr(tmp_path, dtype, compressor):
    arr = (np.random.default_rng(2).random((70, 50)) * 100).astype(dtype)
    _write(tmp_path / "a.zarr", arr, (32, 25), compressor=compressor)
    tensor = tensor_server.open(tmp_path / "a.zarr").tensor()
    taken = []
    real = type(tensor)._whole_chunk
    for b in _reads(tensor, (32, 25)):
        whole = real(tensor, b)
        taken.append(whole is not None)
        got = tensor.get_data(b)
        np.testing.assert_array_equal(got, arr[b.to_slices()])
        assert got.dtype == np.dtype(dtype).newbyteorder("=")
    # 2 x 2 interior chunks are whole; the ragged third row of chunks goes through zarr
    assert taken == [True, True, True, True, False, False]


def test_missing_chunk_and_filters_go_through_zarr(tmp_path):
    arr = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64)
    z = _write(tmp_path / "m.zarr", arr, (32, 32), compressor=numcodecs.Zlib(1), fill_value=7)
    z[:32, :32] = 7  # an all-fill chunk is not written at all
    (tmp_path / "m.zarr" / "0.0").unlink(missing_ok=True)
    tensor = tensor_server.open(tmp_path / "m.zarr").tensor()
    assert type(tensor)._whole_chunk(tensor, Bounds((0, 0), (32, 32))) is None
    np.testing.assert_array_equal(tensor.get_data(Bounds((0, 0), (32, 32))), np.full((32, 32), 7, np.uint16))
    np.testing.assert_array_equal(tensor.get_data(Bounds((32, 32), (64, 64))), arr[32:, 32:])

    _write(tmp_path / "f.zarr", arr, (32, 32), compressor=numcodecs.Zlib(1), filters=[numcodecs.Delta("<u2")])
    tensor = tensor_server.open(tmp_path / "f.zarr").tensor()
    assert type(tensor)._whole_chunk(tensor, Bounds((32, 0), (64, 32))) is None
    np.testing.assert_array_equal(tensor.get_data(Bounds((32, 0), (64, 32))), arr[32:, :32])


def test_corrupt_chunk_is_a_clear_error(tmp_path):
    from tensor_server.errors import UnreadableSource

    arr = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64)
    _write(tmp_path / "c.zarr", arr, (32, 32), compressor=numcodecs.Blosc("lz4", 1))
    (tmp_path / "c.zarr" / "1.1").write_bytes(b"\\x02\\x01garbage" * 5)
    tensor = tensor_server.open(tmp_path / "c.zarr").tensor()
    with pytest.raises(UnreadableSource, match="c.zarr"):
        tensor.get_data(Bounds((32, 32), (64, 64)))
