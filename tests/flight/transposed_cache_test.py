"""Issue 11's reproduction through the server and the real biopb SDK: tensors whose axes the
server reorders (an HDF5 volume labelled z, x, y; an x-first array), read at full resolution
first (which fills the chunk cache) and then zoomed out, must equal the oracle over the
served pixels for every method — with the cache, without it, and under concurrent clients."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest
from tensor_server_kernels import reference

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.cache import CacheManager
from tensor_server.catalog import Catalog
from tensor_server.core.normalizing import NormalizingAdapter
from tests.flight.conftest import client_for

METHODS = ["nearest", "area", "min", "max", "mode", "median"]


@pytest.fixture(scope="module")
def transposed_root(tmp_path_factory):
    import h5py

    root = tmp_path_factory.mktemp("transposed")
    # square planes: the stored-order and served-order chunk grids then name the same boxes,
    # which is what let the old cache-sourced path pick transposed entries
    vol = np.random.default_rng(11).integers(0, 60000, (7, 64, 64), dtype=np.uint16)  # z, x, y on disk
    with h5py.File(root / "zxy.h5", "w") as f:
        ds = f.create_dataset("vol", data=vol, chunks=(2, 32, 32))
        for i, label in enumerate("zxy"):
            ds.dims[i].label = label
    return root, np.transpose(vol, (0, 2, 1))  # served z, y, x


def _catalog(root):
    cat = Catalog([root])
    cat.scan()
    xfirst = np.random.default_rng(0).integers(0, 60000, size=(64, 64), dtype=np.uint16)
    inner = ArrayAdapter(xfirst, dim_labels=("x", "y"), chunk_shape=(32, 32))
    from tensor_server.core import normalize_axes

    cat.add_source(MemorySource(normalize_axes(inner), source_id="xfirst"))
    return cat, xfirst.T


@pytest.fixture(scope="module", params=["cached", "uncached"])
def served(request, transposed_root, tmp_path_factory):
    from tensor_server.testing import serving

    root, vol = transposed_root
    cat, xfirst = _catalog(root)
    cache = CacheManager(tmp_path_factory.mktemp("cache")) if request.param == "cached" else None
    h5_id = next(r.source_id for r in cat.records() if r.type == "hdf5")
    with serving(cat, cache=cache) as srv:
        yield srv, {h5_id: vol, "xfirst": xfirst}
    if cache is not None:
        cache.close()
    cat.close()


def _scales(ndim):
    return [(1, 2, 2), (2, 4, 2), (3, 3, 3)] if ndim == 3 else [(2, 2), (4, 3)]


@pytest.mark.parametrize("method", METHODS)
def test_zoom_out_after_full_resolution_equals_the_oracle(served, method):
    srv, arrays = served
    client = client_for(srv)
    for array_id, want_full in arrays.items():
        tensor, _ = srv.runtime.catalog.find_tensor(array_id)
        assert isinstance(tensor, NormalizingAdapter), "the case needs a reordered tensor"
        np.testing.assert_array_equal(client.get_array(array_id), want_full)
        for scale in _scales(want_full.ndim):
            got = client.get_array(array_id, scale_hint=list(scale), reduction_method=method)
            want = reference.downsample(want_full, scale, method)
            np.testing.assert_array_equal(got, want, err_msg=f"{array_id} {method} {scale}")


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "uncached"])
def test_concurrent_clients_equal_serial_reads(transposed_root, tmp_path, cached):
    """Eight client threads at once against one server. Each client has the SDK's copy cache
    off (``cache_bytes=0``, on a server of its own so no earlier client of that location made
    one): biopb 0.13.0 shares one ``cachey.Cache`` between a process's threads without a lock,
    and its heapdict livelocked here once (py-spy: eight threads in ``heapdict._swap`` for
    24 minutes). What this test checks is the server under concurrent requests."""
    from biopb.tensor import TensorFlightClient

    from tensor_server.testing import serving

    root, vol = transposed_root
    cat, xfirst = _catalog(root)
    arrays = {next(r.source_id for r in cat.records() if r.type == "hdf5"): vol, "xfirst": xfirst}
    cache = CacheManager(tmp_path / "cache") if cached else None
    try:
        with serving(cat, cache=cache) as srv:
            _concurrent_equal_serial(lambda: TensorFlightClient(srv.location, cache_bytes=0), arrays)
    finally:
        if cache is not None:
            cache.close()
        cat.close()


def _concurrent_equal_serial(new_client, arrays):
    jobs = []
    for array_id, want_full in arrays.items():
        jobs.append((array_id, None, None))
        for scale in _scales(want_full.ndim):
            for method in ("area", "nearest", "max"):
                jobs.append((array_id, scale, method))
    jobs = jobs * 3

    def read(job):
        array_id, scale, method = job
        client = new_client()
        if scale is None:
            return client.get_array(array_id)
        return client.get_array(array_id, scale_hint=list(scale), reduction_method=method)

    serial = [read(j) for j in jobs]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        parallel = list(pool.map(read, jobs[::-1]))[::-1]
    for job, a, b in zip(jobs, serial, parallel):
        np.testing.assert_array_equal(a, b, err_msg=str(job))
        array_id, scale, method = job
        want = arrays[array_id] if scale is None else reference.downsample(arrays[array_id], scale, method)
        np.testing.assert_array_equal(b, want, err_msg=str(job))
