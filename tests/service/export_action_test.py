"""The ``export`` action through Flight: progress records stream as the export goes, the image
lands under the write dir and equals the engine's reads; bad destinations are refused by name."""
from __future__ import annotations

import json

import numpy as np
import pyarrow.flight as flight
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.testing import serving

IMAGE = np.arange(256 * 192, dtype=np.uint16).reshape(256, 192)


@pytest.fixture
def served(tmp_path):
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(IMAGE, "yx", chunk_shape=(128, 96)), source_id="img"))
    cat.first_scan_done.set()
    with serving(cat, write_dir=str(tmp_path / "w"), writable=True) as srv:
        yield srv
    cat.close()


def _export(srv, body):
    client = flight.FlightClient(srv.location)
    return [json.loads(r.body.to_pybytes()) for r in client.do_action(flight.Action("export", json.dumps(body).encode()))]


def test_export_streams_progress_and_writes_under_the_write_dir(served):
    import zarr

    records = _export(served, {"array_id": "img", "dest": "img.ome.zarr", "options": {"levels": 2, "codec": "zstd"}})
    kinds = [r.get("event") or r.get("kind") or r.get("type") for r in records]
    assert kinds[0] == "start" and kinds[-1] == "done" and "unit" in kinds
    out = served.runtime.uploads.write_dir / "exports" / "img.ome.zarr"
    group = zarr.open_group(str(out), mode="r")
    np.testing.assert_array_equal(group["0"][...], IMAGE)
    np.testing.assert_array_equal(group["1"][...], served.runtime.engine.read(
        served.runtime.catalog.find_tensor("img")[0], None, (2, 2), "area"))


@pytest.mark.parametrize("dest", ["../escape", "/etc/x", "", "a/b"])
def test_a_destination_outside_the_write_dir_is_refused(served, dest):
    with pytest.raises(flight.FlightServerError, match="dest"):
        _export(served, {"array_id": "img", "dest": dest})


def test_export_is_not_served_without_writes(tmp_path):
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(IMAGE, "yx"), source_id="img"))
    with serving(cat) as srv:
        with pytest.raises(flight.FlightServerError, match="read-only"):
            _export(srv, {"array_id": "img", "dest": "x"})
    cat.close()


def test_exports_are_counted_in_the_metrics(tmp_path):
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(IMAGE, "yx", chunk_shape=(128, 96)), source_id="img"))
    cat.first_scan_done.set()
    with serving(cat, write_dir=str(tmp_path / "w"), writable=True, metrics_port=0) as srv:
        records = _export(srv, {"array_id": "img", "dest": "m.zarr", "options": {"levels": 1}})
        text = httpx.get(srv.metrics_url).text
    samples = {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples["tensor_server_export_bytes_total"] == records[-1]["bytes_written"] > 0
    assert samples["tensor_server_exports_running"] == 0
    cat.close()


def test_an_uploaded_label_set_is_exported_beside_its_image_by_the_action_and_by_server(tmp_path):
    """The label set uploaded onto an image (``<image>/@labels/<name>``) lands under the
    export's ``labels/<name>``, through the action and through ``export --server``."""
    import zarr
    from biopb.tensor import TensorFlightClient

    from tensor_server_kernels import reference
    from tests.export.helpers import run_cli
    from tests.uploads.conftest import upload_server

    img = np.random.default_rng(0).integers(0, 4000, (2, 30, 40), dtype=np.uint16)
    labels = np.zeros((30, 40), np.uint32)
    labels[5:15, 10:30] = 3
    with upload_server(tmp_path) as srv:
        client = TensorFlightClient(srv.location)
        field = client.setup_array_upload("zarr://scratch/@fields/img", img, dim_labels=["c", "y", "x"])
        client.upload_array(field, img)
        desc = client.setup_array_upload("zarr://scratch/@fields/img/@labels/cells", labels)
        client.upload_array(desc, labels)
        records = _export(srv, {"array_id": field.array_id, "dest": "img.ome.zarr", "options": {"levels": 2}})
        assert records[0]["labels"] == ["cells"]
        by_server = tmp_path / "by-server.zarr"
        done = run_cli(field.array_id, str(by_server), "--server", srv.location, "--levels", "2", "--progress", "none")
        assert done.returncode == 0, done.stderr
        for out in (srv.runtime.uploads.write_dir / "exports" / "img.ome.zarr", by_server):
            group = zarr.open_group(str(out), mode="r")
            np.testing.assert_array_equal(group["0"][...], img)
            np.testing.assert_array_equal(group["labels/cells/0"][...], labels)
            np.testing.assert_array_equal(group["labels/cells/1"][...], reference.downsample(labels, [2, 2], "mode"))
            assert group.attrs["ome"]["multiscales"][0]["axes"][0]["name"] == "c"
