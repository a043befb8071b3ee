from __future__ import annotations

from math import prod

import numpy as np
import pytest

from tensor_server.core.transfer_grid import (
    CEILING_BYTES,
    TARGET_BYTES,
    TILE_MIN_PX,
    scaled_virtual_chunk_size,
    spatial_axes,
    tile_chunk_shape,
    transfer_chunk_shape,
)

MiB = 1 << 20


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "float32"])
@pytest.mark.parametrize(
    "shape, labels",
    [((16384, 16384), None), ((512, 4096, 4096), "zyx"), ((20, 4, 300, 4096, 4096), "tczyx")],
)
def test_default_grid_hits_target(dtype, shape, labels):
    itemsize = np.dtype(dtype).itemsize
    c = transfer_chunk_shape(shape, itemsize, None, labels)
    nbytes = prod(c) * itemsize
    # Square power-of-two tiles come in factors of 4 of bytes: 4 MiB or 16 MiB for uint8.
    assert TARGET_BYTES // 4 <= nbytes <= TARGET_BYTES, (c, nbytes / MiB)
    ys, xs = spatial_axes(len(shape), labels)
    assert c[ys] == c[xs]  # square tiles on square planes


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "float32"])
def test_coalesce_whole_seeds(dtype):
    itemsize = np.dtype(dtype).itemsize
    seed = (1, 1, 1, 256, 256)
    c = transfer_chunk_shape((10, 3, 64, 8192, 8192), itemsize, seed, "tczyx")
    assert all(ci % si == 0 for ci, si in zip(c, seed)), c
    assert TARGET_BYTES // 2 < prod(c) * itemsize <= TARGET_BYTES


def test_coalesce_grows_other_axes_after_the_plane():
    c = transfer_chunk_shape((64, 512, 512), 1, (16, 128, 128), "zyx")
    assert c[1:] == (512, 512) and c[0] == 32  # 32*512*512 = 8 MiB
    assert prod(c) <= TARGET_BYTES


def test_coalesce_stops_at_tensor_extent():
    assert transfer_chunk_shape((100, 200), 2, (32, 32)) == (100, 200)


def test_divide_plane_axes_first_then_square_tiles():
    # one 4096² uint16 zarr chunk of 4 channels: 128 MiB -> split C, then Y/X together
    c = transfer_chunk_shape((4, 8192, 8192), 2, (4, 4096, 4096), "cyx")
    assert c == (1, 2048, 2048)
    c = transfer_chunk_shape((8192, 8192), 2, (8192, 8192))
    assert c == (2048, 2048)


def test_divide_keeps_rgb_samples_together():
    c = transfer_chunk_shape((20000, 20000, 3), 1, (20000, 20000, 3), "yxs")
    assert c[2] == 3 and prod(c) * 1 <= TARGET_BYTES


def test_wide_plane_shrinks_the_long_axis():
    c = transfer_chunk_shape((100, 100_000), 8, None)
    assert c[0] == 100 and prod(c) * 8 <= TARGET_BYTES


def test_ceiling_never_exceeded_even_with_a_big_target():
    c = transfer_chunk_shape((8192, 8192, 4), 4, None, "yxc", target_bytes=1 << 30)
    assert prod(c) * 4 <= CEILING_BYTES


def test_scaled_virtual_chunk_size_clamps():
    assert scaled_virtual_chunk_size((2048, 2048), (4, 4), (8192, 5000)) == (8192, 5000)
    assert scaled_virtual_chunk_size((1, 512), (1, 2), (3, 4096)) == (1, 1024)


@pytest.mark.parametrize(
    "transfer, blocks, spatial, tile",
    [
        ((2048, 4096), (512, 512), (0, 1), (512, 512)),  # a uint8 plane of 512² tiles: the larger axis first
        ((2048, 2048), (1024, 1024), (0, 1), (1024, 1024)),  # never splits a block
        ((2048, 2048), (4096, 4096), (0, 1), (2048, 2048)),  # within one block: a split would decode it again
        ((1, 2048, 2048), (1, 256, 256), (1, 2), (1, 512, 512)),  # other axes keep the transfer extent
        ((16, 1024, 1024), (16, 512, 512), (1, 2), (16, 512, 512)),
        ((512, 512), (256, 256), (0, 1), (512, 512)),  # already at the floor
        ((2048, 2048), (1, 1), (0, 1), (512, 512)),  # a reader that crops cheaply (memmap)
        ((300, 2000), (300, 500), (0, 1), (300, 1000)),  # 500 is under the floor
        ((1536, 1536), (512, 512), (0, 1), (1536, 1536)),  # 768 is not whole 512-px blocks
    ],
)
def test_tile_grid_halves_the_plane_down_to_whole_blocks(transfer, blocks, spatial, tile):
    got = tile_chunk_shape(transfer, blocks, spatial)
    assert got == tile
    for axis, (t, c) in enumerate(zip(got, transfer)):
        assert c % t == 0, "a tile grid chunk divides the transfer chunk"
        if axis in spatial and t != c:
            assert t >= TILE_MIN_PX
