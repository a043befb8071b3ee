from __future__ import annotations

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.core import Bounds, plan_read
from tensor_server.core.downsample import downsample_block
from tensor_server.core.engine import ReadEngine
from tensor_server.core.methods import effective_method, normalize_method
from tensor_server.errors import InvalidArgument, InvalidBounds


def assemble(tensor, plan):
    out = np.zeros(plan.shape, dtype=tensor.dtype)
    seen = np.zeros(plan.shape, dtype=int)
    for pc in plan.chunks:
        data = ReadEngine().chunk(pc.chunk_id.encode(), tensor)[1]
        assert data.shape == pc.out_bounds.shape
        out[pc.out_bounds.to_slices()] = data
        seen[pc.out_bounds.to_slices()] += 1
    assert seen.min() == 1 and seen.max() == 1, "chunks must tile the output exactly"
    return out


def test_worked_example_of_the_wire_spec():
    base = (np.arange(35, dtype=np.uint16) * 3 + 1).reshape(5, 7)
    t = ArrayAdapter(base, chunk_shape=(2, 2))
    MemorySource(t, source_id="demo")
    plan = plan_read(t, Bounds((1, 2), (5, 7)), (1, 2), "nearest")
    assert plan.realized == Bounds((0, 0), (5, 7))
    assert plan.shape == (5, 4)
    cols = sorted({(c.out_bounds.start[1], c.out_bounds.stop[1]) for c in plan.chunks})
    rows = sorted({(c.out_bounds.start[0], c.out_bounds.stop[0]) for c in plan.chunks})
    assert cols == [(0, 2), (2, 4)] and rows == [(0, 2), (2, 4), (4, 5)]
    out = assemble(t, plan)
    # the client's crop (wire §5.3): [(req.start - ret)//s, ceil((req.stop - ret)/s))
    crop = out[1:5, (2 - 0) // 2 : -(-(7 - 0) // 2)]
    np.testing.assert_array_equal(crop, base[1:5, 2:7:2])


@pytest.mark.parametrize("method", ["nearest", "area", "max", "mode"])
def test_random_plans_assemble_to_the_reduced_realized_region(method):
    rng = np.random.default_rng(11)
    for _ in range(25):
        ndim = int(rng.integers(1, 4))
        shape = tuple(int(n) for n in rng.integers(3, 40, ndim))
        arr = rng.integers(0, 1000, shape).astype(np.int32)
        chunk = tuple(int(rng.integers(1, n + 1)) for n in shape)
        t = ArrayAdapter(arr, chunk_shape=chunk)
        MemorySource(t)
        start = tuple(int(rng.integers(0, n)) for n in shape)
        stop = tuple(int(rng.integers(a + 1, n + 1)) for a, n in zip(start, shape))
        scale = tuple(int(s) for s in rng.integers(1, 5, ndim))
        plan = plan_read(t, Bounds(start, stop), scale, method)
        r = plan.realized
        assert all(a <= s0 for a, s0 in zip(r.start, start)) and all(b >= s1 for b, s1 in zip(r.stop, stop))
        assert all(a % (c * s) == 0 for a, c, s in zip(r.start, chunk, scale))
        out = assemble(t, plan)
        eff = method if any(s > 1 for s in scale) else "nearest"
        np.testing.assert_array_equal(out, downsample_block(arr[r.to_slices()], scale, eff))


def test_stop_clamped_but_bad_regions_refused():
    t = ArrayAdapter(np.zeros((10, 10), np.uint8), chunk_shape=(4, 4))
    MemorySource(t)
    assert plan_read(t, Bounds((0, 0), (99, 10))).realized == Bounds((0, 0), (10, 10))
    with pytest.raises(InvalidBounds, match="negative"):
        plan_read(t, Bounds((-1, 0), (4, 4)))
    with pytest.raises(InvalidBounds, match="empty"):
        plan_read(t, Bounds((4, 0), (4, 4)))
    with pytest.raises(InvalidBounds, match="axes"):
        plan_read(t, Bounds((0,), (4,)))
    with pytest.raises(InvalidArgument, match="positive"):
        plan_read(t, None, (0, 2))
    with pytest.raises(InvalidArgument, match="unknown reduction"):
        plan_read(t, None, (2, 2), "bicubic")


def test_chunk_ids_distinguish_methods_and_scales():
    t = ArrayAdapter(np.zeros((64, 64), np.uint8), chunk_shape=(16, 16))
    MemorySource(t)
    ids = set()
    for scale in [(2, 2), (4, 4)]:
        for method in ["nearest", "area", "mean"]:
            ids.add(plan_read(t, None, scale, method).chunks[0].chunk_id.encode())
    assert len(ids) == 4  # mean == area: same effective method, same id


def test_label_tensors_never_get_area_or_median():
    labels = np.array([[3, 3, 5, 5], [5, 5, 5, 5]], dtype=np.uint32)
    t = ArrayAdapter(labels, chunk_shape=(2, 4), is_labels=True)
    MemorySource(t)
    for requested in ["area", "mean", "median", ""]:
        plan = plan_read(t, None, (2, 2), requested)
        assert plan.method == "mode"
        out = assemble(t, plan)
        np.testing.assert_array_equal(out, [[3, 5]])  # never the invented label 4
    assert plan_read(t, None, (2, 2), "nearest").method == "nearest"
    assert effective_method("max", is_labels=True) == "max"


def test_method_vocabulary():
    assert normalize_method(" Stride ") == "nearest"
    assert normalize_method("decimate") == "nearest"
    assert normalize_method("LINEAR") == "area"
    assert normalize_method("") == "area"
    assert normalize_method("precomputed") == "precompute"
    with pytest.raises(InvalidArgument):
        normalize_method("bilinear")


def test_plan_chunk_count_and_shapes_for_a_big_scaled_read():
    t = ArrayAdapter(np.zeros((1, 8192, 8192), np.uint16), dim_labels="zyx")
    MemorySource(t)
    assert t.chunk_shape == (1, 2048, 2048)
    plan = plan_read(t, None, (1, 16, 16), "area")
    assert plan.shape == (1, 512, 512) and len(plan.chunks) == 1
    assert plan.chunks[0].chunk_id.bounds == Bounds.full((1, 8192, 8192))


def test_precompute_plans_on_the_stored_level_grid():
    from tensor_server.core.adapter_base import NativeLevel

    base = np.arange(11 * 13, dtype=np.uint16).reshape(11, 13)
    level1 = base[::2, ::2][:5, :6].copy()  # a writer's floor(S/2) level, not ceil
    t = ArrayAdapter(base, chunk_shape=(4, 4))
    lt = ArrayAdapter(level1, chunk_shape=(2, 4))
    t.native_levels.append(NativeLevel((2, 2), lt))
    MemorySource(t, source_id="pyr")
    plan = plan_read(t, None, (2, 2), "precomputed")
    assert plan.method == "precompute" and plan.shape == (5, 6)
    assert plan.realized == Bounds((0, 0), (10, 12))
    np.testing.assert_array_equal(assemble(t, plan), level1)
    sub = plan_read(t, Bounds((4, 5), (9, 13)), (2, 2), "precompute")
    assert sub.realized.start == (4, 0)  # level rows [2, 5) -> snapped to level chunk 2
    crop = assemble(t, sub)[(4 - 4) // 2 : -(-(9 - 4) // 2), (5 - 0) // 2 : -(-(13 - 0) // 2)]
    np.testing.assert_array_equal(crop, level1[2:5, 2:6])
    with pytest.raises(InvalidArgument, match="stores no level"):
        plan_read(t, None, (4, 4), "precompute")


def _tiled_plane():
    """A uint8 8192² plane whose reader decodes 512² blocks, on 2048×4096 transfer chunks
    (what the transfer grid gives a zarr of 512² chunks)."""
    rng = np.random.default_rng(5)
    t = ArrayAdapter(
        rng.integers(0, 255, (8192, 8192), dtype=np.uint8), "yx", chunk_shape=(2048, 4096), read_block_shape=(512, 512)
    )
    MemorySource(t, source_id="tiles")
    return t


def test_a_tile_sized_read_plans_on_the_tile_grid():
    t = _tiled_plane()
    assert t.chunk_shape == (2048, 4096) and t.tile_shape == (512, 512)
    tile = plan_read(t, Bounds((1024, 1536), (1536, 2048)))  # one 512² viewer tile
    assert [pc.chunk_id.bounds for pc in tile.chunks] == [Bounds((1024, 1536), (1536, 2048))]
    assert tile.chunk_shape == (512, 512)
    scaled = plan_read(t, Bounds((4096, 0), (8192, 4096)), (8, 8), "area")  # a 512² tile of level 3
    assert [pc.chunk_id.bounds for pc in scaled.chunks] == [Bounds((4096, 0), (8192, 4096))]
    whole = plan_read(t, None, (8, 8), "area")  # on the transfer grid, the whole image was every tile's chunk
    assert [pc.chunk_id.bounds for pc in whole.chunks] == [Bounds.full((8192, 8192))]
    assert plan_read(t).chunk_shape == (2048, 4096) and len(plan_read(t).chunks) == 8
    forced = plan_read(t, Bounds((1024, 1536), (1536, 2048)), grid="transfer")
    assert [pc.chunk_id.bounds for pc in forced.chunks] == [Bounds((0, 0), (2048, 4096))]
    with pytest.raises(ValueError, match="grid must be one of"):
        plan_read(t, None, grid="tiles")


def test_fit_keeps_the_transfer_grid_unless_tiles_save_four_times():
    t = _tiled_plane()
    # 1500² across a transfer-chunk row boundary: 4096² on the transfer grid, 2048×1536 on tiles (5.3x)
    assert plan_read(t, Bounds((1800, 0), (3300, 1500))).chunk_shape == (512, 512)
    # 3000² from the origin: 4096² against 3072² of tiles (1.8x), too little for 36 round trips instead of 2
    assert plan_read(t, Bounds((0, 0), (3000, 3000))).chunk_shape == (2048, 4096)


@pytest.mark.parametrize("scale, method", [((1, 1), None), ((2, 2), "area"), ((4, 4), "nearest"), ((8, 8), "max")])
def test_tile_and_transfer_plans_give_the_same_pixels(scale, method):
    t = _tiled_plane()
    region = Bounds((1000, 3000), (1000 + 512 * scale[0] + 7, 3000 + 512 * scale[1] - 5))
    tile = plan_read(t, region, scale, method, grid="tile")
    transfer = plan_read(t, region, scale, method, grid="transfer")
    assert tile.chunk_shape != transfer.chunk_shape
    a, b = assemble(t, tile), assemble(t, transfer)
    off = tuple((p - q) // s for p, q, s in zip(tile.realized.start, transfer.realized.start, scale))
    np.testing.assert_array_equal(a, b[tuple(slice(o, o + n) for o, n in zip(off, a.shape))])
    want = downsample_block(t.get_data(tile.realized), scale, normalize_method(method or "nearest"))
    np.testing.assert_array_equal(a, want)


def test_a_tiles_plan_is_kept_and_a_changed_tensor_plans_afresh():
    t = ArrayAdapter(np.zeros((1024, 1024), np.uint16), chunk_shape=(256, 256))
    MemorySource(t, source_id="kept")
    tile = Bounds((0, 512), (512, 1024))
    first = plan_read(t, tile, (2, 2), "mean")
    assert plan_read(t, Bounds((0, 512), (512, 1024)), [2, 2], "mean") is first, "the same request: the same plan"
    assert plan_read(t, tile, (2, 2), "max") is not first and plan_read(t, tile, (1, 1), "mean") is not first
    t.content_version = b"rewritten"
    fresh = plan_read(t, tile, (2, 2), "mean")
    assert fresh is not first and {pc.chunk_id.content_version for pc in fresh.chunks} == {b"rewritten"}
    other = ArrayAdapter(np.zeros((1024, 1024), np.uint16), chunk_shape=(256, 256))
    MemorySource(other, source_id="kept")  # the same ids and geometry, another tensor object
    assert plan_read(other, tile, (2, 2), "mean") is not fresh


def test_bulk_plans_are_not_kept_and_the_kept_ones_are_bounded(monkeypatch):
    from tensor_server.core import plan as plan_module

    t = ArrayAdapter(np.zeros((64, 64), np.uint8), chunk_shape=(4, 4))
    MemorySource(t, source_id="bulk")
    whole = plan_read(t)
    assert len(whole.chunks) == 256 > plan_module.REMEMBERED_PLAN_CHUNKS
    assert plan_read(t) is not whole
    monkeypatch.setattr(plan_module, "REMEMBERED_PLANS", 3)
    tiles = [Bounds((0, x), (4, x + 4)) for x in range(0, 20, 4)]
    plans = [plan_read(t, b) for b in tiles]
    assert len(plan_module._PLANS) == 3
    assert plan_read(t, tiles[-1]) is plans[-1] and plan_read(t, tiles[0]) is not plans[0], "oldest dropped"
