"""Fixtures of the Flight tests: generated sources and an in-process server over them
(``tensor_server.testing.serving``: 127.0.0.1, an ephemeral port, torn down cleanly)."""

from __future__ import annotations

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.testing import serving


def client_for(server, token=None):
    from biopb.tensor import TensorFlightClient

    return TensorFlightClient(server.location, token=token)


@pytest.fixture(scope="module")
def generated_root(tmp_path_factory):
    """zarr, OME-TIFF, HDF5 and .npy sources written with their own writers."""
    import h5py
    import tifffile
    import zarr

    root = tmp_path_factory.mktemp("root")
    rng = np.random.default_rng(42)
    img = rng.integers(0, 60000, (2, 300, 410), dtype=np.uint16)
    z = zarr.open_array(
        str(root / "plain.zarr"), mode="w", shape=img.shape, chunks=(1, 128, 128), dtype=img.dtype, zarr_format=3
    )
    z[...] = img
    vol = rng.integers(0, 255, (12, 200, 260), dtype=np.uint8)
    tifffile.imwrite(root / "vol.ome.tif", vol, tile=(64, 64), photometric="minisblack", metadata={"axes": "ZYX"})
    with h5py.File(root / "data.h5", "w") as f:
        f.create_dataset("grp/chunked", data=rng.standard_normal((150, 170)).astype(np.float32), chunks=(64, 64))
        f.create_dataset("labels", data=rng.integers(0, 5, (90, 120), dtype=np.int32))
    np.save(root / "arr.npy", rng.integers(-1000, 1000, (33, 47), dtype=np.int16))
    (root / "notes.txt").write_text("not a source")
    (root / "broken.tif").write_bytes(b"II*\x00" + b"\xff" * 60)
    return root


@pytest.fixture(scope="module")
def catalog(generated_root):
    cat = Catalog([generated_root])
    cat.scan()
    arr = (np.arange(35, dtype=np.uint16) * 3 + 1).reshape(5, 7)
    cat.add_source(MemorySource(ArrayAdapter(arr, chunk_shape=(2, 2)), source_id="demo"))
    big = np.random.default_rng(0).integers(0, 60000, (3, 300, 500), dtype=np.uint16)
    labels = np.random.default_rng(1).integers(0, 6, (120, 160), dtype=np.uint32)
    cat.add_source(
        MemorySource(
            {
                "a": ArrayAdapter(big, "cyx", chunk_shape=(1, 128, 128)),
                "mask": ArrayAdapter(labels, "yx", chunk_shape=(64, 64), is_labels=True),
            },
            source_id="multi",
        )
    )
    yield cat
    cat.close()


@pytest.fixture(scope="module")
def server(catalog):
    with serving(catalog) as srv:
        yield srv


@pytest.fixture
def client(server):
    return client_for(server)
