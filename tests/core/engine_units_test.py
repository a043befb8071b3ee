"""The unit a streamed reduction reads a ``reads_into`` reader by: its storage blocks stacked
along the outermost axis they split, so each block lies contiguous in the unit and decodes
straight into it; and the pixels equal the oracle whatever the unit."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from tensor_server_kernels import reference

import tensor_server
from tensor_server.core.bounds import Bounds
from tensor_server.core.engine import READ_INTO_UNIT_BYTES, ReadEngine, _stream_unit


@pytest.mark.parametrize(
    "shape, chunks, dtype, unit",
    [
        ((16384, 1024), (512, 512), "uint8", (READ_INTO_UNIT_BYTES // 512, 512)),  # 16 blocks of 256 KiB
        ((4096, 4096), (1024, 1024), "uint16", (2048, 1024)),  # 2 blocks of 2 MiB
        ((1, 4096, 4096), (1, 512, 512), "uint16", (1, 4096, 512)),  # one plane: stacked in y, to the edge
        ((4096, 4096), (2048, 2048), "uint16", (2048, 2048)),  # one block is already 8 MiB
    ],
)
def test_blocks_stack_on_the_outermost_split_axis(tmp_path, shape, chunks, dtype, unit):
    zarr.create_array(str(tmp_path / "a.zarr"), shape=shape, chunks=chunks, dtype=dtype, fill_value=1)
    t = tensor_server.open(tmp_path / "a.zarr").tensor()
    assert t.reads_into
    assert _stream_unit(t, (1,) * len(shape), has_uniform=False) == unit


def test_a_block_deeper_than_one_before_the_split_axis_is_not_stacked(tmp_path):
    """Blocks (2, 512, 512) of a (2, 4096, 4096) array: stacked in y they would not be
    contiguous, so the unit stays what it was (the transfer chunk, rounded to blocks)."""
    zarr.create_array(
        str(tmp_path / "a.zarr"), shape=(2, 4096, 4096), chunks=(2, 512, 512), dtype="uint8", fill_value=1
    )
    t = tensor_server.open(tmp_path / "a.zarr").tensor()
    unit = _stream_unit(t, (1, 1, 1), has_uniform=False)
    assert unit[0] == 2 and unit[2] != 512


@pytest.mark.parametrize("scale", [(2, 2), (4, 4), (3, 5), (16, 16)])
def test_stacked_units_read_the_oracle(tmp_path, scale):
    data = np.random.default_rng(3).integers(0, 60000, (1000, 700), dtype=np.uint16)  # ragged edges
    zarr.create_array(str(tmp_path / "a.zarr"), data=data, chunks=(128, 96))
    t = tensor_server.open(tmp_path / "a.zarr").tensor()
    b = Bounds((37, 11), (1000, 690))  # off-origin: units straddle blocks
    for method in ("area", "max", "mode"):
        got = ReadEngine().read(t, b, scale, method)
        np.testing.assert_array_equal(got, reference.downsample(data[37:, 11:690], scale, method))


def test_a_scale_that_cuts_the_blocks_keeps_the_old_unit(tmp_path):
    """Scale 3 on 512-wide blocks: a stacked unit rounded to whole reduction blocks (513 wide)
    would straddle every block column and decode each twice, so the unit is the one a
    ``reads_into`` reader had before stacking (the transfer chunk, rounded to scale)."""
    zarr.create_array(str(tmp_path / "a.zarr"), shape=(16384, 4096), chunks=(512, 512), dtype="uint8", fill_value=1)
    t = tensor_server.open(tmp_path / "a.zarr").tensor()
    assert _stream_unit(t, (1, 1), has_uniform=False) == (8192, 512)
    unit = _stream_unit(t, (3, 3), has_uniform=False)
    assert unit != (8193, 513) and all(u % 3 == 0 for u in unit) and unit[1] > 513
