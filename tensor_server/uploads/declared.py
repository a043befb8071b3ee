"""What a client declares and sends for an upload, checked before anything is allocated.

``add_tensor`` takes a client's shape: in exact (Python) integers its element count, byte
size and number of chunks must each fit int64, or the tensor would be dead on arrival (every
reader computes them in int64). A DoPut's rows become one chunk's values only after the
ticket named the chunk, so the byte budget is that chunk's size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from tensor_server.errors import InvalidArgument

__all__ = ["MAX_RANK", "INT64_MAX", "checked_extent", "chunk_values"]

INT64_MAX = 2**63 - 1
#: numpy's own limit is 64; no imaging tensor has more than a handful of axes
MAX_RANK = 32


def checked_extent(
    shape: Sequence[Any], chunk_shape: Sequence[Any], itemsize: int, what: str
) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """``(shape, chunk_shape, nbytes)`` as exact ints; ``InvalidArgument`` naming ``what``
    when a rank, an extent, the element count, the byte size or the chunk count is out of
    range. An empty ``chunk_shape`` is the whole shape."""

    def ints(values: Sequence[Any], name: str) -> tuple[int, ...]:
        out = []
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= int(v) <= INT64_MAX:
                raise InvalidArgument(f"{what}: {name} must be positive integers below 2**63, got {str(v)[:40]}")
            out.append(int(v))
        return tuple(out)

    if not 1 <= len(shape) <= MAX_RANK:
        raise InvalidArgument(f"{what}: a tensor has 1 to {MAX_RANK} axes, not {len(shape)}")
    dims = ints(shape, "shape")
    grid = ints(chunk_shape, "chunk_shape") or dims
    if len(grid) != len(dims):
        raise InvalidArgument(f"{what}: chunk_shape {list(grid)} does not fit shape {list(dims)}")
    count = math.prod(dims)
    nbytes = count * itemsize
    chunks = math.prod(-(-n // min(c, n)) for n, c in zip(dims, grid))
    for name, value in (("element count", count), ("byte size", nbytes), ("chunk count", chunks)):
        if value > INT64_MAX:
            raise InvalidArgument(
                f"{what}: shape {list(dims)} has a {name} of {value:.3e}, beyond int64; no reader could address it"
            )
    return dims, grid, nbytes


def chunk_values(pieces: Iterable[Any]) -> np.ndarray:
    """One chunk's flat values from a DoPut's pieces: Arrow record batches (or tables) with
    one ``data`` column (bool arrives bit-packed and is unpacked with a copy), or numpy
    arrays. Nulls and non-numeric columns are refused."""
    import pyarrow as pa

    arrays: list[np.ndarray] = []
    for piece in pieces:
        if isinstance(piece, np.ndarray):
            arrays.append(piece.ravel())
            continue
        if "data" not in piece.schema.names:
            raise InvalidArgument(f"DoPut: the stream has no 'data' column (columns: {piece.schema.names[:10]})")
        col = piece.column("data")
        chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
        for arr in chunks:
            if arr.null_count:
                raise InvalidArgument("DoPut: the 'data' column holds nulls")
            try:
                arrays.append(arr.to_numpy(zero_copy_only=not pa.types.is_boolean(arr.type)))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError) as exc:
                raise InvalidArgument(
                    f"DoPut: the 'data' column of type {arr.type} is not a numeric array: {str(exc)[:200]}"
                ) from None
    if not arrays:
        raise InvalidArgument("DoPut: the stream carries no values")
    if any(a.dtype != arrays[0].dtype for a in arrays):
        raise InvalidArgument(
            f"DoPut: the pieces of one chunk have different dtypes ({sorted({a.dtype.str for a in arrays})})"
        )
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
