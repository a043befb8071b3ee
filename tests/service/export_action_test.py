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
