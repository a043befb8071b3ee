"""A stranger sees nothing of another's granted tensor: not its rows in SQL, not its entry in a
source's row, not its shape or state in a refusal; its reads are refused, and its writes are not
its (PERMISSION_DENIED: only its owner writes it).

Local mode (no server token): the control surface is open to every client on the machine, so
only the grant stands between alice's private upload and bob (or a client with no token). A
read grant is given on purpose (``service/access.py``: the SDK has no private option, so an
in-process producer creates the upload with ``grant=``); alice fills it, reads and annotates
it through the real biopb SDK, and the strangers try theirs through it, as the red-team
findings of issue 38 were made.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.testing import serving

ARR = np.arange(8 * 6, dtype=np.uint16).reshape(8, 6)
SHAPE_TEXT = str(list(ARR.shape))
LABEL = "alice's nucleus"
STRANGERS = [None, "bob"]


def _roi(label: str = LABEL):
    from biopb.image.annotation_pb2 import RoiAnnotation
    from biopb.image.roi_pb2 import ROI

    roi = ROI()
    roi.rectangle.top_left.x, roi.rectangle.top_left.y = 1, 1
    roi.rectangle.bottom_right.x, roi.rectangle.bottom_right.y = 3, 4
    return RoiAnnotation(roi=roi, label=label)


def _private_upload(served, token: str, name: str):
    """A private upload on scratch, owned by and granted to ``token``, filled and published by
    its holder through the SDK; its descriptor."""
    from tensor_server.service.access import grant_digest

    digest = grant_digest(token)
    up = served.runtime.uploads.add_tensor(
        f"zarr://scratch/@fields/{name}", ARR.shape, ARR.dtype, owner=digest, grant=digest
    )
    client = served.client(token)
    desc = client.get_descriptor(up.array_id)
    assert client.upload_array(desc, ARR)["state"] == "READY"
    return desc


@pytest.fixture
def alice(tmp_path):
    """A local-mode server where alice uploaded a private ``scratch/@fields/alice-secret``,
    annotated it and read it (a decode-rate sample); ``img`` carries no grant and one ROI by a
    client with no token. Yields (served, alice's array id)."""
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(ARR, "yx"), source_id="img"))
    cat.first_scan_done.set()
    cat.decode_rates_refresh = 0.0  # publish every sample
    try:
        with serving(cat, write_dir=str(tmp_path / "w"), writable=True) as served:
            client = served.client("alice")
            desc = _private_upload(served, "alice", "alice-secret")
            assert len(client.put_rois(desc.array_id, [_roi()]).stored) == 1
            np.testing.assert_array_equal(client.get_array(desc.array_id), ARR)
            assert cat.decode_rates.rate(desc.array_id) is not None  # the read was sampled
            served.client(None).put_rois("img", [_roi("open")])
            np.testing.assert_array_equal(served.client(None).get_array("img"), ARR)
            yield served, desc.array_id
    finally:
        cat.close()


def _tensor_ids(client, source_id: str) -> set[str]:
    rows = client.query(
        f"SELECT unnest(tensors).array_id AS array_id FROM sources WHERE source_id = '{source_id}'", format="records"
    )
    return {r["array_id"] for r in rows}


def _ids(client, table: str) -> set[str]:
    return {r["array_id"] for r in client.query(f"SELECT array_id FROM {table}", format="records")}


@pytest.mark.parametrize("token", STRANGERS)
def test_a_stranger_reads_no_annotation_of_a_granted_tensor_through_sql(alice, token):
    """The critical finding: ``SELECT * FROM rois`` with no token returned alice's rows, labels
    and geometry, while ``roi_read`` of the same tensor was refused. Both refuse now."""
    served, aid = alice
    stranger = served.client(token)
    rows = stranger.query("SELECT * FROM rois", format="records")
    assert [r["label"] for r in rows] == ["open"]  # img's row, and nothing of alice's
    assert not [r for r in rows if r["array_id"] == aid]
    with pytest.raises(Exception, match="capability token"):
        stranger.list_rois(aid)


@pytest.mark.parametrize("token", STRANGERS)
def test_a_stranger_is_listed_nothing_of_a_granted_upload(alice, token):
    """``sources`` (the scratch row's tensors), ``decode_rates``, ``resolve scratch`` and the
    catalog tree: no trace of alice's upload; what carries no grant is listed as before."""
    served, aid = alice
    stranger = served.client(token)
    assert _tensor_ids(stranger, "scratch") == set()
    assert _tensor_ids(stranger, "img") == {"img"}
    assert _ids(stranger, "decode_rates") == {"img"}
    assert "alice-secret" not in json.dumps(stranger.query("SELECT * FROM sources", format="records"), default=str)
    assert stranger.resolve_source("scratch")["tensors"] == []
    top = stranger.catalog_children("")
    assert "alice-secret" not in json.dumps(top, default=str)
    assert [s["source_id"] for s in top["sources"]] == ["img"]  # scratch holds nothing it may read


