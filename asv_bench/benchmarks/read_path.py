"""Scaled reads through the read path: ArrayAdapter (no I/O), a blosc zarr store and a tiled
OME-TIFF. Each ``setup`` ends with one untimed read, which compiles (or loads from numba's
cache) exactly the kernels that read uses; the zarr and TIFF setups do not call ``warm_up()``,
whose ~24 kernels would be compiled again for every commit the perf gate installs."""

from __future__ import annotations

import shutil
import tempfile

import numpy as np

from tensor_server.adapters.memory import ArrayAdapter
from tensor_server.core import Bounds
from tensor_server.core.downsample import warm_up


class ScaledReadArray:
    params = (["nearest", "area", "max"], [4, 16])
    param_names = ["method", "scale"]

    def setup(self, method, scale):
        warm_up()
        arr = np.random.default_rng(0).integers(0, 60000, (4096, 4096), dtype=np.uint16)
        self.t = ArrayAdapter(arr, chunk_shape=(1024, 1024))
        self.b = Bounds.full(arr.shape)
        self.t.get_scaled_data(self.b, (scale, scale), method)  # compile outside the timing

    def time_scaled_read(self, method, scale):
        self.t.get_scaled_data(self.b, (scale, scale), method)


class ScaledReadZarr:
    params = (["nearest", "area"], [4, 16])
    param_names = ["method", "scale"]
    timeout = 300

    def setup(self, method, scale):
        import zarr

        import tensor_server

        self.dir = tempfile.mkdtemp()
        arr = np.random.default_rng(0).integers(0, 4000, (4096, 4096), dtype=np.uint16)
        z = zarr.open_array(
            f"{self.dir}/img.zarr", mode="w", shape=arr.shape, chunks=(1024, 1024), dtype=arr.dtype, zarr_format=2
        )
        z[...] = arr
        self.t = tensor_server.open(f"{self.dir}/img.zarr").tensor()
        self.b = Bounds.full(self.t.shape)
        self.t.get_scaled_data(self.b, (scale, scale), method)

    def teardown(self, method, scale):
        shutil.rmtree(self.dir, ignore_errors=True)

    def time_scaled_read(self, method, scale):
        self.t.get_scaled_data(self.b, (scale, scale), method)


class ScaledReadTiff:
    """A 4096² OME-TIFF of 512² zlib tiles, written by tifffile, read through tensor_server.open."""

    params = (["nearest", "area"], [4, 16])
    param_names = ["method", "scale"]
    timeout = 300

    def setup(self, method, scale):
        import tifffile

        import tensor_server

        self.dir = tempfile.mkdtemp()
        arr = np.random.default_rng(0).integers(0, 4000, (4096, 4096), dtype=np.uint16)
        tifffile.imwrite(
            f"{self.dir}/img.ome.tif",
            arr,
            tile=(512, 512),
            compression="zlib",
            photometric="minisblack",
            metadata={"axes": "YX"},
        )
        self.t = tensor_server.open(f"{self.dir}/img.ome.tif").tensor()
        self.b = Bounds.full(self.t.shape)
        self.t.get_scaled_data(self.b, (scale, scale), method)

    def teardown(self, method, scale):
        shutil.rmtree(self.dir, ignore_errors=True)

    def time_scaled_read(self, method, scale):
        self.t.get_scaled_data(self.b, (scale, scale), method)
