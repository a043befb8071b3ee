"""Owners and read-only servers (``service/access.py``), through the real biopb SDK: an upload
belongs to whoever created it; a ``--read-only`` server refuses every verb that writes."""

from __future__ import annotations

import numpy as np
import pyarrow.flight as flight
import pytest
from biopb.tensor import TensorFlightClient

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.testing import serving

ARR = np.arange(8 * 6, dtype=np.uint16).reshape(8, 6)


@pytest.fixture
def catalog():
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(ARR, "yx"), source_id="img"))
    cat.first_scan_done.set()
    yield cat
    cat.close()


def _private_upload(srv, name, token):
    """A READY upload given a read grant on purpose (an in-process producer's private one):
    ``token`` owns it and alone reads it."""
    from tensor_server.service.access import grant_digest

    manager = srv.runtime.uploads
    digest = grant_digest(token)
    up = manager.add_tensor(f"cache://img/@fields/{name}", ARR.shape, ARR.dtype, owner=digest, grant=digest)
    manager.set_ready(up.array_id, holes_are_fill=True)
    return up.array_id


def test_an_upload_belongs_to_whoever_created_it(catalog, tmp_path):
    """Local mode (no server token): alice's token makes her the upload's owner, not its read
    grant. Only she writes, publishes or discards it (PERMISSION_DENIED to anyone else); once
    READY everyone reads it, as any served file, the token-less Tensor Browser included."""
    with serving(catalog, write_dir=str(tmp_path / "w"), writable=True) as srv:
        alice, bob, anon = (TensorFlightClient(srv.location, token=t) for t in ("alice", "bob", None))
        desc = alice.setup_array_upload("cache://img/@fields/mine", ARR, chunk_shape=(4, 6))
        for other in (bob, anon):
            with pytest.raises(flight.FlightUnauthorizedError, match="is an upload whose chunks"):
                other.upload_array(desc, ARR)
            for state in ("READY", "DISCARDED"):  # a write of it: only its owner's
                with pytest.raises(flight.FlightUnauthorizedError, match=f"{desc.array_id} is an upload whose chunks"):
                    other.set_upload_status(desc.array_id, state)
        assert srv.runtime.uploads.get(desc.array_id).status()["uploaded_chunks"] == 0
        assert alice.upload_array(desc, ARR)["state"] == "READY"
        for reader in (alice, bob, anon):
            np.testing.assert_array_equal(reader.get_array(desc.array_id), ARR)
            listed = reader.query(
                "SELECT unnest(tensors).array_id AS a FROM sources WHERE source_id = 'img'", format="records"
            )
            assert {"a": desc.array_id} in listed
        for other in (bob, anon):
            with pytest.raises(flight.FlightUnauthorizedError, match="is an upload whose chunks"):
                other.set_upload_status(desc.array_id, "DISCARDED")
        assert alice.set_upload_status(desc.array_id, "DISCARDED")["state"] == "DISCARDED"


def test_a_private_upload_is_its_grant_holders_alone(catalog, tmp_path):
    """A read grant given on purpose: a stranger reads nothing of it, its status included;
    its writes are the owner's (PERMISSION_DENIED, nothing of its state or grid)."""
    with serving(catalog, write_dir=str(tmp_path / "w"), writable=True) as srv:
        array_id = _private_upload(srv, "private", "alice")
        alice, bob, anon = (TensorFlightClient(srv.location, token=t) for t in ("alice", "bob", None))
        np.testing.assert_array_equal(alice.get_array(array_id), np.zeros_like(ARR))
        for other in (bob, anon):
            with pytest.raises(flight.FlightUnauthenticatedError, match="capability token"):
                other.get_array(array_id)
            assert other.get_upload_status(array_id)["state"] == "UNKNOWN"  # the SDK's word for a refused describe
            with pytest.raises(flight.FlightUnauthorizedError, match="is an upload whose chunks") as refused:
                other.set_upload_status(array_id, "DISCARDED")
            assert "READY" not in str(refused.value) and str(list(ARR.shape)) not in str(refused.value)
        assert alice.get_upload_status(array_id)["state"] == "READY"
        np.testing.assert_array_equal(anon.get_array("img"), ARR)  # what carries no grant stays open


