"""The adapter contract (``AdapterTests``) for the two remote readers: a zarr store in S3
(moto on loopback) and an upstream server's tensors (scaled reads computed upstream)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.adapters.upstream import Upstream, open_upstream_sources
from tensor_server.adapters.zarr_remote import ObjectListing, RemoteZarrSource
from tensor_server.catalog import Catalog
from tensor_server.testing import AdapterTests, serving
from tests.remote.conftest import BUCKET


class TestS3Zarr(AdapterTests):
    """The sharded v3 store and the OME-Zarr image + labels, read from the bucket; the
    reference is zarr-python's read of the local copy."""

    methods = ("nearest", "area", "max")
    #: each pick reads ~36 objects, and moto answers one request at a time (~9 ms each, its
    #: dispatcher holds a lock): 16 picks on 8 threads still overlap every read with others
    thread_reads = 16

    @pytest.fixture(params=["vol.zarr", "cells.ome.zarr"])
    def source(self, request, s3_data):
        local, _ = s3_data
        listing = ObjectListing.from_url(f"s3://{BUCKET}/run1")
        src = RemoteZarrSource(listing.path(f"{BUCKET}/run1/{request.param}"), source_id="s3src")
        src.local = local / request.param
        yield src
        src.close()

    def reference_array(self, source, field):
        path = {None: "", "data": "", "image": "0", "image/@labels/cells": "labels/cells/0"}[field]
        return np.asarray(zarr.open_array(store=str(source.local), path=path, mode="r")[...])


@pytest.fixture(scope="module")
def upstream():
    rng = np.random.default_rng(3)
    arrays = {
        "vol": rng.integers(0, 60000, (3, 150, 170), dtype=np.uint16),
        "f": rng.standard_normal((90, 110)).astype(np.float32),
    }
    cat = Catalog([])
    cat.add_source(
        MemorySource(
            {
                "vol": ArrayAdapter(arrays["vol"], "zyx", chunk_shape=(1, 64, 64)),
                "f": ArrayAdapter(arrays["f"], "yx", chunk_shape=(32, 32)),
            },
            source_id="up",
        )
    )
    with serving(cat) as srv:
        yield srv, arrays
    cat.close()


class TestRemoteTensorAdapter(AdapterTests):
    """Reads and (upstream-computed) scaled reads of an upstream's tensors equal the oracle."""

    @pytest.fixture
    def source(self, upstream):
        srv, arrays = upstream
        (src,) = open_upstream_sources(Upstream(srv.location), prefix="px.")
        src.arrays = arrays
        yield src
        src.close()

    def reference_array(self, source, field):
        return source.arrays[field]

    def test_scaled_reads_are_asked_of_the_upstream(self, source, upstream):
        srv, arrays = upstream
        t = source.tensor("vol")
        assert t.reduces
        before = srv.runtime.metrics.calls()["flight"]["GetFlightInfo"]
        got = self.engine().read(t, None, (1, 2, 2), "area")
        assert srv.runtime.metrics.calls()["flight"]["GetFlightInfo"] == before + 1
        from tensor_server_kernels import reference

        np.testing.assert_array_equal(got, reference.downsample(arrays["vol"], (1, 2, 2), "area"))


class TestUrlImage(AdapterTests):
    """Images opened by URL from a range host on loopback: OME-Zarr v2 (image + labels), the
    sharded v3 array and the pyramidal OME-TIFF; the reference is the local file read by
    zarr-python / tifffile."""

    methods = ("nearest", "area", "max")

    @pytest.fixture(params=["cells.ome.zarr", "vol.zarr", "img.ome.tif"])
    def source(self, request, url_host):
        from tensor_server.adapters.url_source import open_url_source

        src = open_url_source(f"{url_host.url}/{request.param}", source_id="urlsrc")
        src.local = url_host.root / request.param
        yield src
        src.close()

    def reference_array(self, source, field):
        import tifffile

        if source.local.suffix == ".tif":
            return tifffile.imread(source.local)
        path = {None: "", "data": "", "image": "0", "image/@labels/cells": "labels/cells/0"}[field]
        return np.asarray(zarr.open_array(store=str(source.local), path=path, mode="r")[...])
