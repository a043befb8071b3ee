"""The export's default geometry follows the reader: a volume whose reader decodes whole
planes (a TIFF page) gets plane chunks, so a unit is one page and not sixteen; a reader of
smaller blocks (zarr chunks) keeps 16-deep volume chunks."""

from __future__ import annotations

import numpy as np

from tensor_server.adapters.memory import ArrayAdapter
from tensor_server.export.layout import plan_layout


def test_a_page_reader_gets_plane_chunks_and_one_page_units():
    vol = np.zeros((20, 2048, 2048), np.uint16)
    paged = plan_layout(ArrayAdapter(vol, "zyx", read_block_shape=(1, 2048, 2048)), levels=3)
    assert paged.unit == (1, 2048, 2048)
    assert paged.levels[0].chunk == (1, 256, 256) and paged.levels[0].shard == (1, 2048, 2048)
    chunked = plan_layout(ArrayAdapter(vol, "zyx", read_block_shape=(1, 512, 512)), levels=3)
    assert chunked.levels[0].chunk == (16, 256, 256) and chunked.unit[0] == 16
    assert chunked.unit_bytes() <= 42 << 20 and paged.unit_bytes() <= 11 << 20  # units and levels, MiB
