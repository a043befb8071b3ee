"""What a client declares and sends for an upload, checked before anything is allocated.

``add_tensor`` takes a client's shape: in exact (Python) integers its element count, byte
size and number of chunks must each fit int64, or the tensor would be dead on arrival (every
reader computes them in int64). Its dtype, dim labels, metadata, lifetime and write grid are
checked here too, and a label set's shape against its image's, each refusal naming the
request and the reason. A DoPut's rows become one chunk's values only after the ticket named
the chunk, so the byte budget is that chunk's size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from tensor_server.core.adapter_base import TensorAdapter
from tensor_server.core.json_body import decode_json
from tensor_server.core.transfer_grid import CEILING_BYTES, transfer_chunk_shape
from tensor_server.errors import InvalidArgument
from tensor_server.uploads.names import UploadTarget

__all__ = [
    "MAX_RANK",
    "INT64_MAX",
    "checked_dim_labels",
    "checked_dtype",
    "checked_extent",
    "checked_metadata",
    "checked_ttl",
    "chunk_values",
    "label_set_dim_labels",
    "write_grid",
]

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


def checked_dtype(dtype: Any, request_id: str) -> np.dtype:
    """The numpy dtype a client named; it must be a little-endian numeric one."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise InvalidArgument(
            f"add_tensor {str(request_id)[:200]!r}: {str(dtype)[:40]!r} is not a numpy dtype"
        ) from None
    if dt.kind not in "biuf" or dt.byteorder == ">":
        raise InvalidArgument(f"add_tensor {request_id!r}: dtype {dt.str} is not a little-endian numeric dtype")
    return dt


def checked_dim_labels(dim_labels: Iterable[Any], ndim: int, request_id: str) -> tuple[str, ...]:
    """The dim labels a client named, lower-cased: none, or one per axis."""
    labels = tuple(str(d).lower() for d in dim_labels)
    if labels and len(labels) != ndim:
        raise InvalidArgument(f"add_tensor {request_id!r}: {len(labels)} dim_labels for a {ndim}-D tensor")
    return labels


def checked_metadata(target: UploadTarget, metadata_json: str, request_id: str) -> dict[str, Any]:
    """The attributes an upload's store carries besides its own: none, since metadata is the
    source's, except a label set's own 'image-label' block."""
    if not metadata_json:
        return {}
    doc = decode_json(metadata_json, f"add_tensor {request_id!r}: metadata_json")
    if target.is_label_set and isinstance(doc, dict) and set(doc) <= {"image-label"}:
        return doc
    raise InvalidArgument(
        f"add_tensor {request_id!r}: metadata is the source's, not a tensor's (an uploaded tensor has "
        "none; upload onto the source that carries the physical scale). The one exception is a label "
        "set's own 'image-label' block."
    )


def checked_ttl(ttl_seconds: int | None, request_id: str) -> None:
    """A lifetime asked for is positive; None asks for no deadline."""
    if ttl_seconds is not None and ttl_seconds <= 0:
        raise InvalidArgument(
            f"add_tensor {request_id!r}: ttl_seconds must be positive; leave it unset for no deadline"
        )


def label_set_dim_labels(image: TensorAdapter, shape: tuple[int, ...], request_id: str) -> tuple[str, ...]:
    """A label set covers its image's extent: the image's shape, or the image's shape without
    its channel axis. Returns the image's dim labels for that shape (what a set that names
    none takes)."""
    no_channel = tuple(n for n, d in zip(image.shape, image.dim_labels) if d != "c")
    if shape != image.shape and shape != no_channel:
        raise InvalidArgument(
            f"add_tensor {request_id!r}: a label set of {image.array_id} must have shape "
            f"{list(image.shape)} or {list(no_channel)}, not {list(shape)}"
        )
    return image.dim_labels if shape == image.shape else tuple(d for d in image.dim_labels if d != "c")


def write_grid(
    target: UploadTarget,
    shape: tuple[int, ...],
    chunk_shape: tuple[int, ...],
    dtype: np.dtype,
    dim_labels: tuple[str, ...],
    request_id: str,
) -> tuple[int, ...]:
    """The chunk grid an upload is written on: the declared chunk shape cut to the shape (for
    a zarr store, the transfer grid over it), at most one chunk's byte ceiling."""
    grid = tuple(min(c, n) for c, n in zip(chunk_shape, shape))
    if target.store_format == "zarr":
        grid = transfer_chunk_shape(shape, dtype.itemsize, grid, dim_labels or None)
    if int(np.prod(grid)) * dtype.itemsize > CEILING_BYTES:
        raise InvalidArgument(
            f"add_tensor {request_id!r}: chunk_shape {list(grid)} is above the 64 MiB "
            f"limit of one chunk; upload in smaller chunks"
        )
    return grid


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
