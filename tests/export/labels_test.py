"""Label images: an OME-Zarr source's ``labels/`` (and label sets uploaded onto an image) are
written under the export's ``labels/<name>``, every level the engine's ``mode`` read of the
label tensor on the image's levels, with ``image-label`` metadata that ome-zarr-models
validates (0.5 and 0.4) and ome-zarr-py's Reader follows; which label tensors belong to
which image is the rule of export/sources.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from tensor_server.adapters.memory import ArrayAdapter
from tensor_server.core.engine import ReadEngine
from tensor_server.export import ExportOptions, export_tensor
from tensor_server.export.sources import label_images, open_export_source
from tests.export.helpers import run_cli, write_cells


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    """A 2-channel 300x413 OME-Zarr (NGFF 0.4) with one label image ``cells`` (y, x)."""
    path = tmp_path_factory.mktemp("src") / "cells.ome.zarr"
    write_cells(path)
    return path


@pytest.mark.parametrize("ngff", ["0.5", "0.4"])
def test_labels_are_written_beside_the_image_and_validate(cells, tmp_path, ngff):
    dest = tmp_path / "out.zarr"
    with open_export_source(str(cells)) as src:
        assert sorted(src.labels) == ["cells"] and src.skipped == []
        summary = export_tensor(src.tensor, dest, ExportOptions(levels=3, ngff=ngff), labels=src.labels)
        label = src.labels["cells"]
        expected = [ReadEngine().read(label, None, (2**k, 2**k), "mode") for k in range(3)]
        image0 = src.tensor.get_data()
    assert summary["labels"] == {"cells": [[300, 413], [150, 207], [75, 104]]}
    group = zarr.open_group(str(dest), mode="r")
    for k in range(3):
        np.testing.assert_array_equal(group[f"labels/cells/{k}"][...], expected[k], err_msg=f"label level {k}")
    np.testing.assert_array_equal(group["0"][...], image0)
    if ngff == "0.5":
        from ome_zarr_models.v05.image import Image
    else:
        from ome_zarr_models.v04.image import Image
    image = Image.from_zarr(group)  # validates the image, labels/ and each label image (levels match)
    assert image.labels is not None
    listed = image.labels.attributes.ome.labels if ngff == "0.5" else image.labels.attributes.labels
    assert list(listed) == ["cells"]
    attrs = group["labels/cells"].attrs.asdict()
    block = attrs["ome"]["image-label"] if ngff == "0.5" else attrs["image-label"]
    assert block["source"] == {"image": "../../"}
    assert "omero" not in (attrs.get("ome") or attrs)


def test_ome_zarr_py_reader_follows_the_labels(cells, tmp_path):
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Label, Reader

    dest = tmp_path / "out.zarr"
    assert run_cli(str(cells), str(dest), "--levels", "2", "--progress", "none").returncode == 0
    nodes = list(Reader(parse_url(str(dest)))())
    label_nodes = [n for n in nodes if n.load(Label)]
    assert label_nodes, "the Reader found no label image"
    with open_export_source(str(cells)) as src:
        np.testing.assert_array_equal(np.asarray(label_nodes[0].data[0]), src.labels["cells"].get_data())


def test_no_labels_leaves_them_out(cells, tmp_path):
    dest = tmp_path / "out.zarr"
    done = run_cli(str(cells), str(dest), "--levels", "2", "--no-labels", "--progress", "json")
    assert done.returncode == 0, done.stderr
    assert not (dest / "labels").exists()
    assert json.loads(done.stdout.splitlines()[0])["labels"] == []


def _t(shape, labels, is_labels=False):
    return ArrayAdapter(np.zeros(shape, np.uint16), labels, is_labels=is_labels)


def test_which_label_tensors_belong_to_which_image():
    image, other = _t((2, 8, 9), "cyx"), _t((8, 9), "yx")
    fields = {
        "image": image,
        "other": other,
        "labels/root": _t((8, 9), "yx", True),  # top level: the default image's
        "image/@labels/uploaded": _t((1, 8, 9), "cyx", True),  # a label set uploaded onto it
        "other/labels/theirs": _t((8, 9), "yx", True),  # another image's
        "image/labels/wide": _t((8, 10), "yx", True),  # a different extent: left out, with why
        "image/labels/plain": _t((8, 9), "yx"),  # not a label tensor
    }
    mine = label_images(fields, "image", image)
    assert sorted(mine.labels) == ["root", "uploaded"]
    assert mine.skipped == [{"name": "wide", "reason": "its x extent 10 is not the image's 9"}]
    assert sorted(label_images(fields, "other", other).labels) == ["theirs"]
