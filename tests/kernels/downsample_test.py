"""Downsampling kernels against the NumPy oracle, and the oracle against hand-computed values.

Comparison rule: integers and bools exactly; floats exactly too (0 ULP, NaN == NaN, and
-0.0 == +0.0 as IEEE equality says). Why exact for float area: the oracle *defines* the float64
summation order (block offsets in C order) and the kernel adds in that order, so any difference
would be a bug, not rounding. (Signed zeros are the documented exception: which zero min/max/
mode/median return where both occur is unspecified.)

Runs under ``NUMBA_DISABLE_JIT=1`` too (pure-Python kernels): arrays stay small, and the large
last-axis cases are trimmed when the JIT is off.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections import Counter
from fractions import Fraction

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tensor_server_kernels import cases
from tensor_server_kernels import downsample as K
from tensor_server_kernels import reference as R

JIT_OFF = bool(numba.config.DISABLE_JIT)
METHODS = R.METHODS


def assert_same(expected: np.ndarray, got: np.ndarray, what: str = "") -> None:
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != {expected.dtype}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    assert got.flags.c_contiguous, f"{what}: output not C-contiguous"
    nan = expected.dtype.kind in "fc"
    if not np.array_equal(expected, got, equal_nan=nan):
        bad = np.argwhere(~((expected == got) | (nan & (expected != expected) & (got != got))))
        i = tuple(bad[0])
        raise AssertionError(
            f"{what}: first mismatch at {i}: expected {expected[i]!r}, got {got[i]!r} ({len(bad)} mismatches)"
        )


# ---------------------------------------------------------------------------------------------
# The oracle itself, pinned by hand-computed values and by a brute-force definition
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mod", [R, K], ids=["oracle", "kernel"])
class TestPinnedValues:
    def test_area_rounds_half_to_even(self, mod):
        x = np.array([1, 2, 2, 3, 1, 2, 3, 3, 5, 6, 0, 0], dtype=np.int32)
        # blocks of 4: [1,2,2,3] = 2, [1,2,3,3] = 2.25 -> 2, [5,6,0,0] = 2.75 -> 3
        assert mod.downsample(x, (4,), "area").tolist() == [2, 2, 3]
        assert mod.downsample(np.array([1, 2, 3, 4], np.uint8), (2,), "area").tolist() == [2, 4]
        # 1.5 -> 2, 3.5 -> 4, -0.5 -> 0, -1.5 -> -2, -2.5 -> -2
        y = np.array([1, 2, 3, 4, 0, -1, -1, -2, -2, -3], np.int8)
        assert mod.downsample(y, (2,), "area").tolist() == [2, 4, 0, -2, -2]

    def test_area_ragged_block_is_edge_padded(self, mod):
        # [1, 2, 3] by 2: blocks [1, 2] and [3, (3)] -> 1.5 -> 2, 3
        assert mod.downsample(np.array([1, 2, 3], np.uint16), (2,), "area").tolist() == [2, 3]
        # 2-D: last row/col repeated
        x = np.array([[0, 10, 20], [30, 40, 50], [60, 70, 80]], np.uint8)
        # blocks: [[0,10],[30,40]]=20; [[20,20],[50,50]]=35; [[60,70],[60,70]]=65; [[80]*4]=80
        assert mod.downsample(x, (2, 2), "area").tolist() == [[20, 35], [65, 80]]

    def test_area_saturated_extremes_do_not_wrap(self, mod):
        for dt in ("uint8", "int8", "uint16", "int32", "uint64", "int64"):
            info = np.iinfo(dt)
            x = np.array([info.max] * 16 + [info.min] * 16, dtype=dt)
            assert mod.downsample(x, (16,), "area").tolist() == [info.max, info.min], dt
            # mean of max and min: (max + min) / 2 = -0.5 (signed) -> 0, or max/2 (unsigned)
            y = np.array([info.max, info.min], dtype=dt)
            expect = int(round(Fraction(int(info.max) + int(info.min), 2)))  # half to even
            assert mod.downsample(y, (2,), "area").tolist() == [expect], dt
        big = np.array([2**64 - 1, 2**64 - 2, 2**64 - 2, 2**64 - 3], np.uint64)
        assert mod.downsample(big, (4,), "area").tolist() == [2**64 - 2]
        odd = np.array([2**63 - 1, -(2**63), 2**63 - 1, 2**63 - 1], np.int64)
        # sum = 2**64 - 3, mean = 2**62 - 0.75 -> 2**62 - 1
        assert mod.downsample(odd, (4,), "area").tolist() == [2**62 - 1]

    def test_area_bool_majority_ties_false(self, mod):
        x = np.array([1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1], bool)
        assert mod.downsample(x, (4,), "area").tolist() == [False, True, False]
        assert mod.downsample(np.array([True, False]), (2,), "area").tolist() == [False]

    def test_area_float_nan_inf(self, mod):
        x = np.array([1.0, np.nan, 2.0, 4.0, np.inf, -np.inf, np.inf, 1.0], np.float32)
        out = mod.downsample(x, (2,), "area")
        assert np.isnan(out[0]) and out[1] == 3.0 and np.isnan(out[2]) and out[3] == np.inf
        assert out.dtype == np.float32

    def test_min_max_nan_propagates(self, mod):
        x = np.array([1.0, np.nan, 2.0, 4.0, np.nan, 0.5], np.float64)
        assert np.isnan(mod.downsample(x, (2,), "max")[0])
        assert np.isnan(mod.downsample(x, (2,), "min")[0])
        assert mod.downsample(x, (2,), "max")[1] == 4.0
        assert np.isnan(mod.downsample(x, (2,), "min")[2])
        b = np.array([True, False, False, False], bool)
        assert mod.downsample(b, (2,), "max").tolist() == [True, False]
        assert mod.downsample(b, (2,), "min").tolist() == [False, False]

    def test_mode_ties_to_smallest(self, mod):
        x = np.array([7, 3, 3, 7, 9, 1, 9, 1, 5, 5, 5, 0], np.uint32)
        assert mod.downsample(x, (4,), "mode").tolist() == [3, 1, 5]
        s = np.array([-1, 2, 2, -1, -5, 9, 9, -5], np.int16)
        assert mod.downsample(s, (4,), "mode").tolist() == [-1, -5]
        # more distinct values than the count-distinct list holds: the sort path
        many = np.array([9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 7, 3], np.int64)
        assert mod.downsample(many, (12,), "mode").tolist() == [3]
        assert mod.downsample(np.arange(16, dtype=np.uint8)[::-1].copy(), (16,), "mode").tolist() == [0]

    def test_mode_nan_is_one_value_sorting_last(self, mod):
        x = np.array([np.nan, np.nan, 1.0, 1.0, np.nan, np.nan, np.nan, 2.0], np.float32)
        out = mod.downsample(x, (4,), "mode")
        assert out[0] == 1.0 and np.isnan(out[1])

    def test_median_is_lower_median(self, mod):
        x = np.array([4, 1, 3, 2, 10, 20, 30, 40, 50, 60, 7, 7, 1, 9], np.uint8)
        # [1,2,3,4] -> 2 ; [10,20,30,40] -> 20 ; [50,60,7,7] sorted [7,7,50,60] -> 7 ;
        # ragged [1, 9, 9, 9] -> 9
        assert mod.downsample(x, (4,), "median").tolist() == [2, 20, 7, 9]
        assert mod.downsample(np.array([5, 1, 3], np.int8), (3,), "median").tolist() == [3]
        f = np.array([np.nan, 1.0, 2.0, np.nan, np.nan, np.nan, 1.0, 2.0], np.float64)
        out = mod.downsample(f, (4,), "median")  # sorted [1, 2, nan, nan] -> 2; [1, 2, nan, nan] -> 2
        assert out.tolist() == [2.0, 2.0]
        g = np.array([np.nan, np.nan, np.nan, 1.0], np.float64)
        assert np.isnan(mod.downsample(g, (4,), "median")[0])

    def test_bool_mode_median_are_majority_ties_false(self, mod):
        x = np.array([1, 0, 1, 0, 1, 1, 0, 1], bool)
        for m in ("mode", "median", "area"):
            assert mod.downsample(x, (4,), m).tolist() == [False, True], m

    def test_nearest_takes_first_element(self, mod):
        x = np.arange(35, dtype=np.int16).reshape(5, 7)
        assert mod.downsample(x, (2, 3), "nearest").tolist() == [[0, 3, 6], [14, 17, 20], [28, 31, 34]]
        c = np.arange(6, dtype=np.complex64) * (1 + 1j)
        assert mod.downsample(c, (4,), "nearest").tolist() == [0j, 4 + 4j]


def _brute(data: np.ndarray, scale: tuple[int, ...], method: str) -> np.ndarray:
    """Independent definition: Python loops, exact Fractions, padded block built by clamping."""
    oshape = R.output_shape(data.shape, scale)
    out = np.empty(oshape, dtype=data.dtype)
    for p in itertools.product(*(range(o) for o in oshape)):
        ranges = [range(pi * s, pi * s + s) for pi, s in zip(p, scale)]
        vals = [data[tuple(min(i, n - 1) for i, n in zip(idx, data.shape))] for idx in itertools.product(*ranges)]
        if method == "nearest":
            v = vals[0]
        elif method == "area":
            if data.dtype.kind == "b":
                v = 2 * sum(map(bool, vals)) > len(vals)
            else:
                v = round(Fraction(sum(int(x) for x in vals), len(vals)))  # half to even
        elif method == "min":
            v = min(vals)
        elif method == "max":
            v = max(vals)
        elif method == "mode":
            counts = Counter(vals)
            top = max(counts.values())
            v = min(k for k, c in counts.items() if c == top)
        else:
            v = sorted(vals)[(len(vals) - 1) // 2]
        out[p] = v
    return out


@pytest.mark.parametrize("dtype", ["uint8", "int16", "int64", "uint64", "bool"])
@pytest.mark.parametrize("geom", [((7, 5), (2, 3)), ((9,), (4,)), ((3, 4, 5), (2, 1, 3))])
def test_oracle_matches_brute_force(dtype, geom):
    shape, scale = geom
    for fill in ("random", "extremes", "ties", "labels"):
        if dtype == "bool" and fill in ("extremes", "labels"):
            continue
        x = cases.make_array(dtype, shape, fill, seed=3)
        for method in METHODS:
            assert_same(_brute(x, scale, method), R.downsample(x, scale, method), f"oracle {method} {dtype} {fill}")


# ---------------------------------------------------------------------------------------------
# Kernel == oracle over the shared case table
# ---------------------------------------------------------------------------------------------

_GROUPS: dict[tuple, list[cases.Case]] = {}
for _c in cases.TEST_CASES:
    _GROUPS.setdefault((_c.shape, _c.scale, _c.dtype), []).append(_c)


@pytest.mark.parametrize(
    "key", list(_GROUPS), ids=lambda k: f"{'x'.join(map(str, k[0]))}-s{'x'.join(map(str, k[1]))}-{k[2]}"
)
def test_kernel_matches_oracle(key):
    for case in _GROUPS[key]:
        x = case.make(seed=hash(case.id) % 1000)
        before = x.copy()
        got = K.downsample(x, case.scale, case.method)
        assert_same(R.downsample(x, case.scale, case.method), got, case.id)
        assert np.array_equal(x, before, equal_nan=x.dtype.kind == "f"), f"{case.id}: input modified"
        assert not np.shares_memory(got, x), f"{case.id}: output aliases input"


_WIDE = cases.WIDE_S2_CASES if not JIT_OFF else cases.WIDE_S2_CASES[:6]


@pytest.mark.parametrize("case", _WIDE, ids=lambda c: c.id)
def test_large_scales_match_oracle(case):
    x = case.make()
    assert_same(R.downsample(x, case.scale, case.method), K.downsample(x, case.scale, case.method), case.id)


# ---------------------------------------------------------------------------------------------
# Layouts, ownership, dtypes the kernels do not run natively
# ---------------------------------------------------------------------------------------------


def _layouts(x: np.ndarray) -> dict[str, np.ndarray]:
    big = np.zeros((x.shape[0] * 2,) + x.shape[1:], dtype=x.dtype)
    big[::2] = x
    ro = x.copy()
    ro.flags.writeable = False
    return {
        "F": np.asfortranarray(x),
        "strided": big[::2],
        "transposed": x.T.copy().T,
        "big-endian": x.astype(x.dtype.newbyteorder(">")),
        "read-only": ro,
    }


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int32", "float32", "float64", "bool", "int64"])
@pytest.mark.parametrize("method", METHODS)
def test_layouts_and_ownership(dtype, method):
    scale = (2, 3, 2)
    x = cases.make_array(dtype, (5, 7, 6), "nonfinite" if dtype.startswith("float") else "random", 1)
    expected = R.downsample(x, scale, method)
    for name, v in _layouts(x).items():
        before = v.copy()
        got = K.downsample(v, scale, method)
        assert_same(expected.astype(v.dtype), got, f"{method} {dtype} {name}")
        assert got.dtype == v.dtype
        assert not np.shares_memory(got, v), name
        assert np.array_equal(v, before, equal_nan=dtype.startswith("float")), name


def test_all_ones_scale_returns_a_copy():
    x = np.arange(12, dtype=np.uint16).reshape(3, 4)
    for mod in (R, K):
        for m in METHODS:
            out = mod.downsample(x, (1, 1), m)
            assert_same(x, out, m)
            assert not np.shares_memory(out, x)


def test_empty_axes():
    x = np.zeros((0, 5), np.uint8)
    for m in METHODS:
        assert K.downsample(x, (2, 2), m).shape == (0, 3)


@pytest.mark.parametrize("dtype", ["float16", "complex64"])
def test_other_dtypes_follow_oracle(dtype):
    x = (np.arange(40) % 7).astype(dtype).reshape(5, 8)
    methods = METHODS if dtype == "float16" else ("nearest", "mode")
    for m in methods:
        assert_same(R.downsample(x, (2, 3), m), K.downsample(x, (2, 3), m), f"{m} {dtype}")


@pytest.mark.parametrize("dtype", ["uint8", "int16", "float32", "uint64"])
@pytest.mark.parametrize(
    "shape, scale, words",
    [
        ((7, 2 * 9), (2, 2), True),  # rows of whole blocks: one word per block
        ((1, 4 * 5 + 3), (1, 4), True),  # one row: words, then the ragged block element-wise
        ((5, 2 * 9 + 1), (2, 2), False),  # odd width: rows off the word boundary, element-wise
    ],
)
def test_nearest_words_and_elements_follow_oracle(dtype, shape, scale, words):
    """Both plain nearest kernels, the word one and the element one, on the oracle's values
    (uint64 at scale 2 has no word: 16 bytes)."""
    x = cases.make_array(dtype, shape, "random", seed=3)
    u = x.view(f"u{x.dtype.itemsize}")
    reads_words = K._block_words(u.reshape(-1, shape[-1]), scale[-1]) is not None
    assert reads_words == (words and x.dtype.itemsize * scale[-1] <= 8)
    assert_same(R.downsample(x, scale, "nearest"), K.downsample(x, scale, "nearest"), f"{dtype} {shape}")


@pytest.mark.parametrize("dtype", ["uint8", "int16"])
@pytest.mark.parametrize("scale", [(4, 4), (8, 2), (16, 8)])
@pytest.mark.parametrize("method", ["area", "min", "max"])
def test_long_rows_four_at_a_time_follow_oracle(dtype, scale, method):
    """Rows of at least ``QUAD_MIN_ROW_BYTES`` are combined four block rows a pass (twice over
    for 8 and 16 rows); a ragged last block of rows and of columns included."""
    from tensor_server_kernels.plain import QUAD_MIN_ROW_BYTES

    width = QUAD_MIN_ROW_BYTES // np.dtype(dtype).itemsize + 4  # even: the word kernels
    x = cases.make_array(dtype, (2 * scale[0] + 3, width), "random", seed=7)
    assert_same(R.downsample(x, scale, method), K.downsample(x, scale, method), f"{method} {dtype} {scale}")


def test_float16_area_in_bands_follows_oracle():
    """Output rows over ~1 MiB of float64 are rounded band by band (here one row a band)."""
    x = cases.make_array("float16", (6, 2**17 + 3), "nonfinite", seed=5)
    assert_same(R.downsample(x, (2, 2), "area"), K.downsample(x, (2, 2), "area"), "float16 area in bands")


# ---------------------------------------------------------------------------------------------
# Argument errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mod", [R, K], ids=["oracle", "kernel"])
@pytest.mark.parametrize(
    "data, scale, method, word",
    [
        (np.zeros((4, 4)), (2, 2), "bogus", "method"),
        (np.zeros((4, 4)), (2, 2), "mean", "method"),  # aliases are resolved elsewhere
        (np.zeros((4, 4)), (2,), "area", "scale_hint"),
        (np.zeros((4, 4)), (2, 2, 2), "area", "scale_hint"),
        (np.zeros((4, 4)), (2, 0), "area", "scale_hint"),
        (np.zeros((4, 4)), (-1, 2), "area", "scale_hint"),
        (np.zeros((4, 4)), (2, 1.5), "area", "scale_hint"),
        (np.zeros((4, 4)), (True, 2), "area", "scale_hint"),
        (np.zeros((4, 4)), 2, "area", "scale_hint"),
        (np.zeros(()), (), "area", "data"),
        (np.zeros((1,) * 7), (1,) * 7, "area", "data"),
        (np.zeros((4, 4), np.complex64), (2, 2), "area", "dtype"),
        (np.zeros((4, 4), np.complex128), (2, 2), "min", "dtype"),
        (np.zeros((4, 4), np.complex128), (2, 2), "max", "dtype"),
        (np.zeros((4, 4), np.complex128), (2, 2), "median", "dtype"),
        (np.zeros((4, 4), object), (2, 2), "mode", "dtype"),
    ],
)
def test_invalid_arguments(mod, data, scale, method, word):
    with pytest.raises(ValueError, match=word):
        mod.downsample(data, scale, method)


def test_numpy_integer_scales_accepted():
    x = np.arange(16, dtype=np.uint8).reshape(4, 4)
    assert K.downsample(x, np.array([2, 2]), "area").shape == (2, 2)
    assert K.downsample(x, [np.int64(2), np.uint8(4)], "max").shape == (2, 1)


# ---------------------------------------------------------------------------------------------
# The area gate and the accumulator plan
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, scale, expected", cases.GATE_CASES)
def test_area_gate_routes_by_block_size(dtype, scale, expected, monkeypatch):
    assert K.area_path(dtype, scale) == expected
    block = int(np.prod(scale))
    gate = "strided-add" if block <= K._STRIDED_ADD_MAX_BLOCK else "reshape-sum"
    if expected in ("strided-add", "reshape-sum"):
        assert expected == gate
    # and the kernel that runs is the one named
    called: list[str] = []
    real, real_plain = K._kernel, K._plain

    def spy(name, dt, s2):
        kernel = real(name, dt, s2)
        return lambda *a: (called.append(name), kernel(*a))[1]

    def spy_plain(name, *key):
        kernel = real_plain(name, *key)
        return lambda *a: (called.append(f"{name}_plain"), kernel(*a))[1]

    monkeypatch.setattr(K, "_kernel", spy)
    monkeypatch.setattr(K, "_plain", spy_plain)
    kernels = {
        "strided-add": "area_strided",
        "reshape-sum": "area_reshape",
        "generic": "area_reshape",
        "float": "area_float",
        "plain": "area_plain",
    }
    # ragged on every axis; the plain kernel needs rows of even width, else the gate decides
    widths = [(2 * scale[-1] if block <= 4096 else scale[-1]) + 2] if expected == "plain" else []
    widths.append(2 * scale[-1] + 1 if block <= 4096 else scale[-1] + 1)
    for width in widths:
        called.clear()
        shape = tuple(2 * s + 1 if block <= 4096 else s + 1 for s in scale[:-1]) + (width,)
        x = cases.make_array(dtype, shape, "random", 0)
        assert_same(R.downsample(x, scale, "area"), K.downsample(x, scale, "area"), f"{scale} {shape}")
        name = kernels.get(gate if expected == "plain" and width % 2 else expected)
        assert called == ([name] if name else []), shape


def _scale_for_block(block: int, ndim: int) -> tuple[int, ...]:
    """A power-of-two scale tuple of ``ndim`` axes whose product is ``block`` (last axes larger)."""
    k = block.bit_length() - 1
    parts = [k // ndim] * ndim
    for i in range(k % ndim):
        parts[-1 - i] += 1
    return tuple(2**p for p in parts)


CROSSOVER_BLOCKS = sorted(
    {
        max(4, K._STRIDED_ADD_MAX_BLOCK // 4),
        K._STRIDED_ADD_MAX_BLOCK // 2,
        K._STRIDED_ADD_MAX_BLOCK,
        2 * K._STRIDED_ADD_MAX_BLOCK,
        4 * K._STRIDED_ADD_MAX_BLOCK,
    }
)


@pytest.mark.parametrize("block", CROSSOVER_BLOCKS)
@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int16"])
@pytest.mark.parametrize("ndim", [2, 3])
def test_both_area_kernels_equal_the_oracle_around_the_crossover(block, dtype, ndim, monkeypatch):
    """Either side of ``_STRIDED_ADD_MAX_BLOCK`` the gate may move (it is a measured value), so
    both kernels must be exact for the blocks near it: each is forced in turn, on ragged inputs
    and on all-maximum inputs (the accumulator bound)."""
    from tensor_server_kernels import plan

    monkeypatch.setattr(plan, "_PLAIN_S2", ())  # these are the general kernels' tests
    scale = _scale_for_block(block, ndim)
    assert int(np.prod(scale)) == block
    shape = tuple(s + 1 + (s > 1) for s in scale)  # one full block and a ragged edge block per axis
    natural = K.area_path(dtype, scale)
    assert natural == ("strided-add" if block <= K._STRIDED_ADD_MAX_BLOCK else "reshape-sum")
    for forced, bound in (("strided-add", 2**62), ("reshape-sum", 0)):
        monkeypatch.setattr(plan, "_STRIDED_ADD_MAX_BLOCK", bound)
        assert K.area_path(dtype, scale) == forced
        for fill in ("random", "max", "extremes"):
            x = cases.make_array(dtype, shape, fill, block)
            assert_same(R.downsample(x, scale, "area"), K.downsample(x, scale, "area"), f"{forced} {scale} {fill}")


@pytest.mark.parametrize(
    "dtype, block, acc",
    [
        ("uint8", 4, "uint16"),
        ("uint8", 257, "uint16"),
        ("uint8", 258, "uint32"),
        ("bool", 257, "uint16"),
        # signed data is summed sign-flipped as unsigned: the unsigned bound applies
        ("int8", 257, "uint16"),
        ("int8", 258, "uint32"),
        ("uint16", 65537, "uint32"),
        ("uint16", 65538, "int64"),
        ("int16", 65537, "uint32"),
        ("int16", 65538, "int64"),
        ("uint32", 2, "int64"),
        ("int32", 2**31, "int64"),
        ("int32", 2**31 + 2, None),
        ("uint64", 2, None),
        ("int64", 2, None),
    ],
)
def test_plan_integer_area_sizes_the_accumulator(dtype, block, acc):
    plan = K._plan_integer_area(np.dtype(dtype), block)
    assert (plan.name if plan is not None else None) == acc
    if plan is not None:  # the bound really fits
        bits = 8 * np.dtype(dtype).itemsize
        assert block * (2**bits - 1) <= int(np.iinfo(plan).max)


# ---------------------------------------------------------------------------------------------
# Property test
# ---------------------------------------------------------------------------------------------


@st.composite
def _problems(draw):
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim)))
    scale = tuple(draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim)))
    dtype = draw(st.sampled_from(cases.DTYPES))
    fill = draw(st.sampled_from(cases.fills_for(dtype)))
    method = draw(st.sampled_from(METHODS))
    seed = draw(st.integers(0, 2**16))
    order = draw(st.sampled_from(["C", "F"]))
    return shape, scale, dtype, fill, method, seed, order


@settings(max_examples=200, deadline=None)
@given(_problems())
def test_property_kernel_equals_oracle(problem):
    shape, scale, dtype, fill, method, seed, order = problem
    x = cases.make_array(dtype, shape, fill, seed, scale)
    if order == "F":
        x = np.asfortranarray(x)
    before = x.copy()
    got = K.downsample(x, scale, method)
    assert_same(R.downsample(x, scale, method), got, str(problem))
    assert not np.shares_memory(got, x)
    assert np.array_equal(x, before, equal_nan=x.dtype.kind == "f")


# ---------------------------------------------------------------------------------------------
# The server entry point
# ---------------------------------------------------------------------------------------------


def test_downsample_block_dispatches_and_raises_invalid_argument():
    from tensor_server.core import downsample as core
    from tensor_server.core.methods import CANONICAL_METHODS
    from tensor_server.errors import InvalidArgument

    assert CANONICAL_METHODS == ("nearest", "area", "min", "max", "mode", "median")
    x = cases.make_array("uint16", (9, 10), "random", 2)
    for m in CANONICAL_METHODS:
        assert_same(R.downsample(x, (2, 4), m), core.downsample_block(x, (2, 4), m), m)
    with pytest.raises(InvalidArgument, match="method"):
        core.downsample_block(x, (2, 2), "stride")
    with pytest.raises(InvalidArgument, match="scale_hint"):
        core.downsample_block(x, (2, 0), "area")
    with pytest.raises(InvalidArgument, match="dtype"):
        core.downsample_block(x.astype(np.complex64), (2, 2), "max")


def test_importing_core_downsample_does_not_import_numba():
    code = (
        "import sys, tensor_server.core.downsample, tensor_server_kernels.reference, "
        "tensor_server_kernels.cases; assert 'numba' not in sys.modules, 'numba imported'"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_DISABLE_JIT"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_warm_up_reports_elapsed_seconds():
    from tensor_server.core import downsample as core

    elapsed = core.warm_up()
    assert isinstance(elapsed, float) and elapsed >= 0.0


def test_concurrent_calls_agree():
    """Kernels release the GIL and share nothing but read-only inputs: threads must agree."""
    from concurrent.futures import ThreadPoolExecutor

    x = cases.make_array("uint16", (66, 70), "labels", 5)
    expected = {m: R.downsample(x, (2, 2), m) for m in METHODS}
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda m: (m, K.downsample(x, (2, 2), m)), list(METHODS) * 4))
    for m, out in got:
        assert_same(expected[m], out, m)
