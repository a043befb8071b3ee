"""Object-store roots: zarr and OME-Zarr stores in S3 (moto's server on loopback) discovered by
listing and served like their local copies, through the real SDK against a served catalog."""

from __future__ import annotations

import json
import logging
import os
import socket

import numpy as np
import pyarrow.flight as flight
import pytest
from tensor_server_kernels import reference

from tensor_server.adapters._remote_bytes import reset_remote_bytes
from tensor_server.cache import CacheManager
from tensor_server.catalog import Catalog
from tensor_server.core import plan_read
from tensor_server.errors import StaleChunkId
from tensor_server.testing import serving
from tests.flight.conftest import client_for
from tests.remote.conftest import BUCKET, SECRET, _forget_filesystems, remote_config, s3fs_client, write_sharded

ROOT = f"s3://{BUCKET}/run1"


@pytest.fixture(scope="module")
def served(s3_data, tmp_path_factory):
    local, written = s3_data
    cat = Catalog([ROOT, local])
    counts = cat.scan()
    cache = CacheManager(tmp_path_factory.mktemp("s3-cache"))
    with serving(cat, cache=cache) as srv:
        yield cat, srv, written, counts
    cache.close()
    cat.close()


def _pair(cat, name):
    """(remote record, local record) of a store name."""
    recs = [r for r in cat.records() if r.url.rstrip("/").endswith("/" + name)]
    remote = [r for r in recs if r.url.startswith("s3://")]
    local = [r for r in recs if r.url.startswith("file://")]
    assert len(remote) == 1 and len(local) == 1, [r.url for r in recs]
    return remote[0], local[0]


def test_discovery_lists_the_stores_like_local_ones(served):
    cat, _, _, counts = served
    assert counts["unresolved"] == 0
    remote_ome, local_ome = _pair(cat, "cells.ome.zarr")
    remote_vol, local_vol = _pair(cat, "vol.zarr")
    assert remote_ome.url == f"{ROOT}/cells.ome.zarr" and remote_ome.type == "ome-zarr"
    assert remote_vol.url == f"{ROOT}/vol.zarr" and remote_vol.type == "zarr"
    assert list(remote_ome.source.tensors) == list(local_ome.source.tensors) == ["image", "image/@labels/cells"]
    img = remote_ome.source.tensor("image")
    assert [lv.scale for lv in img.native_levels] == [(1, 2, 2), (1, 4, 4)]
    assert remote_ome.source.tensor("image/@labels/cells").is_labels
    assert img.physical_scale == local_ome.source.tensor("image").physical_scale
    assert remote_vol.source.tensor().metadata["shards"] == [6, 100, 120]
    # notes.txt is not a source, and nothing else was found
    assert sorted(r.url for r in cat.records() if r.url.startswith("s3://")) == [
        f"{ROOT}/cells.ome.zarr",
        f"{ROOT}/vol.zarr",
    ]


def test_full_and_scaled_reads_equal_the_local_copy(served):
    cat, srv, written, _ = served
    sdk = client_for(srv)
    for name, fields in (("cells.ome.zarr", ("image", "image/@labels/cells")), ("vol.zarr", (None,))):
        remote, local = _pair(cat, name)
        for fld in fields:
            rid = remote.source.tensor(fld).array_id
            lid = local.source.tensor(fld).array_id
            full = sdk.get_tensor(rid).compute()
            np.testing.assert_array_equal(full, sdk.get_tensor(lid).compute())
            ndim = full.ndim
            scale = [1] * (ndim - 2) + [2, 3]
            for method in ("area", "nearest"):
                got = sdk.get_tensor(rid, scale_hint=scale, reduction_method=method).compute()
                if not remote.source.tensor(fld).is_labels:  # labels reduce by mode whatever is asked
                    np.testing.assert_array_equal(got, reference.downsample(full, tuple(scale), method))
                np.testing.assert_array_equal(
                    got, sdk.get_tensor(lid, scale_hint=scale, reduction_method=method).compute()
                )
    np.testing.assert_array_equal(sdk.get_tensor(_pair(cat, "vol.zarr")[0].source_id).compute(), written["sharded"])
    np.testing.assert_array_equal(
        sdk.get_tensor(_pair(cat, "cells.ome.zarr")[0].source.tensor("image").array_id).compute(), written["image"]
    )


def test_stored_level_is_served_from_the_bucket(served):
    cat, srv, written, _ = served
    remote, _ = _pair(cat, "cells.ome.zarr")
    img = remote.source.tensor("image")
    level = img.native_level((1, 4, 4)).tensor
    np.testing.assert_array_equal(level.get_data(), written["image"][:, ::4, ::4])


def test_cached_chunks_fetch_no_object_twice(served, caplog, tmp_path):
    """The second read of a region is served by the chunk cache: the S3 server sees no GET
    of a chunk object (moto logs every request it answers through werkzeug)."""
    cat, _, written, _ = served
    remote, _ = _pair(cat, "vol.zarr")
    with (
        remote_config(tmp_path / "bytes"),
        CacheManager(tmp_path / "chunks") as cache,
        serving(cat, cache=cache) as srv,
    ):
        _read_twice(client_for(srv), remote, written, caplog)


