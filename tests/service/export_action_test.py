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
    return [
        json.loads(r.body.to_pybytes()) for r in client.do_action(flight.Action("export", json.dumps(body).encode()))
    ]


def test_export_streams_progress_and_writes_under_the_write_dir(served):
    import zarr

    records = _export(served, {"array_id": "img", "dest": "img.ome.zarr", "options": {"levels": 2, "codec": "zstd"}})
    kinds = [r.get("event") or r.get("kind") or r.get("type") for r in records]
    assert kinds[0] == "start" and kinds[-1] == "done" and "unit" in kinds
    out = served.runtime.uploads.write_dir / "exports" / "img.ome.zarr"
    group = zarr.open_group(str(out), mode="r")
    np.testing.assert_array_equal(group["0"][...], IMAGE)
    np.testing.assert_array_equal(
        group["1"][...], served.runtime.engine.read(served.runtime.catalog.find_tensor("img")[0], None, (2, 2), "area")
    )


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


# ---- bounds at the service floor: a client that leaves, concurrent exports, options ----------
class SlowChunks:
    """Every chunk an export encodes, counted, each ``delay`` seconds slower: with 1 ms, one
    4096² unit of 64² chunks (5120 chunks over two levels) lasts seconds, long enough to leave in."""

    def __init__(self) -> None:
        self.encoded: list[int] = []  # appended from the writer threads (atomic)
        self.delay = 0.001


@pytest.fixture
def slow_chunks(monkeypatch):
    import time

    from tensor_server.export.chunk_files import ChunkFiles

    slow = SlowChunks()
    real = ChunkFiles._chunk

    def counted(self, piece):
        slow.encoded.append(1)
        time.sleep(slow.delay)
        return real(self, piece)

    monkeypatch.setattr(ChunkFiles, "_chunk", counted)
    return slow


@pytest.fixture
def big(tmp_path):
    """Two 4096² units (4096 x 8192 uint16, computed per read: no pixels held)."""
    from tests.export.helpers import GeneratedPlane

    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(IMAGE, "yx", chunk_shape=(128, 96)), source_id="img"))
    cat.add_source(MemorySource(GeneratedPlane((4096, 8192)), source_id="big"))
    cat.first_scan_done.set()
    with serving(cat, write_dir=str(tmp_path / "w"), writable=True) as srv:
        yield srv
    cat.close()


BIG = {
    "array_id": "big",
    "dest": "big.zarr",
    "options": {"levels": 2, "chunks": [64, 64], "shards": [4096, 4096], "codec": "zstd"},
}


def _leave_when(srv, body, until, then=lambda: True):
    """Start the action, read its results until ``until(records)``, wait for ``then()``, and
    leave: the result stream is dropped and the client closed, as a client process that exits."""
    client = flight.FlightClient(srv.location)
    stream = client.do_action(flight.Action("export", json.dumps(body).encode()))
    records = []
    for result in stream:
        records.append(json.loads(result.body.to_pybytes()))
        if until(records):
            break
    assert _wait_for(then)
    del stream, result
    client.close()
    return records


def _wait_for(condition, seconds=5.0):
    import time

    end = time.monotonic() + seconds
    while not condition() and time.monotonic() < end:
        time.sleep(0.02)
    return condition()


def test_a_client_that_leaves_mid_unit_stops_its_export_and_resume_continues_it(big, slow_chunks):
    """The client leaves while the second unit's chunks are being encoded: the export stops
    within that unit (nowhere near its 5120 chunks), its thread ends, only the first unit is
    recorded; the same body with "mode": "resume" finishes from there."""
    import zarr

    per_unit = 4096 + 1024
    records = _leave_when(
        big, BIG, until=lambda rs: rs[-1].get("event") == "unit", then=lambda: len(slow_chunks.encoded) >= per_unit + 50
    )  # into the second unit
    assert [r["event"] for r in records] == ["start", "unit"] and records[0]["units_total"] == 2
    assert _wait_for(lambda: big.runtime.metrics.exports_running == 0)  # the export's thread ended
    stopped_at = len(slow_chunks.encoded)
    assert stopped_at < per_unit * 1.5, stopped_at
    staging = big.runtime.uploads.write_dir / "exports" / "big.zarr.partial"
    assert len((staging / ".export-progress.jsonl").read_text().splitlines()) == 2  # header + the first unit
    assert len(slow_chunks.encoded) == stopped_at  # nothing more is encoded once stopped
    slow_chunks.delay = 0
    done = _export(big, {**BIG, "options": {**BIG["options"], "mode": "resume"}})[-1]
    assert done["event"] == "done" and done["units_resumed"] == 1
    group = zarr.open_group(str(big.runtime.uploads.write_dir / "exports" / "big.zarr"), mode="r")
    tensor = big.runtime.catalog.find_tensor("big")[0]
    np.testing.assert_array_equal(group["1"][...], big.runtime.engine.read(tensor, None, (2, 2), "area"))


def test_a_third_export_is_overloaded_and_a_second_to_the_same_dest_refused(big, slow_chunks):
    """Two exports run; a third is UNAVAILABLE naming the limit (retryable), and is served
    once one has stopped. An export to a destination another is writing is refused."""
    from tensor_server.service.export_verb import MAX_RUNNING

    assert MAX_RUNNING == 2
    clients = [flight.FlightClient(big.location) for _ in range(2)]
    streams = [
        c.do_action(flight.Action("export", json.dumps({**BIG, "dest": f"b{i}.zarr"}).encode()))
        for i, c in enumerate(clients)
    ]
    assert [json.loads(next(s).body.to_pybytes())["event"] for s in streams] == ["start", "start"]
    assert big.runtime.metrics.exports_running == 2
    with pytest.raises(
        flight.FlightUnavailableError,
        match=r"2 exports are running on this server, the most it "
        r"runs at once \(2\); retry when one has finished",
    ):
        _export(big, {"array_id": "img", "dest": "small.zarr"})
    del streams
    for c in clients:
        c.close()
    assert _wait_for(lambda: big.runtime.metrics.exports_running == 0)
    client = flight.FlightClient(big.location)
    first = client.do_action(flight.Action("export", json.dumps(BIG).encode()))
    assert json.loads(next(first).body.to_pybytes())["event"] == "start"
    with pytest.raises(flight.FlightServerError, match="big.zarr: another export to it is running"):
        _export(big, {**BIG, "options": {**BIG["options"], "mode": "overwrite"}})
    del first
    client.close()
    assert _wait_for(lambda: big.runtime.metrics.exports_running == 0)
    assert _export(big, {"array_id": "img", "dest": "small.zarr"})[-1]["event"] == "done"


@pytest.mark.parametrize(
    "options,match",
    [
        ({"resume": True}, 'export option \'resume\' is spelled "mode": "resume"'),
        ({"overwrite": True}, 'export option \'overwrite\' is spelled "mode": "overwrite"'),
        ({"workers": 8}, r"workers 8 is more than a server's export may use \(4\)"),
        ({"chunks": [1, 1]}, r"chunks \[1, 1\]: the y edge 1 is below the minimum of 64 pixels"),
        ([1, 2], "export options must be a JSON object"),
    ],
)
def test_bad_options_are_invalid_argument_naming_the_option(served, options, match):
    with pytest.raises(flight.FlightServerError, match=match) as info:
        _export(served, {"array_id": "img", "dest": "bad.zarr", "options": options})
    assert "INVALID_ARGUMENT" in str(info.value.extra_info) or "invalid_argument" in str(info.value.extra_info)
    assert not (served.runtime.uploads.write_dir / "exports" / "bad.zarr").exists()
