"""The engine's closed-form path on a reference adapter that reports its uniform grid blocks:
bit-identical to the oracle for every method, dtype and edge, and it skips the reads."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter
from tensor_server.core.bounds import Bounds
from tensor_server.core.engine import ReadEngine
from tensor_server.core.plan import plan_read
from tensor_server.core.uniform import constant_value, grid_uniform_blocks, reduced_constant, uniform_value

from .conftest import METHODS, ReadCounter, assert_bit_identical, oracle


class GridArray(ArrayAdapter):
    """An in-memory tensor whose "metadata" lists the blocks of ``block`` that hold one value
    (found once at construction, as a format would store them)."""

    reports_uniform_blocks = True

    def __init__(self, array: np.ndarray, block: tuple[int, ...], chunk: tuple[int, ...]) -> None:
        super().__init__(array, chunk_shape=chunk, read_block_shape=block)
        self.block = block
        self.values: dict[tuple[int, ...], np.generic] = {}
        grid = [range(-(-n // b)) for n, b in zip(array.shape, block)]
        for idx in itertools.product(*grid):
            sl = tuple(slice(i * b, (i + 1) * b) for i, b in zip(idx, block))
            part = array[sl]
            first = part.reshape(-1)[0]
            if part.tobytes() == np.full(part.shape, first, dtype=part.dtype).tobytes():
                self.values[idx] = first

    def uniform_blocks(self, bounds: Bounds):
        return grid_uniform_blocks(bounds, self.block, self.shape, self.values.get)


def sparse(shape, dtype, block, fill, seed=0, dense_blocks=2):
    """``fill`` everywhere but ``dense_blocks`` random blocks of noise."""
    rng = np.random.default_rng(seed)
    a = np.full(shape, fill, dtype=dtype)
    for _ in range(dense_blocks):
        start = [int(rng.integers(0, n // b)) * b for n, b in zip(shape, block)]  # on the grid
        sl = tuple(slice(s, s + b) for s, b in zip(start, block))
        if np.dtype(dtype).kind == "f":
            a[sl] = rng.normal(size=a[sl].shape).astype(dtype)
        else:
            a[sl] = rng.integers(0, 50, size=a[sl].shape).astype(dtype)
    return a


CASES = [
    (np.uint8, 0),
    (np.int16, -7),
    (np.uint16, 3),
    (np.float16, 0.0),
    (np.float32, 2.5),
    (np.float64, 0.1),
    (np.float64, np.nan),
    (np.bool_, True),
    (np.int64, -(2**62)),
]


@pytest.mark.parametrize("dtype,fill", CASES)
def test_scaled_reads_equal_oracle_for_every_method(dtype, fill) -> None:
    block = (4, 8, 8)
    t = GridArray(sparse((19, 37, 34), dtype, block, fill), block, (4, 16, 16))
    counted = ReadCounter(t)
    engine = ReadEngine(workers=1)
    for scale in ((1, 4, 4), (3, 5, 7), (4, 8, 8)):
        for method in METHODS:
            if np.dtype(dtype).kind == "b" and method == "mode":
                continue
            want = oracle(t, Bounds.full(t.shape), scale, method)
            counted.reset()
            got = engine.read(t, None, scale, method)
            assert_bit_identical(got, want)
            # units on the block grid read the two dense blocks' units; others read more
            limit = t.array.size // 4 if all(b % s == 0 for b, s in zip(block, scale)) else t.array.size
            assert counted.pixels < limit, (scale, method, counted.pixels)


def test_uniform_regions_are_never_read_and_unscaled_reads_are_full() -> None:
    block = (4, 8)
    a = np.zeros((16, 32), np.uint16)
    a[4:8, 8:16] = np.arange(32, dtype=np.uint16).reshape(4, 8)
    t = GridArray(a, block, (8, 16))
    counted = ReadCounter(t)
    engine = ReadEngine()
    got = engine.read(t, Bounds((8, 0), (16, 32)))
    assert counted.regions == [] and got.flags.owndata and got.flags.writeable
    assert np.array_equal(got, np.zeros((8, 32), np.uint16))
    assert uniform_value(t, Bounds((0, 0), (4, 32))) == 0
    assert uniform_value(t, Bounds((0, 0), (8, 32))) is None  # the dense block is inside
    # a scaled read over a mixed extent reads only the unit holding the dense block
    got = engine.read(t, None, (2, 2), "area")
    assert_bit_identical(got, oracle(t, Bounds.full(t.shape), (2, 2), "area"))
    assert all(r.intersect(Bounds((4, 8), (8, 16))) is not None for r in counted.regions)


def test_switched_off_and_dense_arrays_read_everything() -> None:
    block = (4, 8)
    a = np.zeros((16, 32), np.uint16)
    t = GridArray(a, block, (8, 16))
    counted = ReadCounter(t)
    ReadEngine(special_chunks=False).read(t, None, (2, 2), "max")
    assert counted.pixels == a.size
    dense = GridArray(np.arange(16 * 32, dtype=np.uint16).reshape(16, 32), block, (8, 16))
    counted = ReadCounter(dense)
    got = ReadEngine().read(dense, None, (2, 2), "area")
    assert counted.pixels == dense.array.size
    assert_bit_identical(got, oracle(dense, Bounds.full(dense.shape), (2, 2), "area"))


def test_chunks_of_uniform_extents_are_broadcast_values() -> None:
    block = (4, 8)
    a = np.full((16, 32), 9, np.int32)
    a[0:4, 0:8] = 1
    t = GridArray(a, block, (8, 16))
    engine = ReadEngine()
    plan = plan_read(t, None, (2, 2), "area")
    seen_constant = 0
    for pc in plan.chunks:
        cid, arr = engine.chunk(pc.chunk_id, t)
        want = oracle(t, cid.bounds, cid.scale, "area")
        assert_bit_identical(np.ascontiguousarray(arr), want)
        if constant_value(arr) is not None:
            seen_constant += 1
            assert not arr.flags.writeable and arr.strides == (0, 0)
    assert seen_constant == len(plan.chunks) - 1


def test_reduced_constant_is_the_kernels_answer() -> None:
    assert reduced_constant(np.float64(0.1), np.dtype("f8"), (3, 3), "area") == np.float64(sum([0.1] * 9) / 9)
    assert np.isnan(reduced_constant(np.float32(np.nan), np.dtype("f4"), (2, 2), "median"))
    assert reduced_constant(np.uint8(255), np.dtype("u1"), (7,), "area") == 255
