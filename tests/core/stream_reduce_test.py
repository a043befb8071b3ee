"""Streamed reduction == whole-extent reduction (scaled-read-path.md §2, §8)."""

from __future__ import annotations

import threading
import time
import tracemalloc
import weakref

import numpy as np
import pytest

from tensor_server.core import Bounds
from tensor_server.core.downsample import downsample_block
from tensor_server.core.methods import CANONICAL_METHODS
from tensor_server.core.stream_reduce import iter_units, stream_reduce, streaming_unit
from tensor_server.testing.deadline import finishes_within

METHODS = CANONICAL_METHODS
DTYPES = ["uint8", "int16", "uint16", "float32", "float64", "bool"]


def _data(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) > 0.5
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    if info is not None:
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    a = (rng.standard_normal(shape) * 100).astype(dtype)
    a.flat[::97] = np.nan  # NaN must propagate identically through units
    return a


def _check(arr, bounds, unit, scale, method):
    calls = []

    def fetch(b):
        calls.append(b)
        return arr[b.to_slices()].copy()

    got = stream_reduce(bounds, unit, scale, method, fetch, arr.dtype)
    want = downsample_block(arr[bounds.to_slices()], scale, method)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == arr.dtype
    return calls


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_streamed_equals_whole_2d(method, dtype):
    if dtype == "bool" and method in ("median",):
        pass  # bool median is defined by the oracle too; keep it in the table
    arr = _data((61, 83), dtype)
    bounds = Bounds((3, 5), (61, 83))  # off-origin, ragged on both axes
    for scale in [(2, 2), (3, 5), (1, 7)]:
        unit = streaming_unit((8, 10), None, scale)
        calls = _check(arr, bounds, unit, scale, method)
        assert len(calls) > 1, "the test must actually stream"


@pytest.mark.parametrize("method", METHODS)
def test_streamed_equals_whole_3d_nondyadic(method):
    arr = _data((13, 29, 31), "uint16", seed=3)
    bounds = Bounds((1, 2, 0), (13, 29, 31))
    _check(arr, bounds, (6, 10, 9), (3, 5, 3), method)


def test_units_that_divide_the_extent_exactly():
    arr = _data((64, 64), "uint16")
    calls = _check(arr, Bounds((0, 0), (64, 64)), (16, 32), (4, 4), "area")
    assert len(calls) == 8 and all(c.shape in ((16, 32),) for c in calls)


def test_units_walk_row_major_and_tile_without_overlap():
    b = Bounds((2, 3), (11, 10))
    units = list(iter_units(b, (4, 3)))
    assert units[0] == Bounds((2, 3), (6, 6)) and units[1] == Bounds((2, 6), (6, 9))
    cover = np.zeros((11, 10), int)
    for u in units:
        cover[u.to_slices()] += 1
    assert cover[b.to_slices()].min() == 1 and cover.sum() == b.size


def test_unit_must_hold_whole_blocks():
    with pytest.raises(ValueError, match="whole number"):
        stream_reduce(Bounds((0,), (10,)), (3,), (2,), "area", lambda b: np.zeros(b.shape), np.uint8)


@pytest.mark.parametrize(
    "transfer, block, scale, expected",
    [
        ((512, 512), None, (4, 4), (512, 512)),
        ((512, 512), (1024, 256), (4, 4), (1024, 512)),  # floored at the read block
        ((500, 500), None, (3, 7), (501, 504)),  # rounded up to whole reduction blocks
        ((1, 256), (1, 4096), (1, 2), (1, 4096)),
    ],
)
def test_streaming_unit(transfer, block, scale, expected):
    assert streaming_unit(transfer, block, scale) == expected


def test_random_cases_property():
    rng = np.random.default_rng(7)
    for _ in range(60):
        ndim = int(rng.integers(1, 4))
        shape = tuple(int(n) for n in rng.integers(1, 20, ndim))
        arr = _data(shape, "int32", seed=int(rng.integers(1 << 30)))
        start = tuple(int(rng.integers(0, n)) for n in shape)
        bounds = Bounds(start, shape)
        scale = tuple(int(s) for s in rng.integers(1, 6, ndim))
        unit = tuple(int(s * rng.integers(1, 4)) for s in scale)
        for method in METHODS:
            _check(arr, bounds, unit, scale, method)


