"""The decode floor decodes every stored piece of the plane, and only that (the bench's limit row)."""

from __future__ import annotations

import numpy as np

from tensor_server.bench.decode_floor import tiff_decode_floor, tiff_extent_floor, zarr_decode_floor, zarr_extent_floor


def _plane():
    return np.random.default_rng(1).integers(0, 4000, (300, 260), dtype=np.uint16)


def test_zarr_floor_decodes_every_chunk(tmp_path):
    import numcodecs
    import zarr

    arr = _plane()
    z = zarr.open_array(
        str(tmp_path / "a"),
        mode="w",
        shape=arr.shape,
        chunks=(128, 128),
        dtype=arr.dtype,
        zarr_format=2,
        compressor=numcodecs.Blosc("zstd", 5, numcodecs.Blosc.SHUFFLE),
    )
    z[...] = arr
    # 3 x 3 chunks of 128^2 (edge chunks are stored full size)
    assert zarr_decode_floor(tmp_path / "a")() == 9 * 128 * 128 * 2


def test_zarr_v3_and_sharded_floors_decode_every_stored_inner_chunk(tmp_path):
    import zarr

    arr = _plane()
    zarr.create_array(str(tmp_path / "v3"), data=arr, chunks=(128, 128), zarr_format=3)
    assert zarr_decode_floor(tmp_path / "v3")() == 9 * 128 * 128 * 2
    z = zarr.create_array(
        str(tmp_path / "s"),
        shape=arr.shape,
        chunks=(64, 64),
        shards=(128, 128),
        dtype=arr.dtype,
        zarr_format=3,
        fill_value=0,
    )
    z[...] = arr
    z[:64, :64] = 0  # one inner chunk equal to the fill value is not stored
    # 3 x 3 shards of 2 x 2 inner chunks; inner chunks wholly past the edge are not stored
    stored = sum(1 for i in range(6) for j in range(6) if i * 64 < 300 and j * 64 < 260) - 1
    assert zarr_decode_floor(tmp_path / "s")() == stored * 64 * 64 * 2


def test_tiff_floor_decodes_every_tile(tmp_path):
    import tifffile

    arr = _plane()
    tifffile.imwrite(tmp_path / "t.tif", arr, tile=(64, 64), compression="zlib")
    # 5 x 5 tiles of 64^2 (edge tiles decode full size)
    assert tiff_decode_floor(tmp_path / "t.tif")() == 25 * 64 * 64 * 2


def test_the_extent_floors_decode_only_the_pieces_under_the_region(tmp_path):
    import numcodecs
    import tifffile
    import zarr

    arr = _plane()
    tifffile.imwrite(tmp_path / "t.tif", arr, tile=(64, 64), compression="zlib")
    z = zarr.open_array(
        str(tmp_path / "a"),
        mode="w",
        shape=arr.shape,
        chunks=(64, 64),
        dtype=arr.dtype,
        zarr_format=2,
        compressor=numcodecs.Zstd(0),
    )
    z[...] = arr
    piece = 64 * 64 * 2
    for floor in (tiff_extent_floor(tmp_path / "t.tif"), zarr_extent_floor(tmp_path / "a")):
        assert floor(0, 0, 64, 64) == piece  # one piece
        assert floor(60, 10, 10, 100) == 2 * 2 * piece  # x 60-70 (2 columns), y 10-110 (2 rows)
        assert floor(256, 256, 4, 44) == piece  # the corner piece (x 256-260, y 256-300)
        assert floor(200, 250, 60, 50) == 4 * piece
