"""A label set on an uploaded field; the cache:// localhost fast path from the member's own
sealed segments; the read gate on chunk_locate; the `make run` upload snippet."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.flight as flight
import pytest
from biopb.tensor import TensorFlightClient
from biopb.tensor._upload import _plan_write
from biopb.tensor.ticket_pb2 import TensorTicket

from tests.uploads.conftest import upload_server


def test_label_set_on_an_uploaded_field(client, server):
    img = np.random.default_rng(0).integers(0, 4000, (2, 30, 40), dtype=np.uint16)
    field = client.setup_array_upload("zarr://scratch/@fields/img", img, dim_labels=["c", "y", "x"])
    client.upload_array(field, img)
    labels = np.zeros((30, 40), np.uint32)
    labels[5:15, 10:30] = 3
    block = {"image-label": {"version": "0.4", "source": {"image": "../../"}}}
    desc = client.setup_array_upload("zarr://scratch/@fields/img/@labels/cells", labels, ome_metadata=block)
    assert desc.array_id == "scratch/@fields/img/@labels/cells"
    assert list(desc.dim_labels) == ["y", "x"]  # bound to the image's spatial axes
    client.upload_array(desc, labels)
    np.testing.assert_array_equal(client.get_array(desc.array_id), labels)
    # a label tensor reduces label-safely by default (mode, never a mean of ids)
    from tensor_server_kernels import reference

    np.testing.assert_array_equal(
        client.get_array(desc.array_id, scale_hint=[2, 2]), reference.downsample(labels, [2, 2], "mode")
    )
    member = server.runtime.uploads.get(desc.array_id).member.path
    attrs = json.loads((member / ".zattrs").read_text())
    assert attrs["image-label"] == block["image-label"] and attrs["tensor_server_upload"]["is_labels"] is True
    ids = [
        t["array_id"]
        for t in client.query("SELECT tensors FROM sources WHERE source_id='scratch'").to_pylist()[0]["tensors"]
    ]
    assert ids[-2:] == ["scratch/@fields/img", "scratch/@fields/img/@labels/cells"]
    with pytest.raises(flight.FlightServerError, match="must have shape"):
        client.setup_array_upload("zarr://scratch/@fields/img/@labels/bad", np.zeros((31, 40), np.uint32))
    with pytest.raises(flight.FlightServerError, match="image-label"):
        client.setup_array_upload("zarr://scratch/@fields/img/@labels/meta", labels, ome_metadata={"omero": {}})
    with pytest.raises(flight.FlightServerError, match="no tensor"):
        client.setup_array_upload("zarr://scratch/@fields/nothing/@labels/x", labels)
    with pytest.raises(flight.FlightServerError, match="label set is an OME-Zarr"):
        client.setup_array_upload("cache://scratch/@fields/img/@labels/c2", labels)
    # discarding the image takes its label sets with it
    client.set_upload_status(field.array_id, "DISCARDED")
    st = client.get_upload_status(desc.array_id)
    assert st["state"] == "DISCARDED" and "its image scratch/@fields/img was discarded" in st["reason"]
    assert not member.exists()


def test_cache_member_fast_path_maps_its_own_segments(tmp_path):
    arr = np.random.default_rng(1).integers(0, 60000, (128, 192), dtype=np.uint16)
    with upload_server(tmp_path, cache=True) as srv:
        c = TensorFlightClient(srv.location)
        desc = c.setup_array_upload("cache://scratch/@fields/fast", arr, chunk_shape=(64, 64))
        body = _plan_write(c._state, desc.array_id, None)[0].ticket  # the SDK's own write plan
        raw = flight.FlightClient(srv.location)
        with pytest.raises(flight.FlightServerError, match="PENDING"):  # the gate covers chunk_locate
            list(raw.do_action(flight.Action("chunk_locate", body)))
        c.upload_array(desc, arr)
        loc = json.loads(next(iter(raw.do_action(flight.Action("chunk_locate", body)))).body.to_pybytes())
        member = srv.runtime.uploads.get(desc.array_id).member.path
        assert loc["available"] and loc["segment_path"].startswith(str(member.resolve()))
        before_doget, cached = srv.runtime.metrics.calls()["flight"]["DoGet"], len(srv.runtime.cache)
        np.testing.assert_array_equal(TensorFlightClient(srv.location).get_array(desc.array_id), arr)
        assert srv.runtime.metrics.calls()["flight"]["DoGet"] == before_doget, (
            "every chunk mapped from the member's segment"
        )
        assert len(srv.runtime.cache) == cached == 0, "nothing copied into the chunk cache"
        tt = TensorTicket.FromString(body)
        assert tt.WhichOneof("payload") == "chunk_id"


def test_make_run_upload_snippet_works(server):
    from tensor_server.cli_banner import upload_snippet

    code = upload_snippet(server.location, None)
    scope: dict = {}
    exec(compile(code, "<snippet>", "exec"), scope)  # our own printed snippet
    assert scope["client"].get_upload_status(scope["desc"].array_id)["state"] == "DISCARDED"
    np.testing.assert_array_equal(scope["result"].shape, (512, 512))


def test_label_set_on_a_native_tensor_of_a_source(client, server):
    labels = (np.arange(20 * 24, dtype=np.uint16).reshape(20, 24) % 5).astype(np.uint16)
    # 'mem' is a single-tensor source: its tensor's id is 'mem', and the set is named under it
    desc = client.setup_array_upload("zarr://mem/img/@labels/nuclei", labels)
    assert desc.array_id == "mem/@labels/nuclei" and list(desc.dim_labels) == ["y", "x"]
    client.upload_array(desc, labels)
    np.testing.assert_array_equal(client.get_array(desc.array_id), labels)
    assert (
        server.runtime.uploads.write_dir / "fields" / "mem" / "@labels" / "%40default" / "nuclei" / ".zattrs"
    ).is_file()
    ids = [
        t["array_id"]
        for t in client.query("SELECT tensors FROM sources WHERE source_id='mem'").to_pylist()[0]["tensors"]
    ]
    # beside label sets only, the image keeps its bare id: the one its set is filed under
    assert ids == ["mem", "mem/@labels/nuclei"]
    assert client.get_array("mem", (slice(0, 2), slice(0, 20), slice(0, 24))).shape == (2, 20, 24)
    assert client.get_array("mem/@labels/nuclei", (slice(0, 8), slice(None))).shape == (8, 24)
    # what that costs (docs/uploading.md): the SDK refuses an open-ended slice of a bare id whose
    # source lists two tensors; 'mem/' names the image exactly and still reads
    with pytest.raises(ValueError, match="multiple tensors"):
        client.get_array("mem", (slice(0, 2), slice(None), slice(None)))
    assert client.get_array("mem/", (slice(0, 2), slice(None), slice(None))).shape == (2, 20, 24)
    # an attached field is another tensor of the source: the image is then listed as 'mem/'
    # (core.identity.ArrayId), so the SDK's open-ended slices read every listed id
    field = client.setup_array_upload("cache://mem/@fields/other", np.ones((4, 5), np.uint8))
    client.upload_array(field, np.ones((4, 5), np.uint8))
    ids = [
        t["array_id"]
        for t in client.query("SELECT tensors FROM sources WHERE source_id='mem'").to_pylist()[0]["tensors"]
    ]
    assert ids == ["mem/", "mem/@labels/nuclei", "mem/@fields/other"]
    assert client.get_array("mem/", (slice(0, 2), slice(None), slice(None))).shape == (2, 20, 24)
    with pytest.raises(flight.FlightServerError, match="name is taken"):
        client.setup_array_upload("zarr://mem/@labels/NUCLEI", labels)


def test_zarr_member_reads_go_through_the_chunk_cache_and_fast_path(tmp_path):
    arr = np.random.default_rng(2).integers(0, 60000, (3, 300, 400), dtype=np.uint16)
    with upload_server(tmp_path, cache=True) as srv:
        c = TensorFlightClient(srv.location)
        desc = c.setup_array_upload("zarr://scratch/@fields/cached", arr, chunk_shape=(1, 128, 128))
        c.upload_array(desc, arr)
        np.testing.assert_array_equal(c.get_array(desc.array_id), arr)  # resolved into the chunk cache
        n_chunks = len(srv.runtime.cache)
        assert n_chunks >= 1
        before = srv.runtime.metrics.calls()["flight"]["DoGet"]
        fresh = TensorFlightClient(srv.location)
        np.testing.assert_array_equal(fresh.get_array(desc.array_id), arr)
        assert (
            srv.runtime.metrics.calls()["flight"]["DoGet"] == before and len(srv.runtime.cache) == n_chunks
        )  # warm: mmap, no DoGet
        from tensor_server_kernels import reference

        got = fresh.get_array(desc.array_id, scale_hint=[1, 4, 4], reduction_method="area")
        np.testing.assert_array_equal(got, reference.downsample(arr, [1, 4, 4], "area"))
