"""An OME-Zarr HCS plate served as one image (``<source>/plate``, ``core/montage.py``): plates
written with ome-zarr-py's own writer (``write_plate_metadata``, ``write_well_metadata``,
``write_image``), NGFF 0.4 on zarr v2 and 0.5 on zarr v3, with and without pyramids, ragged
fields, a missing well and fields that cannot share the plate's image.

What it pins: every field's published box holds that field's pixels at level 0 and at each
stored level (and nothing else holds anything but the fill); without a level every field
stores, the montage's levels are the engine's reduction of it, bit for bit; the layout's
numbers; bad wells and fields are left out with the reason and the rest served; the SDK and
the OME-Zarr views (v2 and v3) read what the adapter reads and carry the layout.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from tensor_server_kernels import reference

import tensor_server
from tensor_server.bench.writers import plate_grid, write_plate
from tensor_server.core.bounds import Bounds
from tensor_server.core.engine import ReadEngine
from tensor_server.core.level_grid import published_levels
from tensor_server.core.methods import PRECOMPUTE
from tensor_server.core.plan import plan_read
from tensor_server.core.uniform import covering_value
from tensor_server.errors import UnreadableSource
from tensor_server.testing import AdapterTests

zarr = pytest.importorskip("zarr")
ome_writer = pytest.importorskip("ome_zarr.writer")
ome_format = pytest.importorskip("ome_zarr.format")

#: well -> the (y, x) of each of its fields; every field is 2 channels of uint16
RAGGED = {"A/1": [(40, 36), (32, 44)], "B/3": [(40, 36)]}


def _write_plate(
    path: Path,
    version: str,
    wells: dict[str, list[tuple[int, int] | None]],
    *,
    pyramid: bool = True,
    listed: tuple[str, ...] = (),
    odd: dict[tuple[str, int], np.ndarray] | None = None,
    chunks: tuple[int, int, int] = (1, 16, 16),
) -> Path:
    """A 2 × 3 plate (rows A-B, columns 1-3) through ome-zarr-py's writer (``write_plate``):
    ``wells`` written (a None field is listed in its well but never written), ``listed`` only
    named in the plate; ``odd``: (well, field) -> the pixels to write there instead of random
    uint16; ``chunks``: the fields' storage chunks (the writer takes ~2 ms a chunk file)."""
    rng = np.random.default_rng(42)

    def pixels(well: str, index: int, shape: tuple[int, int, int]) -> np.ndarray:
        chosen = (odd or {}).get((well, index))
        return rng.integers(1, 60000, shape, dtype=np.uint16) if chosen is None else chosen  # never the fill, 0

    return write_plate(
        path,
        ["A", "B"],
        ["1", "2", "3"],
        wells,
        pixels,
        version=version,
        scale_factors=(2, 4) if pyramid else (),
        listed=listed,
        chunks=chunks,
    )


def _field_levels(plate: Path, well: str, field: str) -> list[np.ndarray]:
    """A field's stored levels, finest first, read with zarr-python (the writer's paths)."""
    group = zarr.open_group(str(plate / well / field), mode="r")
    attrs = group.attrs.asdict()
    datasets = (attrs.get("ome") or attrs)["multiscales"][0]["datasets"]
    return [np.asarray(group[d["path"]][...]) for d in datasets]


def _boxes(layout: dict) -> list[tuple[str, str, list[list[int]]]]:
    return [(w["path"], f["path"], f["box"]) for w in layout["wells"] for f in w["fields"]]


@pytest.fixture(params=["0.4", "0.5"])
def ragged(request, tmp_path):
    path = _write_plate(tmp_path / "plate.ome.zarr", request.param, RAGGED)
    with tensor_server.open(path) as src:
        yield src


def test_the_plate_is_listed_beside_its_fields(ragged):
    assert list(ragged.tensors) == ["A/1/0", "A/1/1", "B/3/0", "plate"]
    montage = ragged.tensor("plate")
    assert montage.array_id == f"{ragged.source_id}/plate"
    assert montage.dim_labels == ("c", "y", "x") and montage.dtype == np.uint16


