from __future__ import annotations

import pytest

from tensor_server.core import Bounds
from tensor_server.errors import InvalidBounds


def test_from_slices_handles_none_negative_and_clamp():
    b = Bounds.from_slices((slice(None, 3), slice(-4, None), 2), (5, 10, 4))
    assert b == Bounds((0, 6, 2), (3, 10, 3))
    assert b.shape == (3, 4, 1)
    assert Bounds.from_slices((), (2, 3)) == Bounds.full((2, 3))
    assert Bounds.from_slices(slice(1, 99), (5, 6)).stop == (5, 6)


def test_from_slices_rejects_steps_and_too_many_axes():
    with pytest.raises(InvalidBounds, match="step"):
        Bounds.from_slices((slice(0, 4, 2),), (5,))
    with pytest.raises(InvalidBounds, match="3 slices"):
        Bounds.from_slices((slice(None),) * 3, (5, 5))
    with pytest.raises(InvalidBounds, match="out of range"):
        Bounds.from_slices((7,), (5,))


def test_from_chunk_bounds_protobuf():
    from biopb.tensor import ticket_pb2

    cb = ticket_pb2.ChunkBounds(start=[1, 2], stop=[3, 4])
    assert Bounds.from_chunk_bounds(cb) == Bounds((1, 2), (3, 4))


@pytest.mark.parametrize(
    "start, stop, match",
    [
        ((0,), (1, 1), "axes"),
        ((-1, 0), (1, 1), "negative"),
        ((0, 0), (1, 9), "exceeds"),
        ((0, 2), (1, 2), "empty"),
        ((0, 3), (1, 2), "reversed"),
    ],
)
def test_validate_names_the_problem(start, stop, match):
    with pytest.raises(InvalidBounds, match=match):
        Bounds(start, stop).validate((4, 4)) if len(start) == len(stop) else Bounds(start, stop)


def test_validate_rank_mismatch():
    with pytest.raises(InvalidBounds, match="3 axes"):
        Bounds((0, 0, 0), (1, 1, 1)).validate((4, 4))


def test_arithmetic():
    a = Bounds((0, 0), (4, 4))
    assert a.intersect(Bounds((2, 3), (6, 6))) == Bounds((2, 3), (4, 4))
    assert a.intersect(Bounds((4, 0), (5, 1))) is None
    assert a.shift((1, 2)) == Bounds((1, 2), (5, 6))
    assert Bounds((3, 5), (4, 9)).relative_to((3, 4)) == Bounds((0, 1), (1, 5))
    assert Bounds((1, 2, 3), (4, 5, 6)).permute((2, 0, 1)) == Bounds((3, 1, 2), (6, 4, 5))
    assert a.size == 16 and a.to_slices() == (slice(0, 4), slice(0, 4))
    assert {a: 1}[Bounds([0, 0], [4, 4])] == 1  # hashable, list input normalised


def test_rejects_non_integers():
    with pytest.raises(InvalidBounds):
        Bounds((0.5,), (2,))
    with pytest.raises(InvalidBounds):
        Bounds((True,), (2,))


def test_with_axis_replaces_one_axis_only():
    box = Bounds((0, 10, 20), (60, 30, 50))
    assert box.with_axis(0, 4, 5) == Bounds((4, 10, 20), (5, 30, 50))
    assert box.with_axis(2, 0, 7) == Bounds((0, 10, 0), (60, 30, 7))
    assert box == Bounds((0, 10, 20), (60, 30, 50))  # the box itself is left as it was
