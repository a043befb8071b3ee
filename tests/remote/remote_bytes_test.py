"""The remote byte store: versions (a changed ETag is refetched, old and new bytes never
mixed, a pinned reader refused), the revalidation period, absent objects remembered, the
budget; coalescing (concurrent readers of one range: one fetch, also through the server's
doors) and the bound on requests in flight per host."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tensor_server.adapters._remote_bytes import ABSENT, RemoteBytes
from tensor_server.adapters.url_source import RemoteSettings, open_url_source
from tensor_server.catalog import Catalog
from tensor_server.core.bounds import Bounds
from tensor_server.errors import RemoteUnavailable, UnreadableSource
from tensor_server.testing import serving
from tensor_server.testing.range_host import range_host
from tests.flight.conftest import client_for
from tests.remote.conftest import remote_config


def _settings(tmp_path, **options) -> RemoteSettings:
    return RemoteSettings(
        **{"allowed_hosts": ("127.0.0.1",), "timeout": 5.0, "cache_dir": str(tmp_path / "bytes"), **options}
    )


def _rewrite(path, data: bytes) -> None:
    """New content with a new mtime (the host's ETag is made of size and mtime)."""
    path.write_bytes(data)
    later = time.time() + 10
    os.utime(path, (later, later))


@pytest.fixture
def host(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "obj.bin").write_bytes(bytes(range(256)) * 4)
    with range_host(tmp_path / "site") as h:
        yield h


def test_a_changed_etag_is_refetched_and_the_old_ranges_dropped(host, tmp_path):
    store = RemoteBytes(_settings(tmp_path, revalidate_seconds=0))
    url = f"{host.url}/obj.bin"
    first, v1 = store.read(url, "0-9")
    assert first == bytes(range(10)) and store.read(url, "10-19")[0] == bytes(range(10, 20))
    _rewrite(tmp_path / "site" / "obj.bin", b"\xff" * 1000)
    host.reset()
    again, v2 = store.read(url, "0-9")
    assert again == b"\xff" * 10 and v2 != v1
    assert [m for m, _, _ in host.requests] == ["HEAD", "GET"]  # revalidated, then fetched anew
    # the old version's 10-19 was dropped with it: fetched again, from the new version
    assert store.read(url, "10-19")[0] == b"\xff" * 10 and host.count(method="GET") == 2
    assert store.store.total == 20


def test_within_the_revalidation_period_the_cache_asks_nothing(host, tmp_path):
    store = RemoteBytes(_settings(tmp_path, revalidate_seconds=3600))
    url = f"{host.url}/obj.bin"
    assert store.read(url, "0-9")[0] == bytes(range(10))
    _rewrite(tmp_path / "site" / "obj.bin", b"\xff" * 1000)
    host.reset()
    assert store.read(url, "0-9")[0] == bytes(range(10)) and host.count() == 0


def test_a_reader_that_found_an_object_due_sends_no_head_once_another_revalidated_it(host, tmp_path):
    """The interleaving of a viewer's tiles: a reader finds the object due, another reader's
    HEAD revalidates it and ends, then the first asks: no second HEAD (one a period an object,
    not one a tile)."""
    store = RemoteBytes(_settings(tmp_path, revalidate_seconds=600))
    url = f"{host.url}/obj.bin"
    store.read(url, "0-9")
    meta = store.store.meta(url)
    store.store.set_meta(url, meta["validator"], time.time() - 3600, meta["size"])
    due = dict(store.store.meta(url))  # what the first reader saw
    host.reset()
    assert store.read(url, "0-9")[0] == bytes(range(10))  # the other reader: one HEAD
    assert host.requests == [("HEAD", "/obj.bin", "")]
    seen, real = iter([due]), store.store.meta
    store.store.meta = lambda u: next(seen, None) or real(u)  # type: ignore[method-assign]
    assert store.read(url, "0-9")[0] == bytes(range(10))
    assert host.requests == [("HEAD", "/obj.bin", "")]


def test_a_pinned_reader_is_refused_when_the_object_changed(host, tmp_path):
    store = RemoteBytes(_settings(tmp_path, revalidate_seconds=0))
    url = f"{host.url}/obj.bin"
    _, pinned = store.read(url, "0-9")
    _rewrite(tmp_path / "site" / "obj.bin", b"\xff" * 1000)
    with pytest.raises(UnreadableSource, match="changed on the host since it was opened") as err:
        store.read(url, "100-199", pinned=pinned)
    assert url in str(err.value)


def test_a_tiff_rewritten_on_the_host_is_refused_mid_read_not_decoded(tmp_path, url_images):
    folder, written = url_images
    site = tmp_path / "site"
    site.mkdir()
    (site / "img.ome.tif").write_bytes((folder / "img.ome.tif").read_bytes())
    with range_host(site) as h, remote_config(tmp_path / "c", revalidate_seconds=0):
        src = open_url_source(f"{h.url}/img.ome.tif", "t")
        (t,) = src.tensors.values()
        _rewrite(site / "img.ome.tif", (folder / "vol.zarr" / "zarr.json").read_bytes() * 50)
        with pytest.raises(UnreadableSource, match="changed on the host"):
            t.read_region(Bounds((1, 384, 512), (2, 520, 610)))
        src.close()


def test_absent_objects_are_remembered(host, tmp_path):
    store = RemoteBytes(_settings(tmp_path))
    url = f"{host.url}/nothing/.zattrs"
    assert store.read(url) == (None, ABSENT) and store.read(url) == (None, ABSENT)
    assert host.count() == 1


def test_the_budget_evicts_the_least_recently_used_ranges(host, tmp_path):
    store = RemoteBytes(_settings(tmp_path, cache_max_bytes=250))
    url = f"{host.url}/obj.bin"
    for start in range(0, 500, 100):
        store.read(url, f"{start}-{start + 99}")
    files = [p for p in (tmp_path / "bytes").rglob("r.*")]
    assert store.store.total == 200 == sum(p.stat().st_size for p in files)
    host.reset()
    store.read(url, "400-499")  # kept
    store.read(url, "0-99")  # evicted: asked again
    assert [r for _, _, r in host.requests] == ["bytes=0-99"]


def test_sixteen_concurrent_readers_of_one_cold_range_cause_one_fetch(host, tmp_path):
    host.latency = 0.3  # every reader arrives while the first fetch is still out
    store = RemoteBytes(_settings(tmp_path))
    url = f"{host.url}/obj.bin"
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda _: store.read(url, "0-99")[0], range(16)))
    assert got == [bytes(range(100))] * 16
    assert host.count(method="GET") == 1


