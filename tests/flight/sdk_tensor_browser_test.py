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
import pyarrow.flight as flight
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
    cat.add_source(
        MemorySource(ArrayAdapter(np.arange(64 * 96, dtype=np.float32).reshape(64, 96), "yx"), source_id="mem")
    )
    # a small plane budget, so the 256x384 image advertises computed levels
    with serving(cat, plane_budget_px=96 * 96) as srv:
        yield srv, client_for(srv), image
    cat.close()


@pytest.fixture
def writable(tmp_path):
    """A server taking uploads (local mode: no server token) over one in-memory image, and
    the catalog it serves."""
    cat = Catalog([])
    cat.add_source(
        MemorySource(ArrayAdapter(np.arange(64 * 96, dtype=np.uint16).reshape(64, 96), "yx"), source_id="mem")
    )
    cat.first_scan_done.set()
    with serving(cat, write_dir=str(tmp_path / "write"), writable=True) as srv:
        yield srv
    cat.close()


class _Connection:
    def __init__(self, client):
        self.client = client


def test_sources_listed_a_folder_at_a_time(browser, served, tmp_path):
    srv, client, _ = served
    sl = browser.sources.SourceList(_Connection(client))
    sources = sl.refresh()
    assert sl.lazy is True  # the server answers catalog_children
    top = sl.levels[""]
    assert [s["source_id"] for s in top["sources"]] == ["mem"] and len(top["folders"]) == 1
    assert "mem" in sources and sources["mem"].is_resolved
    # the one root (lab) is the top: its folder plate1 by name, never the filesystem above it
    assert top["path"] == str(tmp_path / "lab") and top["folders"] == [
        {"name": "plate1", "key": "plate1", "path": str(tmp_path / "lab" / "plate1")}
    ]
    inside = sl.load_level(top["folders"][0]["key"])
    assert [s["name"] for s in inside["sources"]] == ["well_a.ome.tif"] and [f["name"] for f in inside["folders"]] == [
        "sub"
    ]
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
    specs = browser.rois.roi_layer_specs(listed.rois, desc, scale=browser.rois.image_scale(client, "mem", desc))
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


def test_the_generation_moves_when_an_upload_is_published_or_discarded(browser, writable):
    """The browser's watch re-lists when ``catalog_generation`` moves: a READY upload and a
    DISCARDED one (how the SDK deletes an upload) each move it; a PENDING one lists nothing."""
    client = client_for(writable)
    sl = browser.sources.SourceList(_Connection(client))

    def generation():
        return sl.update_health()["catalog_generation"]

    arr = np.arange(40 * 50, dtype=np.float32).reshape(40, 50)
    start = generation()
    assert generation() == start  # stable when idle
    desc = client.setup_array_upload("zarr://scratch/@fields/result", arr, chunk_shape=(20, 25))
    assert generation() == start  # PENDING: nothing new is listed
    assert client.upload_array(desc, arr)["state"] == "READY"
    published = generation()
    assert published > start
    labels = client.setup_array_upload("zarr://mem/@labels/cells", np.zeros((64, 96), np.uint8), chunk_shape=(64, 96))
    client.upload_array(labels, np.ones((64, 96), np.uint8))
    labelled = generation()
    assert labelled > published
    assert client.set_upload_status(desc, "DISCARDED", "superseded")["state"] == "DISCARDED"
    discarded = generation()
    assert discarded > labelled
    assert client.set_upload_status(labels, "DISCARDED", "deleted")["state"] == "DISCARDED"
    deleted = generation()
    assert deleted > discarded
    assert client.set_upload_status(labels, "DISCARDED")["state"] == "DISCARDED"  # again: nothing changes
    assert generation() == deleted


def test_uploaded_results_are_listed_in_the_tree_to_whoever_may_read_them(browser, writable):
    """The scratch source holds only uploads: the tree lists it once one is READY, to a caller
    that may read one of them (the read rule SQL rows follow), and the browser opens it."""
    from tensor_server.service.access import grant_digest

    uploader = client_for(writable)
    sl = browser.sources.SourceList(_Connection(client_for(writable)))

    def top():
        sl.refresh()
        return [s["source_id"] for s in sl.levels[""]["sources"]]

    assert top() == ["mem"]  # empty: nothing to open
    arr = np.arange(40 * 50, dtype=np.float32).reshape(40, 50)
    desc = uploader.setup_array_upload("zarr://scratch/@fields/result", arr, chunk_shape=(20, 25))
    assert top() == ["mem"]  # PENDING: not readable yet
    uploader.upload_array(desc, arr)
    assert top() == ["mem", "scratch"]
    scratch = sl.sources["scratch"]
    assert scratch.is_resolved and [t.array_id for t in scratch.tensors] == ["scratch/@fields/result"]
    np.testing.assert_array_equal(uploader.get_array("scratch/@fields/result"), arr)

    # a private upload (an in-process producer's, granted to alice) is alice's alone
    uploader.set_upload_status(desc, "DISCARDED", "moved")
    manager = writable.runtime.uploads
    alice_grant = grant_digest("alice")
    up = manager.add_tensor("cache://scratch/@fields/private", (4, 5), "<u1", owner=alice_grant, grant=alice_grant)
    manager.set_ready(up.array_id, holes_are_fill=True)
    assert top() == ["mem"]  # the stranger (no token) may read no tensor of scratch
    alice = browser.sources.SourceList(_Connection(client_for(writable, token="alice")))
    alice.refresh()
    assert [s["source_id"] for s in alice.levels[""]["sources"]] == ["mem", "scratch"]
    assert [t.array_id for t in alice.sources["scratch"].tensors] == ["scratch/@fields/private"]


