"""Conformance details through the real biopb SDK: error reason slugs, field masks,
residency, the v3 plan descriptor, and slices past the end (clamped on purpose)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.flight as flight
import pytest
from biopb.tensor import descriptor_pb2


def _reason(server, array_id, **read):
    """The extra_info ``{"code", "reason"}`` of a GetFlightInfo refused for ``read``."""
    fields = read.pop("fields", ["endpoints"])
    sl = read.pop("slice", None)
    opt = descriptor_pb2.TensorReadOption(array_id=array_id, **read)
    opt.fields.paths.extend(fields)
    if sl is not None:
        opt.slice_hint.start.extend(sl[0])
        opt.slice_hint.stop.extend(sl[1])
    cmd = descriptor_pb2.FlightRequest(tensor_read=opt).SerializeToString()
    with pytest.raises(flight.FlightError) as info:
        flight.FlightClient(server.location).get_flight_info(flight.FlightDescriptor.for_command(cmd))
    return info.value, json.loads(info.value.extra_info)


@pytest.mark.parametrize(
    "read, slug",
    [
        ({"scale_hint": [2, 2, 2]}, "scale_rank"),
        ({"scale_hint": [0, 2]}, "scale_not_positive"),
        ({"slice": ([0], [3])}, "slice_rank"),
        ({"slice": ([-1, 0], [3, 3])}, "slice_negative"),
        ({"slice": ([3, 0], [2, 3])}, "slice_inverted"),
        ({"slice": ([5, 0], [9, 3])}, "slice_out_of_range"),  # starts past the 5-row end
    ],
)
def test_request_errors_carry_the_reference_slugs(server, read, slug):
    exc, info = _reason(server, "demo", **read)
    assert info == {"code": "INVALID_ARGUMENT", "reason": slug}
    assert "axis" in str(exc) or "axes" in str(exc)  # our own message stays


def test_addressing_errors_carry_the_reference_slugs(server):
    assert _reason(server, "nope")[1] == {"code": "NOT_FOUND", "reason": "unknown_source"}
    assert _reason(server, "multi/zzz")[1] == {"code": "NOT_FOUND", "reason": "unknown_field"}


def test_unknown_field_mask_path_is_refused_by_name(server, client):
    exc, info = _reason(server, "demo", fields=["pyramid", "bogus_path"])
    assert "bogus_path" in str(exc) and info["code"] == "INVALID_ARGUMENT"
    exc, _ = _reason(server, "demo", fields=["ticket_stub"])  # health says ticket_stubs: false
    assert "ticket_stub" in str(exc)
    # the SDK's own masks are all known
    d = client.get_descriptor(
        "demo", with_metadata=True, with_pyramid=True, with_read_plan=True, with_residency=True, with_upload_status=True
    )
    assert list(d.shape) == [5, 7]


def test_residency_is_answered_when_asked(server, client, generated_root):
    d = client.get_descriptor("demo", with_residency=True)
    assert d.HasField("is_resident") and d.is_resident is True
    assert not client.get_descriptor("demo").HasField("is_resident")
    sid = client.query("SELECT source_id FROM sources WHERE source_url LIKE '%arr.npy'", format="records")[0][
        "source_id"
    ]
    assert client.get_descriptor(sid, with_residency=True).is_resident is True
    rec = server.runtime.catalog.get_record(sid)
    moved = generated_root / "arr.npy.away"
    (generated_root / "arr.npy").rename(moved)
    try:
        assert rec.is_resident() is False
    finally:
        moved.rename(generated_root / "arr.npy")


def test_v3_plan_descriptor_does_not_echo_scale_and_method(server, client):
    opt = descriptor_pb2.TensorReadOption(array_id="multi/a", scale_hint=[1, 4, 4], reduction_method="area")
    opt.fields.paths.append("endpoints")
    info = flight.FlightClient(server.location).get_flight_info(
        flight.FlightDescriptor.for_command(descriptor_pb2.FlightRequest(tensor_read=opt).SerializeToString())
    )
    d = descriptor_pb2.TensorDescriptor.FromString(info.descriptor.command)
    assert list(d.scale_hint) == [] and d.reduction_method == ""
    assert list(d.shape) == [3, 75, 125]
    echoed = descriptor_pb2.TensorReadOption.FromString(info.app_metadata)
    assert list(echoed.scale_hint) == [1, 4, 4] and echoed.reduction_method == "area"
    np.testing.assert_array_equal(
        np.asarray(client.get_array("multi/a", scale_hint=[1, 4, 4], reduction_method="nearest")).shape, (3, 75, 125)
    )


def test_a_stop_past_the_end_is_clamped_not_refused(client):
    """A deliberate difference from the reference (which refuses it): NumPy semantics."""
    arr = (np.arange(35, dtype=np.uint16) * 3 + 1).reshape(5, 7)
    got = np.asarray(client.get_array("demo", slice_hint=(slice(3, 50), slice(0, 7))))
    np.testing.assert_array_equal(got, arr[3:50, 0:7])


def test_units_through_the_sdk(tmp_path):
    """Every unit is spelled the reference's way (µm), whether the data carries it (OME-Zarr
    axis units, an in-memory tensor's) or the server derives it from format metadata; a unit
    the server has no spelling for passes through as written."""
    import tifffile

    from tensor_server.adapters.memory import ArrayAdapter, MemorySource
    from tensor_server.catalog import Catalog
    from tensor_server.demo import _write_ome_zarr
    from tensor_server.testing import serving
    from tests.flight.conftest import client_for

    img = np.zeros((2, 64, 64), np.uint16)
    _write_ome_zarr(tmp_path / "cells.ome.zarr", img, np.zeros((64, 64), np.uint32))  # axes say "micrometer"
    tifffile.imwrite(
        tmp_path / "ij.tif",
        np.zeros((3, 32, 32), np.uint8),
        imagej=True,
        resolution=(2.0, 2.0),
        metadata={"axes": "ZYX", "unit": "micron", "spacing": 1.5},
    )
    tifffile.imwrite(
        tmp_path / "x.ome.tif",
        np.zeros((32, 32), np.uint8),
        metadata={
            "axes": "YX",
            "PhysicalSizeX": 0.25,
            "PhysicalSizeY": 0.25,
            "PhysicalSizeXUnit": "um",
            "PhysicalSizeYUnit": "um",
        },
    )
    cat = Catalog([tmp_path])
    cat.scan()
    cat.add_source(
        MemorySource(
            ArrayAdapter(
                np.zeros((4, 4), np.uint8), "yx", physical_scale=(1.0, 1.0), physical_unit=("furlong", "micrometer")
            ),
            source_id="mem",
        )
    )
    with serving(cat) as srv:
        client = client_for(srv)

        def units(name):
            rows = client.query(
                f"SELECT unnest(tensors).array_id AS a FROM sources WHERE source_url LIKE '%{name}' ORDER BY a",
                format="records",
            )
            return client.get_physical_scale(rows[0]["a"])[1]

        assert units("cells.ome.zarr") == ["", "µm", "µm"]
        assert units("ij.tif") == ["µm", "µm", "µm"]
        assert units("x.ome.tif") == ["µm", "µm"]
        assert client.get_physical_scale("mem")[1] == ["furlong", "µm"]
    cat.close()
