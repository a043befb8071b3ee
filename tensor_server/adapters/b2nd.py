"""Blosc2 N-D arrays (``.b2nd`` files) through the ``blosc2`` package: one tensor per file.

Blosc2 marks chunks that hold one value in the chunk header (byte 31, bits 4-6): ZERO, NAN
and VALUE chunks (a VALUE chunk's value follows the 32-byte header) store no data at all.
``blosc2``'s ``iterchunks_info`` reads those headers without decompressing, so the tensor
reports them as uniform blocks and the read engine answers them in closed form. UNINIT
chunks (``blosc2.empty``) are not reported: they decode to whatever memory held, which only
a decode reproduces.

Reads go through ``NDArray.__getitem__`` under a lock per file (one handle, and blosc2's own
threads decompress a selection's chunks in parallel).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.adapters.registry import FormatEntry, register_format
from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.core.identity import file_content_version
from tensor_server.core.uniform import UniformBlock, grid_uniform_blocks
from tensor_server.errors import UnreadableSource

__all__ = ["B2ndAdapter", "B2ndSource"]

_MAGIC = b"b2frame"


class B2ndAdapter(TensorAdapter):
    """One blosc2 NDArray. Read block = the blosc2 chunk (the unit blosc2 decompresses)."""

    reports_uniform_blocks = True

    def __init__(self, path: Path, array: Any) -> None:
        self.path = path
        self._array = array
        self._lock = threading.Lock()
        self._specials: tuple[bytes, dict[int, np.generic]] | None = None
        chunks = tuple(int(c) for c in array.chunks)
        super().__init__(
            TensorInfo(
                array.shape,
                array.dtype,
                native_chunk_shape=chunks,
                content_version=file_content_version(path),
                metadata={
                    "chunks": list(chunks),
                    "blocks": [int(b) for b in array.blocks],
                    "cparams": str(getattr(array.schunk, "cparams", ""))[:200],
                },
            )
        )

    def read_region(self, bounds: Bounds) -> np.ndarray:
        try:
            with self._lock:
                return np.asarray(self._array[bounds.to_slices()])
        except Exception as exc:  # a corrupt chunk surfaces only here
            raise UnreadableSource(self.path, f"blosc2 region {bounds}: {type(exc).__name__}: {exc}") from exc

    def uniform_blocks(self, bounds: Bounds) -> list[UniformBlock]:
        specials = self._special_chunks()
        grid = [-(-n // c) for n, c in zip(self.shape, self.native_chunk_shape)]
        return grid_uniform_blocks(
            bounds,
            self.native_chunk_shape,
            self.shape,
            lambda idx: specials.get(int(np.ravel_multi_index(idx, grid))),
        )

    def _special_chunks(self) -> dict[int, np.generic]:
        """Chunk number -> value of every ZERO / NAN / VALUE chunk, from the chunk headers
        (one pass per content version; nothing is decompressed)."""
        cached = self._specials
        if cached is not None and cached[0] == self.content_version:
            return cached[1]
        import blosc2

        sv = blosc2.SpecialValue
        zero = np.zeros((), self.dtype)[()]
        nan = np.full((), np.nan, self.dtype)[()] if self.dtype.kind in "fc" else None
        out: dict[int, np.generic] = {}
        with self._lock:
            for info in self._array.schunk.iterchunks_info():
                if info.special == sv.ZERO:
                    out[info.nchunk] = zero
                elif info.special == sv.NAN and nan is not None:
                    out[info.nchunk] = nan
                elif info.special == sv.VALUE and info.repeated_value is not None:
                    raw = bytes(info.repeated_value)
                    if len(raw) == self.dtype.itemsize:
                        out[info.nchunk] = np.frombuffer(raw, dtype=self.dtype)[0]
        self._specials = (self.content_version, out)
        return out


class B2ndSource(SourceAdapter):
    """A ``.b2nd`` file: its NDArray is the one tensor."""

    format_name = "blosc2"

    def __init__(self, path: str | Path) -> None:
        import blosc2

        path = Path(path)
        try:
            array = blosc2.open(str(path), mode="r")
        except Exception as exc:
            raise UnreadableSource(path, f"not a readable blosc2 file: {type(exc).__name__}: {exc}") from None
        if not isinstance(array, blosc2.NDArray):
            raise UnreadableSource(path, f"a blosc2 {type(array).__name__}, not an NDArray")
        dt = np.dtype(array.dtype)
        if dt.fields is not None or dt.kind not in "biufc" or len(array.shape) == 0 or 0 in array.shape:
            raise UnreadableSource(path, f"no servable pixels (dtype {dt}, shape {array.shape})")
        super().__init__(path, {"data": B2ndAdapter(path, array)}, metadata={"format": "b2nd"})


register_format(
    FormatEntry(
        name="blosc2",
        opener=B2ndSource,
        sniff=lambda path, head: _MAGIC in head[:16],
        extensions=(".b2nd",),
        priority=60,
        description="Blosc2 N-D array (.b2nd)",
    )
)