# ---- pipelining: read-ahead on the shared pool ---------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_workers_do_not_change_the_result(method):
    """1 worker (the serial loop) and N read-ahead workers give bit-identical pixels."""
    for dtype, shape, bounds, unit, scale in [
        ("uint16", (67, 90), Bounds((1, 2), (67, 90)), (8, 12), (2, 3)),
        ("float32", (13, 29, 31), Bounds((1, 2, 0), (13, 29, 31)), (6, 10, 9), (3, 5, 3)),
    ]:
        arr = _data(shape, dtype, seed=5)

        def fetch(b: Bounds, arr: np.ndarray = arr) -> np.ndarray:
            return arr[b.to_slices()].copy()

        serial = stream_reduce(bounds, unit, scale, method, fetch, arr.dtype, workers=1)
        np.testing.assert_array_equal(serial, downsample_block(arr[bounds.to_slices()], scale, method))
        for workers in (2, 3, 8):
            got = stream_reduce(bounds, unit, scale, method, fetch, arr.dtype, workers=workers)
            assert got.dtype == serial.dtype
            assert got.tobytes() == serial.tobytes(), f"workers={workers}"  # bit-identical, NaN too


def test_units_are_read_ahead_concurrently():
    """With 2 workers, unit 1 is read while unit 0 is still being read (unit 0 waits for it)."""
    arr = _data((16, 16), "uint16")
    second_started = threading.Event()

    def fetch(b):
        if b.start == (0, 4):
            second_started.set()
        if b.start == (0, 0):
            assert second_started.wait(10), "unit 1 was not read ahead"
        return arr[b.to_slices()].copy()

    got = finishes_within(
        lambda: stream_reduce(Bounds.full(arr.shape), (16, 4), (2, 2), "max", fetch, arr.dtype, workers=2)
    )
    np.testing.assert_array_equal(got, downsample_block(arr, (2, 2), "max"))


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_at_most_workers_plus_one_units_alive(workers):
    """Units alive at once (fetched and not yet released, counted by finalizers) never exceed
    workers + 1, whatever the thread timing."""
    arr = _data((64, 64), "uint8")
    lock, alive, most = threading.Lock(), [0], [0]

    def released():
        with lock:
            alive[0] -= 1

    def fetch(b):
        block = arr[b.to_slices()].copy()
        with lock:
            alive[0] += 1
            most[0] = max(most[0], alive[0])
        weakref.finalize(block, released)
        return block

    got = stream_reduce(Bounds.full(arr.shape), (4, 64), (2, 2), "area", fetch, arr.dtype, workers=workers)
    np.testing.assert_array_equal(got, downsample_block(arr, (2, 2), "area"))
    assert alive[0] == 0
    assert 1 <= most[0] <= workers + 1


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_peak_memory_is_output_plus_workers_plus_one_units(workers):
    """tracemalloc: a scaled read of an extent 32 units large, through a real reader's read
    path, allocates at most the output plus (workers + 1) units above baseline; reading the
    whole extent at once (what the bound forbids) exceeds it, so the check can fail."""
    from tensor_server.adapters.memory import ArrayAdapter
    from tensor_server.core.downsample import warm_up

    arr = np.random.default_rng(0).integers(0, 60000, (2048, 2048), dtype=np.uint16)
    tensor = ArrayAdapter(arr, chunk_shape=(256, 512))
    unit = (256, 512)
    unit_bytes = 256 * 512 * 2
    b = Bounds.full(arr.shape)
    warm_up()
    stream_reduce(Bounds((0, 0), (512, 512)), unit, (4, 4), "area", tensor.get_data, arr.dtype, workers=workers)
    out_bytes = (512 * 512) * 2
    bound = out_bytes + (workers + 1) * unit_bytes + (64 << 10)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        got = stream_reduce(b, unit, (4, 4), "area", tensor.get_data, arr.dtype, workers=workers)
        peak = tracemalloc.get_traced_memory()[1] - base
        del got
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        downsample_block(tensor.get_data(b), (4, 4), "area")
        whole = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak <= bound, f"peak {(peak - out_bytes) / unit_bytes:.2f} units above the output"
    assert whole > bound


def test_fetch_error_reaches_the_caller_and_stops_reading():
    arr = _data((40, 8), "uint16")
    fetched = []

    def fetch(b):
        fetched.append(b.start[0])
        if b.start[0] == 8:
            raise OSError("unit at row 8 is corrupt")
        return arr[b.to_slices()].copy()

    with pytest.raises(OSError, match="row 8 is corrupt"):
        stream_reduce(Bounds.full(arr.shape), (2, 8), (2, 2), "area", fetch, arr.dtype, workers=3)
    time.sleep(0.05)  # let a unit that was already running finish (it is not waited for)
    assert 8 in fetched and max(fetched) <= 8 + 2 * 3  # nothing read beyond the read-ahead


