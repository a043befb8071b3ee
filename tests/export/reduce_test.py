"""The export's NumPy reductions give the oracle's bits (``tensor_server_kernels.reference``)
on the kernels' own case table, as a cascaded pyramid of the case's scale times 1, 2, 3, 4
(a non-nested level among them, ragged blocks at every level; times 1, 2 for big blocks);
the methods it leaves to the kernels say so."""

from __future__ import annotations

import numpy as np
import pytest
from tensor_server_kernels import cases
from tensor_server_kernels import reference as R

from tensor_server.export.reduce import SLAB_BYTES, numpy_handles, unit_levels

_GROUPS: dict[tuple, list[cases.Case]] = {}
for _c in cases.TEST_CASES:
    if numpy_handles(_c.method, np.dtype(_c.dtype)):
        _GROUPS.setdefault((_c.shape, _c.scale, _c.dtype), []).append(_c)


def _same(want: np.ndarray, got: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (
        f"{what}: {got.dtype}{got.shape} != {want.dtype}{want.shape}"
    )
    assert got.flags.c_contiguous, f"{what}: not C-contiguous"
    if want.dtype.kind == "f":  # signed zeros compare equal (the oracle leaves them unspecified)
        assert np.array_equal(want, got, equal_nan=True), what
    else:
        assert np.array_equal(want, got), what


@pytest.mark.parametrize("slab_bytes", [SLAB_BYTES, 1], ids=["whole", "slabs"])
@pytest.mark.parametrize(
    "key", list(_GROUPS), ids=lambda k: f"{'x'.join(map(str, k[0]))}-s{'x'.join(map(str, k[1]))}-{k[2]}"
)
def test_numpy_levels_match_the_oracle(key, slab_bytes):
    """Whole (the case tables' arrays are smaller than a slab) and in slabs of the least
    whole number of blocks (one byte asked for)."""
    for case in _GROUPS[key]:
        x = case.make(seed=hash(case.id) % 1000)
        before = x.copy()
        factors = (1, 2, 3, 4) if np.prod(case.scale) <= 16 else (1, 2)  # one strided view per block offset
        scales = [(1,) * x.ndim] + [tuple(s * k for s in case.scale) for k in factors]
        levels = unit_levels(x, scales, case.method, slab_bytes)
        assert levels[0] is x
        for scale, got in zip(scales[1:], levels[1:]):
            _same(R.downsample(x, scale, case.method), got, f"{case.id} at {scale}")
            assert not np.shares_memory(got, x), f"{case.id}: output aliases input"
        assert np.array_equal(x, before, equal_nan=x.dtype.kind == "f"), f"{case.id}: input modified"


def test_a_dyadic_volume_pyramid_cascades_to_the_oracle():
    x = cases.make_array("uint16", (9, 70, 45), "extremes", seed=3)
    scales = [(1, 1, 1), (1, 2, 2), (1, 4, 4), (2, 8, 8)]
    for method in ("area", "min", "max", "nearest"):
        for slab_bytes in (SLAB_BYTES, 1, 70 * 45 * 2 * 4):  # whole; slabs of 2 planes; of 4 (the last ragged)
            for scale, got in zip(scales[1:], unit_levels(x, scales, method, slab_bytes)[1:]):
                _same(R.downsample(x, scale, method), got, f"{method} {scale} in slabs of {slab_bytes} B")


def test_what_numpy_leaves_to_the_kernels():
    assert not numpy_handles("mode", np.dtype(np.uint16)) and not numpy_handles("median", np.dtype(np.float32))
    assert not numpy_handles("area", np.dtype(np.uint64)) and numpy_handles("area", np.dtype(np.uint32))
    x = cases.make_labels((20, 30), "uint32", seed=1)
    for slab_bytes in (SLAB_BYTES, 1):
        _same(R.downsample(x, (4, 4), "mode"), unit_levels(x, [(1, 1), (2, 2), (4, 4)], "mode", slab_bytes)[2], "mode")
    big = np.full((4, 4), 2**31 - 1, np.int32)  # an int32 area sum needs int64: still exact
    _same(R.downsample(big, (4, 4), "area"), unit_levels(big, [(1, 1), (4, 4)], "area")[1], "int32 area")