def test_ownership_survives_a_restart(catalog, tmp_path):
    wd = str(tmp_path / "w")
    with serving(catalog, write_dir=wd, writable=True) as srv:
        alice = TensorFlightClient(srv.location, token="alice")
        desc = alice.setup_array_upload("cache://img/@fields/kept", ARR)
        alice.upload_array(desc, ARR)
        private = _private_upload(srv, "secret", "alice")
    with serving(catalog, write_dir=wd, writable=True) as srv:
        alice, bob = (TensorFlightClient(srv.location, token=t) for t in ("alice", "bob"))
        np.testing.assert_array_equal(bob.get_array(desc.array_id), ARR)
        with pytest.raises(flight.FlightUnauthorizedError, match="is an upload whose chunks"):
            bob.set_upload_status(desc.array_id, "DISCARDED")
        with pytest.raises(flight.FlightUnauthenticatedError, match="capability token"):
            bob.get_array(private)
        np.testing.assert_array_equal(alice.get_array(private), np.zeros_like(ARR))
        assert alice.set_upload_status(desc.array_id, "DISCARDED")["state"] == "DISCARDED"


def test_an_upload_kept_from_before_owners_and_grants_stays_private(catalog, tmp_path):
    """A marker written when the owner's token was also the read grant (no ``grant`` key) is
    adopted as it was created: private to that token."""
    import json

    from tensor_server.uploads.marker import MARKER_KEY

    wd = tmp_path / "w"
    with serving(catalog, write_dir=str(wd), writable=True) as srv:
        alice = TensorFlightClient(srv.location, token="alice")
        desc = alice.setup_array_upload("cache://img/@fields/older", ARR)
        alice.upload_array(desc, ARR)
    descriptor = wd / "fields" / "img" / "older" / "descriptor.json"
    doc = json.loads(descriptor.read_text())
    assert doc[MARKER_KEY].pop("grant") == ""  # made over the wire: no read grant
    descriptor.write_text(json.dumps(doc))
    with serving(catalog, write_dir=str(wd), writable=True) as srv:
        with pytest.raises(flight.FlightUnauthenticatedError, match="capability token"):
            TensorFlightClient(srv.location, token="bob").get_array(desc.array_id)
        np.testing.assert_array_equal(TensorFlightClient(srv.location, token="alice").get_array(desc.array_id), ARR)


def test_with_a_server_token_a_stranger_cannot_create_or_touch_uploads(catalog, tmp_path):
    with serving(catalog, token="s3cret", write_dir=str(tmp_path / "w"), writable=True) as srv:
        owner = TensorFlightClient(srv.location, token="s3cret")
        desc = owner.setup_array_upload("cache://img/@fields/served", ARR)
        stranger = TensorFlightClient(srv.location, token="wrong")
        with pytest.raises(flight.FlightUnauthenticatedError):
            stranger.setup_array_upload("cache://img/@fields/theirs", ARR)
        with pytest.raises(Exception, match="unauthenticated"):
            stranger.upload_array(desc, ARR)
        assert owner.upload_array(desc, ARR)["state"] == "READY"


def test_a_read_only_server_refuses_every_write(catalog, tmp_path):
    from biopb.tensor.descriptor_pb2 import AddSourceRequest

    with serving(catalog, read_only=True, write_dir=str(tmp_path / "w"), writable=True) as srv:
        raw = flight.FlightClient(srv.location)
        listed = {a.type for a in raw.list_actions()}
        assert not listed & {"add_tensor", "set_upload_status", "add_source", "remove_source"}
        assert {"health", "tensor_stats", "catalog_children"} <= listed
        body = AddSourceRequest(url=str(tmp_path)).SerializeToString()
        with pytest.raises(flight.FlightServerError, match="--read-only"):
            list(raw.do_action(flight.Action("add_source", body)))
        sdk = TensorFlightClient(srv.location)
        with pytest.raises(Exception, match="read-only|--writable"):
            sdk.setup_array_upload("cache://img/@fields/x", ARR)
        from biopb.image.annotation_pb2 import RoiAnnotation
        from biopb.image.roi_pb2 import ROI

        roi = ROI()
        roi.point.x, roi.point.y = 1, 1
        with pytest.raises(Exception, match="--read-only"):
            sdk.put_rois("img", [RoiAnnotation(roi=roi, roi_id="a")])
        np.testing.assert_array_equal(sdk.get_array("img"), ARR)


