"""Many workers computing over a served tensor: the biopb SDK's dask arrays on a
``dask.distributed.LocalCluster`` with process workers, against the in-process oracle; the
server's per-client counters show the chunk reads came from several workers. And the server
side of such fan-out: concurrent misses of one chunk computed once, a bounded number of
computations at once, overload answered UNAVAILABLE (retryable)."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time

import numpy as np
import pyarrow.flight as flight
import pytest
from tensor_server_kernels import reference

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.cache import CacheManager
from tensor_server.catalog import Catalog
from tensor_server.core import plan_read
from tensor_server.core.engine import Overloaded, ReadEngine
from tensor_server.testing import serving


@pytest.fixture(scope="module")
def volume_server(tmp_path_factory):
    import zarr

    root = tmp_path_factory.mktemp("dist")
    # 48 MiB: several 8 MiB transfer chunks at full resolution, so a graph has tasks to spread
    vol = np.random.default_rng(4).integers(0, 60000, (24, 1024, 1024), dtype=np.uint16)
    z = zarr.open_array(str(root / "vol.zarr"), mode="w", shape=vol.shape, chunks=(1, 256, 256), dtype=vol.dtype)
    z[...] = vol
    cat = Catalog([root])
    cat.scan()
    cache = CacheManager(tmp_path_factory.mktemp("dist-cache"))
    with serving(cat, cache=cache, max_computes=4) as srv:
        yield srv, cat.records()[0].source_id, vol
    cache.close()
    cat.close()


def test_reductions_on_a_process_cluster_equal_the_oracle(volume_server):
    from biopb.tensor import TensorFlightClient
    from dask.distributed import Client, LocalCluster

    srv, array_id, vol = volume_server
    sdk = TensorFlightClient(srv.location)
    with (
        LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as dask_client,
    ):
        level = sdk.get_tensor(array_id, scale_hint=[1, 2, 2], reduction_method="area")
        per_plane_mean = dask_client.compute(level.astype(np.float64).mean(axis=(1, 2))).result()
        projection = dask_client.compute(sdk.get_tensor(array_id).max(axis=0)).result()
        workers = len(dask_client.scheduler_info()["workers"])
    want_level = reference.downsample(vol, (1, 2, 2), "area")
    np.testing.assert_allclose(per_plane_mean, want_level.astype(np.float64).mean(axis=(1, 2)), rtol=1e-12)
    np.testing.assert_array_equal(projection, vol.max(axis=0))
    assert workers == 2
    stats = json.loads(
        next(iter(flight.FlightClient(srv.location).do_action(flight.Action("server_stats", b"")))).body.to_pybytes()
    )
    readers = {peer: n for peer, n in stats["chunk_reads_by_peer"].items() if n > 0}
    assert len(readers) >= 2, f"chunk reads came from one client only: {readers}"


def test_concurrent_misses_of_one_chunk_compute_once(tmp_path):
    arr = np.random.default_rng(1).integers(0, 9, (256, 256), dtype=np.uint8)
    t = ArrayAdapter(arr, chunk_shape=(256, 256))
    MemorySource(t, source_id="once")
    with CacheManager(tmp_path) as cache:
        engine = ReadEngine(cache, max_computes=2)
        cid = plan_read(t).chunks[0].chunk_id
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda _: engine.chunk(cid, t)[1], range(32)))
        assert t.reads == 1
        for r in results:
            np.testing.assert_array_equal(r, arr)


class _Slow(ArrayAdapter):
    """Holds each read until released, counting how many run at once."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.gate = threading.Event()
        self.running = 0
        self.peak = 0
        self.lock = threading.Lock()

    def read_region(self, bounds):
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        self.gate.wait(10)
        with self.lock:
            self.running -= 1
        return super().read_region(bounds)


def test_admission_bounds_concurrent_computes_and_overload_is_retryable():
    t = _Slow(np.zeros((64, 64), np.uint16), chunk_shape=(8, 64))
    MemorySource(t, source_id="slow")
    chunks = [pc.chunk_id for pc in plan_read(t).chunks]
    engine = ReadEngine(max_computes=2, admission_timeout=0.3)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(engine.chunk, cid, t) for cid in chunks[:6]]
        time.sleep(0.8)  # the two admitted reads hold their slots; the others time out
        t.gate.set()
        outcomes = [f.exception() for f in futures]
    assert t.peak == 2
    assert sum(isinstance(e, Overloaded) for e in outcomes) == 4
    assert sum(e is None for e in outcomes) == 2
    # after the burst the slots are free again
    assert engine.chunk(chunks[7], t)[1].shape == (8, 64)


def test_overload_is_unavailable_on_the_wire():
    from tensor_server.flight.errors import flight_error

    err = flight_error(Overloaded("busy"))
    assert isinstance(err, flight.FlightUnavailableError)
    assert json.loads(err.extra_info)["code"] == "UNAVAILABLE"
