"""A zarr array that grows while it is open (adapters/_zarr_growth.py): the extent follows the
written frames in place, the content version stays, the live edge is never settled, and a
change that is not growth is a reason to reopen."""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr

from tensor_server.adapters.zarr import ZarrSource
from tensor_server.core.bounds import Bounds


def frame(i: int, n: int = 16) -> np.ndarray:
    return (np.arange(n * n, dtype=np.uint16).reshape(n, n) + 100 * (i + 1)).astype(np.uint16)


def growing(path, fmt: int, chunks=(1, 8, 8), shards=None, frames: int = 2):
    z = zarr.create_array(
        str(path), shape=(frames, 16, 16), chunks=chunks, shards=shards, dtype="uint16", zarr_format=fmt
    )
    for i in range(frames):
        z[i] = frame(i)
    return z


def metadata_file(path, fmt: int):
    return path / (".zarray" if fmt == 2 else "zarr.json")


@pytest.mark.parametrize(("fmt", "shards"), [(2, None), (3, None), (3, (1, 16, 16))], ids=["v2", "v3", "v3-sharded"])
def test_growth_is_published_in_place_once_the_frame_is_written(tmp_path, fmt, shards):
    z = growing(tmp_path / "a.zarr", fmt, shards=shards)
    t = ZarrSource(tmp_path / "a.zarr").tensor()
    version = t.content_version
    assert (t.shape, t.extents.sequence, t.refresh_extent()) == ((2, 16, 16), 0, None)
    z.resize((3, 16, 16))  # zarr-python resizes before it can write the frame
    assert t.refresh_extent() is None and t.shape == (2, 16, 16), "not published before it is written"
    z[2] = frame(2)
    assert t.refresh_extent() is None
    assert (t.shape, t.extents.sequence, t.content_version) == ((3, 16, 16), 1, version)
    np.testing.assert_array_equal(t.get_data(), np.stack([frame(i) for i in range(3)]))
    assert t.stale_reason(Bounds.full(t.shape), exact=True) is None
    assert t.settled(Bounds((0, 0, 0), (2, 16, 16))) and not t.settled(Bounds((2, 0, 0), (3, 16, 16)))
    assert t.describe()["sequence"] == 1
    assert t.extents.after(0, timeout=0) == [(1, (3, 16, 16))]


def test_a_chunk_written_before_the_reopen_check_is_growth_not_a_change(tmp_path):
    """The writer resizes and writes before any look: the next read's stale check finds the
    chunk file changed, looks at the metadata, and publishes instead of refusing."""
    z = growing(tmp_path / "a.zarr", 2, chunks=(2, 16, 16), frames=3)  # cell 1 holds frame 2 of 2
    t = ZarrSource(tmp_path / "a.zarr").tensor()
    z.resize((4, 16, 16))
    z[3] = frame(3)
    assert t.stale_reason(Bounds((2, 0, 0), (3, 16, 16))) is None
    assert t.shape == (4, 16, 16)
    np.testing.assert_array_equal(t.get_data()[3], frame(3))


def test_a_partial_cell_counts_once_rewritten_after_the_resize(tmp_path):
    z = growing(tmp_path / "a.zarr", 3, chunks=(2, 16, 16), frames=3)
    t = ZarrSource(tmp_path / "a.zarr").tensor()
    z.resize((4, 16, 16))
    cell = tmp_path / "a.zarr" / "c" / "1" / "0" / "0"
    meta = metadata_file(tmp_path / "a.zarr", 3)
    # the partial cell's file predates the resize (set explicitly: file times are coarse)
    os.utime(cell, ns=(meta.stat().st_mtime_ns - 10**6, meta.stat().st_mtime_ns - 10**6))
    assert t.refresh_extent() is None and t.shape == (3, 16, 16)
    z[3] = frame(3)
    assert t.refresh_extent() is None and t.shape == (4, 16, 16)
    np.testing.assert_array_equal(t.get_data()[2:], np.stack([frame(2), frame(3)]))


def test_new_chunks_are_listed_so_they_are_not_taken_for_the_fill_value(tmp_path):
    z = growing(tmp_path / "a.zarr", 3)
    t = ZarrSource(tmp_path / "a.zarr").tensor()
    assert t.uniform_blocks(Bounds.full(t.shape)) == []
    z.resize((3, 16, 16))
    z[2] = frame(2)
    t.refresh_extent()
    assert t.uniform_blocks(Bounds.full(t.shape)) == []