def test_a_chunk_object_costs_one_get_and_no_head(served, caplog, tmp_path):
    """A whole-object chunk read is one GET (through an empty byte cache). s3fs sends a HEAD
    before each one unless its ``max_concurrency`` is 1 (it decides on the size whether to
    split the object), which doubled the round trips of every chunk; moto logs each request
    it answers."""
    cat, _, written, _ = served
    remote, _ = _pair(cat, "cells.ome.zarr")
    prefix = "/lab-data/run1/cells.ome.zarr/0/"
    with remote_config(tmp_path / "bytes"), caplog.at_level(logging.INFO, logger="werkzeug"):
        got = remote.source.tensor("image").get_data()
    requests = [rec.getMessage() for rec in caplog.records if prefix in rec.getMessage()]
    np.testing.assert_array_equal(got, written["image"])
    # 2 x 300 x 260 in 1 x 64 x 64 chunks: 2 x 5 x 5 objects, and .zarray is read at open
    assert sum(f"GET {prefix}" in r for r in requests) == 50, requests
    assert not [r for r in requests if f"HEAD {prefix}" in r], requests


def _read_twice(sdk, remote, written, caplog):
    region = (slice(0, 6), slice(0, 100), slice(0, 120))

    def chunk_gets() -> int:
        return sum("GET /lab-data/run1/vol.zarr/c/" in rec.getMessage() for rec in caplog.records)

    with caplog.at_level(logging.INFO, logger="werkzeug"):
        before = chunk_gets()
        first = sdk.get_tensor(remote.source_id, slice_hint=region).compute()
        after_first = chunk_gets()
        second = sdk.get_tensor(remote.source_id, slice_hint=region).compute()
        after_second = chunk_gets()
    np.testing.assert_array_equal(first, written["sharded"][region])
    np.testing.assert_array_equal(second, first)
    assert after_first > before, "the first read fetched nothing from S3 (already cached by another test?)"
    assert after_second == after_first


def test_credentials_never_reach_the_catalog_or_logs(s3_data, caplog):
    """The secret key lives in the environment (as with any AWS client); no row, no log
    line carries it; a URL's user-info is never shown."""
    from tensor_server.adapters.zarr_remote import public_url

    assert os.environ["AWS_SECRET_ACCESS_KEY"] == SECRET
    assert public_url(f"s3://key:{SECRET}@{BUCKET}/run1") == ROOT
    with caplog.at_level(logging.DEBUG):
        cat = Catalog([ROOT])
        cat.scan()
        table = cat.query("SELECT * FROM sources").to_pylist()
    try:
        assert len(table) == 2
        assert SECRET not in json.dumps(table, default=str)
        assert not any(SECRET in rec.getMessage() for rec in caplog.records)
    finally:
        cat.close()


def test_a_changed_object_makes_old_chunk_ids_stale(s3_data, tmp_path):
    """A rewritten shard: new chunk ids at the rescan, and its new pixels read through the
    byte cache, which takes the rescan's ETags over the versions it cached (the old shard's
    ranges are not served with the new version)."""
    fs = s3fs_client()
    vol = write_sharded(tmp_path / "vol.zarr", seed=5)
    fs.put(str(tmp_path / "vol.zarr"), f"{BUCKET}/run2/vol.zarr", recursive=True)
    cat = Catalog([f"s3://{BUCKET}/run2"])
    try:
        cat.scan()
        (rec,) = cat.records()
        tensor = rec.source.tensor()
        old_version = tensor.content_version
        old_ids = [c.chunk_id for c in plan_read(tensor).chunks]
        np.testing.assert_array_equal(tensor.get_data(), vol)
        # rewrite one shard object (new pixels in its first plane)
        changed = vol.copy()
        changed[0, :100, :120] += 1
        import zarr

        zarr.open_array(str(tmp_path / "vol.zarr"), mode="r+")[0, :100, :120] = changed[0, :100, :120]
        fs.put(str(tmp_path / "vol.zarr" / "c" / "0" / "0" / "0"), f"{BUCKET}/run2/vol.zarr/c/0/0/0")
        assert cat.scan()["changed"] == 1
        (rec2,) = cat.records()
        fresh = rec2.source.tensor()
        assert fresh.array_id == tensor.array_id and fresh.content_version != old_version
        from tensor_server.core.engine import ReadEngine

        with pytest.raises(StaleChunkId):
            ReadEngine().chunk(old_ids[0], fresh)
        np.testing.assert_array_equal(fresh.get_data(), changed)
        # an unchanged store keeps its version across scans
        assert cat.scan()["changed"] == 0
        (rec3,) = cat.records()
        assert rec3.source.tensor().content_version == fresh.content_version
    finally:
        cat.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_endpoint_is_a_clear_row_and_local_roots_still_serve(s3_data, s3_endpoint, monkeypatch):
    local, written = s3_data
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
    _forget_filesystems()
    cat = Catalog([ROOT, local])
    try:
        counts = cat.scan()
        down = [r for r in cat.records() if r.url.startswith("s3://")]
        assert len(down) == 1 and down[0].url == ROOT and not down[0].is_resolved
        assert down[0].unresolved_reason.startswith("cannot list the object store")
        assert counts["unresolved"] == 1
        with serving(cat) as srv:
            sdk = client_for(srv)
            rows = sdk.query("SELECT source_id, is_resolved FROM sources").to_pylist()
            assert {r["is_resolved"] for r in rows} == {True, False}
            lid = _pair_local(cat, "vol.zarr")
            np.testing.assert_array_equal(sdk.get_tensor(lid).compute(), written["sharded"])
            # the SDK restates the server's UNAVAILABLE "unresolved" refusal; the row says why
            with pytest.raises(ValueError, match="unresolved"):
                sdk.get_tensor(down[0].source_id).compute()
            # the endpoint comes back: resolving the row lists the bucket again
            monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
            _forget_filesystems()
            row = sdk.resolve_source(down[0].source_id)
            assert row["is_resolved"] is False and "listed again" in row["unresolved_reason"]
            remote_urls = sorted(r.url for r in cat.records() if r.url.startswith("s3://"))
            assert remote_urls == [f"{ROOT}/cells.ome.zarr", f"{ROOT}/vol.zarr"]
    finally:
        cat.close()
        monkeypatch.undo()
        _forget_filesystems()


