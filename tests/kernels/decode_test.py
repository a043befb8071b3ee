"""Decode kernels (tensor_server_kernels.decode) against the spec's formulas written in NumPy,
over every code of a uint8 array and a sample of uint16 codes.

The spec (Luxar encoding v0.3, as its reference decoder evaluates it, in float64):
bounded ``min + u/L·(max−min)``; rgb ``u/L``; log ``expm1(u/L·max_log)``; geolog ``0`` at code 0
else ``exp(min_log + (u−1)/(L−1)·(max_log−min_log))``; per-channel the same per column with
``rng = max(hi − lo, 1e−30)``, a reserved zero code when ``zero_level``. Linear formulas are
compared exactly, exp/expm1 within 1 float32 ULP (libm vs NumPy). Runs under
``NUMBA_DISABLE_JIT=1`` too (``make test-nojit``): the pure-Python kernels must agree as well.
"""

from __future__ import annotations

import numpy as np
import pytest
from tensor_server_kernels import decode as K

CODES8 = np.arange(256, dtype=np.uint8)
CODES16 = np.unique(np.concatenate([np.arange(0, 65536, 97), [1, 2, 65534, 65535]])).astype(np.uint16)


def _compare(got, want, exact):
    if exact:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_array_max_ulp(got, want, maxulp=1)


@pytest.mark.parametrize("codes", [CODES8, CODES16], ids=["u8", "u16"])
@pytest.mark.parametrize(
    "kind,a,b,exact",
    [
        (K.SCALAR_BOUNDED, -2.5, 7.25, True),
        (K.SCALAR_BOUNDED, 3.0, 3.0, True),
        (K.SCALAR_RGB, 0.0, 0.0, True),
        (K.SCALAR_LOG, 0.0, 9.5, False),
        (K.SCALAR_GEOLOG, -7.0, 6.0, False),
    ],
)
def test_scalar_kernels_follow_the_spec(codes, kind, a, b, exact):
    L = int(np.iinfo(codes.dtype).max)
    u = codes.astype(np.float64)
    want = {
        K.SCALAR_BOUNDED: u / L * (b - a) + a,
        K.SCALAR_RGB: u / float(L),
        K.SCALAR_LOG: np.expm1(u / L * b),
        K.SCALAR_GEOLOG: np.where(codes == 0, 0.0, np.exp(a + (u - 1.0) / (L - 1) * (b - a))),
    }[kind].astype(np.float32)
    out = np.empty(codes.size, np.float32)
    K.decode_scalar(codes, out, kind, L, a, b)
    _compare(out, want, exact)
    if kind == K.SCALAR_GEOLOG:
        assert out[0] == 0.0 and np.all(out[1:] > 0)


@pytest.mark.parametrize("codes", [CODES8, CODES16], ids=["u8", "u16"])
@pytest.mark.parametrize(
    "kind,zero_level,exact",
    [
        (K.PERCHANNEL_LINEAR, False, True),
        (K.PERCHANNEL_LOG, True, False),
        (K.PERCHANNEL_LOG, False, False),
        (K.PERCHANNEL_SIGNED_LOG, True, False),
        (K.PERCHANNEL_SIGNED_LOG, False, False),
        (K.PERCHANNEL_GEOLOG, True, False),
    ],
)
def test_perchannel_kernels_follow_the_spec(codes, kind, zero_level, exact):
    L = int(np.iinfo(codes.dtype).max)
    lo = np.array([-3.0, 0.25, 2.0, 1.0])
    hi = np.array([2.0, 4.0, 2.0 + 1e-40, 1.0])  # a constant column: rng clamps at 1e-30
    grid = np.stack([codes, codes[::-1], codes, codes], axis=1)
    u = grid.astype(np.float64)
    rng = np.maximum(hi - lo, 1e-30)
    if kind == K.PERCHANNEL_LINEAR:
        want = lo + u / L * rng
    else:
        y = lo + (u - 1.0) / (L - 1) * rng if zero_level else lo + u / L * rng
        x = {
            K.PERCHANNEL_LOG: np.expm1(y),
            K.PERCHANNEL_SIGNED_LOG: np.sign(y) * np.expm1(np.abs(y)),
            K.PERCHANNEL_GEOLOG: np.exp(y),
        }[kind]
        want = np.where(grid == 0, 0.0, x) if zero_level else x
    out = np.empty(grid.shape, np.float32)
    K.decode_perchannel(grid, lo, hi, out, kind, L, zero_level)
    _compare(out, want.astype(np.float32), exact)


def test_lut_gather_rows_scalars_and_the_first_bad_index():
    idx = np.array([2, 0, 1, 2], np.uint8)
    lut = np.array([0.5, 1.5, 2.5], np.float32)
    out = np.empty(4, np.float32)
    assert K.lut_gather(idx, lut, out) == -1
    np.testing.assert_array_equal(out, [2.5, 0.5, 1.5, 2.5])
    rows = np.arange(9, dtype=np.float32).reshape(3, 3)
    out2 = np.empty((4, 3), np.float32)
    assert K.lut_gather(idx, rows, out2) == -1
    np.testing.assert_array_equal(out2, rows[idx])
    assert K.lut_gather(np.array([1, 7, 9], np.uint8), lut, np.empty(3, np.float32)) == 7
