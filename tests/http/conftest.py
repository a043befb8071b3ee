"""A Flight server with a chunk cache and its HTTP front end on 127.0.0.1, over generated data:
the demo OME-Zarr (stored levels and labels), an OME-TIFF volume (computed levels), an HDF5
volume stored z, x, y (served reordered) and an in-memory image big enough for computed levels
under a small plane budget."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.cache import CacheManager
from tensor_server.catalog import Catalog
from tensor_server.core.pyramid import PyramidPolicy
from tensor_server.testing import serving

#: the one cross-origin page the shared server lets read (tests/http/security_test.py has the rest)
VIEWER_ORIGIN = "http://viewer.example"
POLICY = PyramidPolicy(plane_budget_px=128 * 128, volume_budget_voxels=32 * 64 * 64, coarsest_tile=128)


@contextmanager
def http_serving(catalog, tmp_path, *, token=None, precache_bytes=0, security=None, tls=None, **settings):
    """(Served, its HTTP front end) over ``catalog`` with a chunk cache and POLICY's levels;
    ``security`` is the HTTP door's browser-safety policy, ``tls`` the certificate both doors serve."""
    cache = CacheManager(tmp_path / "cache")
    try:
        with serving(
            catalog,
            cache=cache,
            http=True,
            http_security=security,
            tls=tls,
            token=token,
            plane_budget_px=POLICY.plane_budget_px,
            volume_budget_voxels=POLICY.volume_budget_voxels,
            coarsest_tile=POLICY.coarsest_tile,
            precache_bytes=precache_bytes,
            **settings,
        ) as srv:
            yield srv, srv.http
    finally:
        cache.close()


@pytest.fixture(scope="module")
def http_catalog(tmp_path_factory):
    import h5py
    import tifffile

    from tensor_server.demo import make_demo_dataset

    root = tmp_path_factory.mktemp("http-root")
    make_demo_dataset(root / "demo")
    rng = np.random.default_rng(8)
    vol = rng.integers(0, 255, (10, 300, 260), dtype=np.uint8)
    tifffile.imwrite(
        root / "vol.ome.tif",
        vol,
        tile=(64, 64),
        photometric="minisblack",
        metadata={"axes": "ZYX", "PhysicalSizeX": 0.5, "PhysicalSizeY": 0.5, "PhysicalSizeZ": 2.0},
    )
    zxy = rng.integers(0, 60000, (6, 200, 180), dtype=np.uint16)
    with h5py.File(root / "zxy.h5", "w") as f:
        ds = f.create_dataset("vol", data=zxy, chunks=(2, 64, 64))
        for i, label in enumerate("zxy"):
            ds.dims[i].label = label
    cat = Catalog([root])
    cat.scan()
    img = rng.integers(0, 60000, (700, 900), dtype=np.uint16)
    cat.add_source(
        MemorySource(
            ArrayAdapter(
                img,
                "yx",
                chunk_shape=(128, 128),
                physical_scale=(0.25, 0.25),
                physical_unit=("micrometer", "micrometer"),
            ),
            source_id="plane",
        )
    )
    yield cat
    cat.close()


@pytest.fixture(scope="module")
def served(http_catalog, tmp_path_factory):
    from tensor_server.http.security import HttpSecurity

    security = HttpSecurity.build(cors_origins=[VIEWER_ORIGIN])  # no token: the semantics tests
    with http_serving(http_catalog, tmp_path_factory.mktemp("http-cache"), security=security) as pair:
        yield pair


def ids(catalog):
    """Array ids by kind: the demo image, its labels, the TIFF volume, the reordered HDF5, the plane."""
    out = {}
    for rec in catalog.records():
        if rec.source is None:
            continue
        for t in rec.source.tensors.values():
            if rec.type.startswith("ome-zarr") or "cells" in t.array_id:
                out["labels" if t.is_labels else "image"] = t.array_id
            elif t.array_id.startswith("vol"):
                out["tiff"] = t.array_id
            elif t.array_id.startswith("zxy"):
                out["hdf5"] = t.array_id
            elif t.array_id == "plane":
                out["plane"] = t.array_id
    return out
