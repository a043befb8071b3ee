"""A real S3 API on loopback (moto's server mode) holding an OME-Zarr with stored levels and
labels and a sharded zarr v3, plus their local copies (the oracle)."""

from __future__ import annotations

import os
from contextlib import contextmanager
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


# ---- one image by URL: a static range host on loopback (tensor_server/testing/range_host.py) ----
def write_bioformats2raw(path: Path, seed: int = 2) -> np.ndarray:
    """A bioformats2raw layout: series ``0`` an OME-Zarr image, ``OME/.zattrs`` listing it."""
    import zarr

    image = write_ome_zarr(path / "0", seed)["image"]
    root = zarr.open_group(str(path), mode="a", zarr_format=2)
    root.attrs["bioformats2raw.layout"] = 3
    root.create_group("OME").attrs["series"] = ["0"]
    return image


def write_ome_tiff(path: Path, seed: int = 4) -> list[np.ndarray]:
    """A tiled cyx uint16 OME-TIFF with two SubIFD levels (factors 2 and 4); its levels."""
    import tifffile

    image = np.random.default_rng(seed).integers(0, 60000, (2, 520, 610), dtype=np.uint16)
    levels = [image, image[:, ::2, ::2].copy(), image[:, ::4, ::4].copy()]
    with tifffile.TiffWriter(path, ome=True) as tw:
        tw.write(levels[0], tile=(128, 128), subifds=2, metadata={"axes": "CYX"}, compression="zlib")
        for level in levels[1:]:
            tw.write(level, tile=(128, 128), subfiletype=1, compression="zlib")
    return levels


@pytest.fixture(scope="module")
def url_images(tmp_path_factory):
    """A folder of images written by their own writers, and what was written."""
    folder = tmp_path_factory.mktemp("url-images")
    written = write_ome_zarr(folder / "cells.ome.zarr")
    written["sharded"] = write_sharded(folder / "vol.zarr")
    written["b2r"] = write_bioformats2raw(folder / "b2r.zarr")
    written["tiff_levels"] = write_ome_tiff(folder / "img.ome.tif")
    (folder / "notes.txt").write_text("not an image")
    return folder, written


@pytest.fixture
def url_host(url_images):
    """The images on a range host at 127.0.0.1 (its own per test: a clean request log and
    fault list), with the remote settings allowing it and a fresh byte cache."""
    from tensor_server.testing.range_host import range_host

    folder, written = url_images
    with range_host(folder) as host, remote_config(folder.parent / f"cache-{host.url.rsplit(':', 1)[1]}"):
        host.written = written
        yield host


@contextmanager
def remote_config(cache_dir, **options):
    """``[remote]`` settings for the block: loopback allowed (tests' hosts are on it), a short
    timeout, the byte cache in ``cache_dir``."""
    from tensor_server.adapters.url_source import RemoteSettings, set_remote_settings

    options = {"allowed_hosts": ("127.0.0.1",), "timeout": 3.0, "cache_dir": str(cache_dir), **options}
    old = set_remote_settings(RemoteSettings(**options))
    try:
        yield
    finally:
        set_remote_settings(old)
