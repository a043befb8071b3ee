from __future__ import annotations

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.core import Bounds, NormalizingAdapter, normalize_axes, plan_read
from tensor_server.core.downsample import downsample_block
from tensor_server.core.normalizing import canonical_axis_order


@pytest.mark.parametrize(
    "labels, expected",
    [
        ("tczyx", "tczyx"),
        ("zcyx", "czyx"),
        ("xyz", "zyx"),
        ("ptzyx", "ptzyx"),
        ("yxs", "yxs"),
        ("czyxs", "czyxs"),
        ("qzyx", "qzyx"),
        ("xyc", "cyx"),
    ],
)
def test_canonical_order(labels, expected):
    order = canonical_axis_order(list(labels))
    assert "".join(labels[i] for i in order) == expected


def make():
    arr = np.random.default_rng(0).integers(0, 5000, (6, 3, 20, 30), dtype=np.uint16)  # z c y x
    inner = ArrayAdapter(arr, dim_labels="zcyx", chunk_shape=(2, 3, 8, 8), physical_scale=(2.0, None, 0.5, 0.25))
    wrapped = normalize_axes(inner)
    MemorySource(wrapped, source_id="norm")
    return arr, inner, wrapped


def test_metadata_permuted():
    arr, inner, w = make()
    assert isinstance(w, NormalizingAdapter)
    assert w.dim_labels == ("c", "z", "y", "x") and w.shape == (3, 6, 20, 30)
    assert w.chunk_shape == (3, 2, 8, 8) and w.physical_scale == (None, 2.0, 0.5, 0.25)
    assert w.array_id == inner.array_id == "norm" and w.content_version == inner.content_version


def test_reads_are_transposed_and_owned():
    arr, inner, w = make()
    canon = np.transpose(arr, (1, 0, 2, 3))
    b = Bounds((1, 2, 3, 4), (3, 5, 17, 29))
    got = w.get_data(b)
    np.testing.assert_array_equal(got, canon[b.to_slices()])
    assert got.flags.c_contiguous and got.flags.owndata
    for method in ["nearest", "area", "mode"]:
        s = w.get_scaled_data(b, (1, 3, 2, 5), method)
        np.testing.assert_array_equal(s, downsample_block(canon[b.to_slices()], (1, 3, 2, 5), method))
        assert s.flags.c_contiguous


def test_the_wrapper_reads_but_never_reduces_through_the_inner_tensor():
    """The served tensor reduces in its own order; the inner tensor is only read (its own
    chunk keys would name transposed pixels)."""
    arr, inner, w = make()
    seen = []
    orig = inner.get_data

    def spy(bounds=None):
        seen.append(bounds)
        return orig(bounds)

    inner.get_data = spy
    inner.get_scaled_data = None  # any scaled call on the inner tensor would fail
    out = w.get_scaled_data(Bounds.full(w.shape), (1, 2, 4, 4), "area")
    canon = np.transpose(arr, (1, 0, 2, 3))
    np.testing.assert_array_equal(out, downsample_block(canon, (1, 2, 4, 4), "area"))
    assert seen and all(b.ndim == 4 for b in seen)


def test_plans_through_the_wrapper_resolve():
    from tensor_server.core.engine import ReadEngine

    arr, inner, w = make()
    canon = np.transpose(arr, (1, 0, 2, 3))
    plan = plan_read(w, Bounds((0, 1, 0, 5), (3, 6, 20, 30)), (1, 2, 2, 2), "max")
    out = np.zeros(plan.shape, arr.dtype)
    for pc in plan.chunks:
        out[pc.out_bounds.to_slices()] = ReadEngine().chunk(pc.chunk_id.encode(), w)[1]
    np.testing.assert_array_equal(out, downsample_block(canon[plan.realized.to_slices()], (1, 2, 2, 2), "max"))


def test_identity_order_is_not_wrapped():
    t = ArrayAdapter(np.zeros((2, 3, 4), np.uint8), dim_labels="zyx")
    assert normalize_axes(t) is t
