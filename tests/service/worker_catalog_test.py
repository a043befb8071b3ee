"""The manifest of ``serve --workers N`` (service/worker_catalog.py), in one process: a primary's
catalog and upload manager publish, a second catalog (a worker's) follows. Public READY uploads
are served under their ids, private ones are not, a discarded upload leaves, a name made again
is served at its new version, an unknown id looks at the file, and a malformed or oversized
manifest serves nothing from it."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.errors import TensorNotFound
from tensor_server.service import worker_catalog
from tensor_server.service.worker_catalog import ManifestFollower, ManifestPublisher
from tensor_server.uploads import UploadManager

ARR = np.arange(48, dtype=np.uint16).reshape(6, 8)


def _catalog() -> Catalog:
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(ARR, "yx"), source_id="img"))
    return cat


@pytest.fixture
def pair(tmp_path):
    primary, worker = _catalog(), _catalog()
    uploads = UploadManager(primary, tmp_path / "write")
    publisher = ManifestPublisher(primary, uploads, tmp_path / "manifest.json")
    follower = ManifestFollower(worker, tmp_path / "manifest.json")
    yield uploads, publisher, follower, worker
    uploads.close()
    primary.close()
    worker.close()


def _ready(uploads: UploadManager, name: str, grant: str = "") -> str:
    up = uploads.add_tensor(f"cache://img/@fields/{name}", ARR.shape, ARR.dtype, grant=grant)
    uploads.set_ready(up.array_id, holes_are_fill=True)
    return up.array_id


def test_public_ready_uploads_are_followed_and_private_ones_are_not(pair):
    uploads, publisher, follower, worker = pair
    public, private = _ready(uploads, "public"), _ready(uploads, "private", grant="ab" * 32)
    assert publisher.publish() and not publisher.publish()  # written once, then unchanged
    assert [e["array_id"] for e in publisher.manifest()["uploads"]] == [public]
    assert follower.refresh() and not follower.refresh()  # unchanged file: nothing to do
    tensor, echo = worker.find_tensor(public)
    assert echo == public and tensor.shape == ARR.shape
    assert tensor.content_version == uploads.get(public).tensor.content_version
    with pytest.raises(TensorNotFound):
        worker.find_tensor(private)


def test_a_discarded_upload_leaves_and_a_name_made_again_is_served_at_its_new_version(pair):
    uploads, publisher, follower, worker = pair
    aid = _ready(uploads, "again")
    publisher.publish()
    follower.refresh()
    first = worker.find_tensor(aid)[0].content_version
    uploads.discard(aid)
    publisher.publish()
    assert follower.refresh()
    with pytest.raises(TensorNotFound):
        worker.find_tensor(aid)
    uploads.clock = lambda: time.time() + 2 * uploads.upload_ttl  # the tombstone holds the name until swept
    assert uploads.sweep()["reclaimed"] == 1
    _ready(uploads, "again")
    publisher.publish()
    worker.on_miss = follower.refresh  # as ``start`` sets it: the unknown id looks at the file
    second = worker.find_tensor(aid)[0].content_version
    assert second == uploads.get(aid).tensor.content_version != first


def test_a_malformed_or_oversized_manifest_serves_nothing_from_it(pair, tmp_path, monkeypatch):
    _, _, follower, worker = pair
    path = tmp_path / "manifest.json"
    good = {"array_id": "img/@fields/x", "path": str(tmp_path / "nowhere"), "content_version": "00"}
    doc = {"version": 1, "write_dir": None, "uploads": [{"array_id": 3}, good], "sources": "not a list"}
    path.write_text(json.dumps(doc))
    assert not follower.refresh()  # the malformed entry is skipped, the good one names no member
    with pytest.raises(TensorNotFound):
        worker.find_tensor("img/@fields/x")
    with monkeypatch.context() as m:
        m.setattr(worker_catalog, "MAX_MANIFEST_BYTES", 10)
        path.write_text(json.dumps({**doc, "write_dir": str(tmp_path / "write")}))
        assert not follower.refresh()
        assert worker.known_record("scratch") is None  # not read: the write dir's scratch source is not served
    follower.refresh(retry=True)  # within the bound, the same file is read
    assert worker.known_record("scratch") is not None


def test_a_ready_answer_is_sent_after_the_manifest_lists_it(tmp_path, monkeypatch):
    """The loop may wait up to MAX_PUBLISH_WAIT after a publish; a READY answered in that wait
    (CI saw a worker 404 an upload the client was just told is READY) is published first."""
    from biopb.tensor import descriptor_pb2, ticket_pb2

    from tensor_server.config import Settings
    from tensor_server.service.caller import Caller
    from tensor_server.service.runtime import ServingRuntime

    monkeypatch.setattr(worker_catalog, "MAX_PUBLISH_WAIT", 60.0)
    monkeypatch.setattr(worker_catalog, "PUBLISH_GAP", 10**9)
    primary = _catalog()
    uploads = UploadManager(primary, tmp_path / "write")
    runtime = ServingRuntime(primary, Settings(writable=True), uploads=uploads)
    publisher = ManifestPublisher(primary, uploads, tmp_path / "manifest.json")
    first = _ready(uploads, "first")
    publisher.start()  # publishes the first, then its loop wakes on the move, publishes, waits 60 s
    runtime.catalog_written = publisher.flush
    try:
        deadline = time.monotonic() + 10
        while primary.moved.is_set():  # the loop has not woken yet
            assert time.monotonic() < deadline, "the publisher's loop never woke"
            time.sleep(0.01)
        with publisher._writing:  # its publish is over: it waits out its gap now
            pass
        assert [e["array_id"] for e in json.loads((tmp_path / "manifest.json").read_bytes())["uploads"]] == [first]
        up = uploads.add_tensor("cache://img/@fields/second", ARR.shape, ARR.dtype)
        body = ticket_pb2.SetUploadStatus(array_id=up.array_id, state=descriptor_pb2.UploadStatus.READY)
        answer = next(runtime.do_action("set_upload_status", body.SerializeToString(), Caller()))
        assert descriptor_pb2.UploadStatus.FromString(answer).state == descriptor_pb2.UploadStatus.READY
        listed = [e["array_id"] for e in json.loads((tmp_path / "manifest.json").read_bytes())["uploads"]]
        assert listed == sorted([first, up.array_id])
    finally:
        publisher.close()
        runtime.close()
        uploads.close()
        primary.close()
