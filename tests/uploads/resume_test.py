"""A crashed uploader re-plans by name and finishes (the README's "re-plan and resume"):
``setup_array_upload`` of a PENDING upload's name with its declaration answers that upload
as it stands, to its owner only; a different declaration keeps the name taken and says what
differs. Through the biopb SDK against a real Flight door."""

from __future__ import annotations

import numpy as np
import pytest
from biopb.tensor import TensorFlightClient
from biopb.tensor.descriptor_pb2 import UploadStatus
from pyarrow import flight

from tests.uploads.conftest import upload_server

#: 16 MiB: two chunks of a zarr:// upload's transfer grid, eight of the cache:// grid asked for
ARR = np.random.default_rng(40).integers(0, 65535, (4096, 2048), dtype=np.uint16)


def _client(server, token=None):
    return TensorFlightClient(server.location, token=token) if token else TensorFlightClient(server.location)


@pytest.mark.parametrize("scheme", ["zarr", "cache"])
def test_a_crashed_uploader_replans_by_name_and_finishes_bit_identical(server, scheme):
    name = f"{scheme}://scratch/@fields/resumed-{scheme}"
    first = _client(server)
    desc = first.setup_array_upload(name, ARR, chunk_shape=(512, 2048))
    rows = desc.chunk_shape[0]
    assert ARR.shape[0] // rows >= 2  # else half an upload is none or all of it
    half = first.upload_array(desc, ARR, slice_hint=(slice(0, ARR.shape[0] // 2), slice(None)))
    assert half["state"] == "PENDING" and 0 < half["uploaded_chunks"] < half["expected_chunks"]
    first.close()  # the uploader is gone; it kept nothing but the name

    second = _client(server)
    again = second.setup_array_upload(name, ARR, chunk_shape=(512, 2048))
    assert again.array_id == desc.array_id and again.content_version == desc.content_version
    assert list(again.chunk_shape) == list(desc.chunk_shape)
    assert again.upload_status.state == UploadStatus.PENDING
    assert again.upload_status.uploaded_chunks == half["uploaded_chunks"]  # what already landed
    assert second.upload_array(again, ARR)["state"] == "READY"
    got = second.get_array(desc.array_id)
    assert got.dtype == ARR.dtype and got.tobytes() == ARR.tobytes()
    second.close()


def test_a_replan_with_another_declaration_names_the_difference(server):
    c = _client(server)
    c.setup_array_upload("zarr://scratch/@fields/declared", ARR, chunk_shape=(512, 2048))
    with pytest.raises(flight.FlightServerError, match=r"shape \[4096, 2048\] \(not \[512, 2048\]\)") as err:
        c.setup_array_upload("zarr://scratch/@fields/declared", ARR[:512], chunk_shape=(512, 2048))
    assert "already exists as" in str(err.value) and '"ALREADY_EXISTS"' in bytes(err.value.extra_info).decode()
    with pytest.raises(flight.FlightServerError, match=r"dtype <u2 \(not <f4\)"):
        c.setup_array_upload("zarr://scratch/@fields/declared", ARR.astype(np.float32), chunk_shape=(512, 2048))
    with pytest.raises(flight.FlightServerError, match=r"store format zarr \(not cache\)"):
        c.setup_array_upload("cache://scratch/@fields/declared", ARR, chunk_shape=(512, 2048))
    assert c.get_upload_status("scratch/@fields/declared")["state"] == "PENDING"  # untouched by the refusals


@pytest.mark.parametrize("private", [False, True])
def test_only_the_owner_may_replan_a_pending_upload(tmp_path, private):
    """Local mode: the token an upload was created with owns it; another token's re-plan is a
    write of someone else's upload, refused before any declaration is compared: PERMISSION_DENIED
    when bob may read the upload, the read refusal (UNAUTHENTICATED, naming neither state nor
    shape) when it is private (a read grant given on purpose, here by an in-process producer)."""
    from tensor_server.service.access import grant_digest

    with upload_server(tmp_path) as srv:
        alice, bob = _client(srv, "alice-token"), _client(srv, "bob-token")
        if private:
            digest = grant_digest("alice-token")
            srv.runtime.uploads.add_tensor(
                "cache://scratch/@fields/owned",
                ARR.shape,
                ARR.dtype,
                chunk_shape=(1024, 2048),
                owner=digest,
                grant=digest,
            )
            desc = alice.get_descriptor("scratch/@fields/owned")
            refusal = (flight.FlightUnauthenticatedError, "the token presented is neither")
        else:
            desc = alice.setup_array_upload("cache://scratch/@fields/owned", ARR, chunk_shape=(1024, 2048))
            refusal = (flight.FlightUnauthorizedError, "is an upload whose chunks")
        for arr in (ARR, ARR[:512]):  # the same declaration or not: refused before it is compared
            with pytest.raises(refusal[0], match=refusal[1]) as err:
                bob.setup_array_upload("cache://scratch/@fields/owned", arr, chunk_shape=(1024, 2048))
            assert "PENDING" not in str(err.value) and "2048" not in str(err.value)
        again = alice.setup_array_upload("cache://scratch/@fields/owned", ARR, chunk_shape=(1024, 2048))
        assert again.content_version == desc.content_version
        assert alice.upload_array(again, ARR)["state"] == "READY"


def test_ready_and_discarded_names_are_not_replanned(server):
    c = _client(server)
    desc = c.setup_array_upload("cache://scratch/@fields/done", ARR, chunk_shape=(1024, 2048))
    c.upload_array(desc, ARR)
    with pytest.raises(flight.FlightServerError, match=r"already exists as 'scratch/@fields/done' \(READY\)"):
        c.setup_array_upload("cache://scratch/@fields/done", ARR, chunk_shape=(1024, 2048))
    c.set_upload_status(desc.array_id, "DISCARDED")
    with pytest.raises(flight.FlightServerError, match="a discarded tensor until the reclaim sweep"):
        c.setup_array_upload("cache://scratch/@fields/done", ARR, chunk_shape=(1024, 2048))


def test_an_in_process_replan_needs_the_same_owner(tmp_path):
    from tensor_server.catalog import Catalog
    from tensor_server.errors import PermissionDenied
    from tensor_server.uploads import UploadManager

    cat = Catalog([])
    m = UploadManager(cat, tmp_path / "write")
    try:
        up = m.add_tensor("cache://scratch/@fields/mine", (8, 8), "<u1", owner="a" * 64)
        with pytest.raises(PermissionDenied, match="another owner"):
            m.add_tensor("cache://scratch/@fields/mine", (8, 8), "<u1", owner="b" * 64)
        assert m.add_tensor("cache://scratch/@fields/mine", (8, 8), "<u1", owner="a" * 64) is up
    finally:
        m.close()
        cat.close()