def test_the_grant_holder_sees_her_own_rows(alice):
    served, aid = alice
    client = served.client("alice")
    assert {"array_id": aid, "label": LABEL} in client.query("SELECT array_id, label FROM rois", format="records")
    assert _tensor_ids(client, "scratch") == {aid}
    assert _ids(client, "decode_rates") == {aid, "img"}
    assert [t["array_id"] for t in client.resolve_source("scratch")["tensors"]] == [aid]
    assert [s["source_id"] for s in client.catalog_children("")["sources"]] == ["img", "scratch"]
    assert [r.label for r in client.list_rois(aid).rois] == [LABEL]


def test_another_grant_holder_sees_only_its_own(alice):
    """Bob's own private upload is his; alice's stays hers: each sees one granted tensor. An
    upload made over the wire asks for no grant: everyone sees it, alice's stays hers."""
    served, aid = alice
    bob = served.client("bob")
    desc = _private_upload(served, "bob", "bobs")
    assert _tensor_ids(bob, "scratch") == {desc.array_id}
    assert _tensor_ids(served.client("alice"), "scratch") == {aid}
    assert _tensor_ids(served.client(None), "scratch") == set()
    shared = bob.setup_array_upload("zarr://scratch/@fields/shared", ARR)
    bob.upload_array(shared, ARR)
    assert _tensor_ids(served.client(None), "scratch") == {shared.array_id}
    assert _tensor_ids(served.client("alice"), "scratch") == {aid, shared.array_id}


@pytest.mark.parametrize("token", STRANGERS)
def test_a_strangers_annotation_write_on_a_granted_tensor_is_refused(alice, token):
    """The medium finding: a stranger's ``roi_put`` onto alice's tensor was stored."""
    served, aid = alice
    stranger = served.client(token)
    with pytest.raises(Exception, match="capability token"):
        stranger.put_rois(aid, [_roi("bob was here")])
    with pytest.raises(Exception, match="capability token"):
        stranger.delete_rois(aid)
    assert [r.label for r in served.client("alice").list_rois(aid).rois] == [LABEL]


@pytest.mark.parametrize("token", STRANGERS)
def test_upload_refusals_show_a_stranger_nothing_of_a_granted_tensor(alice, token):
    """A label set of alice's image (its shape was echoed), her upload's own name (its state was
    echoed): each the read refusal, nothing else; DISCARDED: PERMISSION_DENIED (only its owner
    writes it), nothing else; its status is not told."""
    served, aid = alice
    stranger = served.client(token)
    attempts = [
        (
            lambda: stranger.setup_array_upload(f"zarr://{aid}/@labels/cells", np.zeros((2, 2), np.uint32)),
            "capability token",
        ),
        (lambda: stranger.setup_array_upload(f"zarr://{aid}", ARR), "capability token"),
        (lambda: stranger.set_upload_status(aid, "DISCARDED"), f"permission denied: {aid} is an upload whose chunks"),
    ]
    for attempt, refusal in attempts:
        with pytest.raises(Exception, match=refusal) as refused:
            attempt()
        assert SHAPE_TEXT not in str(refused.value) and "READY" not in str(refused.value)
    assert stranger.get_upload_status(aid)["state"] == "UNKNOWN"  # the SDK's word for a refused describe
    assert served.client("alice").get_upload_status(aid)["state"] == "READY"
    with pytest.raises(Exception, match=rf"must have shape \{SHAPE_TEXT}"):  # its holder is told why
        served.client("alice").setup_array_upload(f"zarr://{aid}/@labels/cells", np.zeros((2, 2), np.uint32))


def test_a_discarded_uploads_rows_go_with_it(alice):
    """Once an upload is discarded its annotations and decode rate go too: its name may later
    name another's upload, and rows no upload record covers would be anyone's to read."""
    served, aid = alice
    client = served.client("alice")
    client.set_upload_status(aid, "DISCARDED")
    cat = served.runtime.catalog
    assert cat.rois.list(aid)[0] == [] and cat.decode_rates.rate(aid) is None
    assert aid not in _ids(client, "rois") | _ids(client, "decode_rates")
    assert _ids(client, "rois") == {"img"}
