"""In-memory tensors (ArrayAdapter) and ``.npy`` files served through them.

ArrayAdapter is the reference implementation of the contract: tests build sources from
NumPy arrays with chosen transfer grids and read blocks, and the demo serves generated data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from tensor_server.adapters.registry import FormatEntry, register_format
from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.core.identity import file_content_version

__all__ = ["ArrayAdapter", "MemorySource", "NpySource"]


class ArrayAdapter(TensorAdapter):
    """A tensor over a NumPy array (or any array-like NumPy can slice, e.g. a memmap).

    ``chunk_shape`` sets the transfer grid directly (default: sized from a plane seed);
    ``read_block_shape`` declares a read granularity to exercise the streaming floor (default
    None: slicing memory crops for free). Reads copy, so the caller's array is never exposed.
    """

    def __init__(
        self,
        array: np.ndarray,
        dim_labels: Sequence[str] | None = None,
        chunk_shape: Sequence[int] | None = None,
        read_block_shape: Sequence[int] | None = None,
        *,
        is_labels: bool = False,
        physical_scale: Sequence[float] | None = None,
        physical_unit: Sequence[str] | None = None,
        content_version: bytes | None = None,
        metadata: Mapping[str, object] | None = None,
    ) -> None:
        self.array = array
        self._read_block = None if read_block_shape is None else tuple(int(b) for b in read_block_shape)
        super().__init__(
            TensorInfo(
                array.shape,
                array.dtype,
                dim_labels=dim_labels,
                physical_scale=physical_scale,
                physical_unit=physical_unit,
                is_labels=is_labels,
                content_version=content_version,
                metadata=metadata,
                transfer_chunk_shape=chunk_shape,
            )
        )
        self.reads = 0  # regions read, for tests that count source reads

    @property
    def read_block_shape(self) -> tuple[int, ...] | None:
        return self._read_block

    def read_region(self, bounds: Bounds) -> np.ndarray:
        self.reads += 1
        return self.array[bounds.to_slices()]


class MemorySource(SourceAdapter):
    """A source over arrays held in memory: one ndarray, or a mapping field → array/adapter."""

    format_name = "memory"

    def __init__(
        self,
        arrays: np.ndarray | TensorAdapter | Mapping[str, np.ndarray | TensorAdapter],
        *,
        source_id: str | None = None,
        metadata: Mapping[str, object] | None = None,
    ) -> None:
        if isinstance(arrays, (np.ndarray, TensorAdapter)):
            arrays = {"data": arrays}
        tensors = {
            name: a if isinstance(a, TensorAdapter) else ArrayAdapter(np.asarray(a)) for name, a in arrays.items()
        }
        super().__init__(None, tensors, source_id=source_id, metadata=metadata)


class NpySource(SourceAdapter):
    """A ``.npy`` file, memory-mapped (nothing is read until a region is asked for)."""

    format_name = "npy"

    def __init__(self, path: Path) -> None:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
        if array.dtype.hasobject or array.dtype.fields is not None or array.ndim == 0:
            from tensor_server.errors import UnreadableSource

            raise UnreadableSource(path, f"not a numeric N-D array (dtype {array.dtype}, {array.ndim}-D)")
        tensor = ArrayAdapter(array, content_version=file_content_version(path))
        super().__init__(path, {"data": tensor}, metadata={"npy_version": "1"})


register_format(
    FormatEntry(
        name="npy",
        opener=NpySource,
        sniff=lambda path, head: head.startswith(b"\x93NUMPY"),
        extensions=(".npy",),
        priority=90,
        description="NumPy .npy array (memory-mapped)",
    )
)
