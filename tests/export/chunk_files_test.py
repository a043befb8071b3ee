"""The files an export writes itself (export/chunk_files.py) are the files zarr-python would
write: zarr-python reads them back as the block, a v2 chunk file is byte for byte zarr's, and
a v3 shard holds, inner chunk for inner chunk, zarr's encoded bytes under a valid index."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import zarr

from tensor_server.export.chunk_files import ChunkFiles
from tensor_server.export.store import _compressors, _fill

# (shape, file shape, inner chunk shape): ragged edges in every axis, a 3-D volume, one
# inner chunk per shard
CASES = [
    ((300, 413), (128, 256), (64, 64)),
    ((5, 70, 90), (4, 64, 64), (2, 32, 32)),
    ((256, 256), (64, 64), (64, 64)),
]


def _array(
    root: Path, name: str, shape, file_shape, chunk, dtype, codec: str, zarr_format: int, write_empty: bool = True
):
    group = zarr.open_group(str(root), mode="a", zarr_format=zarr_format)
    kw = {"shards": file_shape} if zarr_format == 3 else {"chunk_key_encoding": {"name": "v2", "separator": "/"}}
    return group.create_array(
        name,
        shape=shape,
        dtype=dtype,
        chunks=chunk if zarr_format == 3 else file_shape,
        compressors=_compressors(codec, zarr_format),
        fill_value=_fill(np.dtype(dtype)),
        config={"write_empty_chunks": write_empty},
        **kw,
    )


def _data(shape, dtype) -> np.ndarray:
    rng = np.random.default_rng(7)
    values = rng.integers(0, 50, shape).astype(dtype) if np.dtype(dtype).kind != "b" else rng.random(shape) > 0.5
    values[tuple(slice(0, max(1, n // 3)) for n in shape)] = 0  # some fill-valued chunks
    return values


def _write_ours(root: Path, array, data: np.ndarray) -> None:
    files = ChunkFiles(array)
    for key, part in files.files((0,) * data.ndim, data):
        pieces = files.encode(part)
        payload = None if pieces is None else b"".join(pieces)
        path = root / array.path / key
        if payload is None:
            assert not path.exists()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(payload)


def _inner_chunks(shard: bytes, per_shard: tuple[int, ...]) -> dict[tuple[int, ...], bytes]:
    n = int(np.prod(per_shard))
    table, crc = shard[-(16 * n + 4) : -4], shard[-4:]
    import google_crc32c

    assert np.uint32(google_crc32c.value(table)).astype("<u4").tobytes() == crc
    index = np.frombuffer(table, "<u8").reshape(per_shard + (2,))
    return {
        k: shard[int(index[k][0]) : int(index[k][0] + index[k][1])]
        for k in itertools.product(*map(range, per_shard))
        if index[k][0] != 2**64 - 1
    }


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("codec", ["blosc-zstd", "zstd", "none"])
@pytest.mark.parametrize("dtype", ["uint16", "float32", "bool"])
@pytest.mark.parametrize("shape, file_shape, chunk", CASES)
def test_files_read_back_and_match_what_zarr_writes(tmp_path, zarr_format, codec, dtype, shape, file_shape, chunk):
    data = _data(shape, dtype)
    ours = _array(tmp_path / "ours", "a", shape, file_shape, chunk, dtype, codec, zarr_format)
    _write_ours(tmp_path / "ours", ours, data)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "ours" / "a"), mode="r")[...], data)

    # zarr-python, told to leave fill chunks out exactly when an export does (uncompressed)
    theirs = _array(
        tmp_path / "theirs", "a", shape, file_shape, chunk, dtype, codec, zarr_format, write_empty=codec != "none"
    )
    theirs[...] = data
    ours_files = sorted(p.relative_to(tmp_path / "ours") for p in (tmp_path / "ours" / "a").rglob("*") if p.is_file())
    their_files = sorted(
        p.relative_to(tmp_path / "theirs") for p in (tmp_path / "theirs" / "a").rglob("*") if p.is_file()
    )
    assert ours_files == their_files
    per_shard = tuple(-(-f // c) for f, c in zip(file_shape, chunk))
    for rel in ours_files:
        if rel.name in ("zarr.json", ".zarray", ".zattrs"):
            continue
        mine, zarrs = (tmp_path / "ours" / rel).read_bytes(), (tmp_path / "theirs" / rel).read_bytes()
        if zarr_format == 2:
            assert mine == zarrs, rel
        else:  # the same inner chunks, encoded the same; zarr orders them in Morton order
            assert _inner_chunks(mine, per_shard) == _inner_chunks(zarrs, per_shard), rel


def test_a_block_that_covers_a_file_in_part_is_refused(tmp_path):
    array = _array(tmp_path, "a", (300, 413), (128, 256), (64, 64), "uint16", "zstd", 3)
    with pytest.raises(ValueError, match=r"covers file \(0, 0\) only in part"):
        ChunkFiles(array).files((0, 0), np.zeros((100, 256), np.uint16))


def test_an_all_fill_uncompressed_shard_is_no_file_and_a_compressed_one_is_written(tmp_path):
    zeros = np.zeros((128, 256), np.uint16)
    for codec, expect_file in (("none", False), ("zstd", True)):
        array = _array(tmp_path / codec, "a", (128, 256), (128, 256), (64, 64), "uint16", codec, 3)
        files = ChunkFiles(array)
        ((key, part),) = files.files((0, 0), zeros)
        assert key == "c/0/0"
        assert (files.encode(part) is not None) == expect_file


def test_a_file_of_more_pieces_than_one_gathered_write_takes_is_written_whole(tmp_path):
    """A shard of many inner chunks is written in several ``writev`` calls (at most 1024
    pieces each); the file and its [size, CRC-32] are those of the joined bytes."""
    import zlib

    from tensor_server.export.store import Staging

    staging = Staging(tmp_path / "o.zarr", {})
    staging.path.mkdir()
    pieces = [bytes([i % 251]) * (i % 7) for i in range(3000)]  # empty pieces among them
    entry = staging.write_file("0/c/0/0", pieces)
    joined = b"".join(pieces)
    assert (staging.path / "0/c/0/0").read_bytes() == joined
    assert entry == [len(joined), zlib.crc32(joined)]
    assert staging.write_file("0/c/0/0", None) is None and not (staging.path / "0/c/0/0").exists()
