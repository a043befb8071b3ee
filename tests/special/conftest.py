"""Helpers for the special-chunk tests: count the reads that reach a format's decoder, and
compare the engine's answers with the oracle computed from a full decode."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from tensor_server_kernels.reference import downsample

from tensor_server.core.adapter_base import TensorAdapter
from tensor_server.core.bounds import Bounds
from tensor_server.core.engine import ReadEngine
from tensor_server.core.methods import CANONICAL_METHODS
from tensor_server.core.normalizing import NormalizingAdapter

METHODS = CANONICAL_METHODS


class ReadCounter:
    """Wraps the innermost ``read_region`` (and ``read_region_into``) of a tensor and records
    every region it decodes."""

    def __init__(self, tensor: TensorAdapter) -> None:
        inner = tensor
        while isinstance(inner, NormalizingAdapter):
            inner = inner.inner
        self.inner = inner
        self.regions: list[Bounds] = []
        original = inner.read_region

        def counted(bounds: Bounds) -> np.ndarray:
            self.regions.append(bounds)
            return original(bounds)

        inner.read_region = counted  # type: ignore[method-assign]
        original_into = inner.read_region_into

        def counted_into(bounds: Bounds, out: np.ndarray) -> None:  # a reader that reads into a buffer
            self.regions.append(bounds)
            original_into(bounds, out)

        inner.read_region_into = counted_into  # type: ignore[method-assign]

    @property
    def pixels(self) -> int:
        return sum(b.size for b in self.regions)

    def reset(self) -> None:
        self.regions.clear()


@pytest.fixture
def counter() -> Iterator[Any]:
    yield ReadCounter


def oracle(tensor: TensorAdapter, bounds: Bounds, scale: tuple[int, ...], method: str) -> np.ndarray:
    """The contract's definition: the NumPy oracle over a full decode (special chunks off)."""
    data = ReadEngine(special_chunks=False).read(tensor, bounds)
    return downsample(data, scale, method) if any(s != 1 for s in scale) else data


def assert_bit_identical(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    assert got.tobytes() == want.tobytes() or np.array_equal(got, want, equal_nan=want.dtype.kind == "f")
