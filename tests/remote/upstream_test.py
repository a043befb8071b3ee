"""A server in front of another: a ``grpc://`` root lists the upstream's tensors under a
prefix and serves them through the proxy's cache and engine. Two in-process servers, the
real SDK on both."""

from __future__ import annotations

import socket
from contextlib import contextmanager

import numpy as np
import pyarrow.flight as flight
import pytest
from tensor_server_kernels import reference

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.adapters.upstream import RemoteTensorAdapter
from tensor_server.cache import CacheManager
from tensor_server.catalog import Catalog
from tensor_server.core import plan_read
from tensor_server.errors import StaleChunkId
from tensor_server.testing import serving
from tests.flight.conftest import client_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_volume(path, seed: int) -> np.ndarray:
    import zarr

    vol = np.random.default_rng(seed).integers(0, 60000, (3, 260, 300), dtype=np.uint16)
    zarr.open_array(str(path), mode="w", shape=vol.shape, chunks=(1, 128, 128), dtype=vol.dtype, zarr_format=3)[...] = (
        vol
    )
    return vol


@contextmanager
def upstream_server(root, port: int):
    cat = Catalog([root])
    cat.scan()
    labels = np.random.default_rng(9).integers(0, 6, (120, 160), dtype=np.uint32)
    cat.add_source(
        MemorySource(
            {
                "img": ArrayAdapter(
                    np.arange(120 * 160, dtype=np.float32).reshape(120, 160), "yx", chunk_shape=(64, 64)
                ),
                "mask": ArrayAdapter(labels, "yx", chunk_shape=(64, 64), is_labels=True),
            },
            source_id="multi",
        )
    )
    try:
        with serving(cat, port=port) as srv:
            yield srv
    finally:
        cat.close()


@pytest.fixture
def setup(tmp_path):
    """(upstream root, its volume, port, proxy catalog factory)."""
    up_root = tmp_path / "up"
    up_root.mkdir()
    vol = _write_volume(up_root / "vol.zarr", seed=1)
    own = tmp_path / "own"
    own.mkdir()
    np.save(own / "local.npy", np.arange(20 * 30, dtype=np.int16).reshape(20, 30))
    return up_root, vol, _free_port(), own


@contextmanager
def proxy(port: int, own, tmp_path):
    cat = Catalog([f"grpc://127.0.0.1:{port}", own])
    cat.scan()
    cache = CacheManager(tmp_path / "proxy-cache")
    try:
        with serving(cat, cache=cache) as srv:
            yield cat, srv
    finally:
        cache.close()
        cat.close()


def _proxied_id(port: int, upstream_id: str) -> str:
    return f"127.0.0.1-{port}.{upstream_id}"


def test_reads_through_the_proxy_equal_direct_reads(setup, tmp_path, monkeypatch):
    up_root, vol, port, own = setup
    with upstream_server(up_root, port) as up, proxy(port, own, tmp_path) as (cat, px):
        direct, via = client_for(up), client_for(px)
        up_rows = direct.query("SELECT source_id, tensors FROM sources").to_pylist()
        ids = [t["array_id"] for row in up_rows for t in row["tensors"]]
        assert len(ids) == 3 and {"multi/img", "multi/mask"} <= set(ids)
        listed = {t["array_id"] for row in via.query("SELECT tensors FROM sources").to_pylist() for t in row["tensors"]}
        assert {_proxied_id(port, i) for i in ids} <= listed
        # a scaled read is asked of the upstream (reduced there), never read at full resolution here
        full_reads = []
        original = RemoteTensorAdapter.read_region
        monkeypatch.setattr(
            RemoteTensorAdapter, "read_region", lambda self, b: full_reads.append(b) or original(self, b)
        )
        for aid in ids:
            desc = direct.get_descriptor(aid)
            proxied = via.get_descriptor(_proxied_id(port, aid))
            assert list(proxied.shape) == list(desc.shape) and proxied.dtype == desc.dtype
            assert list(proxied.chunk_shape) == list(desc.chunk_shape)
            scale = [1] * (len(desc.shape) - 2) + [2, 3]
            np.testing.assert_array_equal(
                via.get_tensor(_proxied_id(port, aid), scale_hint=scale, reduction_method="area").compute(),
                direct.get_tensor(aid, scale_hint=scale, reduction_method="area").compute(),
            )
        assert full_reads == []
        for aid in ids:
            np.testing.assert_array_equal(
                via.get_tensor(_proxied_id(port, aid)).compute(), direct.get_tensor(aid).compute()
            )
        assert len(full_reads) > 0
        vid = next(i for i in ids if not i.startswith("multi"))
        np.testing.assert_array_equal(via.get_tensor(_proxied_id(port, vid)).compute(), vol)
        # the proxy's own local root is served beside the upstream's
        local_id = next(r.source_id for r in cat.records() if r.url.startswith("file://"))
        np.testing.assert_array_equal(
            via.get_tensor(local_id).compute(), np.arange(600, dtype=np.int16).reshape(20, 30)
        )


