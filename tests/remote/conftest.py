"""A real S3 API on loopback (moto's server mode) holding an OME-Zarr with stored levels and
labels and a sharded zarr v3, plus their local copies (the oracle)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

BUCKET = "lab-data"
SECRET = "s3cr3t-never-shown"


def write_ome_zarr(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """A cyx uint16 OME-Zarr 0.4 (levels at factors 1, 2, 4) with labels/cells, written by
    zarr-python. Returns the written level-0 image and labels."""
    import zarr

    rng = np.random.default_rng(seed)
    image = rng.integers(0, 60000, (2, 300, 260), dtype=np.uint16)
    labels = rng.integers(0, 7, (300, 260), dtype=np.uint32)
    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    for i in range(3):
        root.create_array(str(i), data=np.ascontiguousarray(image[:, :: 2**i, :: 2**i]), chunks=(1, 64, 64))
    axes = [
        {"name": "c", "type": "channel"},
        {"name": "y", "type": "space", "unit": "micrometer"},
        {"name": "x", "type": "space", "unit": "micrometer"},
    ]
    root.attrs["multiscales"] = [
        {
            "version": "0.4",
            "name": "img",
            "axes": axes,
            "datasets": [
                {"path": str(i), "coordinateTransformations": [{"type": "scale", "scale": [1, 0.5 * 2**i, 0.5 * 2**i]}]}
                for i in range(3)
            ],
        }
    ]
    lab = root.create_group("labels")
    lab.attrs["labels"] = ["cells"]
    cells = lab.create_group("cells")
    cells.create_array("0", data=labels, chunks=(64, 64))
    cells.attrs["multiscales"] = [
        {
            "version": "0.4",
            "name": "cells",
            "axes": axes[1:],
            "datasets": [{"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [0.5, 0.5]}]}],
        }
    ]
    cells.attrs["image-label"] = {"version": "0.4", "source": {"image": "../../"}}
    return {"image": image, "labels": labels}


def write_sharded(path: Path, seed: int = 1) -> np.ndarray:
    import zarr

    vol = np.random.default_rng(seed).integers(0, 255, (6, 200, 180), dtype=np.uint8)
    arr = zarr.create_array(
        str(path), shape=vol.shape, chunks=(2, 50, 60), shards=(6, 100, 120), dtype=vol.dtype, zarr_format=3
    )
    arr[...] = vol
    return vol


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 on 127.0.0.1, with the usual AWS_* environment pointing at it."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "testing-key",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    _forget_filesystems()
    try:
        yield endpoint
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _forget_filesystems()


def _forget_filesystems() -> None:
    """fsspec caches S3 filesystems (and their resolved endpoint) per process."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


def s3fs_client():
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True)


@pytest.fixture(scope="module")
def s3_data(s3_endpoint, tmp_path_factory):
    """The local copies and the bucket ``lab-data/run1/`` holding the same stores."""
    local = tmp_path_factory.mktemp("s3-local")
    written = write_ome_zarr(local / "cells.ome.zarr")
    written["sharded"] = write_sharded(local / "vol.zarr")
    (local / "notes.txt").write_text("not a source")
    fs = s3fs_client()
    if not fs.exists(BUCKET):  # moto's state is per process, shared by its servers
        fs.mkdir(BUCKET)
    for name in ("cells.ome.zarr", "vol.zarr", "notes.txt"):
        fs.put(str(local / name), f"{BUCKET}/run1/{name}", recursive=True)
    return local, written
