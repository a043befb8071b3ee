"""Upload fixtures: an in-process writable server (optionally with a chunk cache and an
injectable clock) over a catalog with an in-memory source and a discovered zarr source."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.testing import serving
from tensor_server.uploads import UploadManager


class FakeClock:
    """A wall clock tests move by hand (sweeps without sleeping)."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_catalog(root) -> Catalog:
    import zarr

    z = zarr.open_array(str(root / "disc.zarr"), mode="w", shape=(40, 30), chunks=(16, 16), dtype="<u2", zarr_format=3)
    z[...] = np.arange(1200, dtype=np.uint16).reshape(40, 30)
    cat = Catalog([root])
    cat.scan()
    cat.add_source(MemorySource({"img": ArrayAdapter(np.ones((3, 20, 24), np.uint16), "cyx")}, source_id="mem"))
    return cat


@contextmanager
def upload_server(tmp_path, *, writable=True, write_dir=True, clock=None, cache=False, **cfg):
    from tensor_server.cache import CacheManager

    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    cat = make_catalog(root)
    wd = tmp_path / "write" if write_dir else None
    manager = UploadManager(cat, wd, clock=clock, **cfg) if (wd is not None and clock is not None) else None
    cm = CacheManager(tmp_path / "chunks") if cache else None
    try:
        with serving(
            cat, cache=cm, uploads=manager, write_dir=None if wd is None else str(wd), writable=writable
        ) as srv:
            yield srv
    finally:
        if manager is not None:
            manager.close()  # releases the write dir for a restart in the same test
        if cm is not None:
            cm.close()
        cat.close()


@pytest.fixture
def server(tmp_path):
    with upload_server(tmp_path) as srv:
        yield srv


@pytest.fixture
def client(server):
    from biopb.tensor import TensorFlightClient

    return TensorFlightClient(server.location)


def discovered_id(catalog) -> str:
    return next(r.source_id for r in catalog.records() if r.type == "zarr")
