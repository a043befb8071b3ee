"""The Tensor Browser's data layer (PyPI ``biopb-napari-widget``) against this server.

``tensor_browser/_sources.py`` (the catalog listing, folder browsing, drops, resolve, ROI
sets) and ``_tensor_utils.py`` / ``_rois.py`` (pyramid levels, ROI layers) are Qt-free; the
``tensor_browser`` package's ``__init__`` imports the Qt widget, so the package is stood in
for by a bare module object pointing at its folder, and ``_sources`` imports as in the
browser. Nothing here imports Qt (asserted).
"""
from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.testing import serving
from tests.flight.conftest import client_for


@pytest.fixture
def browser(monkeypatch):
    def gui_modules():
        return {m for m in sys.modules if m.split(".")[0] in ("qtpy", "PyQt5", "PyQt6", "PySide2", "PySide6", "napari")}

    before = gui_modules()  # a napari install's pytest plugin may have loaded some already
    pkg = pytest.importorskip("biopb_napari_widget")
    stub = types.ModuleType("biopb_napari_widget.tensor_browser")
    stub.__path__ = [str(Path(pkg.__file__).parent / "tensor_browser")]
    monkeypatch.setitem(sys.modules, "biopb_napari_widget.tensor_browser", stub)
    for name in ("tensor_browser._sources", "_tensor_utils", "_rois", "_catalog", "_labels"):
        monkeypatch.delitem(sys.modules, f"biopb_napari_widget.{name}", raising=False)
    mods = types.SimpleNamespace(
        sources=importlib.import_module("biopb_napari_widget.tensor_browser._sources"),
        tensor_utils=importlib.import_module("biopb_napari_widget._tensor_utils"),
        rois=importlib.import_module("biopb_napari_widget._rois"),
    )
    assert gui_modules() == before  # the data layer pulled in no Qt and no napari
    return mods


@pytest.fixture
def served(tmp_path, monkeypatch):
    import tifffile

    monkeypatch.setenv("HOME", str(tmp_path))  # add_source allows the user's home (and the roots) by default

    root = tmp_path / "lab" / "plate1"
    rng = np.random.default_rng(3)
    image = rng.integers(0, 60000, (2, 256, 384), dtype=np.uint16)
    (root / "sub").mkdir(parents=True)
    tifffile.imwrite(root / "well_a.ome.tif", image, photometric="minisblack", tile=(64, 64), metadata={"axes": "CYX"})
    tifffile.imwrite(root / "sub" / "b.tif", rng.integers(0, 255, (40, 50), dtype=np.uint8), photometric="minisblack")
    cat = Catalog([tmp_path / "lab"])
    cat.scan()
    cat.add_source(MemorySource(ArrayAdapter(np.arange(64 * 96, dtype=np.float32).reshape(64, 96), "yx"),
                                source_id="mem"))
    # a small plane budget, so the 256x384 image advertises computed levels
    with serving(cat, plane_budget_px=96 * 96) as srv:
        yield srv, client_for(srv), image
    cat.close()


class _Connection:
    def __init__(self, client):
        self.client = client


def test_sources_listed_a_folder_at_a_time(browser, served):
    srv, client, _ = served
    sl = browser.sources.SourceList(_Connection(client))
    sources = sl.refresh()
    assert sl.lazy is True  # the server answers catalog_children
    top = sl.levels[""]
    assert [s["source_id"] for s in top["sources"]] == ["mem"] and len(top["folders"]) == 1
    assert "mem" in sources and sources["mem"].is_resolved
    # one folder: the chain of single-child folders down to where a source sits
    assert top["folders"][0]["key"].endswith("lab/plate1")
    inside = sl.load_level(top["folders"][0]["key"])
    assert [s["name"] for s in inside["sources"]] == ["well_a.ome.tif"] and [f["name"] for f in inside["folders"]] == ["sub"]
    well = inside["sources"][0]["source_id"]
    assert sl.sources[well].is_resolved and sl.sources[well].tensors[0].shape == (2, 256, 384)
    assert sl.roi_sets == {}  # the rois table is queryable: ROI loading is on


def test_pyramid_levels_built_from_the_advertised_levels(browser, served):
    srv, client, image = served
    sl = browser.sources.SourceList(_Connection(client))
    sl.refresh()
    well = sl.load_level(sl.levels[""]["folders"][0]["key"])["sources"][0]["source_id"]
    desc = sl.sources[well].tensors[0]
    levels = browser.tensor_utils.build_pyramid_levels(client, well, desc.array_id, desc)
    assert [lv.shape for lv in levels] == [(2, 256, 384), (2, 128, 192), (2, 64, 96)]
    np.testing.assert_array_equal(levels[0].compute(), image)
    coarse = image.reshape(2, 64, 4, 96, 4).astype(np.float64).mean(axis=(2, 4))
    np.testing.assert_array_equal(levels[2].compute(), np.round(coarse).astype(np.uint16))


def test_roi_loading(browser, served):
    from biopb.image.annotation_pb2 import RoiAnnotation
    from biopb.image.roi_pb2 import ROI

    srv, client, _ = served
    sl = browser.sources.SourceList(_Connection(client))
    sl.refresh()
    roi = ROI()
    roi.rectangle.top_left.x, roi.rectangle.top_left.y = 10, 20
    roi.rectangle.bottom_right.x, roi.rectangle.bottom_right.y = 30, 50
    point = ROI()
    point.point.x, point.point.y = 5, 6
    client.put_rois("mem", [RoiAnnotation(roi=roi, set_name="cells"), RoiAnnotation(roi=point, set_name="cells")])
    sl.refresh()
    mem_id = client.get_descriptor("mem").array_id
    assert sl.roi_sets == {mem_id: {"cells": 2}}
    desc = client.get_descriptor(mem_id)
    listed = client.list_rois(mem_id)
    specs = browser.rois.roi_layer_specs(listed.rois, desc,
                                         scale=browser.rois.image_scale(client, "mem", desc))
    by_kind = {s.kind: s for s in specs}
    assert set(by_kind) == {"points", "shapes"}
    np.testing.assert_array_equal(np.asarray(by_kind["points"].data), [[6, 5]])  # (y, x)
    corners = np.asarray(by_kind["shapes"].data[0])
    assert corners.min(axis=0).tolist() == [20, 10] and corners.max(axis=0).tolist() == [50, 30]


def test_drop_resolve_and_remove(browser, served, tmp_path):
    import tifffile

    srv, client, _ = served
    sl = browser.sources.SourceList(_Connection(client))
    sl.refresh()
    drop = tmp_path / "dropped"
    drop.mkdir()
    tifffile.imwrite(drop / "d.tif", np.ones((8, 9), np.uint16), photometric="minisblack")
    result = sl.add(str(drop))
    assert len(result.added) == 1
    assert sl.dropped_roots == frozenset({"dnd://dropped"})
    sid = result.added[0]
    assert sl.resolve(sid).is_resolved  # a resolve of a readable source is a no-op
    removed = sl.remove("dnd://dropped")
    assert list(removed.removed) == [sid] and sl.dropped_roots == frozenset()