def _pair_local(cat, name):
    (rec,) = [r for r in cat.records() if r.url.startswith("file://") and r.url.endswith("/" + name)]
    return rec.source_id


def test_an_endpoint_that_goes_away_fails_reads_clearly(s3_data, tmp_path, monkeypatch):
    """Listed while up, then the S3 server stops: a read of it is an error naming the store;
    local sources keep serving; a rescan keeps the listed rows and flags the root."""
    from moto.server import ThreadedMotoServer

    local, written = s3_data
    other = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    other.start()
    host, port = other.get_host_and_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
    _forget_filesystems()
    stopped = False
    try:
        fs = s3fs_client()
        fs.mkdir("transient")
        fs.put(str(local / "vol.zarr"), "transient/vol.zarr", recursive=True)
        cat = Catalog(["s3://transient", local])
        cat.scan()
        (rid,) = [r.source_id for r in cat.records() if r.url.startswith("s3://")]
        other.stop()
        stopped = True
        with serving(cat) as srv:
            sdk = client_for(srv)
            with pytest.raises(flight.FlightError, match="s3://transient/vol.zarr"):
                sdk.get_tensor(rid).compute()
            np.testing.assert_array_equal(sdk.get_tensor(_pair_local(cat, "vol.zarr")).compute(), written["sharded"])
        cat.scan()
        urls = {r.url: r.is_resolved for r in cat.records() if r.url.startswith("s3://")}
        assert urls == {"s3://transient": False, "s3://transient/vol.zarr": True}
        cat.close()
    finally:
        if not stopped:
            other.stop()
        monkeypatch.undo()
        _forget_filesystems()


def test_without_s3fs_an_s3_root_names_the_extra_to_install(monkeypatch):
    """The serving install has fsspec but not s3fs (the ``s3`` extra): listing an s3:// root says
    what to install instead of a bare ImportError."""
    import fsspec.core

    from tensor_server.adapters.zarr_remote import ObjectListing
    from tensor_server.errors import UnreadableSource

    def no_s3fs(url, **options):
        raise ImportError("Install s3fs to access S3")

    monkeypatch.setattr(fsspec.core, "url_to_fs", no_s3fs)
    with pytest.raises(UnreadableSource) as refused:
        ObjectListing.from_url("s3://key:secret@bucket/run1")
    message = str(refused.value)
    assert "s3://bucket/run1" in message and "secret" not in message
    assert "no filesystem for s3:// is installed (Install s3fs to access S3)" in message
    assert "pip install 'tensor-server[s3]'" in message


def test_a_restarted_server_reads_an_s3_root_with_no_get_of_a_chunk(s3_data, tmp_path, caplog):
    """The pixels of an ``s3://`` root go through the persistent byte cache: after a restart
    (a new catalog over the same cache folder) the same region is read with no GET of a chunk
    object reaching the store (moto logs each request), the same pixels."""
    _, written = s3_data
    region = (slice(0, 6), slice(0, 100), slice(0, 120))
    got, gets = [], []
    with remote_config(tmp_path / "bytes"):
        for _ in range(2):
            reset_remote_bytes()  # a restart: the process's store forgotten, its folder kept
            cat = Catalog([ROOT])
            cat.scan()
            remote = next(r for r in cat.records() if r.url.endswith("/vol.zarr"))
            with caplog.at_level(logging.INFO, logger="werkzeug"):
                caplog.clear()
                got.append(remote.source.tensor().get_data()[region])
                gets.append(sum("GET /lab-data/run1/vol.zarr/c/" in r.getMessage() for r in caplog.records))
            cat.close()
    assert gets[0] > 0 and gets[1] == 0, gets
    np.testing.assert_array_equal(got[0], written["sharded"][region])
    np.testing.assert_array_equal(got[1], got[0])