def test_the_layout_is_the_plate_grid(ragged):
    """Cell = the largest field (40 × 44), a multiple of the coarsest stored factor 4; gap =
    ceil(44 / 16) = 3 rounded up to 4; two fields a well side by side; B/3 is row 1, column 2."""
    layout = ragged.tensor("plate").metadata["montage"]
    assert layout["rows"] == ["A", "B"] and layout["columns"] == ["1", "2", "3"]
    assert layout["cell"] == [40, 44] and layout["gap"] == [4, 4]
    pitch = (40 + 4, 2 * 44 + 4)
    assert _boxes(layout) == [
        ("A/1", "0", [[0, 0], [40, 36]]),
        ("A/1", "1", [[0, 44], [32, 88]]),
        ("B/3", "0", [[pitch[0], 2 * pitch[1]], [pitch[0] + 40, 2 * pitch[1] + 36]]),
    ]
    assert ragged.tensor("plate").shape == (2, 2 * pitch[0] - 4, 3 * pitch[1] - 4)
    # the plate's descriptor carries it beside the source's metadata; a field's never does
    assert json.loads(ragged.metadata_json("plate"))["metadata"]["montage"] == layout
    assert "montage" not in json.loads(ragged.metadata_json("A/1/0"))["metadata"]
    assert "montage" not in ragged.metadata and "montage" not in json.loads(ragged.metadata_json())["metadata"]