def test_a_notebooks_upload_opens_in_the_token_less_browser(browser, writable):
    """Local mode: a notebook that follows the reference README (``token="your-token"``) owns
    what it uploads, and nothing more: the Tensor Browser, which presents no token, lists and
    reads the result; only the notebook discards it."""
    notebook = client_for(writable, token="your-token")
    arr = np.arange(40 * 50, dtype=np.uint16).reshape(40, 50)
    desc = notebook.setup_array_upload("zarr://scratch/@fields/segmented", arr, chunk_shape=(20, 25))
    assert notebook.upload_array(desc, arr)["state"] == "READY"

    viewer = client_for(writable)
    sl = browser.sources.SourceList(_Connection(viewer))
    sl.refresh()
    assert [s["source_id"] for s in sl.levels[""]["sources"]] == ["mem", "scratch"]
    tensor = sl.sources["scratch"].tensors[0]
    assert tensor.array_id == desc.array_id
    levels = browser.tensor_utils.build_pyramid_levels(viewer, "scratch", tensor.array_id, tensor)
    np.testing.assert_array_equal(levels[0].compute(), arr)
    with pytest.raises(flight.FlightUnauthorizedError, match="is an upload whose chunks"):
        viewer.set_upload_status(desc, "DISCARDED")
    assert notebook.set_upload_status(desc, "DISCARDED")["state"] == "DISCARDED"


def label_sets(client, image_id):
    """The label sets of image ``image_id``, by the rule the biopb clients share (the browser's
    ``split_label_array_id``: the last ``@labels`` segment with a name after it files a tensor
    under the image named before it), over the source's listed tensors."""
    from biopb_napari_widget._labels import split_label_array_id

    source_id = image_id.split("/", 1)[0]
    rows = client.query(f"SELECT tensors FROM sources WHERE source_id = '{source_id}'").to_pylist()
    listed = [t["array_id"] for t in rows[0]["tensors"]] if rows else []
    return [i for i in listed if (a := split_label_array_id(i)) is not None and a.image_array_id == image_id]


def _browser_groups(tensors):
    """image array_id -> its label sets' ids, as the browser's tree files a source's tensors
    (``_widget._group_tensors``, which imports Qt, on the rule of ``_labels``); a source with
    one group opens its image on a double click (``_sole_image``)."""
    from biopb_napari_widget._labels import split_label_array_id

    groups = {t.array_id: [] for t in tensors if split_label_array_id(t.array_id) is None}
    for t in tensors:
        address = split_label_array_id(t.array_id)
        if address is not None:
            groups.setdefault(address.image_array_id, []).append(t.array_id)
    return groups


@pytest.fixture
def ome_with_labels(tmp_path, monkeypatch):
    """An OME-Zarr (0.5 µm pixels) with a label image ``labels/nuclei``, written by ome-zarr-py."""
    import zarr
    from ome_zarr.writer import write_image, write_labels

    monkeypatch.setenv("HOME", str(tmp_path))
    root = tmp_path / "ome"
    root.mkdir()
    image = np.random.default_rng(5).integers(0, 4000, (64, 96), dtype=np.uint16)
    nuclei = np.zeros((64, 96), np.uint32)
    nuclei[10:30, 20:50], nuclei[40:60, 60:90] = 1, 2
    group = zarr.open_group(str(root / "cells.ome.zarr"), mode="w")
    write_image(
        image,
        group,
        axes="yx",
        scale_factors=(2,),
        scale={"y": 0.5, "x": 0.5},
        axes_units={"y": "micrometer", "x": "micrometer"},
    )
    write_labels(nuclei, group, name="nuclei", axes="yx", scaler=None, scale_factors=(2,))  # no scale of its own
    cat = Catalog([root])
    cat.scan()
    with serving(cat, write_dir=str(tmp_path / "ome-write"), writable=True) as srv:
        yield client_for(srv), cat.records()[0].source_id, image, nuclei
    cat.close()