def test_no_add_source_refuses_by_rule(catalog, tmp_path):
    from biopb.tensor.descriptor_pb2 import AddSourceRequest

    with serving(catalog, add_source=False) as srv:
        body = AddSourceRequest(url=str(tmp_path)).SerializeToString()
        with pytest.raises(flight.FlightUnauthorizedError, match="--no-add-source"):
            list(flight.FlightClient(srv.location).do_action(flight.Action("add_source", body)))


@pytest.mark.parametrize("private", [False, True])
def test_a_chunk_write_by_another_is_permission_denied(catalog, tmp_path, private):
    """The write verb itself, not only the plan before it: a DoPut of alice's planned chunk
    by bob is PERMISSION_DENIED, naming the upload and why (nothing of its state or grid),
    whether bob may read the upload or it is private."""
    with serving(catalog, write_dir=str(tmp_path / "w"), writable=True) as srv:
        if private:
            from tensor_server.service.access import grant_digest

            up = srv.runtime.uploads.add_tensor(
                "cache://img/@fields/solo",
                ARR.shape,
                ARR.dtype,
                owner=grant_digest("alice"),
                grant=grant_digest("alice"),
            )
            array_id = up.array_id
        else:
            array_id = (
                TensorFlightClient(srv.location, token="alice")
                .setup_array_upload("cache://img/@fields/solo", ARR)
                .array_id
            )
        from biopb.tensor import descriptor_pb2, ticket_pb2

        opt = descriptor_pb2.TensorReadOption(array_id=array_id)
        opt.fields.paths.append("endpoints")
        headers = lambda t: flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {t}".encode())])  # noqa: E731
        raw = flight.FlightClient(srv.location)
        info = raw.get_flight_info(
            flight.FlightDescriptor.for_command(descriptor_pb2.FlightRequest(tensor_read=opt).SerializeToString()),
            headers("alice"),
        )
        chunk_id = ticket_pb2.TensorTicket.FromString(info.endpoints[0].ticket.ticket).chunk_id
        cmd = ticket_pb2.PutCommand(chunk_ticket=ticket_pb2.TensorTicket(chunk_id=chunk_id).SerializeToString())
        import pyarrow as pa

        batch = pa.record_batch([pa.array(ARR.ravel())], names=["data"])
        writer, _ = raw.do_put(
            flight.FlightDescriptor.for_command(cmd.SerializeToString()), batch.schema, headers("bob")
        )
        with pytest.raises(
            flight.FlightUnauthorizedError,
            match=f"{array_id} is an upload whose chunks and status only its owner writes",
        ) as refused:
            writer.write_batch(batch)
            writer.close()
        assert "PENDING" not in str(refused.value) and str(list(ARR.shape)) not in str(refused.value)
        assert srv.runtime.uploads.get(array_id).status()["uploaded_chunks"] == 0


def test_annotations_carry_their_writer(catalog, tmp_path):
    """A client changes and deletes only the rows it wrote; the server token, any row; who wrote
    a row is not in the ``rois`` table clients query."""
    from biopb.image.annotation_pb2 import RoiAnnotation
    from biopb.image.roi_pb2 import ROI

    def roi(roi_id):
        r = ROI()
        r.point.x, r.point.y = 1, 2
        return RoiAnnotation(roi=r, roi_id=roi_id)

    with serving(catalog) as srv:
        alice, bob = (TensorFlightClient(srv.location, token=t) for t in ("alice", "bob"))
        alice.put_rois("img", [roi("a1"), roi("a2")])
        bob.put_rois("img", [roi("b1")])
        with pytest.raises(Exception, match="stored by another client"):
            bob.put_rois("img", [roi("a1")])
        with pytest.raises(
            flight.FlightUnauthorizedError,
            match=r"roi_delete on img: a1 were stored by another "
            "client; .* nothing was deleted",
        ):
            bob.delete_rois("img", ["a1", "b1"])  # by id: another's row is refused, never skipped in silence
        assert bob.delete_rois("img", ["b1", "gone"]).deleted == ["b1"]  # an id no one holds is no one's
        assert sorted(r.roi_id for r in alice.list_rois("img").rois) == ["a1", "a2"]
        assert bob.delete_rois("img").deleted == []  # "all of mine": none left
        columns = alice.query("SELECT * FROM rois LIMIT 1").column_names
        assert "writer" not in columns and "roi_id" in columns
    with serving(catalog, token="s3cret") as srv:
        admin = TensorFlightClient(srv.location, token="s3cret")
        assert sorted(admin.delete_rois("img").deleted) == ["a1", "a2"]
