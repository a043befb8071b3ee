"""The ``luxar_delta_v1`` zarr filter, so Luxar stores open without luxar installed.

Luxar's writer enables this filter on uint8/uint16 code arrays when it compresses better
(spatially ordered codes are smooth ramps). Its wire format, per chunk of ``rows x cols``
codes: for each column, the modular difference to the previous row's code (0 before the
first row) as a signed value, zigzag-mapped to unsigned, all of column 0 first, then
column 1, ...; values are ``bits`` (8 or 16) wide. A format-2 store records it as a
numcodecs filter ``{"id": "luxar_delta_v1", "cols", "bits"}``; a format-3 store as an
array-to-array codec ``{"name": "luxar_delta_v1", "configuration": {"cols", "bits"}}``.

Luxar registers its own implementation when imported (the same bytes): with numcodecs ours
is registered only when the name is unclaimed; zarr is configured to pick ours. Encoding is
implemented too, so the round trip is testable without luxar.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CODEC_ID", "register_luxar_delta", "delta_decode_columns", "delta_encode_columns"]

CODEC_ID = "luxar_delta_v1"
_registered = False
_lock = threading.Lock()


def _check(cols: Any, bits: Any) -> tuple[int, int]:
    if bits not in (8, 16):
        raise ValueError(f"{CODEC_ID}: bits must be 8 or 16, got {bits!r}")
    if not isinstance(cols, int) or cols < 1:
        raise ValueError(f"{CODEC_ID}: cols must be a positive integer, got {cols!r}")
    return int(cols), int(bits)


def _code_dtype(bits: int) -> np.dtype:
    return np.dtype(np.uint8 if bits == 8 else np.uint16)


def delta_decode_columns(residuals: np.ndarray, cols: int, bits: int) -> np.ndarray:
    """Flat wire residuals of one chunk -> its codes, flat in row-major order."""
    flat = np.asarray(residuals).reshape(-1)
    if flat.size % cols:
        raise ValueError(f"{CODEC_ID}: a chunk of {flat.size} codes does not hold whole rows of {cols}")
    z = flat.reshape(cols, flat.size // cols).astype(np.int64)
    signed = (z >> 1) ^ -(z & 1)  # un-zigzag
    codes = np.cumsum(signed, axis=1) & ((1 << bits) - 1)  # running sum, modulo 2**bits
    return codes.T.astype(_code_dtype(bits)).reshape(-1)


def delta_encode_columns(codes: np.ndarray, cols: int, bits: int) -> np.ndarray:
    """Flat row-major codes of one chunk -> its wire residuals (flat, column after column)."""
    flat = np.asarray(codes).reshape(-1)
    if flat.size % cols:
        raise ValueError(f"{CODEC_ID}: a chunk of {flat.size} codes does not hold whole rows of {cols}")
    by_col = flat.reshape(-1, cols).T.astype(np.int64)
    m = 1 << bits
    diff = np.diff(by_col, axis=1, prepend=0) % m
    signed = np.where(diff >= m // 2, diff - m, diff)
    zz = (signed << 1) ^ (signed >> 63)
    return np.ascontiguousarray(zz.astype(_code_dtype(bits))).reshape(-1)


def register_luxar_delta() -> None:
    """Register the filter with numcodecs (format 2) and zarr (format 3) unless an
    implementation (luxar's) is already registered. Idempotent and thread-safe."""
    global _registered
    with _lock:
        if _registered:
            return
        _register_numcodecs()
        _register_zarr()
        _registered = True


def _register_numcodecs() -> None:
    from numcodecs.abc import Codec
    from numcodecs.compat import ensure_ndarray, ndarray_copy
    from numcodecs.registry import codec_registry, register_codec

    if CODEC_ID in codec_registry:
        return

    class LuxarDeltaFilter(Codec):
        """numcodecs spelling (format 2): handed the chunk's raw bytes."""

        codec_id = CODEC_ID

        def __init__(self, cols: int = 1, bits: int = 16) -> None:
            self.cols, self.bits = _check(cols, bits)

        def encode(self, buf: Any) -> np.ndarray:
            codes = np.ascontiguousarray(ensure_ndarray(buf)).reshape(-1).view(_code_dtype(self.bits))
            return delta_encode_columns(codes, self.cols, self.bits)

        def decode(self, buf: Any, out: Any = None) -> Any:
            raw = np.ascontiguousarray(ensure_ndarray(buf)).reshape(-1).view(_code_dtype(self.bits))
            codes = delta_decode_columns(raw, self.cols, self.bits)
            return ndarray_copy(codes, out) if out is not None else codes

        def get_config(self) -> dict[str, Any]:
            return {"id": CODEC_ID, "cols": self.cols, "bits": self.bits}

    LuxarDeltaFilter.__qualname__ = LuxarDeltaFilter.__name__
    register_codec(LuxarDeltaFilter)


def _register_zarr() -> None:
    """zarr keeps several implementations per name and picks the configured one: ours is
    registered and configured, so a store opens the same with or without luxar (asking
    zarr whether the name is claimed would import luxar through its entry point)."""
    import zarr
    from zarr.abc.codec import ArrayArrayCodec
    from zarr.core.common import parse_named_configuration
    from zarr.registry import register_codec

    @dataclass(frozen=True)
    class LuxarDeltaCodec(ArrayArrayCodec):
        """zarr spelling (format 3): handed the typed chunk; the shape is kept."""

        is_fixed_size = True
        cols: int = 1
        bits: int = 16

        def __post_init__(self) -> None:
            _check(self.cols, self.bits)

        @classmethod
        def from_dict(cls, data: dict[str, Any]) -> LuxarDeltaCodec:
            _, configuration = parse_named_configuration(data, CODEC_ID)
            return cls(**(configuration or {}))

        def to_dict(self) -> dict[str, Any]:
            return {"name": CODEC_ID, "configuration": {"cols": self.cols, "bits": self.bits}}

        async def _decode_single(self, chunk_array: Any, chunk_spec: Any) -> Any:
            arr = np.asarray(chunk_array.as_ndarray_like())
            codes = delta_decode_columns(arr, self.cols, self.bits).reshape(arr.shape)
            return chunk_spec.prototype.nd_buffer.from_ndarray_like(codes)

        async def _encode_single(self, chunk_array: Any, chunk_spec: Any) -> Any:
            arr = np.asarray(chunk_array.as_ndarray_like())
            wire = delta_encode_columns(arr, self.cols, self.bits).reshape(arr.shape)
            return chunk_spec.prototype.nd_buffer.from_ndarray_like(wire)

        def compute_encoded_size(self, input_byte_length: int, _chunk_spec: Any) -> int:
            return input_byte_length

    LuxarDeltaCodec.__qualname__ = LuxarDeltaCodec.__name__
    register_codec(CODEC_ID, LuxarDeltaCodec)
    zarr.config.set({f"codecs.{CODEC_ID}": f"{LuxarDeltaCodec.__module__}.{LuxarDeltaCodec.__name__}"})