def test_every_box_holds_its_field_at_every_level(ragged):
    montage = ragged.tensor("plate")
    assert [lv.scale for lv in montage.native_levels] == [(1, 2, 2), (1, 4, 4)]
    levels = [((1, 1, 1), montage)] + [(lv.scale, lv.tensor) for lv in montage.native_levels]
    for scale, tensor in levels:
        f = scale[1]
        whole = tensor.get_data()
        assert whole.shape == (2, montage.shape[1] // f, montage.shape[2] // f)
        covered = np.zeros(whole.shape[1:], bool)
        for well, field, ((y0, x0), _stop) in _boxes(montage.metadata["montage"]):
            want = _field_levels(ragged.path, well, field)[{1: 0, 2: 1, 4: 2}[f]]
            box = (slice(None), slice(y0 // f, y0 // f + want.shape[1]), slice(x0 // f, x0 // f + want.shape[2]))
            np.testing.assert_array_equal(whole[box], want, err_msg=f"{well}/{field} at factor {f}")
            covered[box[1:]] = True
        assert not whole[:, ~covered].any(), "outside the fields the montage is the fill, 0"


def test_a_stored_level_never_reads_full_resolution(ragged):
    """Every field's level-0 chunk files removed: the plate's stored levels still read the
    fields' stored pixels (served through the engine's plan of the stored level)."""
    montage = ragged.tensor("plate")
    want = [lv.tensor.get_data() for lv in montage.native_levels]
    for level0 in ragged.path.glob("*/*/*/s0"):
        for f in level0.rglob("*"):
            if f.is_file() and not f.name.startswith((".", "zarr")):
                f.unlink()
    engine = ReadEngine(workers=2)
    for lv, pixels in zip(montage.native_levels, want):
        plan = plan_read(montage, None, lv.scale, PRECOMPUTE)
        got = np.empty(plan.shape, montage.dtype)
        for pc in plan.chunks:
            got[pc.out_bounds.to_slices()] = engine.chunk(pc.chunk_id.encode(), montage)[1]
        assert pixels.any()
        np.testing.assert_array_equal(got, pixels)
    assert not montage.get_data().any(), "level 0 now reads the fill: its chunks are gone"


def test_levels_below_the_coarsest_stored_one_reduce_it(tmp_path):
    """Fields of 600² with levels at 2 and 4: the montage's coarsest stored level (310 × 920)
    is over one 512² tile, so one level is computed below it, at 8: the engine's area
    reduction of the stored level at 4, bit for bit, and read from it: with every field's
    level 0 and level 1 chunk files removed it still reads the same pixels. Chunks of 64²: at
    16² the writer's 10,900 chunk files took 21 of the test's 24 s; at 64² the stored level at
    4 (150² a field) is still 3 × 3 chunks a field, edge chunks partial."""
    wells = {"A/1": [(600, 600), (600, 600)], "B/3": [(600, 600)]}
    with tensor_server.open(_write_plate(tmp_path / "big.ome.zarr", "0.4", wells, chunks=(1, 64, 64))) as src:
        montage = src.tensor("plate")
        assert montage.shape == (2, 1240, 3680)
        assert [lv.scale for lv in montage.native_levels] == [(1, 2, 2), (1, 4, 4), (1, 8, 8)]
        stored, below = montage.native_levels[1].tensor, montage.native_levels[2].tensor
        assert stored.shape == (2, 310, 920) and below.shape == (2, 155, 460)
        assert [lv.scale for lv in published_levels(montage)][-1] == (1, 8, 8)
        want = ReadEngine(workers=2).read(stored, None, (1, 2, 2), "area")
        assert want.any()
        for level in ("s0", "s1"):
            for chunk in src.path.glob(f"*/*/*/{level}/**/*"):
                if chunk.is_file() and not chunk.name.startswith((".", "zarr")):
                    chunk.unlink()
        plan = plan_read(montage, None, (1, 8, 8), PRECOMPUTE)
        got = np.empty(plan.shape, montage.dtype)
        engine = ReadEngine(workers=2)
        for pc in plan.chunks:
            got[pc.out_bounds.to_slices()] = engine.chunk(pc.chunk_id.encode(), montage)[1]
        np.testing.assert_array_equal(got, want)
        assert not montage.native_levels[0].tensor.get_data().any(), "level 1 now reads the fill"


def test_time_and_z_are_the_fields_own(tmp_path):
    """5-D fields (t c z y x, NGFF 0.5): the plate image has their t, c and z; its stored
    levels reduce Y and X as the fields' do, and every box holds its field there."""
    fmt = ome_format.FormatV05()
    root = zarr.open_group(str(tmp_path / "tczyx.ome.zarr"), mode="w", zarr_format=3)
    ome_writer.write_plate_metadata(root, ["A", "B"], ["1", "2"], ["A/2", "B/1"], fmt=fmt)
    rng = np.random.default_rng(5)
    for well in ("A/2", "B/1"):
        group = root.require_group(well)
        ome_writer.write_well_metadata(group, ["0"], fmt=fmt)
        pixels = rng.integers(1, 255, (2, 2, 3, 24, 20), dtype=np.uint8)
        ome_writer.write_image(pixels, group.require_group("0"), scale_factors=(2,), axes="tczyx", fmt=fmt)
    with tensor_server.open(tmp_path / "tczyx.ome.zarr") as src:
        montage = src.tensor("plate")
        assert montage.dim_labels == tuple("tczyx") and montage.shape[:3] == (2, 2, 3)
        assert [lv.scale for lv in montage.native_levels] == [(1, 1, 1, 2, 2)]
        for scale, tensor in [((1,) * 5, montage), ((1, 1, 1, 2, 2), montage.native_levels[0].tensor)]:
            whole = tensor.get_data()
            for well, field, ((y0, x0), _stop) in _boxes(montage.metadata["montage"]):
                want = _field_levels(src.path, well, field)[scale[-1] - 1]
                f = scale[-1]
                got = whole[..., y0 // f : y0 // f + want.shape[-2], x0 // f : x0 // f + want.shape[-1]]
                np.testing.assert_array_equal(got, want, err_msg=f"{well}/{field} at factor {f}")


def test_a_region_reads_only_what_it_overlaps(ragged):
    """A box across two fields' edges and the gap between them: their parts, else the fill."""
    montage = ragged.tensor("plate")
    field = _field_levels(ragged.path, "A/1", "0")[0]
    got = montage.get_data(Bounds((1, 30, 30), (2, 42, 46)))
    want = np.zeros((1, 12, 16), np.uint16)
    want[:, :10, :6] = field[1:2, 30:40, 30:36]
    want[:, :2, 14:16] = _field_levels(ragged.path, "A/1", "1")[0][1:2, 30:32, 0:2]  # 32 rows tall
    np.testing.assert_array_equal(got, want)


def test_opening_reads_metadata_only(tmp_path):
    """Every chunk file removed: the plate opens with the same layout (its open never read a
    pixel), and reads the fill where the pixels were."""
    path = _write_plate(tmp_path / "p.ome.zarr", "0.4", RAGGED)
    with tensor_server.open(path) as src:
        layout = src.tensor("plate").metadata["montage"]
    for f in path.rglob("*"):
        if f.is_file() and f.name not in (".zarray", ".zattrs", ".zgroup", "zarr.json"):
            f.unlink()
    with tensor_server.open(path) as src:
        montage = src.tensor("plate")
        assert montage.metadata["montage"] == layout
        assert not montage.get_data().any()
        # the fields' never-written chunks are the plate's uniform blocks, where they lie in it
        for _well, _field, ((y0, x0), (y1, x1)) in _boxes(layout):
            box = Bounds((0, y0, x0), (2, y1, x1))
            assert covering_value(montage.uniform_blocks(box), box) == 0


@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_opening_builds_no_zarr_array_and_lists_no_chunk_folder(tmp_path, monkeypatch, version):
    """The open reads each field's array metadata as JSON: no zarr-python array is opened or
    built, no chunk folder listed, no chunk file stat'ed; a read of one field's box builds
    that field's level-0 array alone (the plate's 3 fields of 3 levels are 9 arrays) and
    reads its pixels."""
    from tensor_server.adapters import _zarr_array

    path = _write_plate(tmp_path / "p.ome.zarr", version, RAGGED)
    calls = {"open_array": 0, "built": [], "listed": 0, "stat": 0}
    real_build, real_listing, real_stat = _zarr_array.StoredArray._build, _zarr_array.stored_files, os.stat
    real_open_array = zarr.open_array

    def build(self):
        calls["built"].append(self.path)
        return real_build(self)

    def listing(folder):
        calls["listed"] += 1
        return real_listing(folder)

    def counted_open_array(*args, **kwargs):
        calls["open_array"] += 1
        return real_open_array(*args, **kwargs)

    def stat(p, *args, **kwargs):
        name = os.fspath(p)
        calls["stat"] += name.startswith(f"{path}/") and "/s0/" in name  # a level 0 chunk file or folder
        return real_stat(p, *args, **kwargs)

    monkeypatch.setattr(_zarr_array.StoredArray, "_build", build)
    monkeypatch.setattr(_zarr_array, "stored_files", listing)
    monkeypatch.setattr(zarr, "open_array", counted_open_array)
    monkeypatch.setattr(os, "stat", stat)
    with tensor_server.open(path) as src:
        assert calls == {"open_array": 0, "built": [], "listed": 0, "stat": 0}
        montage = src.tensor("plate")
        (y0, x0), (y1, x1) = montage.metadata["montage"]["wells"][1]["fields"][0]["box"]  # B/3/0
        got = montage.get_data(Bounds((0, y0, x0), (2, y1, x1)))
        assert calls["built"] == ["B/3/0/s0"] and calls["open_array"] == 0
    np.testing.assert_array_equal(got, _field_levels(path, "B/3", "0")[0])


def test_the_garbage_collector_is_paused_while_a_plate_is_walked(tmp_path, monkeypatch):
    """Off while the wells are walked (``_zarr_store.collector_paused``), on again after, also
    when the walk fails; left off when it was off before; pauses that overlap end together."""
    import gc

    from tensor_server.adapters import _zarr_store

    path = _write_plate(tmp_path / "p.ome.zarr", "0.4", RAGGED)
    seen = []
    real_add_well = _zarr_store.StoreWalker.add_well

    def add_well(self, wnode):
        seen.append(gc.isenabled())
        return real_add_well(self, wnode)

    monkeypatch.setattr(_zarr_store.StoreWalker, "add_well", add_well)
    assert gc.isenabled()
    with tensor_server.open(path) as src:
        assert src.tensor("plate").shape == (2, 84, 272)
    assert seen == [False, False] and gc.isenabled()
    with _zarr_store.collector_paused():
        with _zarr_store.collector_paused():
            pass
        assert not gc.isenabled()  # the outer pause still runs
    assert gc.isenabled()
    gc.disable()
    try:
        with _zarr_store.collector_paused():
            pass
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()
    monkeypatch.setattr(_zarr_store.StoreWalker, "add_well", lambda self, wnode: 1 / 0)
    with pytest.raises(UnreadableSource, match="ZeroDivisionError"):
        tensor_server.open(path)
    assert gc.isenabled()


def _metadata_only_plate(path: Path, rows: int, columns: int) -> Path:
    """A plate of one 2 × 1080² field per well with levels at 2, 4 and 8 and no chunk written:
    the plate and well documents by ome-zarr-py's writer, the field's arrays by zarr-python
    (no pixels; ome-zarr-py's ``write_image`` writes them), one well copied to every place."""
    import shutil

    fmt = ome_format.FormatV04()
    names, numbers = plate_grid(rows, columns)
    wells = [f"{r}/{c}" for r in names for c in numbers]
    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    ome_writer.write_plate_metadata(root, names, numbers, wells, fmt=fmt, field_count=1)
    well = zarr.open_group(str(path.parent / "well"), mode="w", zarr_format=2)
    ome_writer.write_well_metadata(well, ["0"], fmt=fmt)
    field = well.require_group("0")
    datasets = []
    for level in range(4):
        n, factor = -(-1080 // 2**level), 2**level
        field.create_array(f"s{level}", shape=(2, n, n), chunks=(1, 540, 540), dtype="uint16", fill_value=0)
        datasets.append(
            {"path": f"s{level}", "coordinateTransformations": [{"type": "scale", "scale": [1, factor, factor]}]}
        )
    ome_writer.write_multiscales_metadata(field, datasets, fmt=fmt, axes="cyx")
    for path_in_plate in wells:
        shutil.copytree(path.parent / "well", path / path_in_plate)
    return path


def test_a_1536_well_plate_opens_from_metadata_and_only_the_plate_carries_its_layout(tmp_path):
    """32 × 48 wells, no pixel written (the plate opens from its metadata alone), its layout
    lists every well, and only the plate's describe carries it (a field's stays the size of
    the source's metadata, not the layout's)."""
    with tensor_server.open(_metadata_only_plate(tmp_path / "p1536.ome.zarr", 32, 48)) as src:
        assert len(src.tensors) == 1536 + 1
        layout = src.tensor("plate").metadata["montage"]
        assert len(layout["wells"]) == 1536 and layout["wells"][-1]["path"] == "AF/48"
        assert layout["wells"][-1]["fields"] == [
            {"path": "0", "box": [[31 * 1152, 47 * 1152], [31 * 1152 + 1080, 47 * 1152 + 1080]]}
        ]
        plate_doc, field_doc = src.metadata_json("plate"), src.metadata_json("AF/48/0")
        assert json.loads(plate_doc)["metadata"]["montage"] == layout
        assert "montage" not in json.loads(field_doc)["metadata"] and field_doc == src.metadata_json()
        assert len(field_doc) < len(plate_doc) - len(json.dumps(layout)) + 100
        assert src.metadata_json("plate") is plate_doc, "encoded once"
        assert src.tensor("plate").native_levels[-1].scale == (1, 128, 128)


def test_empty_wells_are_answered_in_closed_form(ragged):
    """A box under no field (an empty well) is one uniform block of the fill; reads through
    the engine with closed-form blocks equal reads without them."""
    montage = ragged.tensor("plate")
    pitch_x = montage.metadata["montage"]["cell"][1] * 2 + montage.metadata["montage"]["gap"][1]
    empty = Bounds((0, 0, 2 * pitch_x), (2, 40, 3 * pitch_x - 4))  # A/3: never written
    assert montage.uniform_blocks(empty) == [(empty, np.uint16(0))]
    on, off = ReadEngine(workers=2), ReadEngine(workers=2, special_chunks=False)
    for scale in ((1, 2, 2), (1, 8, 8)):
        np.testing.assert_array_equal(on.read(montage, None, scale, "area"), off.read(montage, None, scale, "area"))


def test_a_field_rewritten_in_place_makes_the_plate_stale(ragged):
    """The plate answers a changed chunk file under a box with its field's reason (so the
    server reopens the source), and only under that field."""
    montage = ragged.tensor("plate")
    full = Bounds.full(montage.shape)
    assert montage.stale_reason(full, exact=True) is None
    chunk = next(
        f for f in (ragged.path / "B/3/0/s0").rglob("*") if f.is_file() and not f.name.startswith((".", "zarr"))
    )
    chunk.write_bytes(chunk.read_bytes() + b"\0")
    why = montage.stale_reason(full, exact=True)
    assert why is not None and "B/3/0" in why and "changed" in why
    (y0, x0), (y1, x1) = montage.metadata["montage"]["wells"][0]["fields"][0]["box"]
    assert montage.stale_reason(Bounds((0, y0, x0), (2, y1, x1)), exact=True) is None


def test_a_bioformats2raw_plate_is_a_plate(tmp_path):
    """bioformats2raw marks an HCS plate's root with its layout key beside ``plate``."""
    path = _write_plate(tmp_path / "b2r.ome.zarr", "0.4", RAGGED)
    attrs = json.loads((path / ".zattrs").read_text())
    (path / ".zattrs").write_text(json.dumps({"bioformats2raw.layout": 3, **attrs}))
    with tensor_server.open(path) as src:
        assert src.metadata["layout"] == "plate" and list(src.tensors)[-1] == "plate"
        assert [(w, f) for w, f, _ in _boxes(src.tensor("plate").metadata["montage"])] == [
            ("A/1", "0"),
            ("A/1", "1"),
            ("B/3", "0"),
        ]


def test_wells_are_placed_by_index_else_by_name(tmp_path):
    """No rowIndex/columnIndex (NGFF 0.3): a well's place is its path's row and column names;
    a well whose index is off the plate's grid is left out of the plate image with the reason."""
    path = _write_plate(tmp_path / "p.ome.zarr", "0.4", RAGGED)
    with tensor_server.open(path) as src:
        layout = src.tensor("plate").metadata["montage"]
    attrs = json.loads((path / ".zattrs").read_text())
    for well in attrs["plate"]["wells"]:
        del well["rowIndex"], well["columnIndex"]
    (path / ".zattrs").write_text(json.dumps(attrs))
    with tensor_server.open(path) as src:
        assert src.tensor("plate").metadata["montage"] == layout
    attrs["plate"]["wells"][1]["rowIndex"] = 7
    (path / ".zattrs").write_text(json.dumps(attrs))
    with tensor_server.open(path) as src:
        assert [(w, f) for w, f, _ in _boxes(src.tensor("plate").metadata["montage"])] == [("A/1", "0"), ("A/1", "1")]
        reason = {s["path"]: s["reason"] for s in src.metadata["skipped"]}["B/3"]
        assert "row 7" in reason and "2 × 3 grid" in reason
        assert "B/3/0" in src.tensors


def test_without_a_level_every_field_stores_the_levels_are_the_reduction(tmp_path):
    """No pyramids (and odd sizes, which no stored level could divide): no stored montage
    level; every published level is the engine's reduction of the montage, bit for bit."""
    path = _write_plate(
        tmp_path / "flat.ome.zarr", "0.4", {"A/2": [(37, 41), (30, 29)], "B/1": [(33, 40)]}, pyramid=False
    )
    with tensor_server.open(path) as src:
        montage = src.tensor("plate")
        assert montage.native_levels == []
        full = montage.get_data()
        engine = ReadEngine(workers=2)
        for scale in ((1, 2, 2), (1, 4, 4), (1, 3, 3)):
            for method in ("area", "nearest", "max"):
                want = reference.downsample(full, scale, method)
                np.testing.assert_array_equal(
                    engine.read(montage, None, scale, method), want, err_msg=f"{scale} {method}"
                )


def test_a_field_without_the_level_leaves_the_montage_unleveled(tmp_path):
    """One field with no pyramid: no factor is stored by every field, so none is the montage's."""
    path = _write_plate(tmp_path / "mixed.ome.zarr", "0.4", {"A/1": [(40, 36)]})
    _write_plate(tmp_path / "other.ome.zarr", "0.4", {"A/1": [(40, 36)]}, pyramid=False)
    import shutil

    shutil.rmtree(path / "A/1/0")
    shutil.copytree(tmp_path / "other.ome.zarr/A/1/0", path / "A/1/0")
    with tensor_server.open(path) as src:
        assert src.tensor("plate").native_levels == []


def test_bad_wells_and_fields_are_left_out_and_the_rest_served(tmp_path, caplog):
    """A well listed but missing, a field listed but missing, a field of another dtype and one
    of another channel count: each named with its reason; the plate serves the rest."""
    rng = np.random.default_rng(1)
    odd = {
        ("A/1", 1): rng.integers(1, 200, (2, 40, 36), dtype=np.uint8),
        ("B/2", 0): rng.integers(1, 6000, (3, 40, 36), dtype=np.uint16),
    }
    wells = {"A/1": [(40, 36), (40, 36), None], "B/2": [(40, 36)], "B/3": [(40, 36)]}
    path = _write_plate(tmp_path / "bad.ome.zarr", "0.4", wells, listed=("A/3",), odd=odd)
    with caplog.at_level(logging.WARNING, logger="tensor_server.adapters.zarr"), tensor_server.open(path) as src:
        skipped = {s["path"]: s["reason"] for s in src.metadata["skipped"]}
        assert skipped["A/3"] == "listed well is missing"
        assert skipped["A/1/2"] == "listed field of view is not an image group"
        assert "left out of the plate image" in skipped["A/1/1"] and "dtype uint8" in skipped["A/1/1"]
        assert "'c': 3" in skipped["B/2/0"] and "'c': 2" in skipped["B/2/0"]
        assert all(p in caplog.text for p in ("'A/3'", "'A/1/1'", "'B/2/0'"))
        layout = src.tensor("plate").metadata["montage"]
        assert [(w, f) for w, f, _ in _boxes(layout)] == [("A/1", "0"), ("B/3", "0")]
        assert {"A/1/1", "B/2/0"} <= set(src.tensors)  # still served on their own
        montage = src.tensor("plate").get_data()
        for well, field, ((y0, x0), (y1, x1)) in _boxes(layout):
            np.testing.assert_array_equal(montage[:, y0:y1, x0:x1], _field_levels(path, well, field)[0])
        # the A/1 well's slot 1 (the uint8 field) is the fill
        (y0, x0), (y1, x1) = layout["wells"][0]["fields"][0]["box"]
        assert not montage[:, y0:y1, x1 : x1 + 36].any()


# ---- the doors -------------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_sdk_and_ome_zarr_views_read_what_the_adapter_reads(tmp_path, version):
    from tensor_server.catalog import Catalog
    from tensor_server.testing import serving

    _write_plate(tmp_path / "plates" / "p.ome.zarr", version, RAGGED)
    cat = Catalog([tmp_path / "plates"])
    cat.scan()
    try:
        rec = next(r for r in cat.records() if r.source is not None)
        montage = rec.source.tensor("plate")
        array_id = montage.array_id
        with serving(cat, http=True) as srv:
            client = srv.client()
            desc = client.get_descriptor(array_id, with_metadata=True)
            assert json.loads(desc.metadata_json)["metadata"]["montage"] == montage.metadata["montage"]
            field = json.loads(client.get_descriptor(f"{rec.source_id}/B/3/0", with_metadata=True).metadata_json)
            assert field["metadata"]["layout"] == "plate" and "montage" not in field["metadata"]
            advertised = [(tuple(lv.scale_hint), lv.reduction_method) for lv in desc.pyramid]
            assert advertised == [((1, 1, 1), PRECOMPUTE), ((1, 2, 2), PRECOMPUTE), ((1, 4, 4), PRECOMPUTE)]
            sdk = [np.asarray(client.get_array(array_id))]
            for scale, method in advertised[1:]:
                got = np.asarray(client.get_array(array_id, scale_hint=list(scale), reduction_method=method))
                np.testing.assert_array_equal(got, montage.native_level(scale).tensor.get_data())
                sdk.append(got)
            np.testing.assert_array_equal(sdk[0], montage.get_data())
            region = np.asarray(client.get_array(array_id, slice_hint=(slice(0, 2), slice(20, 70), slice(30, 200))))
            np.testing.assert_array_equal(region, montage.get_data(Bounds((0, 20, 30), (2, 70, 200))))
            _iiif_overview_shows_the_wells(srv.http_url, montage)
            for flavour in ("zarr", "zarr3"):
                group = zarr.open_group(f"{srv.http_url}/{flavour}/{array_id}/", mode="r")
                attrs = group.attrs.asdict()
                assert attrs["montage"] == montage.metadata["montage"], flavour
                datasets = (attrs.get("ome") or attrs)["multiscales"][0]["datasets"]
                assert len(datasets) == 3
                for d, want in zip(datasets, sdk):
                    np.testing.assert_array_equal(group[d["path"]][...], want, err_msg=f"{flavour} {d['path']}")
    finally:
        cat.close()


def _iiif_overview_shows_the_wells(http_url: str, montage) -> None:
    """IIIF's whole-plate overview: the plate's size; the fields drawn, the rest black."""
    import io

    import httpx
    from PIL import Image

    info = httpx.get(f"{http_url}/iiif/3/{montage.array_id}/info.json").json()
    assert (info["height"], info["width"]) == montage.shape[1:]
    r = httpx.get(f"{http_url}/iiif/3/{montage.array_id};c=0/full/max/0/default.png")
    assert r.status_code == 200, r.text
    image = np.asarray(Image.open(io.BytesIO(r.content)).convert("L"))
    assert image.shape == montage.shape[1:]
    inside = np.zeros(image.shape, bool)
    for _well, _field, ((y0, x0), (y1, x1)) in _boxes(montage.metadata["montage"]):
        inside[y0:y1, x0:x1] = True
        assert image[y0:y1, x0:x1].mean() > 32, "a field is drawn"
    assert not image[~inside].any(), "empty wells, empty slots and gaps are the fill"


def test_the_plate_exports_as_one_image_with_its_layout(ragged, tmp_path):
    from tensor_server.export import ExportOptions, export_tensor

    montage = ragged.tensor("plate")
    export_tensor(montage, tmp_path / "plate-export.zarr", ExportOptions(levels=2, ngff="0.5"))
    group = zarr.open_group(str(tmp_path / "plate-export.zarr"), mode="r")
    assert group.attrs.asdict()["montage"] == montage.metadata["montage"]
    datasets = group.attrs.asdict()["ome"]["multiscales"][0]["datasets"]
    np.testing.assert_array_equal(group[datasets[0]["path"]][...], montage.get_data())


# ---- the adapter contract ----------------------------------------------------------------------
class TestPlateMontage(AdapterTests):
    """The conformance suite on the plate image (the fields have theirs in zarr_test.py)."""

    methods = ("nearest", "area")

    @pytest.fixture
    def source(self, tmp_path):
        path = _write_plate(tmp_path / "suite.ome.zarr", "0.4", RAGGED)
        with tensor_server.open(path) as src:
            yield src

    def tensors(self, source):
        return [("plate", source.tensor("plate"))]

    def reference_array(self, source, field):
        """Assembled with NumPy from zarr-python's reads of the fields at the published boxes
        (whose numbers test_the_layout_is_the_plate_grid pins)."""
        montage = source.tensor("plate")
        out = np.zeros(montage.shape, montage.dtype)
        for well, name, ((y0, x0), (y1, x1)) in _boxes(montage.metadata["montage"]):
            out[:, y0:y1, x0:x1] = _field_levels(source.path, well, name)[0]
        return out
