"""The PENDING/READY/DISCARDED ladder through the real SDK: resumed partial uploads, the read
gate, discards, refusals after READY, and the read-only server."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.flight as flight
import pytest
from biopb.tensor import TensorFlightClient
from biopb.tensor._upload import UploadRefused
from biopb.tensor.ticket_pb2 import ChunkBounds

from tests.uploads.conftest import upload_server


def mint(tensor, bounds, scale, method):
    """The chunk id a plan of ``tensor`` mints for ``bounds``."""
    from tensor_server.core.chunk_id import ChunkId

    return ChunkId.for_extent(tensor.array_id, bounds, scale, method, tensor.content_version)


ARR = (np.arange(6 * 5, dtype=np.uint16) * 7 + 1).reshape(6, 5)


def test_partial_upload_resumed_from_a_new_plan(client, server):
    desc = client.setup_array_upload("cache://scratch/@fields/part", ARR, chunk_shape=(4, 2))
    st = client.upload_array(desc, ARR, slice_hint=(slice(0, 4), slice(None)))  # the first row of chunks
    assert (st["state"], st["expected_chunks"], st["uploaded_chunks"]) == ("PENDING", 6, 3)
    # a new client (the old one "crashed") re-plans only the rows still missing
    fresh = TensorFlightClient(server.location)
    st = fresh.upload_array(desc, ARR, slice_hint=(slice(4, 6), slice(None)))
    assert (st["state"], st["uploaded_chunks"]) == ("PENDING", 6)
    assert fresh.set_upload_status(desc.array_id, "READY")["state"] == "READY"
    np.testing.assert_array_equal(fresh.get_array(desc.array_id), ARR)


def test_pending_refuses_reads_but_answers_write_plans(client, server):
    for scheme in ("zarr", "cache"):
        desc = client.setup_array_upload(f"{scheme}://scratch/@fields/pend-{scheme}", ARR, chunk_shape=(4, 2))
        with pytest.raises(
            flight.FlightServerError, match="PENDING, not readable yet: an uploaded tensor is readable once it is READY"
        ):
            client.get_array(desc.array_id)
        with pytest.raises(flight.FlightServerError, match="PENDING"):  # refused at the plan
            client.get_array(desc.array_id, scale_hint=[2, 2], reduction_method="area")
        assert client.get_upload_status(desc.array_id)["state"] == "PENDING"
        client.upload_array(desc, ARR)
        np.testing.assert_array_equal(client.get_array(desc.array_id), ARR)


def test_misaligned_upload_chunk_is_refused_by_the_sdk(client):
    desc = client.setup_array_upload("cache://scratch/@fields/mis", ARR, chunk_shape=(4, 2))
    with pytest.raises(ValueError, match="is not one chunk"):
        client.upload_chunk(desc, ChunkBounds(start=[1, 0], stop=[5, 2]), ARR[1:5, 0:2])


def test_a_doput_outside_the_plan_is_refused(client, server):
    """DoPut takes exactly the tickets the plan minted: a hand-made id for a box off the grid
    (or of another content version) is refused."""
    from tensor_server.core.bounds import Bounds

    desc = client.setup_array_upload("cache://scratch/@fields/offgrid", ARR, chunk_shape=(4, 2))
    t = server.runtime.uploads.get(desc.array_id).tensor
    bad = mint(t, Bounds((1, 0), (5, 2)), (1, 1), "none").encode()
    with pytest.raises(Exception, match="not a chunk of its write plan"):
        server.runtime.uploads.write_chunk(bad, ARR[1:5, 0:2])
    stale = mint(t, Bounds((0, 0), (4, 2)), (1, 1), "none")
    from dataclasses import replace

    with pytest.raises(Exception, match="re-plan"):
        server.runtime.uploads.write_chunk(replace(stale, content_version=b"x" * 16), ARR[0:4, 0:2])


def test_writes_after_ready_are_refused_with_upload_refused(client):
    desc = client.setup_array_upload("cache://scratch/@fields/sealed", ARR, chunk_shape=(4, 2))
    client.upload_array(desc, ARR)
    with pytest.raises(UploadRefused) as err:
        client.upload_chunk(desc, ChunkBounds(start=[0, 0], stop=[4, 2]), ARR[:4, :2])
    assert err.value.state == "READY" and err.value.source_id == desc.array_id
    assert client.set_upload_status(desc.array_id, "READY")["state"] == "READY"  # a no-op


def test_discard_removes_the_store_and_leaves_a_tombstone(client, server):
    for scheme in ("zarr", "cache"):
        desc = client.setup_array_upload(f"{scheme}://scratch/@fields/gone-{scheme}", ARR, chunk_shape=(4, 2))
        client.upload_array(desc, ARR)
        store = server.runtime.uploads.get(desc.array_id).member.path
        assert store.is_dir()
        st = client.set_upload_status(desc.array_id, "DISCARDED", reason="wrong parameters")
        assert (st["state"], st["reason"]) == ("DISCARDED", "wrong parameters")
        assert not store.exists()
        poll = client.get_upload_status(desc.array_id)
        assert (poll["state"], poll["reason"]) == ("DISCARDED", "wrong parameters")
        with pytest.raises(Exception, match="discarded"):
            client.get_array(desc.array_id)
        with pytest.raises(UploadRefused) as err:
            client.set_upload_status(desc.array_id, "READY")
        assert err.value.state == "DISCARDED"
        with pytest.raises(flight.FlightServerError, match="name is taken"):
            client.setup_array_upload(f"{scheme}://scratch/@fields/gone-{scheme}", ARR)
        rows = client.query("SELECT tensors FROM sources WHERE source_id = 'scratch'").to_pylist()[0]["tensors"]
        assert desc.array_id not in [t["array_id"] for t in rows]


def test_discard_of_pending_upload_refuses_its_writes(client, server):
    from biopb.tensor._upload import _plan_write, _put_chunk

    desc = client.setup_array_upload("cache://scratch/@fields/gave-up", ARR, chunk_shape=(4, 2))
    plan = _plan_write(client._state, desc.array_id, None)  # planned before the discard
    client.set_upload_status(desc.array_id, "DISCARDED", reason="job cancelled")
    c = plan[0]
    with pytest.raises(UploadRefused) as err:  # a DoPut still in flight
        _put_chunk(
            flight.FlightClient(server.location),
            flight.FlightCallOptions(),
            desc.array_id,
            c.ticket,
            ARR[tuple(slice(a, b) for a, b in zip(c.start, c.stop))],
        )
    assert (err.value.state, err.value.reason) == ("DISCARDED", "job cancelled")
    with pytest.raises(flight.FlightCancelledError, match="discarded"):  # a re-plan hears the same
        client.upload_array(desc, ARR)


def test_unknown_ids_and_native_tensors(client):
    assert client.set_upload_status("scratch/@fields/never", "DISCARDED")["state"] == "UNKNOWN"
    with pytest.raises(flight.FlightServerError, match="not an upload in progress"):
        client.set_upload_status("scratch/@fields/never", "READY")
    with pytest.raises(flight.FlightServerError, match="cannot be discarded"):
        client.set_upload_status("mem/img", "DISCARDED")
    assert client.get_upload_status("mem/img")["state"] == "UNKNOWN"  # ordinary tensors carry none
    with pytest.raises(flight.FlightServerError, match="PENDING is not a state"):
        client.set_upload_status("mem/img", "PENDING")


def test_add_tensor_refusals(client):
    with pytest.raises(flight.FlightServerError, match="unknown source 'nosuch'"):
        client.setup_array_upload("zarr://nosuch/@fields/x", ARR)
    with pytest.raises(flight.FlightServerError, match="above the 64 MiB limit"):
        client.setup_array_upload("cache://scratch/@fields/huge", np.broadcast_to(np.uint16(0), (6000, 6000)))
    with pytest.raises(flight.FlightServerError, match="ttl_seconds must be positive"):
        client.setup_array_upload("zarr://scratch/@fields/t0", ARR, ttl_seconds=0)
    with pytest.raises(flight.FlightServerError, match="metadata is the source's"):
        client.setup_array_upload("zarr://mem/@fields/meta", ARR, ome_metadata={"physical": 1})


@pytest.mark.parametrize("write_dir", [False, True])
def test_read_only_server_refuses_every_write_verb_clearly(tmp_path, write_dir):
    want = "start it with --write-dir" if not write_dir else "start it with --writable"
    with upload_server(tmp_path, writable=False, write_dir=write_dir) as srv:
        c = TensorFlightClient(srv.location)
        assert c.health_check()["writable"] is False
        with pytest.raises(flight.FlightServerError, match=want):
            c.setup_array_upload("zarr://scratch/@fields/x", ARR)
        with pytest.raises(flight.FlightServerError, match=want):
            c.set_upload_status("scratch/@fields/x", "READY")
        raw = flight.FlightClient(srv.location)
        from biopb.tensor.ticket_pb2 import PutCommand

        desc = flight.FlightDescriptor.for_command(PutCommand(chunk_ticket=b"x").SerializeToString())
        schema = __import__("pyarrow").schema([("data", __import__("pyarrow").uint16())])
        w, r = raw.do_put(desc, schema)
        with pytest.raises(flight.FlightServerError, match=want):
            w.close()
        if write_dir:  # an in-process producer still has the scratch source
            up = srv.runtime.uploads.add_tensor(
                "cache://scratch/@fields/inproc", ARR.shape, ARR.dtype, chunk_shape=(6, 5)
            )
            from tensor_server.core.bounds import Bounds

            srv.runtime.uploads.write_chunk(mint(up.tensor, Bounds((0, 0), (6, 5)), (1, 1), "none"), ARR)
            srv.runtime.uploads.set_ready(up.array_id)
            np.testing.assert_array_equal(c.get_array("scratch/@fields/inproc"), ARR)


def test_health_says_writable(client):
    assert client.health_check()["writable"] is True


def test_write_dir_inside_a_root_is_never_discovered(tmp_path):
    """The upload subsystem is the sole registrar under write_dir: a write_dir misplaced in
    a served root adds no sources (the catalog skips it; the zarr claims decline members)."""
    from tensor_server.catalog import Catalog
    from tensor_server.uploads import UploadManager

    root = tmp_path / "root"
    root.mkdir()
    cat = Catalog([root])
    m = UploadManager(cat, root / "results")
    try:
        up = m.add_tensor("zarr://scratch/@fields/seg.zarr", (4, 5), "<u2")
        m.set_ready(up.array_id)
        cat.scan()
        assert [r.source_id for r in cat.records()] == ["scratch"]
        with pytest.raises(LookupError):  # no format claims the member by content
            _sniffed(up.member.path)
    finally:
        m.close()
        cat.close()


def _sniffed(path):
    from tensor_server.adapters.registry import formats

    hits = [e.name for e in formats() if e.folders and e.sniff is not None and e.sniff(path, b"")]
    if not hits:
        raise LookupError(path)
    return hits


def test_orphaned_field_is_kept_and_reattached_when_its_source_returns(tmp_path):
    import shutil

    from tensor_server.catalog import Catalog
    from tensor_server.uploads import UploadManager
    from tests.uploads.conftest import discovered_id, make_catalog

    (tmp_path / "root").mkdir()
    cat = make_catalog(tmp_path / "root")
    sid = discovered_id(cat)
    m = UploadManager(cat, tmp_path / "write")
    up = m.add_tensor(f"cache://{sid}/@fields/seg", (40, 30), "<u2", chunk_shape=(40, 30))
    from tensor_server.core.bounds import Bounds

    data = np.arange(1200, dtype=np.uint16).reshape(40, 30)[::-1].copy()
    m.write_chunk(mint(up.tensor, Bounds((0, 0), (40, 30)), (1, 1), "none"), data)
    m.set_ready(up.array_id)
    moved = tmp_path / "moved.zarr"
    shutil.move(tmp_path / "root" / "disc.zarr", moved)
    cat.scan()  # the source is gone: its field is not served, but kept
    with pytest.raises(Exception, match="unknown source"):
        cat.find_tensor(up.array_id)

    from tensor_server.config import Settings
    from tensor_server.service import IN_PROCESS, ServingRuntime

    runtime = ServingRuntime(cat, Settings(write_dir=str(tmp_path / "write"), writable=True), uploads=m)
    with pytest.raises(Exception, match="unknown source"):
        runtime.describe(IN_PROCESS, up.array_id, fields=["endpoints"])  # a plan of an orphan is refused like its DoGet
    assert m.sweep() == {"expired": 0, "idle": 0, "reclaimed": 0} and up.member.path.is_dir()
    m.close()
    cat.close()
    # a restart while the source is away adopts the orphan too
    cat = Catalog([tmp_path / "root"])
    cat.scan()
    m = UploadManager(cat, tmp_path / "write")
    try:
        assert m.boot_summary == {"adopted": 1, "removed": 0, "damaged": 0}
        shutil.move(moved, tmp_path / "root" / "disc.zarr")
        cat.scan()  # the source returns: the field is re-attached
        tensor, _ = cat.find_tensor(up.array_id)
        np.testing.assert_array_equal(tensor.get_data(), data)
    finally:
        m.close()
        cat.close()


def test_ready_racing_doputs_loses_no_acknowledged_chunk(client, server):
    """Writes that READY overtakes are refused (UploadRefused), never half-stored: every chunk
    whose DoPut succeeded reads back, every other chunk reads as zeros."""
    import concurrent.futures

    from biopb.tensor._upload import _plan_write, _put_chunk

    arr = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64) + 1
    desc = client.setup_array_upload("cache://scratch/@fields/race", arr, chunk_shape=(4, 64))
    plan = _plan_write(client._state, desc.array_id, None)
    stored = []

    def put(c):
        try:
            _put_chunk(
                flight.FlightClient(server.location),
                flight.FlightCallOptions(),
                desc.array_id,
                c.ticket,
                arr[c.start[0] : c.stop[0]],
            )
            stored.append(c)
        except UploadRefused:
            pass

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(put, c) for c in plan]
        futures[len(futures) // 2].result()
        st = client.set_upload_status(desc.array_id, "READY")
        for f in futures:
            f.result()
    assert 0 < len(stored) and st["uploaded_chunks"] == len(stored)
    want = np.zeros_like(arr)
    for c in stored:
        want[c.start[0] : c.stop[0]] = arr[c.start[0] : c.stop[0]]
    np.testing.assert_array_equal(client.get_array(desc.array_id), want)


@pytest.mark.parametrize("scheme", ["zarr", "cache"])
def test_bool_and_signed_dtypes_round_trip(client, scheme):
    rng = np.random.default_rng(9)
    for arr in (rng.integers(0, 2, (9, 13)).astype(bool), rng.integers(-30000, 30000, (9, 13)).astype(np.int16)):
        desc = client.setup_array_upload(
            f"{scheme}://scratch/@fields/{arr.dtype.name}-{scheme}", arr, chunk_shape=(4, 5)
        )
        client.upload_array(desc, arr)
        got = client.get_array(desc.array_id)
        assert got.dtype == arr.dtype
        np.testing.assert_array_equal(got, arr)


def test_an_untracked_store_is_never_reused_or_deleted(server):
    m = server.runtime.uploads
    stray = m.write_dir / "fields" / "scratch" / "stray"
    stray.mkdir(parents=True)
    (stray / "keep.txt").write_text("not ours to delete")
    with pytest.raises(Exception, match="already exists and no upload holds it"):
        m.add_tensor("cache://scratch/@fields/stray", (4, 4), "<u2")
    assert (stray / "keep.txt").read_text() == "not ours to delete"


def test_a_taken_name_is_refused_in_the_reference_servers_words(client):
    """The biopb reference's own upload tests pin these phrases ("already exists as",
    "advice ... another name", "not readable yet"); a client switching on them works here.
    (The same name declared the same way re-plans the PENDING upload: resume_test.py.)"""
    desc = client.setup_array_upload("zarr://scratch/@fields/advice", ARR)
    for again, arr in (("zarr://scratch/@fields/advice", ARR[:3]), ("cache://scratch/@fields/ADVICE", ARR)):
        with pytest.raises(flight.FlightServerError, match="already exists as") as err:
            client.setup_array_upload(again, arr)
        assert "advice" in str(err.value) and "another name" in str(err.value)
        assert '"ALREADY_EXISTS"' in bytes(err.value.extra_info).decode()
    with pytest.raises(flight.FlightError, match="not readable yet"):
        client.get_array(desc.array_id)


@pytest.mark.parametrize("scheme", ["zarr", "cache"])
def test_a_small_write_plan_stays_on_the_upload_grid(client, server, scheme):
    """A read this small plans on the finer tile grid (core/plan.py); a write plan must not:
    the upload stores its own grid's chunks, and a tile-sized DoPut is not one of them."""
    arr = (np.arange(4096 * 4096, dtype=np.uint32) % 251).astype(np.uint8).reshape(4096, 4096)
    desc = client.setup_array_upload(f"{scheme}://scratch/@fields/grid-{scheme}", arr)
    tensor = server.runtime.uploads.get(desc.array_id).tensor
    assert tensor.tile_shape != tensor.chunk_shape  # else this test could not fail
    st = client.upload_array(desc, arr, slice_hint=(slice(0, 512), slice(0, 512)))
    cells = math.prod(-(-n // c) for n, c in zip(arr.shape, tensor.chunk_shape))
    assert st["uploaded_chunks"] == 1 and st["expected_chunks"] == cells
    client.upload_array(desc, arr)
    np.testing.assert_array_equal(
        client.get_array(desc.array_id, slice_hint=(slice(0, 512), slice(0, 512))), arr[:512, :512]
    )