def test_requests_in_flight_to_one_host_are_bounded(host, tmp_path):
    host.latency = 0.2
    store = RemoteBytes(_settings(tmp_path, per_host=3))
    url = f"{host.url}/obj.bin"
    with ThreadPoolExecutor(12) as pool:
        got = list(pool.map(lambda i: store.read(url, f"{i * 10}-{i * 10 + 9}")[0], range(12)))
    assert got == [bytes(range(256))[i * 10 : i * 10 + 10] for i in range(12)]
    assert host.count(method="GET") == 12
    assert 2 <= host.max_in_flight <= 3  # parallel, within the bound


def test_sixteen_sdk_clients_on_one_cold_chunk_cause_one_remote_fetch(url_host):
    url_host.latency = 0.2
    src = open_url_source(f"{url_host.url}/cells.ome.zarr", "cells")
    cat = Catalog([])
    cat.add_source(src)
    tid = src.tensor("image").array_id
    url_host.reset()
    with serving(cat) as srv:
        start = threading.Barrier(16)

        def read(_):
            sdk = client_for(srv)
            start.wait()
            return sdk.get_tensor(tid)[:1, :64, :64].compute()

        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(read, range(16)))
    cat.close()
    for g in got:
        np.testing.assert_array_equal(g, url_host.written["image"][:1, :64, :64])
    assert url_host.count("/cells.ome.zarr/0/0.0.0") == 1, url_host.requests


def test_a_host_down_at_revalidation_leaves_the_cached_copy_served(host, tmp_path):
    store = RemoteBytes(_settings(tmp_path, revalidate_seconds=0, timeout=1.0))
    url = f"{host.url}/obj.bin"
    assert store.read(url, "0-9")[0] == bytes(range(10))
    host.stall.add("/obj.bin")
    assert store.read(url, "0-9")[0] == bytes(range(10))  # the HEAD stalled: the cached copy
    assert [m for m, _, _ in host.requests] == ["GET", "HEAD"]
    with pytest.raises(RemoteUnavailable, match="obj.bin: the host did not answer within 1 s"):
        store.read(url, "10-19")  # not cached: nothing to serve


def test_an_answer_larger_than_max_object_bytes_is_refused(host, tmp_path):
    store = RemoteBytes(_settings(tmp_path, max_object_bytes=500))
    url = f"{host.url}/obj.bin"
    assert store.read(url, "0-399")[0] == (bytes(range(256)) * 2)[:400]  # a range within the bound
    with pytest.raises(UnreadableSource, match="obj.bin: the answer is larger than .remote. max_object_bytes .500."):
        store.read(url)  # the whole 1024-byte object