def test_the_second_read_makes_no_upstream_call(setup, tmp_path):
    up_root, vol, port, own = setup
    with upstream_server(up_root, port) as up, proxy(port, own, tmp_path) as (cat, px):
        via = client_for(px)
        vid = next(r.source_id for r in cat.records() if r.url.endswith("/" + _upstream_vol_id(up)))
        region = (slice(0, 2), slice(0, 200), slice(50, 300))
        first_full = via.get_tensor(vid, slice_hint=region).compute()
        first_scaled = via.get_tensor(vid, scale_hint=[1, 4, 4], reduction_method="max").compute()
        calls = up.runtime.metrics.calls()
        assert calls["flight"]["DoGet"] > 0
        second_full = via.get_tensor(vid, slice_hint=region).compute()
        second_scaled = via.get_tensor(vid, scale_hint=[1, 4, 4], reduction_method="max").compute()
        assert up.runtime.metrics.calls() == calls, "the proxy called the upstream for cached chunks"
        np.testing.assert_array_equal(first_full, vol[region])
        np.testing.assert_array_equal(second_full, first_full)
        np.testing.assert_array_equal(second_scaled, first_scaled)
        assert first_scaled.shape == (3, 65, 75)


def _upstream_vol_id(up) -> str:
    return next(r.source_id for r in up.runtime.catalog.records() if r.url.startswith("file://"))


def test_an_upstream_restart_with_changed_data_makes_cached_chunks_stale(setup, tmp_path):
    up_root, vol, port, own = setup
    with proxy_after(up_root, port, own, tmp_path) as (cat, px, vid):
        via = client_for(px)
        tensor, _ = cat.find_tensor(vid)
        old_ids = [c.chunk_id.encode() for c in plan_read(tensor).chunks]
        np.testing.assert_array_equal(via.get_tensor(vid).compute(), vol)  # now cached
        changed = _write_volume(up_root / "vol.zarr", seed=2)
        with upstream_server(up_root, port):
            # before the proxy re-lists: an uncached read is refused, never cached under the old version
            with pytest.raises(StaleChunkId, match="upstream"):
                tensor.get_data()
            assert cat.scan()["changed"] >= 1
            fresh, _ = cat.find_tensor(vid)
            assert fresh.content_version != tensor.content_version
            with pytest.raises(StaleChunkId):
                px.runtime.engine.chunk(old_ids[0], fresh)
            with pytest.raises(flight.FlightError, match="re-plan|changed"):
                flight.FlightClient(px.location).do_get(flight.Ticket(_ticket(old_ids[0]))).read_all()
            np.testing.assert_array_equal(via.get_tensor(vid).compute(), changed)


def _ticket(chunk_id: bytes) -> bytes:
    from biopb.tensor import ticket_pb2

    return ticket_pb2.TensorTicket(chunk_id=chunk_id).SerializeToString()


@contextmanager
def proxy_after(up_root, port, own, tmp_path):
    """A proxy that listed a first upstream, which has stopped since."""
    with upstream_server(up_root, port) as up:
        vid_up = _upstream_vol_id(up)
        ctx = proxy(port, own, tmp_path)
        cat, px = ctx.__enter__()
        via = client_for(px)
        vid = _proxied_id(port, vid_up)
        np.testing.assert_array_equal(
            via.get_tensor(vid, slice_hint=(slice(0, 1), slice(None), slice(None))).compute().shape, (1, 260, 300)
        )
    try:
        yield cat, px, vid
    finally:
        ctx.__exit__(None, None, None)


def test_an_upstream_that_is_down_is_a_clear_error_and_the_rest_serves(setup, tmp_path):
    up_root, vol, port, own = setup
    with proxy_after(up_root, port, own, tmp_path) as (cat, px, vid):
        via = client_for(px)
        # the plane read while the upstream was up is cached and still served
        np.testing.assert_array_equal(
            via.get_tensor(vid, slice_hint=(slice(0, 1), slice(None), slice(None))).compute(), vol[:1]
        )
        # a scaled read of it is computed here from the cached full-resolution chunks
        np.testing.assert_array_equal(
            via.get_tensor(vid, scale_hint=[1, 2, 2], reduction_method="min").compute(),
            reference.downsample(vol, (1, 2, 2), "min"),
        )
        # what is not cached needs the upstream: a clear error naming it
        with pytest.raises(flight.FlightError, match=f"127.0.0.1:{port}: upstream .* failed"):
            via.get_tensor(_proxied_id(port, "multi/img")).compute()
        local_id = next(r.source_id for r in cat.records() if r.url.startswith("file://"))
        np.testing.assert_array_equal(
            via.get_tensor(local_id).compute(), np.arange(600, dtype=np.int16).reshape(20, 30)
        )
        cat.scan()
        rows = {r.url: (r.is_resolved, r.unresolved_reason) for r in cat.records() if r.url.startswith("grpc://")}
        assert rows[f"grpc://127.0.0.1:{port}"][0] is False
        assert "catalog listing failed" in rows[f"grpc://127.0.0.1:{port}"][1]
        assert sum(ok for ok, _ in rows.values()) == 2  # the listed sources stay


def test_a_root_may_name_one_upstream_source(setup, tmp_path):
    up_root, vol, port, own = setup
    with upstream_server(up_root, port):
        cat = Catalog([f"grpc://127.0.0.1:{port}/multi"])
        try:
            cat.scan()
            assert [r.source_id for r in cat.records()] == [_proxied_id(port, "multi")]
            t, _ = cat.find_tensor(_proxied_id(port, "multi") + "/mask")
            assert t.shape == (120, 160) and t.dtype == np.uint32 and t.is_labels
            assert not cat.find_tensor(_proxied_id(port, "multi") + "/img")[0].is_labels
        finally:
            cat.close()