@pytest.mark.parametrize(
    ("rewrite", "reason"),
    [
        (
            lambda p: zarr.create_array(str(p), shape=(3, 16, 16), chunks=(1, 8, 8), dtype="uint8", overwrite=True),
            "dtype, chunks or codecs",
        ),
        (lambda p: zarr.open_array(str(p), mode="r+").resize((1, 16, 16)), "shrank"),
        (lambda p: zarr.open_array(str(p), mode="r+").resize((3, 16, 20)), None),
    ],
    ids=["dtype", "truncated", "grown-in-x"],
)
def test_a_change_that_is_not_growth_is_a_reason_to_reopen(tmp_path, rewrite, reason):
    z = growing(tmp_path / "a.zarr", 3)
    t = ZarrSource(tmp_path / "a.zarr").tensor()
    z.resize((3, 16, 16))
    z[2] = frame(2)
    assert t.refresh_extent() is None and t.shape[0] == 3
    rewrite(tmp_path / "a.zarr")
    why = t.refresh_extent()
    if reason is None:  # x grew after t did: another axis than the one growing
        assert why is not None and "another axis" in why
    else:
        assert why is not None and reason in why


def test_an_unchanged_document_is_not_reparsed_and_changes_nothing(tmp_path):
    growing(tmp_path / "a.zarr", 2)
    t = ZarrSource(tmp_path / "a.zarr").tensor()
    for _ in range(3):
        assert t.refresh_extent() is None
    assert (t.shape, t.extents.sequence) == ((2, 16, 16), 0)
    assert t.settled(Bounds.full(t.shape)), "an array never seen growing is settled"


def test_an_unchanged_document_is_answered_without_the_look_lock(tmp_path):
    """Every plan asks whether the array grew; the usual answer (its document is as it was
    when all of it was published) takes no lock, so concurrent plans do not queue on one. A
    document that changed still takes the lock: the look publishes growth once."""
    import threading

    from tensor_server.adapters import _zarr_array

    z = growing(tmp_path / "a.zarr", 3)
    t = ZarrSource(tmp_path / "a.zarr").tensor()
    assert t.refresh_extent() is None  # the first look reads the document, under the lock
    answers: list[object] = []
    with _zarr_array._LOOKING:  # another plan's look in progress
        asked = threading.Thread(target=lambda: answers.append(t.refresh_extent()))
        asked.start()
        asked.join(timeout=10)
        assert answers == [None], "an unchanged document waited for the look lock"
        z.resize((3, 16, 16))
        z[2] = frame(2)
        asked = threading.Thread(target=lambda: answers.append(t.refresh_extent()))
        asked.start()
        asked.join(timeout=0.5)
        assert asked.is_alive() and t.shape == (2, 16, 16), "a changed document is looked at under the lock"
    asked.join(timeout=10)
    assert answers == [None, None] and t.shape == (3, 16, 16)


def test_the_stored_levels_of_an_ome_zarr_image_grow_with_it(tmp_path):
    g = zarr.open_group(str(tmp_path / "img.ome.zarr"), mode="w", zarr_format=2)
    levels = [g.create_array(str(k), shape=(2, 16 >> k, 16 >> k), chunks=(1, 8, 8), dtype="uint16") for k in (0, 1)]
    for k, a in enumerate(levels):
        a[:] = np.stack([frame(i, 16)[:: 1 << k, :: 1 << k] for i in range(2)])
    axes = [{"name": "t", "type": "time"}, {"name": "y", "type": "space"}, {"name": "x", "type": "space"}]
    datasets = [
        {"path": str(k), "coordinateTransformations": [{"type": "scale", "scale": [1, 1 << k, 1 << k]}]} for k in (0, 1)
    ]
    g.attrs["multiscales"] = [{"version": "0.4", "axes": axes, "datasets": datasets}]
    t = ZarrSource(tmp_path / "img.ome.zarr", require_ome=True).tensor()
    for k, a in reversed(list(enumerate(levels))):  # a writer rewrites the levels one after the other
        a.resize((3, 16 >> k, 16 >> k))
        a[2] = frame(2, 16)[:: 1 << k, :: 1 << k]
    assert t.refresh_extent() is None
    level = t.native_levels[0].tensor
    assert (t.shape, level.shape, level.extents.sequence) == ((3, 16, 16), (3, 8, 8), 1)
    np.testing.assert_array_equal(level.get_data()[2], frame(2, 16)[::2, ::2])


def test_a_tensor_served_in_another_axis_order_grows_too(tmp_path):
    """A v3 array stored (y, x, t) is served (t, y, x) by a NormalizingAdapter over it."""
    z = zarr.create_array(
        str(tmp_path / "a.zarr"), shape=(16, 16, 2), chunks=(8, 8, 1), dtype="uint16", dimension_names=["y", "x", "t"]
    )
    for i in range(2):
        z[:, :, i] = frame(i)
    t = ZarrSource(tmp_path / "a.zarr").tensor()
    assert (type(t).__name__, t.shape) == ("NormalizingAdapter", (2, 16, 16))
    z.resize((16, 16, 3))
    z[:, :, 2] = frame(2)
    assert t.refresh_extent() is None and (t.shape, t.extents.sequence) == ((3, 16, 16), 1)
    np.testing.assert_array_equal(t.get_data()[2], frame(2))
    assert not t.settled(Bounds((2, 0, 0), (3, 16, 16))) and t.settled(Bounds((0, 0, 0), (2, 16, 16)))
