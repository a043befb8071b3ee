"""The manifest of ``serve --workers N`` (service/worker_catalog.py), in one process: a primary's
catalog and upload manager publish, a second catalog (a worker's) follows. READY uploads are
served under their ids, a private one read by its grant holder only, a discarded upload leaves,
a name made again is served at its new version, an unknown id looks at the file (again after
an apply it waited for), and a malformed or oversized manifest serves nothing from it."""

from __future__ import annotations

import json
import os
import stat
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


def test_ready_uploads_are_followed_and_a_private_one_keeps_its_grant(pair, tmp_path):
    """A private upload is served by the worker under the one read rule (``Access``): its
    grant holder reads it, a stranger is refused, as on the primary; the manifest that holds
    its grant's SHA-256 is readable by this user only."""
    from tensor_server.config import Settings
    from tensor_server.errors import Unauthenticated
    from tensor_server.service.access import Access, grant_digest
    from tensor_server.service.caller import Caller

    uploads, publisher, follower, worker = pair
    public, private = _ready(uploads, "public"), _ready(uploads, "private", grant=grant_digest("alice"))
    assert publisher.publish() and not publisher.publish()  # written once, then unchanged
    assert [(e["array_id"], e["grant"]) for e in publisher.manifest()["uploads"]] == [
        (private, grant_digest("alice")),
        (public, ""),
    ]
    assert stat.S_IMODE(os.stat(tmp_path / "manifest.json").st_mode) == 0o600
    assert "alice" not in (tmp_path / "manifest.json").read_text()  # its digest only
    assert follower.refresh() and not follower.refresh()  # unchanged file: nothing to do
    tensor, echo = worker.find_tensor(public)
    assert echo == public and tensor.shape == ARR.shape
    assert tensor.content_version == uploads.get(public).tensor.content_version
    on_worker = Access(Settings(), follower.uploads)
    on_primary = Access(Settings(), uploads)
    for access, catalog in ((on_worker, worker), (on_primary, uploads.catalog)):
        secret = catalog.find_tensor(private)[0]
        access.read(Caller(token="alice", door="http"), secret)
        with pytest.raises(Unauthenticated, match="read with its capability token"):
            access.read(Caller(token="bob", door="http"), secret)
        assert access.recognizes("alice") and not access.recognizes("bob")
        access.read(Caller(door="http"), catalog.find_tensor(public)[0])  # local mode: open


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
    good = {
        "array_id": "img/@fields/x",
        "path": str(tmp_path / "nowhere"),
        "content_version": "00",
        "owner": "",
        "grant": "",
    }
    doc = {
        "version": worker_catalog.VERSION,
        "write_dir": None,
        "uploads": [{"array_id": 3}, good],
        "sources": "not a list",
    }
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


def test_a_miss_that_waited_for_another_apply_looks_again(pair, monkeypatch):
    """A request's miss that arrives while the periodic look is applying the file (opening a
    URL takes a while) is told to look again, once that apply is done: it may have served the id."""
    import threading

    uploads, publisher, follower, worker = pair
    aid = _ready(uploads, "slow")
    publisher.publish()
    opening, go_on = threading.Event(), threading.Event()
    apply = follower._follow_uploads

    def slow(entries):
        opening.set()
        go_on.wait(30)
        return apply(entries)

    class Watched:
        """The follower's lock, saying when a caller found it held (then it waits)."""

        def __init__(self, lock):
            self.lock, self.contended = lock, threading.Event()

        def acquire(self, blocking=True):
            got = self.lock.acquire(blocking)
            if not got:
                self.contended.set()
            return got

        def release(self):
            self.lock.release()

    watched = Watched(follower._lock)
    monkeypatch.setattr(follower, "_lock", watched)
    monkeypatch.setattr(follower, "_follow_uploads", slow)
    periodic = threading.Thread(target=follower.refresh, kwargs={"retry": True})
    periodic.start()
    assert opening.wait(30)
    answers = []
    missed = threading.Thread(target=lambda: answers.append(follower.refresh()))
    missed.start()
    assert watched.contended.wait(30)  # the miss waits for the apply under way
    go_on.set()
    periodic.join(30)
    missed.join(30)
    assert answers == [True]  # the file was unchanged for it, but it waited for the apply
    assert worker.find_tensor(aid)[0].shape == ARR.shape
    assert follower.refresh() is False  # uncontended and unchanged: nothing to look for