def test_a_stored_label_image_is_listed_as_a_label_set_of_its_image(browser, ome_with_labels):
    client, sid, image, nuclei = ome_with_labels
    sl = browser.sources.SourceList(_Connection(client))
    sl.refresh()
    # the one root's source sits at the top, no folder to open first
    assert sl.levels[""]["folders"] == [] and [s["source_id"] for s in sl.levels[""]["sources"]] == [sid]
    tensors = sl.sources[sid].tensors
    assert [t.array_id for t in tensors] == [f"{sid}/image", f"{sid}/image/@labels/nuclei"]
    # the browser files the set under its image: one group, so a double click opens the image
    assert _browser_groups(tensors) == {f"{sid}/image": [f"{sid}/image/@labels/nuclei"]}
    assert label_sets(client, f"{sid}/image") == [f"{sid}/image/@labels/nuclei"]
    np.testing.assert_array_equal(client.get_array(f"{sid}/image/@labels/nuclei"), nuclei)
    np.testing.assert_array_equal(client.get_array(f"{sid}/image"), image)
    # the id the store's path gave it before still reads the set; it is not listed
    old = f"{sid}/labels/nuclei"
    assert client.get_descriptor(old).array_id == old
    np.testing.assert_array_equal(client.get_array(old, (slice(0, 32), slice(0, 96))), nuclei[:32])
    # an upload cannot take the stored set's name
    with pytest.raises(flight.FlightServerError, match="label image the file stores"):
        client.setup_array_upload(f"zarr://{sid}/image/@labels/Nuclei", nuclei)


@pytest.fixture
def tiff_image(tmp_path, monkeypatch):
    """One single-tensor source (a 2-channel ImageJ TIFF of 0.5 µm pixels) on a writable server."""
    import tifffile

    monkeypatch.setenv("HOME", str(tmp_path))
    root = tmp_path / "tiff"
    root.mkdir()
    image = np.random.default_rng(7).integers(0, 4000, (2, 40, 56), dtype=np.uint16)
    tifffile.imwrite(
        root / "cells.tif", image, imagej=True, resolution=(2.0, 2.0), metadata={"unit": "um", "axes": "CYX"}
    )
    cat = Catalog([root])
    cat.scan()
    with serving(cat, write_dir=str(tmp_path / "tiff-write"), writable=True) as srv:
        yield client_for(srv), cat.records()[0].source_id, image
    cat.close()


def test_an_uploaded_label_set_leaves_a_single_tensor_image_its_id(browser, tiff_image):
    client, sid, image = tiff_image
    nuclei = np.zeros(image.shape[1:], np.uint32)
    nuclei[5:15, 10:30] = 4
    desc = client.setup_array_upload(f"zarr://{sid}/@labels/nuclei", nuclei)
    client.upload_array(desc, nuclei)
    assert desc.array_id == f"{sid}/@labels/nuclei"
    sl = browser.sources.SourceList(_Connection(client))
    sl.refresh()
    assert [s["source_id"] for s in sl.levels[""]["sources"]] == [sid]  # the one root's file, at the top
    tensors = sl.sources[sid].tensors
    assert [t.array_id for t in tensors] == [sid, f"{sid}/@labels/nuclei"]  # not '<sid>/' beside the set
    assert _browser_groups(tensors) == {sid: [f"{sid}/@labels/nuclei"]}  # one image, its set under it
    assert label_sets(client, sid) == [f"{sid}/@labels/nuclei"]
    desc0 = tensors[0]
    levels = browser.tensor_utils.build_pyramid_levels(client, sid, desc0.array_id, desc0)
    np.testing.assert_array_equal(levels[0].compute(), image)  # the browser opens the image by its listed id


def test_label_sets_carry_their_images_physical_scale(browser, tiff_image, ome_with_labels):
    """napari scales each layer by its own physical size: a set without its image's would be
    drawn at another size (twice the image's, beside 0.5 µm pixels)."""
    client, sid, image = tiff_image
    assert client.get_physical_scale(sid) == ([0.0, 0.5, 0.5], ["", "µm", "µm"])  # c has no size
    for name, labels in (("yx", np.zeros(image.shape[1:], np.uint32)), ("cyx", np.zeros(image.shape, np.uint8))):
        desc = client.setup_array_upload(f"zarr://{sid}/@labels/{name}", labels)
        client.upload_array(desc, labels)
        assert client.get_physical_scale(desc.array_id) == (
            [0.5] * 2 if name == "yx" else [0.0, 0.5, 0.5],
            ["µm"] * 2 if name == "yx" else ["", "µm", "µm"],
        )
    scale, _ = browser.tensor_utils.build_layer_scale(client, sid, 2, tensor_id=f"{sid}/@labels/yx")
    assert list(scale) == [0.5, 0.5]  # the scale napari gives the layer
    # stored: ome-zarr-py wrote the label image with the identity transform (scale 1, no unit)
    client, sid, _, _ = ome_with_labels
    assert client.get_physical_scale(f"{sid}/image") == ([0.5, 0.5], ["µm", "µm"])
    assert client.get_physical_scale(f"{sid}/image/@labels/nuclei") == ([0.5, 0.5], ["µm", "µm"])
