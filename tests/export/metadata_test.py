"""The written image is standard OME-Zarr: ome-zarr-models validates its metadata (0.5 and
0.4) and ome-zarr-py's Reader opens it, with the levels, axes, scales and omero channels the
source implies."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from tensor_server.adapters.registry import open_source
from tensor_server.export import ExportOptions, export_tensor


@pytest.fixture()
def exported(testdata, tmp_path, request):
    ngff = request.param
    with open_source(testdata / "nd2/cluster.nd2") as src:
        t = src.tensor()
        export_tensor(t, tmp_path / "img.zarr", ExportOptions(levels=2, ngff=ngff))
        yield tmp_path / "img.zarr", t, ngff


@pytest.mark.parametrize("exported", ["0.5", "0.4"], indirect=True)
def test_ome_zarr_models_validates_the_image(exported):
    path, t, ngff = exported
    if ngff == "0.5":
        from ome_zarr_models.v05.image import Image
    else:
        from ome_zarr_models.v04.image import Image
    image = Image.from_zarr(zarr.open_group(str(path), mode="r"))
    ms = image.attributes.multiscales[0] if ngff == "0.4" else image.attributes.ome.multiscales[0]
    assert [a.name for a in ms.axes] == ["t", "c", "z", "y", "x"]
    assert [a.type for a in ms.axes] == ["time", "channel", "space", "space", "space"]
    assert ms.axes[3].unit == "micrometer"
    scales = [d.coordinateTransformations[0].scale for d in ms.datasets]
    assert scales[0][2:] == pytest.approx([0.5, t.physical_scale[3], t.physical_scale[4]])
    assert scales[1][3:] == pytest.approx([2 * t.physical_scale[3], 2 * t.physical_scale[4]])


@pytest.mark.parametrize("exported", ["0.5", "0.4"], indirect=True)
def test_ome_zarr_py_reader_opens_every_level(exported):
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Reader

    path, t, _ = exported
    nodes = list(Reader(parse_url(str(path)))())
    image = nodes[0]
    assert len(image.data) == 2
    assert tuple(image.data[0].shape) == t.shape
    assert tuple(image.data[1].shape) == (3, 2, 10, 16, 19)
    np.testing.assert_array_equal(np.asarray(image.data[0][1, 0]), t.get_data()[1, 0])
    attrs = zarr.open_group(str(path), mode="r").attrs.asdict()
    omero = attrs["ome"]["omero"] if "ome" in attrs else attrs["omero"]
    full = t.get_data()
    coarse_max = [int(full[:, c, :, ::2, ::2].max()) for c in range(2)]  # a lower bound of the coarsest max
    assert [ch["window"]["end"] > 0 for ch in omero["channels"]] == [m > 0 for m in coarse_max]
    assert len(omero["channels"]) == 2


def test_the_v3_image_is_sharded_with_the_shapes_asked(testdata, tmp_path):
    with open_source(testdata / "czi/mosaic_test.czi") as src:
        t = src.tensor("scene_0")
        export_tensor(
            t, tmp_path / "m.zarr", ExportOptions(levels=3, chunks=(1, 1, 1, 128, 128), shards=(1, 1, 1, 256, 512))
        )
    g = zarr.open_group(str(tmp_path / "m.zarr"), mode="r")
    assert g["0"].shards == (1, 1, 1, 256, 512) and g["0"].chunks == (1, 1, 1, 128, 128)
    codecs = g["0"].metadata.to_dict()["codecs"]
    assert codecs[0]["name"] == "sharding_indexed"
    assert g["0"].metadata.dimension_names == ("t", "c", "z", "y", "x")