def test_many_concurrent_reads_with_nested_pool_use_finish_on_a_bounded_pool():
    """16 threads each stream a read whose fetch itself streams (uses the same pool): no
    deadlock although the reads far outnumber the pool's threads, every result is right, and
    the units run on at most the pool's fixed number of threads plus the callers."""
    from tensor_server.core import stream_reduce as sr

    arr = _data((64, 64), "uint16", seed=9)
    want = downsample_block(arr, (2, 2), "area")
    runners: set[str] = set()

    def inner_fetch(b):
        runners.add(threading.current_thread().name)
        return arr[b.to_slices()].copy()

    def fetch(b):  # the unit is itself read by a streamed (scale 1) read on the same pool
        runners.add(threading.current_thread().name)
        return stream_reduce(b, (2, b.shape[1]), (1, 1), "nearest", inner_fetch, arr.dtype, workers=4)

    def one_read():
        return stream_reduce(Bounds.full(arr.shape), (8, 64), (2, 2), "area", fetch, arr.dtype, workers=4)

    def all_reads():
        results: list = [None] * 16
        threads = [
            threading.Thread(target=lambda i=i: results.__setitem__(i, one_read()), name=f"client-{i}")
            for i in range(16)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results

    results = finishes_within(all_reads, 60)
    for r in results:
        np.testing.assert_array_equal(r, want)
    pool_threads = {n for n in runners if n.startswith("tensor-read")}
    assert len(pool_threads) <= sr._pool_size
    assert runners - pool_threads <= {f"client-{i}" for i in range(16)}


def test_workers_must_be_positive():
    with pytest.raises(ValueError, match="workers"):
        stream_reduce(Bounds((0,), (4,)), (2,), (2,), "area", lambda b: np.zeros(b.shape), np.uint8, workers=0)


def test_scratch_serves_buffers_of_two_sizes_and_reuses_them():
    """A slot holding a small and a large buffer serves the large one to a large request and
    the same memory again the next time. Two sizes in one slot is the ordinary case of a
    server reading arrays with different chunks; taking the large one out by ``list.remove``
    compared the arrays with ``==`` and failed ("operands could not be broadcast")."""
    from tensor_server.core.stream_reduce import SCRATCH_MIN, scratch

    small, large = (SCRATCH_MIN // 2,), (SCRATCH_MIN,)
    with scratch(small, np.uint16, "test-two-sizes") as a, scratch(large, np.uint16, "test-two-sizes") as b:
        first = b.__array_interface__["data"][0]
        assert a.nbytes == SCRATCH_MIN and b.nbytes == 2 * SCRATCH_MIN
    with scratch(large, np.uint16, "test-two-sizes") as c:
        assert c.shape == large and c.__array_interface__["data"][0] == first
    with scratch(small, np.uint16, "test-two-sizes") as d:
        assert d.shape == small


def test_trim_scratch_frees_the_buffers_no_read_asked_for_since_the_last_trim():
    """A large read keeps large buffers; once the reads since the last trim ask only for small
    ones, the trim frees the large ones (and a slot nobody used is emptied), so one client's
    large reduction does not hold its unit buffers for the life of the server."""
    from tensor_server.core.stream_reduce import SCRATCH_MIN, _free, scratch, trim_scratch

    slot = "test-trim"
    trim_scratch()  # forget what earlier tests asked for
    with scratch((8 * SCRATCH_MIN,), np.uint8, slot), scratch((SCRATCH_MIN,), np.uint8, slot):
        pass
    assert sorted(b.nbytes for b in _free[slot]) == [SCRATCH_MIN, 8 * SCRATCH_MIN]
    trim_scratch()  # both sizes were asked for since the last trim: both stay
    assert sorted(b.nbytes for b in _free[slot]) == [SCRATCH_MIN, 8 * SCRATCH_MIN]
    with scratch((SCRATCH_MIN,), np.uint8, slot) as small:
        assert small.nbytes == SCRATCH_MIN
    assert trim_scratch() >= 8 * SCRATCH_MIN and [b.nbytes for b in _free[slot]] == [SCRATCH_MIN]
    trim_scratch()
    assert _free[slot] == []
