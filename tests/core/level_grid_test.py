"""``core.level_grid``'s chunk ids: the id of a grid cell is minted once and kept
(``level_chunk_id``), and a tensor that changed (another content version) or grew (another
shape) gets ids of its own, never one kept for what it was."""

from __future__ import annotations

import numpy as np

from tensor_server.adapters.memory import ArrayAdapter
from tensor_server.core.bounds import Bounds
from tensor_server.core.chunk_id import UNSCALED, ChunkId
from tensor_server.core.level_grid import grid_levels, level_chunk_id


def _tensor(rows: int, version: bytes) -> ArrayAdapter:
    return ArrayAdapter(np.zeros((rows, 400), np.uint16), "yx", chunk_shape=(128, 128), content_version=version)


def test_a_cells_chunk_id_is_kept_for_its_tensor_version_and_shape():
    old = _tensor(300, b"v1")
    level = grid_levels(old, tiles=False)[0]
    first = level_chunk_id(old, level, (1, 2))
    assert first == ChunkId.for_extent(old.array_id, Bounds((128, 256), (256, 384)), (1, 1), UNSCALED, b"v1")
    assert level_chunk_id(old, level, (1, 2)) is first  # kept, bytes and all
    assert level_chunk_id(old, level, (3, 0)) is None and level_chunk_id(old, level, (0,)) is None  # off the grid

    changed = level_chunk_id(_tensor(300, b"v2"), level, (1, 2))
    assert changed is not None and changed.content_version == b"v2" and changed.bounds == first.bounds

    grown = _tensor(200, b"v1")  # the same version and grid, fewer rows: the last row of cells is cut
    assert level_chunk_id(grown, level, (1, 2)).bounds == Bounds((128, 256), (200, 384))
