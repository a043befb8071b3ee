"""Deadlines, idleness, tombstones and the scratch cap, swept on an injectable clock."""

from __future__ import annotations

import numpy as np
import pytest
from biopb.tensor import TensorFlightClient
from biopb.tensor.ticket_pb2 import ChunkBounds

from tensor_server.uploads import UploadManager
from tests.uploads.conftest import FakeClock, make_catalog, upload_server

ARR = np.arange(24, dtype=np.uint16).reshape(4, 6)


def test_deadline_is_swept_in_any_state_and_the_tombstone_frees_the_name(tmp_path):
    clock = FakeClock()
    with upload_server(tmp_path, clock=clock, upload_ttl=600, scratch_ttl=0) as srv:
        c, m = TensorFlightClient(srv.location), srv.runtime.uploads
        ready = c.setup_array_upload("cache://mem/@fields/ready", ARR, ttl_seconds=100)
        assert ready.ttl_seconds == 100
        c.upload_array(ready, ARR)
        forever = c.setup_array_upload("zarr://mem/@fields/forever", ARR)
        assert not forever.HasField("ttl_seconds")  # none asked, none capped: no deadline
        c.upload_array(forever, ARR)
        clock.advance(99)
        assert m.sweep() == {"expired": 0, "idle": 0, "reclaimed": 0}
        clock.advance(1)
        assert m.sweep() == {"expired": 1, "idle": 0, "reclaimed": 0}
        st = c.get_upload_status(ready.array_id)
        assert (st["state"], st["reason"]) == ("DISCARDED", "ttl_seconds deadline passed")
        with pytest.raises(Exception, match="name is taken"):
            c.setup_array_upload("cache://mem/@fields/ready", ARR)
        clock.advance(600)  # the tombstone has stood for upload_ttl: detached, name free
        assert m.sweep()["reclaimed"] == 1
        assert c.get_upload_status(ready.array_id)["state"] == "UNKNOWN"
        again = c.setup_array_upload("cache://mem/@fields/ready", ARR)
        assert again.content_version != ready.content_version  # a reclaimed name mints a new version
        np.testing.assert_array_equal(c.get_array(forever.array_id), ARR)  # READY without deadline stays


def test_idleness_applies_only_while_pending(tmp_path):
    clock = FakeClock()
    with upload_server(tmp_path, clock=clock, upload_ttl=300, scratch_ttl=0) as srv:
        c, m = TensorFlightClient(srv.location), srv.runtime.uploads
        pend = c.setup_array_upload("cache://scratch/@fields/slow", ARR, chunk_shape=(2, 6))
        done = c.setup_array_upload("cache://scratch/@fields/done", ARR)
        c.upload_array(done, ARR)
        clock.advance(200)
        c.upload_chunk(pend, ChunkBounds(start=[0, 0], stop=[2, 6]), ARR[:2])  # progress resets idleness
        clock.advance(200)
        assert m.sweep()["idle"] == 0
        clock.advance(100)
        assert m.sweep() == {"expired": 0, "idle": 1, "reclaimed": 0}
        st = c.get_upload_status(pend.array_id)
        assert st["state"] == "DISCARDED" and "idle" in st["reason"]
        assert c.get_upload_status(done.array_id)["state"] == "READY"  # READY is never idle


def test_scratch_ttl_caps_every_lifetime_on_scratch_only(tmp_path):
    clock = FakeClock()
    with upload_server(tmp_path, clock=clock, scratch_ttl=1000) as srv:
        c, m = TensorFlightClient(srv.location), srv.runtime.uploads
        unasked = c.setup_array_upload("zarr://scratch/@fields/a", ARR)
        longer = c.setup_array_upload("zarr://scratch/@fields/b", ARR, ttl_seconds=5000)
        shorter = c.setup_array_upload("zarr://scratch/@fields/c", ARR, ttl_seconds=10)
        onsource = c.setup_array_upload("zarr://mem/@fields/d", ARR)
        assert (unasked.ttl_seconds, longer.ttl_seconds, shorter.ttl_seconds) == (1000, 1000, 10)
        assert not onsource.HasField("ttl_seconds")
        for d in (unasked, longer, shorter, onsource):
            c.upload_array(d, ARR)
        clock.advance(1000)
        assert m.sweep()["expired"] == 3
        assert c.get_upload_status(onsource.array_id)["state"] == "READY"


def test_deadline_survives_restart_and_expired_while_down_is_swept_at_boot(tmp_path):
    clock = FakeClock()
    with upload_server(tmp_path, clock=clock, scratch_ttl=0) as srv:
        c = TensorFlightClient(srv.location)
        for name, ttl in (("short", 50), ("long", 500)):
            c.upload_array(c.setup_array_upload(f"cache://mem/@fields/{name}", ARR, ttl_seconds=ttl), ARR)
    clock.advance(100)  # the server was down while 'short' ran out
    cat = make_catalog(tmp_path / "root")
    m = UploadManager(cat, tmp_path / "write", clock=clock, scratch_ttl=0)
    try:
        assert m.boot_summary == {"adopted": 1, "removed": 1, "damaged": 0}
        assert m.get("mem/@fields/short") is None
        assert not (tmp_path / "write" / "fields" / "mem" / "short").exists()
        long = m.get("mem/@fields/long")
        assert long.expires_at == pytest.approx(clock.now - 100 + 500)  # the recorded absolute deadline
        np.testing.assert_array_equal(long.tensor.get_data(), ARR)
        clock.advance(400)
        assert m.sweep()["expired"] == 1
        assert m.get("mem/@fields/long") is None  # adopted: no tombstone, the name is free at once
    finally:
        m.close()
        cat.close()
